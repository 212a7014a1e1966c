"""Checks an OpenAPI 3.1 document, for scripts/api-contract: its structure
against the OpenAPI 3.1 schema schemathesis carries, and every Schema Object
in it against JSON Schema 2020-12, the dialect OpenAPI 3.1 uses (a tuple
written as `items: [...]`, for one, is not 2020-12). schemathesis itself
reads a document without checking its Schema Objects.

    python openapi_valid.py DOCUMENT.json
"""

import json
import sys

import jsonschema_rs
from schemathesis.specs.openapi.definitions import OPENAPI_31


def schema_objects(node, path):
    """Every Schema Object: under `schema` keys and `components/schemas`."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "schema" or path[-2:] == ["components", "schemas"]:
                yield path + [key], value
            yield from schema_objects(value, path + [key])
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from schema_objects(value, path + [str(index)])


def main(path):
    with open(path, encoding="utf-8") as file:
        document = json.load(file)
    errors = [
        f"/{'/'.join(map(str, error.instance_path))}: {error.message}"
        for error in jsonschema_rs.Draft202012Validator(OPENAPI_31).iter_errors(document)
    ]
    checked = 0
    for where, schema in schema_objects(document, []):
        checked += 1
        try:
            jsonschema_rs.meta.validate(schema)
        except jsonschema_rs.ValidationError as error:
            errors.append(f"/{'/'.join(where)}: {error.message}")
    for error in errors:
        print(f"{path}: {error}", file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"{path}: OpenAPI 3.1, {checked} schema object(s) valid under JSON Schema 2020-12")


if __name__ == "__main__":
    main(sys.argv[1])
