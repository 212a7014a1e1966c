"""Prints the end-to-end suite's summary line from the scenarios' records."""

import json
import pathlib
import sys

results = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
if not results:
    print("e2e: no scenario recorded a result", file=sys.stderr)
    sys.exit(1)
total = {"orders": 0, "cancelled": 0, "faults": 0, "lost": 0, "double_effects": 0, "order_violations": 0,
         "status_mismatches": 0, "duplicates_absorbed": 0, "dlt": 0, "back_dlt": 0}
for path in results:
    outcome = json.loads(path.read_text())["outcome"]
    outcome["back_dlt"] = sum(outcome["back_dlt_reasons"].values())
    for key in total:
        total[key] += outcome[key]
print(f"scenarios={len(results)} " + " ".join(f"{key}={value}" for key, value in total.items()))
