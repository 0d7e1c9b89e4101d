"""Validator throughput of ias.schema against the jsonschema package, on skill-like schemas."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ias import schema as ias_schema  # noqa: E402

# (schema, instances): realistic skill parameters, valid and invalid instances mixed.
CASES = [
    ({"type": "object",
      "properties": {
          "city": {"type": "string", "minLength": 1, "description": "City name"},
          "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
          "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 3},
          "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
          "verbose": {"type": "boolean"}},
      "required": ["city"], "additionalProperties": False},
     [{"city": "Paris", "unit": "c", "days": 3, "tags": ["a", "b"]},
      {"city": "Oslo"},
      {"city": "", "unit": "k", "days": True, "extra": 1},
      {"unit": "f", "days": 30}]),
    ({"type": "object",
      "properties": {
          "to": {"type": "string", "format": "email"},
          "subject": {"type": "string", "maxLength": 200},
          "body": {"type": "string"},
          "cc": {"type": "array", "items": {"type": "string", "format": "email"},
                 "uniqueItems": True}},
      "required": ["to", "subject", "body"], "additionalProperties": False},
     [{"to": "a@example.com", "subject": "Hi", "body": "Hello there",
       "cc": ["b@example.com", "c@example.com"]},
      {"to": "not an email", "subject": "Hi", "body": "x", "cc": ["b@example.com", "b@example.com"]},
      {"to": "a@example.com", "subject": "Hi"}]),
    ({"type": "object",
      "properties": {
          "when": {"type": "string", "format": "date-time"},
          "text": {"type": "string", "minLength": 1, "maxLength": 500},
          "repeat": {"type": "string", "enum": ["none", "daily", "weekly"], "default": "none"},
          "priority": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 5},
                                 {"type": "null"}]}},
      "required": ["when", "text"]},
     [{"when": "2024-05-01T09:30:00+08:00", "text": "Call mom", "repeat": "weekly", "priority": 2},
      {"when": "2024-05-01 09:30", "text": "", "priority": 9},
      {"when": "2024-05-01T09:30:00Z", "text": "Standup", "priority": None}]),
    ({"type": "object",
      "properties": {
          "path": {"type": "string", "pattern": "^[A-Za-z0-9_./-]+$"},
          "mode": {"type": "string", "enum": ["read", "write", "append"]},
          "lines": {"type": "integer", "minimum": 1},
          "options": {"type": "object",
                      "properties": {"encoding": {"type": "string", "default": "utf-8"},
                                     "follow": {"type": "boolean", "default": False}},
                      "additionalProperties": False}},
      "required": ["path", "mode"]},
     [{"path": "notes/todo.txt", "mode": "read", "lines": 20,
       "options": {"encoding": "utf-8", "follow": True}},
      {"path": "../etc passwd", "mode": "exec", "options": {"bogus": 1}},
      {"path": "a.txt", "mode": "append", "lines": 0.5}]),
]

SECONDS = 0.6


def _rate(fn, pairs) -> float:
    """Validations per second of fn(validator, instance) over all pairs, for about SECONDS."""
    reps, elapsed = 0, 0.0
    batch = 200
    start = time.perf_counter()
    while elapsed < SECONDS:
        for _ in range(batch):
            for v, inst in pairs:
                fn(v, inst)
        reps += batch
        elapsed = time.perf_counter() - start
    return reps * len(pairs) / elapsed


def main() -> dict:
    """Measure and print validations/s for ias.schema and jsonschema; return the figures."""
    compiled = [(ias_schema.compile(s), inst) for s, insts in CASES for inst in insts]
    raw = [(s, inst) for s, insts in CASES for inst in insts]
    ours = _rate(lambda v, inst: v(inst), compiled)
    ours_validate = _rate(lambda s, inst: ias_schema.validate(inst, s), raw)
    result = {"validator": ours, "validate": ours_validate, "jsonschema": None,
              "ratio": None, "ratio_validate": None}
    try:
        import jsonschema
    except ImportError:
        print(f"validator: {ours:,.0f} validations/s (compiled); "
              f"validate(): {ours_validate:,.0f}/s; jsonschema not installed")
        return result
    theirs_pairs = [(jsonschema.Draft202012Validator(s), inst) for s, insts in CASES for inst in insts]
    # Sanity: both libraries must agree on which instances are valid.
    for (v, inst), (jv, _) in zip(compiled, theirs_pairs):
        if (not v(inst)) != jv.is_valid(inst):
            raise SystemExit(f"disagreement with jsonschema on {inst!r}")
    theirs = _rate(lambda v, inst: v.is_valid(inst), theirs_pairs)
    result.update(jsonschema=theirs, ratio=ours / theirs, ratio_validate=ours_validate / theirs)
    print(f"validator: {ours:,.0f} validations/s; jsonschema {theirs:,.0f}/s; "
          f"ratio {ours / theirs:.1f}x (target >= 10x)")
    print(f"validate(): {ours_validate:,.0f} validations/s (cached compile); "
          f"ratio {ours_validate / theirs:.1f}x")
    return result


if __name__ == "__main__":
    main()
