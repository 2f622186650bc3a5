#!/usr/bin/env python3
"""Validates a lunajit report against docs/report_schema.json (JSON Schema draft 2020-12).

usage: validate_report.py SCHEMA REPORT
Exit 0 when valid; 1 with every error on stderr when not; 3 when the
jsonschema module is missing (Debian: python3-jsonschema).
"""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed (scripts/install_deps.sh installs it)", file=sys.stderr)
    sys.exit(3)


def main():
    with open(sys.argv[1]) as f:
        schema = json.load(f)
    with open(sys.argv[2]) as f:
        report = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.path))
    for e in errors:
        print("/".join(str(p) for p in e.path) + ": " + e.message, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
