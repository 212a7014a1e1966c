"""schemathesis hooks for scripts/api-contract.

Each hook stands for a rule that the OpenAPI documents state in words
because JSON Schema cannot express it; a client that follows the documents
follows these rules too. They rewrite requests just before they are sent, in
every phase (the coverage phase ignores the filter_* and map_* hooks).
"""

import re
import uuid

import schemathesis

# The Idempotency-Key rule the spec declares: at most 255 printable ASCII
# characters, not all spaces.
VALID_KEY = re.compile(r"^(?=[\x20-\x7e]{1,255}$)[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$")


@schemathesis.hook
def before_call(ctx, case, kwargs):
    unique_idempotency_key(case)
    one_item_per_sku(case)


def unique_idempotency_key(case):
    """A key is remembered with its request: schemathesis reuses keys (the
    spec's example, short generated ones) with other requests, which the
    service rightly answers 422. Valid keys are made unique; invalid ones
    stay, to be refused."""
    headers = case.headers or {}
    if VALID_KEY.match(str(headers.get("Idempotency-Key", ""))):
        headers["Idempotency-Key"] = f"st-{uuid.uuid4()}"


def one_item_per_sku(case):
    """POST /orders: each sku at most once (JSON Schema's uniqueItems
    compares whole items, not one field of them). A repeated sku becomes a
    fresh valid one; the first occurrence, valid or not, stays."""
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        return
    seen = set()
    for index, item in enumerate(body["items"]):
        if not isinstance(item, dict) or not isinstance(item.get("sku"), str):
            continue
        if item["sku"] in seen:
            item["sku"] = f"ST-{index}"
        seen.add(item["sku"])
