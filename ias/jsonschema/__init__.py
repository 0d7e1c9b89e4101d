"""A JSON Schema subset for skill parameters (2020-12 semantics, stdlib only): the public API
and `check`, which decides whether a schema is usable at all.

Supported keywords: type, properties, required, additionalProperties, enum, const,
default, description, title, examples, minimum, maximum, exclusiveMinimum,
exclusiveMaximum, multipleOf, minLength, maxLength, pattern, format, items,
minItems, maxItems, uniqueItems, anyOf, oneOf, allOf, not; boolean schemas too.

Deliberately NOT handled (check() reports each as an unsupported keyword): $ref, $defs,
$id, $schema, $anchor, $dynamicRef, $comment, patternProperties, propertyNames,
minProperties, maxProperties, dependentRequired, dependentSchemas, if/then/else,
unevaluatedProperties, unevaluatedItems, prefixItems, contains, minContains,
maxContains, content*, deprecated, readOnly, writeOnly. Tuple-form `items` (a list)
is rejected too. Formats other than date, time, date-time, email, ipv4 and uri are
accepted unchecked (formats.py). `pattern` is a Python regular expression applied with
re.search; one prone to catastrophic backtracking is refused (patterns.py).

Where the rest is decided: validator.py compiles a checked schema into a validator (with
scalars.py for string and number keywords); values.py holds the limits for hostile JSON
(check() refuses schemas nested deeper than JSON_DEPTH_MAX or holding integers of more than
JSON_NUMBER_MAX digits before any recursion; `loads` checks JSON text for both before parsing).

Defaults: apply_defaults() fills absent properties from `default`, following properties,
additionalProperties and items (not allOf/anyOf/oneOf/not); a filled-in default object
gets its own nested defaults too. check() validates every `default` against its schema.

compile(schema) checks the schema and builds its validator once; hold the result (each
skill's is built when the registry loads: `Skill.validator`). validate() checks and compiles
on every call: for tests, one-off checks and the documented `ias.jsonschema.validate` API.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable

from . import validator as _validator
from .values import LEAF_TYPES, TYPE_NAMES, hostile, kind, loads, render, segment, too_deep
from ..limits import JSON_DEPTH_MAX, SCHEMA_NODES_MAX
from .patterns import pattern_problem
from .validator import Validator

__all__ = ["SchemaError", "Validator", "apply_defaults", "check", "compile", "loads", "validate"]


class SchemaError(ValueError):
    """The schema itself is invalid; `problems` holds `path: message` lines."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid schema: " + "; ".join(problems))
        self.problems = problems


def compile(schema: object) -> Validator:  # noqa: A001 - the documented public name
    """Check the schema and return validator(instance) -> errors; raise SchemaError if invalid."""
    problems = _problems(schema)
    if problems:
        raise SchemaError(list(problems))
    return _validator.build(schema, problems.compiled)


def compile_later(schema: object) -> Callable[[object], list[str]]:
    """The validator of a schema check() accepted, compiled at its first use (a listing of thousands of
    skills validates nothing)."""
    compiled: Validator | None = None

    def validate(instance: object) -> list[str]:
        nonlocal compiled
        if compiled is None:
            compiled = compile(schema)
        return compiled(instance)
    return validate


def validate(instance: object, schema: object) -> list[str]:
    """Return the instance's errors as `path: message` strings; empty means valid.

    Raises SchemaError when the schema itself is invalid (see check()).
    """
    return compile(schema)(instance)


def apply_defaults(instance: object, schema: object) -> object:
    """Return a deep copy of instance with absent object properties filled from their defaults.

    An instance nested too deep is returned as is, for the validator to refuse.
    """
    if type(instance) not in LEAF_TYPES and too_deep(instance):
        return instance
    return _apply_defaults(instance, schema)


def _apply_defaults(instance: object, schema: object) -> object:
    if isinstance(instance, dict):
        if not isinstance(schema, dict):
            return copy.deepcopy(instance)
        props = schema.get("properties")
        if not isinstance(props, dict):
            props = {}
        extra = schema.get("additionalProperties")
        out = {k: _apply_defaults(v, props.get(k, extra)) for k, v in instance.items()}
        for name, sub in props.items():
            if name not in out and isinstance(sub, dict) and "default" in sub:
                # Defaults are filled in turn, so a default object gains its own nested defaults.
                out[name] = _apply_defaults(sub["default"], sub)
        return out
    if isinstance(instance, list):
        items = schema.get("items") if isinstance(schema, dict) else None
        return [_apply_defaults(v, items) for v in instance]
    return copy.deepcopy(instance)


# ---------------------------------------------------------------------------------------
# check(): problems with the schema itself


def check(schema: object, measured: bool = False) -> list[str]:
    """Return the problems of a schema as `path: message` strings; empty means usable. `measured`: the schema
    is what `loads` returned, so it was held to the depth and number limits already (not measured again)."""
    return list(_problems(schema, measured))


class _Problems(list):
    """`path: message` problems, plus the subschemas compiled on the way to validate their
    defaults, which compile() hands to the validator so that nothing is compiled twice."""
    __slots__ = ("compiled",)

    def __init__(self):
        super().__init__()
        self.compiled: dict = {}


def _problems(schema: object, measured: bool = False) -> _Problems:
    out = _Problems()
    too_much = None if measured else hostile(schema)
    if too_much is not None:
        out.append(f"$: {too_much}")
    else:
        _check(schema, "$", out)
    return out


def _check(schema: object, path: str, out: _Problems) -> None:
    """Append the problems of one (sub)schema at `path`."""
    if schema is True or schema is False:
        return
    if not isinstance(schema, dict):
        out.append(f"{path}: must be a schema (object or boolean), got {kind(schema)}")
        return
    start = len(out)
    for key, value in schema.items():
        checker = _CHECKERS.get(key)
        if checker is None:
            out.append(f"{path}: unsupported keyword {_q(key)}")
        elif checker is _ck_string:      # the commonest keywords, told apart here (thousands of skills have them)
            if type(value) is not str:
                _ck_string(value, path, key, out)
        elif checker is not _ck_any:
            checker(value, path, key, out)
    if "minimum" in schema or "minLength" in schema or "minItems" in schema:
        for low, high in (("minimum", "maximum"), ("minLength", "maxLength"), ("minItems", "maxItems")):
            a = schema.get(low)
            if a is not None:
                b = schema.get(high)
                if _is_number(a) and _is_number(b) and a > b:
                    out.append(f"{path}: {low} {render(a)} is greater than {high} {render(b)}")
    if "default" in schema and len(out) == start and not _plainly_valid(schema, schema["default"]):
        _validator.node_of(schema, out.compiled)(schema["default"], path + ".default", "", out)


# The keywords _plainly_valid decides, and the Python types of the values it decides for each `type`.
_PLAIN_KEYWORDS = frozenset({"type", "enum", "minLength", "maxLength", "minimum", "maximum", "default",
                             "description", "title", "examples"})
_PLAIN_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "null": (type(None),)}


def _plainly_valid(schema: dict, value: object) -> bool:
    """Whether `value` (a default) passes a checked schema of one scalar `type` with at most an enum of strings,
    a length or bounds — decided without compiling the schema (thousands of skills each have some). False
    when not sure: then the compiled node decides, and words the errors."""
    expected = schema.get("type")
    if (type(expected) is not str or not schema.keys() <= _PLAIN_KEYWORDS
            or type(value) not in _PLAIN_TYPES.get(expected, ())):
        return False
    if type(value) is str:
        return ("minimum" not in schema and "maximum" not in schema
                and ("enum" not in schema or value in schema["enum"]) and schema.get("minLength", 0) <= len(value)
                and ("maxLength" not in schema or len(value) <= schema["maxLength"]))
    if "enum" in schema or "minLength" in schema or "maxLength" in schema:
        return False
    if type(value) is bool or value is None:
        return "minimum" not in schema and "maximum" not in schema
    return schema.get("minimum", value) <= value <= schema.get("maximum", value)


def _ck_type(value: object, path: str, key: str, out: list[str]) -> None:
    """type: a known name or a non-empty list of distinct known names."""
    if type(value) is str and value in TYPE_NAMES:     # the common case, decided at once
        return
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        out.append(f"{path}.type: must be a type name or a non-empty list of type names")
        return
    for n in names:
        if n not in TYPE_NAMES:
            out.append(f"{path}.type: unknown type {_q(n)} "
                       f"(expected one of {', '.join(TYPE_NAMES)})")
    if len(set(names)) != len(names):
        out.append(f"{path}.type: type names must not repeat")


def _ck_properties(value: object, path: str, key: str, out: list[str]) -> None:
    """properties: an object of schemas."""
    if not isinstance(value, dict):
        out.append(f"{path}.properties: must be an object mapping names to schemas, "
                   f"got {kind(value)}")
        return
    for name, sub in value.items():
        _check(sub, f"{path}.properties{segment(name)}", out)


def _ck_string_list(value: object, path: str, key: str, out: list[str]) -> None:
    """required: a list of distinct strings."""
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        out.append(f"{path}.{key}: must be a list of strings")
    elif len(set(value)) != len(value):
        out.append(f"{path}.{key}: names must not repeat")


def _ck_subschema(value: object, path: str, key: str, out: list[str]) -> None:
    """additionalProperties, items, not: a schema."""
    if isinstance(value, list):
        out.append(f"{path}.{key}: must be a schema (object or boolean), got array"
                   + (" (tuple-form items is not supported)" if key == "items" else ""))
        return
    _check(value, f"{path}.{key}", out)


def _ck_schema_list(value: object, path: str, key: str, out: list[str]) -> None:
    """anyOf, oneOf, allOf: a non-empty list of schemas."""
    if not isinstance(value, list) or not value:
        out.append(f"{path}.{key}: must be a non-empty list of schemas")
        return
    for i, sub in enumerate(value):
        _check(sub, f"{path}.{key}[{i}]", out)


def _ck_enum(value: object, path: str, key: str, out: list[str]) -> None:
    """enum: a non-empty list."""
    if not isinstance(value, list):
        out.append(f"{path}.enum: must be a list, got {kind(value)}")
    elif not value:
        out.append(f"{path}.enum: must not be empty")


def _ck_list(value: object, path: str, key: str, out: list[str]) -> None:
    """examples: a list."""
    if not isinstance(value, list):
        out.append(f"{path}.{key}: must be a list, got {kind(value)}")


def _ck_any(value: object, path: str, key: str, out: list[str]) -> None:
    """const and default take any value (default is checked against its schema later)."""


def _ck_string(value: object, path: str, key: str, out: list[str]) -> None:
    """description, title, format: a string."""
    if not isinstance(value, str):
        out.append(f"{path}.{key}: must be a string, got {kind(value)}")


def _ck_number(value: object, path: str, key: str, out: list[str]) -> None:
    """minimum, maximum and the exclusive bounds: a finite number."""
    if not _is_number(value):
        out.append(f"{path}.{key}: must be a number, got {kind(value)}")
    elif isinstance(value, float) and not math.isfinite(value):
        out.append(f"{path}.{key}: must be a finite number")


def _ck_positive(value: object, path: str, key: str, out: list[str]) -> None:
    """multipleOf: a number greater than 0."""
    if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)) or not value > 0:
        out.append(f"{path}.{key}: must be a number greater than 0")


def _ck_count(value: object, path: str, key: str, out: list[str]) -> None:
    """minLength, maxLength, minItems, maxItems: a non-negative integer."""
    if not (_is_number(value) and value >= 0
            and (isinstance(value, int) or value.is_integer())):
        out.append(f"{path}.{key}: must be a non-negative integer")


def _ck_bool(value: object, path: str, key: str, out: list[str]) -> None:
    """uniqueItems: a boolean."""
    if not isinstance(value, bool):
        out.append(f"{path}.{key}: must be a boolean, got {kind(value)}")



def _ck_pattern(value: object, path: str, key: str, out: list[str]) -> None:
    """pattern: a string that compiles as a Python regular expression and is safe to match."""
    if not isinstance(value, str):
        out.append(f"{path}.pattern: must be a string, got {kind(value)}")
        return
    problem = pattern_problem(value)
    if problem is not None:
        out.append(f"{path}.pattern: {problem}")


def _is_number(x: object) -> bool:
    """Return True for int and float values that are not booleans."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _q(name: object) -> str:
    """Quote a name for a message."""
    return f"'{name}'" if isinstance(name, str) else render(name)


_CHECKERS: dict[str, Callable[[object, str, str, list[str]], None]] = {
    "type": _ck_type,
    "properties": _ck_properties,
    "required": _ck_string_list,
    "additionalProperties": _ck_subschema,
    "enum": _ck_enum,
    "const": _ck_any,
    "default": _ck_any,
    "description": _ck_string,
    "title": _ck_string,
    "examples": _ck_list,
    "minimum": _ck_number,
    "maximum": _ck_number,
    "exclusiveMinimum": _ck_number,
    "exclusiveMaximum": _ck_number,
    "multipleOf": _ck_positive,
    "minLength": _ck_count,
    "maxLength": _ck_count,
    "pattern": _ck_pattern,
    "format": _ck_string,
    "items": _ck_subschema,
    "minItems": _ck_count,
    "maxItems": _ck_count,
    "uniqueItems": _ck_bool,
    "anyOf": _ck_schema_list,
    "oneOf": _ck_schema_list,
    "allOf": _ck_schema_list,
    "not": _ck_subschema,
}


# relax(): a schema from elsewhere (an MCP server's inputSchema) made fit for the subset

_META = frozenset({"$schema", "$id", "$comment", "$defs", "definitions", "$anchor"})   # no effect on validation
_SUBSCHEMA = frozenset({"additionalProperties", "items", "not"})
_SCHEMA_LIST = frozenset({"anyOf", "oneOf", "allOf"})
DROPPED_MAX = 20                   # `path: message` lines relax() keeps per schema; the rest are counted
PATTERN_CHARS_PER_NODE = 4         # a `pattern` costs a node per this many characters too (checking it is slow)


class _TooLarge(Exception):
    """The node budget ran out (or the expansion nested too deep) while inlining `$ref`s."""


def relax(schema: dict, nodes: list[int] | None = None) -> tuple[object, list[str]]:
    """`schema` with `$ref`s to its own `$defs`/`definitions` inlined (2020-12: a ref's siblings apply too), the
    meta keywords (`$schema`, `$id`, `$comment`, `$defs`) removed and every keyword outside the subset dropped;
    and a `path: message` line per dropped keyword or unresolvable ref. What is left is still to be check()ed.

    Bounded by size: the result may hold at most `nodes[0]` JSON values (SCHEMA_NODES_MAX when not given;
    `nodes` is decremented in place, so one budget can be shared by several schemas; a `pattern` costs
    its length / PATTERN_CHARS_PER_NODE more, as checking it costs that much more) and nest at most
    JSON_DEPTH_MAX deep. Past either, SchemaError, after work proportional to the budget, never to the
    expansion (30 definitions each naming the previous twice would expand to 2**30 copies)."""
    if hostile(schema) is not None:
        return schema, []                    # check() reports it; nothing here may recurse into it
    defs = {}
    for key in ("definitions", "$defs"):
        if isinstance(schema.get(key), dict):
            defs.update({f"#/{key}/{name}": sub for name, sub in schema[key].items()})
    dropped: list[str] = []
    budget = [SCHEMA_NODES_MAX] if nodes is None else nodes
    limit = budget[0]
    try:
        relaxed = _relax(schema, "$", defs, (), dropped, budget, 1)
    except _TooLarge as exc:
        why = exc.args[0] if exc.args else f"more than {limit} schema nodes after $ref expansion"
        raise SchemaError([f"$: {why}"]) from None
    if len(dropped) > DROPPED_MAX:
        dropped[DROPPED_MAX:] = [f"$: and {len(dropped) - DROPPED_MAX} more keywords or $refs left out"]
    return relaxed, dropped


def _spend(budget: list[int], count: int) -> None:
    budget[0] -= count
    if budget[0] < 0:
        raise _TooLarge()


def _values(value: object, budget: list[int]) -> None:
    """Spend one node per JSON value in `value` (an enum, a default …); stops as soon as the budget is gone."""
    stack = [value]
    while stack:
        item = stack.pop()
        _spend(budget, 1)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _relax(schema: object, path: str, defs: dict, refs: tuple, dropped: list[str], budget: list[int], depth: int) -> object:
    _spend(budget, 1)
    if not isinstance(schema, dict):
        return schema
    if depth > JSON_DEPTH_MAX:
        raise _TooLarge(f"nested deeper than {JSON_DEPTH_MAX} levels after $ref expansion")
    out: dict = {}
    for key, value in schema.items():
        where = f"{path}{segment(key)}"
        if key in _META:
            continue
        if key == "$ref":
            target = defs.get(value) if isinstance(value, str) else None
            if target is None or value in refs:
                _spend(budget, 1)
                dropped.append(f"{where}: {'recursive' if value in refs else 'unresolvable'} $ref {_q(value)}")
                continue
            _spend(budget, 1)                # the allOf list it lands in
            inlined = _relax(target, path, defs, (*refs, value), dropped, budget, depth + 2)
            out.setdefault("allOf", []).append(inlined)
        elif key == "properties" and isinstance(value, dict):
            _spend(budget, 1)
            out[key] = {name: _relax(sub, f"{where}{segment(name)}", defs, refs, dropped, budget, depth + 2)
                        for name, sub in value.items()}
        elif key == "items" and isinstance(value, list):
            _spend(budget, 1)
            dropped.append(f"{where}: tuple-form items (a list)")
        elif key in _SUBSCHEMA:
            out[key] = _relax(value, where, defs, refs, dropped, budget, depth + 1)
        elif key in _SCHEMA_LIST and isinstance(value, list):
            _spend(budget, 1)
            out.setdefault(key, []).extend(_relax(sub, f"{where}[{i}]", defs, refs, dropped, budget, depth + 2)
                                           for i, sub in enumerate(value))
        elif key not in _CHECKERS or (key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool)):
            _spend(budget, 1)
            dropped.append(f"{where}: unsupported keyword {_q(key)}")
        else:
            _values(value, budget)
            if key == "pattern" and isinstance(value, str):
                _spend(budget, len(value) // PATTERN_CHARS_PER_NODE)
            out[key] = value
    return out
