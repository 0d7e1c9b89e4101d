"""The JSON Schema subset's public API under the name SPEC §5 gives it (`ias.schema.validate`,
`ias.schema.check`); the implementation is the `ias.jsonschema` package (not the database schema:
that is `schema.sql` and `migrations.py`)."""
from .jsonschema import SchemaError, Validator, apply_defaults, check, compile, loads, validate

__all__ = ["SchemaError", "Validator", "apply_defaults", "check", "compile", "loads", "validate"]
