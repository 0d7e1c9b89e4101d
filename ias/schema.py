"""A JSON Schema subset validator for skill parameters (2020-12 semantics, stdlib only).

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
accepted unchecked. `pattern` is a Python regular expression applied with re.search.

Hostile input (limits in ias.limits): check() refuses schemas nested deeper than
JSON_DEPTH_MAX or holding integers of more than JSON_NUMBER_MAX digits before any
recursion; loads() checks JSON text for both before parsing. A validator refuses instances
nested deeper than JSON_DEPTH_MAX, without recursion; where the schema describes every
container it accepts ("closed", e.g. additionalProperties false and typed items) the check is
skipped, since such a schema rejects anything deeper than itself, and nothing recurses into
an instance except along the schema. A `pattern` is parsed with
Python's own regex parser and refused when a repeated group can match the same text in
more than one way (`(a+)+`, `(a|ab)*`); for the others the backtracking work is estimated
as a function of the input length, and strings longer than what the step budget allows
(at most PATTERN_INPUT_MAX) are refused before matching. The estimate is deliberately
conservative: `^[a-z]+(-[a-z]+)*$` is safe yet refused; write `^[a-z-]+$` plus a check.

Semantics worth knowing: booleans are not numbers; 1.0 is an integer; enum, const and
uniqueItems use JSON equality (1 == 1.0, True != 1); when a value has the wrong
`type`, the other keywords of that schema are not reported for it; anyOf/oneOf failures
give one summarizing error (or the errors of the only alternative whose type fits).

Defaults: apply_defaults() fills absent properties from `default`, following properties,
additionalProperties and items (not allOf/anyOf/oneOf/not); a filled-in default object
gets its own nested defaults too. check() validates every `default` against its schema.

Compilation and caching: compile(schema) checks the schema and turns it into nested
closures once, returning a function instance -> errors; hold it on hot paths. The closures
copy what they need, so later edits to the schema do not affect a compiled validator.
Compiling takes tens of microseconds; validating a typical call, one or two.
validate() keeps a cache of at most CACHE_MAX entries (cleared when full) keyed by
id(schema). Each entry holds a reference to the schema, so its id cannot be reused while
cached, plus a deep copy; the entry is used only while the schema still compares equal to
that copy, so in-place edits are picked up. Python's == treats 1, 1.0 and True alike, so
an edit that only swaps such values goes unnoticed: compile() again after such a change.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import re
from fractions import Fraction
from typing import Any, Callable

try:  # Python's own regex parser: re._parser since 3.11, sre_parse before
    from re import _constants as _sre, _parser as _sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from .limits import (JSON_DEPTH_MAX, JSON_NUMBER_MAX, PATTERN_INPUT_MAX, PATTERN_INPUT_MIN,
                     PATTERN_MAX, PATTERN_STEPS_MAX)

__all__ = ["SchemaError", "Validator", "apply_defaults", "check", "compile", "loads", "validate"]

TYPE_NAMES = ("string", "integer", "number", "boolean", "object", "array", "null")
CACHE_MAX = 1024

_KIND = {str: "string", int: "integer", float: "number", bool: "boolean",
         type(None): "null", dict: "object", list: "array"}
_MISSING = object()

# A node checks one value: node(value, path, seg, errors) appends "path: message" strings,
# where the value's path is path + seg (joined only when needed, mostly for messages).
Node = Callable[[Any, str, str, list], None]


class SchemaError(ValueError):
    """The schema itself is invalid; `problems` holds `path: message` lines."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid schema: " + "; ".join(problems))
        self.problems = problems


Validator = Callable[[Any], "list[str]"]


def compile(schema: Any) -> Validator:  # noqa: A001 - the documented public name
    """Check the schema and return validator(instance) -> errors; raise SchemaError if invalid."""
    problems = check(schema)
    if problems:
        raise SchemaError(problems)
    node = _guarded(schema, _compile(schema)[0])

    def validator(instance: Any) -> list[str]:
        """Return the instance's errors as `path: message` strings; empty means valid."""
        errors: list[str] = []
        node(instance, "$", "", errors)
        return errors
    return validator


# id(schema) -> (schema, deep copy of it, root node); see the module docstring.
_cache: dict[int, tuple[Any, Any, Node]] = {}


def validate(instance: Any, schema: Any) -> list[str]:
    """Return the instance's errors as `path: message` strings; empty means valid.

    Raises SchemaError when the schema itself is invalid (see check()).
    """
    errors: list[str] = []
    entry = _cache.get(id(schema))
    if entry is not None and entry[1] == schema:
        entry[2](instance, "$", "", errors)
        return errors
    problems = check(schema)
    if problems:
        raise SchemaError(problems)
    node = _guarded(schema, _compile(schema)[0])
    if len(_cache) >= CACHE_MAX:
        _cache.clear()
    _cache[id(schema)] = (schema, copy.deepcopy(schema), node)
    node(instance, "$", "", errors)
    return errors


def apply_defaults(instance: Any, schema: Any) -> Any:
    """Return a deep copy of instance with absent object properties filled from their defaults.

    An instance nested too deep is returned as is, for the validator to refuse.
    """
    if type(instance) not in _LEAF_TYPES and _too_deep(instance):
        return instance
    return _apply_defaults(instance, schema)


def _apply_defaults(instance: Any, schema: Any) -> Any:
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
# Hostile JSON: depth and number size, checked without recursion

_INT_LIMIT = 10 ** JSON_NUMBER_MAX
_DEPTH_MSG = f"nested deeper than {JSON_DEPTH_MAX} levels"
_NUMBER_MSG = f"number with more than {JSON_NUMBER_MAX} digits"


_LEAF_TYPES = frozenset({str, bool, float, int, type(None)})
_TEXT_TYPES = frozenset({str, bool, float, type(None)})
_SCALAR_NAMES = frozenset({"string", "integer", "number", "boolean", "null"})


def _guarded(schema: Any, node: Node) -> Node:
    """The root node plus the depth limit for instances, checked only where the schema leaves
    the depth open: a valid instance of a closed schema is no deeper than the schema."""
    if _closed(schema):
        return node
    names = _closed_but_extra(schema)

    def guarded(x, path, seg, errors):
        t = type(x)
        if t in _LEAF_TYPES or (names is not None and t is dict and x.keys() <= names) or not _too_deep(x):
            node(x, path, seg, errors)
        else:
            errors.append(f"{path}{seg}: {_DEPTH_MSG}")
    return guarded


def _closed(schema: Any) -> bool:
    """Whether every instance the (checked) schema accepts has all its containers described by it."""
    if schema is False:
        return True
    if not isinstance(schema, dict):
        return False
    if "enum" in schema or "const" in schema or any(map(_closed, schema.get("allOf", ()))):
        return True
    if any(key in schema and all(map(_closed, schema[key])) for key in ("anyOf", "oneOf")):
        return True
    if "type" not in schema:
        return False
    names = {schema["type"]} if isinstance(schema["type"], str) else set(schema["type"])
    if "object" in names and not (_closed(schema.get("additionalProperties", True))
                                  and all(map(_closed, schema.get("properties", {}).values()))):
        return False
    return "array" not in names or _closed(schema.get("items", True))


def _closed_but_extra(schema: Any) -> frozenset | None:
    """For an object schema closed but for additional properties, its property names."""
    if not isinstance(schema, dict) or schema.get("type") not in ("object", ["object"]):
        return None
    props = schema.get("properties", {})
    return frozenset(props) if all(map(_closed, props.values())) else None


def _too_deep(value: Any) -> bool:
    """Whether containers nest deeper than JSON_DEPTH_MAX (the validator's hot path: one
    comprehension per level). Numbers are not checked here: huge ints are harmless to
    validate, and JSON text is limited by loads()."""
    if not isinstance(value, (dict, list, tuple)):
        return False
    level = [value]
    for _ in range(JSON_DEPTH_MAX):
        below = [v for c in level for v in (c.values() if isinstance(c, dict) else c)
                 if type(v) not in _LEAF_TYPES]
        level = [v for v in below if isinstance(v, (dict, list, tuple))]
        if not level:
            return False
    return True


def _hostile(value: Any) -> str | None:
    """Why a value is too deep or holds too large a number to handle safely, or None."""
    t = type(value)
    if t is str or t is bool or t is float or value is None:
        return None
    if t is int or not isinstance(value, (dict, list)):
        return _NUMBER_MSG if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT else None
    # Breadth first, one level at a time: no recursion, no per-value bookkeeping.
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > JSON_DEPTH_MAX:
            return _DEPTH_MSG
        below = [v for c in level for v in (c.values() if isinstance(c, dict) else c)
                 if type(v) not in _TEXT_TYPES]
        for v in below:
            if isinstance(v, int) and not isinstance(v, bool) and not -_INT_LIMIT < v < _INT_LIMIT:
                return _NUMBER_MSG
        level = [v for v in below if isinstance(v, (dict, list))]
    return None


# A string (kept whole, so brackets inside it are skipped), a bracket, a number, or a
# constant json accepts but JSON does not have.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]|[\]}]|-?[0-9][-+.0-9eE]*|NaN|-?Infinity')


# What a number over the limits must contain (possibly inside a string: then the full scan in
# loads() decides): past JSON_NUMBER_MAX characters, either the integer or the fraction part has
# half of them in a row, or the exponent has 3 digits; and NaN and Infinity are no JSON.
_SUSPECT_NUMBER = re.compile(rf"[0-9](?:[0-9]{{{JSON_NUMBER_MAX // 2 - 3}}}|[eE][-+]?[0-9]{{3}})")


def _too_big_float(token: str) -> bool:
    """Whether a number literal overflows a float (json.loads would give inf)."""
    try:
        return math.isinf(float(token))
    except ValueError:  # not a number after all: json.loads reports it
        return False


def loads(text: str) -> Any:
    """json.loads with the depth and number limits checked first; raise json.JSONDecodeError.

    json.loads itself recurses per nesting level and parses any number of digits, so a
    hostile document would raise RecursionError or ValueError instead.
    """
    if (text.count("[") + text.count("{") <= JSON_DEPTH_MAX and "NaN" not in text and "Infinity" not in text
            and _SUSPECT_NUMBER.search(text) is None):
        return json.loads(text)          # cannot nest too deep, nor hold a number out of limits
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = text[m.start()]
        if c == '"':
            continue
        if c == "[" or c == "{":
            depth += 1
            if depth > JSON_DEPTH_MAX:
                raise json.JSONDecodeError(_DEPTH_MSG, text, m.start())
        elif c == "]" or c == "}":
            depth -= 1
        elif m.group() in ("NaN", "Infinity", "-Infinity"):
            raise json.JSONDecodeError(f"{m.group()} is not a JSON number", text, m.start())
        elif m.end() - m.start() > JSON_NUMBER_MAX:
            raise json.JSONDecodeError(_NUMBER_MSG, text, m.start())
        elif not m.group().lstrip("-").isdigit() and _too_big_float(m.group()):
            raise json.JSONDecodeError("number out of range", text, m.start())
    return json.loads(text)


# ---------------------------------------------------------------------------------------
# Helpers


def _kind(x: Any) -> str:
    """Return the JSON type name of a value (integral floats count as "number")."""
    k = _KIND.get(type(x))
    if k is not None:
        return k
    for cls, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                      (dict, "object"), (list, "array")):
        if isinstance(x, cls):
            return name
    return type(x).__name__


def _is_number(x: Any) -> bool:
    """Return True for int and float values that are not booleans."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _js(value: Any) -> str:
    """Render a value as compact-ish JSON for a message."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _num(x: Any) -> str:
    """Render a number (or None) for a message, as JSON would."""
    return "" if x is None else repr(x) if isinstance(x, int) else _js(x)


def _q(name: Any) -> str:
    """Quote a name for a message."""
    return f"'{name}'" if isinstance(name, str) else _js(name)


def _seg(name: Any) -> str:
    """Return the path segment for an object member."""
    if isinstance(name, str) and name.isidentifier():
        return "." + name
    return "[" + _js(name if isinstance(name, str) else str(name)) + "]"


def _canon(v: Any) -> Any:
    """Return a hashable key such that JSON-equal values get equal keys."""
    t = type(v)
    if t is str or t is int or t is float or v is None:
        return v
    if t is bool:
        return ("b", v)
    if t is list:
        return ("a", tuple(map(_canon, v)))
    if t is dict:
        return ("o", frozenset((k, _canon(x)) for k, x in v.items()))
    if isinstance(v, bool):
        return ("b", bool(v))
    if isinstance(v, (str, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return ("a", tuple(map(_canon, v)))
    if isinstance(v, dict):
        return ("o", frozenset((k, _canon(x)) for k, x in v.items()))
    return ("?", id(v))


def _canon_instance(v: Any) -> Any:
    """_canon() of an instance value, which may be nested too deep to recurse into."""
    if type(v) in _LEAF_TYPES or not _too_deep(v):
        return _canon(v)
    return ("deep", id(v))       # equal to nothing a schema holds


def _plural(n: int, word: str) -> str:
    """Return '1 item' / '2 items'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# ---------------------------------------------------------------------------------------
# Formats

# Field ranges are in the expressions; only day-of-month and leap seconds need code.
_DATE = r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_TIME = (r"([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]|60)(?:\.[0-9]+)?"
         r"(?:[Zz]|([+-])([01][0-9]|2[0-3]):([0-5][0-9]))")
_DATE_RE = re.compile(_DATE)
_TIME_RE = re.compile(_TIME)
_DATE_TIME_RE = re.compile(_DATE + "[Tt]" + _TIME)
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s.]+(?:\.[^@\s.]+)+")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
_IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:\S*")


def _day_ok(s: str) -> bool:
    """Given a string starting YYYY-MM-DD that matched _DATE, is that day in its month?"""
    day = s[8:10]
    if day <= "28":
        return True
    month = s[5:7]
    if month == "02":
        y = int(s[:4])
        return day == "29" and y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)
    return day != "31" or month in ("01", "03", "05", "07", "08", "10", "12")


def _second_ok(hour: str, minute: str, second: str, sign: str | None,
               off_h: str | None, off_m: str | None) -> bool:
    """Allow second 60 only when the time is 23:59 in UTC (a leap second)."""
    if second != "60":
        return True
    offset = (int(off_h) * 60 + int(off_m)) * (-1 if sign == "-" else 1) if sign else 0
    return (int(hour) * 60 + int(minute) - offset) % 1440 == 23 * 60 + 59


# The expressions fix the field widths, so fields can be sliced at known positions.
def _is_date(s: str) -> bool:
    """RFC 3339 full-date on a real calendar day."""
    return _DATE_RE.fullmatch(s) is not None and _day_ok(s)


def _is_time(s: str) -> bool:
    """RFC 3339 full-time: HH:MM:SS[.frac] plus a required Z or ±HH:MM offset."""
    m = _TIME_RE.fullmatch(s)
    return m is not None and (s[6:8] != "60" or _second_ok(*m.groups()))


def _is_date_time(s: str) -> bool:
    """RFC 3339 date-time with a T or t separator."""
    m = _DATE_TIME_RE.fullmatch(s)
    return (m is not None and _day_ok(s)
            and (s[17:19] != "60" or _second_ok(*m.groups()[3:])))


# A test returns something truthy for a valid string.
_FORMATS: dict[str, tuple[Callable[[str], Any], str]] = {
    "date": (_is_date, "date (YYYY-MM-DD)"),
    "time": (_is_time, "time (HH:MM:SS with a Z or ±HH:MM offset)"),
    "date-time": (_is_date_time, "date-time (YYYY-MM-DDTHH:MM:SS with a Z or ±HH:MM offset)"),
    "email": (_EMAIL_RE.fullmatch, "email address"),
    "ipv4": (_IPV4_RE.fullmatch, "IPv4 address"),
    "uri": (_URI_RE.fullmatch, "URI (with a scheme such as https:)"),
}


# ---------------------------------------------------------------------------------------
# Compilation: each schema becomes one closure ("node") plus its type constraint. The
# keywords of one JSON type are checked inline in a single closure, because Python's call
# overhead, not the checks themselves, dominates validation time.

class _Meta:
    """A compiled schema with what anyOf/oneOf and parents need to know about it."""
    # kinds: JSON types accepted (None = any); leaf: when the node checks nothing but the
    # type, the Python types that pass without calling it.
    __slots__ = ("node", "kinds", "int_floats", "leaf")

    def __init__(self, node: Node, kinds: frozenset | None, int_floats: bool,
                 leaf: frozenset | None = None):
        self.node, self.kinds, self.int_floats, self.leaf = node, kinds, int_floats, leaf

    def type_fits(self, x: Any) -> bool:
        """Return True when x passes this schema's `type` keyword."""
        if self.kinds is None:
            return True
        k = _kind(x)
        return k in self.kinds or (self.int_floats and k == "number" and x.is_integer())


def _accept(x: Any, path: str, seg: str, errors: list) -> None:
    """The `true` schema."""


def _reject(x: Any, path: str, seg: str, errors: list) -> None:
    """The `false` schema."""
    errors.append(f"{path}{seg}: not allowed")


_NONE: frozenset = frozenset()
_TRUE = _Meta(_accept, None, False)
_FALSE = _Meta(_reject, frozenset(), False)
_ANNOTATIONS = frozenset({"default", "description", "title", "examples"})
# Keywords are grouped by the family of types they apply to; integers are numbers.
_FAMILY = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
           "null": "null", "object": "object", "array": "array"}
_TYPE_FAMILY = {str: "string", int: "number", float: "number", bool: "boolean",
                type(None): "null", dict: "object", list: "array"}
_PY_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
             "null": (type(None),), "object": (dict,), "array": (list,)}
_FAMILY_KEYWORDS = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                         "multipleOf"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems", "uniqueItems"}),
}


def _family(x: Any) -> str | None:
    """Return the keyword family of a value, or None for non-JSON values."""
    return _TYPE_FAMILY.get(type(x)) or _FAMILY.get(_kind(x))


def _compile(schema: Any) -> tuple[Node, _Meta]:
    """Compile a schema that check() accepted; return (node, meta)."""
    meta = _compile_meta(schema)
    return meta.node, meta


def _compile_meta(schema: Any) -> _Meta:
    """Compile a schema that check() accepted into a _Meta."""
    if schema is True or (isinstance(schema, dict) and not (schema.keys() - _ANNOTATIONS)):
        return _TRUE
    if schema is False:
        return _FALSE
    families: set[str] = set()
    if "type" in schema:
        names = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
        families = {_FAMILY[n] for n in names}
    # A string or number node checks enum and const itself, saving a call per value.
    inline_values = len(families) == 1 and not families.isdisjoint(("string", "number"))
    generic: list[Node] = []
    if "enum" in schema and not inline_values:
        generic.append(_mk_enum(schema["enum"]))
    if "const" in schema and not inline_values:
        generic.append(_mk_const(schema["const"]))
    for sub in schema.get("allOf", ()):
        sub_meta = _compile_meta(sub)
        if sub_meta is not _TRUE:
            generic.append(sub_meta.node)
    if "anyOf" in schema:
        generic.append(_mk_any_of([_compile_meta(s) for s in schema["anyOf"]]))
    if "oneOf" in schema:
        generic.append(_mk_one_of([_compile_meta(s) for s in schema["oneOf"]]))
    if "not" in schema:
        generic.append(_mk_not(_compile_meta(schema["not"]).node))
    tail = tuple(generic)
    keys = schema.keys()
    if "type" not in schema:
        return _Meta(_mk_untyped(_parts(schema), tail), None, False)

    int_floats = "integer" in names and "number" not in names
    kinds = frozenset(names) | ({"integer"} if "number" in names else frozenset())
    expected = " or ".join(names)
    fast = frozenset(t for k in kinds for t in _PY_TYPES[k])

    def type_ok(x, path, seg, errors):
        """Slow path for subclasses and integral floats: report and return False on a mismatch."""
        k = _KIND.get(type(x)) or _kind(x)
        if k in kinds or (int_floats and k == "number" and x.is_integer()):
            return True
        errors.append(f"{path}{seg}: expected {expected}, got {k}")
        return False

    if len(families) == 1:
        (family,) = families
        own = _FAMILY_KEYWORDS.get(family)
        if (own is not None and not own.isdisjoint(keys)) or (
                inline_values and ("enum" in keys or "const" in keys)):
            # The family's node checks the type itself: one call per value.
            node = _BUILDERS[family](schema, fast, type_ok, tail, inline_values)
        elif not tail:
            return _Meta(_mk_typed(fast, type_ok, tail), kinds, int_floats, fast)
        else:
            node = _mk_typed(fast, type_ok, tail)
    else:
        node = _mk_dispatch(_parts(schema), fast, type_ok, tail)
    return _Meta(node, kinds, int_floats)


def _parts(schema: dict) -> dict[str, Node]:
    """Return a node per type family the schema has keywords for, without type checks."""
    keys = schema.keys()
    return {family: build(schema, None, None, (), False) for family, build in _BUILDERS.items()
            if not _FAMILY_KEYWORDS[family].isdisjoint(keys)}


def _mk_untyped(parts: dict[str, Node], tail: tuple[Node, ...]) -> Node:
    """Node for a schema without `type`: type-specific keywords apply to their own types only."""
    if not parts:
        if len(tail) == 1:
            return tail[0]

        def node(x, path, seg, errors):
            for c in tail:
                c(x, path, seg, errors)
        return node
    get = parts.get

    def node(x, path, seg, errors):
        fn = get(_TYPE_FAMILY.get(type(x)) or _family(x))
        if fn is not None:
            fn(x, path, seg, errors)
        for c in tail:
            c(x, path, seg, errors)
    return node


def _mk_typed(fast: frozenset, type_ok: Callable, tail: tuple[Node, ...]) -> Node:
    """Node for a typed schema with no type-specific keywords."""
    if not tail:
        def node(x, path, seg, errors):
            if type(x) not in fast:
                type_ok(x, path, seg, errors)
        return node

    def node(x, path, seg, errors):
        if type(x) in fast or type_ok(x, path, seg, errors):
            for c in tail:
                c(x, path, seg, errors)
    return node


def _mk_dispatch(parts: dict[str, Node], fast: frozenset, type_ok: Callable,
                 tail: tuple[Node, ...]) -> Node:
    """Node for a schema allowing several types (e.g. ["string", "null"])."""
    get = parts.get

    def node(x, path, seg, errors):
        if type(x) in fast or type_ok(x, path, seg, errors):
            fn = get(_TYPE_FAMILY.get(type(x)) or _family(x))
            if fn is not None:
                fn(x, path, seg, errors)
            for c in tail:
                c(x, path, seg, errors)
    return node


# Each builder returns a node for values of its family. With `fast` (the accepted Python
# types) it checks the type itself; without, the caller has dispatched on the type already.

def _mk_string(schema: dict, fast: frozenset | None, type_ok: Callable | None,
               tail: tuple[Node, ...], values: bool) -> Node:
    """String keywords, plus enum/const when `values`."""
    get = schema.get
    allowed, enum_msg, want, const_msg = _values(schema, values)
    valued = allowed is not None or want is not _MISSING
    lo = int(get("minLength", 0))
    hi = math.inf if get("maxLength") is None else int(get("maxLength"))
    sized = lo > 0 or hi != math.inf
    pattern = get("pattern")
    search = None if pattern is None else re.compile(pattern).search
    # check() refused patterns it cannot bound; longer strings are refused before matching.
    pattern_max = PATTERN_INPUT_MAX if pattern is None else pattern_input_max(pattern)
    too_long_msg = f"must be at most {_plural(pattern_max, 'character')} long to be matched against pattern '{pattern}'"
    test, label = _FORMATS.get(get("format"), (None, ""))
    matched = search is not None or test is not None
    lo_msg = f"must be at least {_plural(lo, 'character')} long"
    hi_msg = f"must be at most {_plural(hi, 'character')} long" if hi != math.inf else ""
    pattern_msg = f"must match pattern '{pattern}'"
    format_msg = f"must be a valid {label}"
    guard = fast is not None

    # Keywords are grouped behind one flag each: absent groups cost a single test.
    def string_node(x, path, seg, errors):
        if guard and type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        if sized and not lo <= len(x) <= hi:
            errors.append(f"{path}{seg}: {lo_msg if len(x) < lo else hi_msg}")
        if matched:
            if search is not None:
                if len(x) > pattern_max:
                    errors.append(f"{path}{seg}: {too_long_msg}")
                elif search(x) is None:
                    errors.append(f"{path}{seg}: {pattern_msg}")
            if test is not None and not test(x):
                errors.append(f"{path}{seg}: {format_msg}")
        if valued:
            # A str is its own canonical form (see _canon).
            if allowed is not None and x not in allowed:
                errors.append(f"{path}{seg}: {enum_msg}")
            if want is not _MISSING and x != want:
                errors.append(f"{path}{seg}: {const_msg}")
        if tail:
            for c in tail:
                c(x, path, seg, errors)
    return string_node


def _mk_number(schema: dict, fast: frozenset | None, type_ok: Callable | None,
               tail: tuple[Node, ...], values: bool) -> Node:
    """Number keywords, plus enum/const when `values`."""
    get = schema.get
    allowed, enum_msg, want, const_msg = _values(schema, values)
    valued = allowed is not None or want is not _MISSING
    minimum, maximum = get("minimum"), get("maximum")
    lo = -math.inf if minimum is None else minimum
    hi = math.inf if maximum is None else maximum
    bounded = minimum is not None or maximum is not None
    ex_min, ex_max = get("exclusiveMinimum"), get("exclusiveMaximum")
    exclusive = ex_min is not None or ex_max is not None
    divisor = get("multipleOf")
    exact = None if divisor is None else _fraction(divisor)
    int_divisor = isinstance(divisor, int)
    min_msg, max_msg = f"must be >= {_num(minimum)}", f"must be <= {_num(maximum)}"
    ex_min_msg, ex_max_msg = f"must be > {_num(ex_min)}", f"must be < {_num(ex_max)}"
    divisor_msg = f"must be a multiple of {_num(divisor)}"
    guard = fast is not None

    def number_node(x, path, seg, errors):
        if guard and type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        if bounded and not lo <= x <= hi:
            errors.append(f"{path}{seg}: {min_msg if x < lo else max_msg}")
        if exclusive:
            if ex_min is not None and x <= ex_min:
                errors.append(f"{path}{seg}: {ex_min_msg}")
            if ex_max is not None and x >= ex_max:
                errors.append(f"{path}{seg}: {ex_max_msg}")
        if divisor is not None:
            if int_divisor and type(x) is int:
                ok = x % divisor == 0
            else:
                try:
                    ok = (_fraction(x) / exact).denominator == 1
                except (ValueError, OverflowError):  # inf, nan
                    ok = False
            if not ok:
                errors.append(f"{path}{seg}: {divisor_msg}")
        if valued:
            # An int or float is its own canonical form (see _canon).
            if allowed is not None and x not in allowed:
                errors.append(f"{path}{seg}: {enum_msg}")
            if want is not _MISSING and x != want:
                errors.append(f"{path}{seg}: {const_msg}")
        if tail:
            for c in tail:
                c(x, path, seg, errors)
    return number_node


def _fraction(x: int | float) -> Fraction:
    """Exact value of a number as written: repr(0.1) is '0.1', so this gives 1/10."""
    return Fraction(x) if isinstance(x, int) else Fraction(repr(float(x)))


def _mk_object(schema: dict, fast: frozenset | None, type_ok: Callable | None,
               tail: tuple[Node, ...], values: bool) -> Node:
    """properties, required and additionalProperties."""
    get = schema.get
    required = tuple(get("required", ()))
    # name -> (path segment, node, Python types that pass without calling the node)
    members: dict[str, tuple[str, Node, frozenset] | None] = {}
    for name, sub in (get("properties") or {}).items():
        meta = _compile_meta(sub)
        members[name] = None if meta is _TRUE else (_seg(name), meta.node, meta.leaf or _NONE)
    extra = get("additionalProperties", True)
    extra_node = None if extra is True or extra is False else _compile_meta(extra).node
    if extra_node is _accept:
        extra, extra_node = True, None
    forbid_extra = extra is False
    scan = forbid_extra or extra_node is not None or any(members.values())
    member = members.get
    guard = fast is not None
    required_set = frozenset(required)

    def object_node(x, path, seg, errors):
        if guard and type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        if required and not x.keys() >= required_set:
            for name in required:
                if name not in x:
                    errors.append(f"{path}{seg}: missing required property '{name}'")
        if scan:
            here = path + seg
            for k, v in x.items():
                p = member(k, _MISSING)
                if p is _MISSING:
                    if forbid_extra:
                        errors.append(f"{here}{_seg(k)}: additional property not allowed")
                    elif extra_node is not None:
                        extra_node(v, here, _seg(k), errors)
                elif p is not None and type(v) not in p[2]:
                    p[1](v, here, p[0], errors)
        if tail:
            for c in tail:
                c(x, path, seg, errors)
    return object_node


def _mk_array(schema: dict, fast: frozenset | None, type_ok: Callable | None,
              tail: tuple[Node, ...], values: bool) -> Node:
    """items, minItems, maxItems and uniqueItems."""
    get = schema.get
    lo = int(get("minItems", 0)) or None
    hi = None if get("maxItems") is None else int(get("maxItems"))
    unique = get("uniqueItems") is True
    item_meta = _compile_meta(get("items", True))
    item = None if item_meta is _TRUE else item_meta.node
    leaf = item_meta.leaf
    lo_msg = f"must contain at least {_plural(lo or 0, 'item')}"
    hi_msg = f"must contain at most {_plural(hi or 0, 'item')}"
    guard = fast is not None

    def array_node(x, path, seg, errors):
        if guard and type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        if lo is not None and len(x) < lo:
            errors.append(f"{path}{seg}: {lo_msg}")
        if hi is not None and len(x) > hi:
            errors.append(f"{path}{seg}: {hi_msg}")
        if unique:
            seen: dict = {}
            for i, v in enumerate(x):
                j = seen.setdefault(_canon_instance(v), i)
                if j != i:
                    errors.append(f"{path}{seg}: items must be unique ([{j}] and [{i}] are equal)")
                    break
        if item is not None:
            here = path + seg
            if leaf is not None:
                for i, v in enumerate(x):
                    if type(v) not in leaf:
                        item(v, here, f"[{i}]", errors)
            elif len(x) <= len(_INDEX):
                for v, index in zip(x, _INDEX):
                    item(v, here, index, errors)
            else:
                for i, v in enumerate(x):
                    item(v, here, f"[{i}]", errors)
        if tail:
            for c in tail:
                c(x, path, seg, errors)
    return array_node


def _values(schema: dict, inline: bool) -> tuple[frozenset | None, str, Any, str]:
    """Return (allowed, message, wanted, message) for enum and const checked inline."""
    allowed, want, enum_msg, const_msg = None, _MISSING, "", ""
    if inline and "enum" in schema:
        allowed = frozenset(map(_canon, schema["enum"]))
        enum_msg = f"must be one of {_js(schema['enum'])}"
    if inline and "const" in schema:
        want = _canon(schema["const"])
        const_msg = f"must be equal to {_js(schema['const'])}"
    return allowed, enum_msg, want, const_msg


_INDEX = tuple(f"[{i}]" for i in range(64))
_BUILDERS = {"string": _mk_string, "number": _mk_number, "object": _mk_object,
             "array": _mk_array}


def _mk_enum(values: list) -> Node:
    """enum, for any type (JSON equality via _canon)."""
    allowed = frozenset(map(_canon, values))
    message = f"must be one of {_js(values)}"

    def check_enum(x, path, seg, errors):
        t = type(x)
        # Strings and numbers are their own canonical form; skip the call for them.
        if (x if t is str or t is int or t is float else _canon_instance(x)) not in allowed:
            errors.append(f"{path}{seg}: {message}")
    return check_enum


def _mk_const(value: Any) -> Node:
    """const, for any type (JSON equality via _canon)."""
    want = _canon(value)
    message = f"must be equal to {_js(value)}"

    def check_const(x, path, seg, errors):
        if _canon_instance(x) != want:
            errors.append(f"{path}{seg}: {message}")
    return check_const


def _no_match(metas: list[_Meta], failures: list[list[str]], x: Any, path: str, seg: str,
              keyword: str, errors: list) -> None:
    """Report that no alternative of anyOf/oneOf matched, as helpfully as one line allows."""
    fitting = [i for i, m in enumerate(metas) if m.type_fits(x)]
    if len(fitting) == 1:
        errors.extend(failures[fitting[0]])
    elif not fitting and all(m.kinds is not None for m in metas):
        names: list[str] = []
        for m in metas:
            for n in TYPE_NAMES:
                if n in m.kinds and n not in names and not (n == "integer" and "number" in m.kinds):
                    names.append(n)
        # Only `false` alternatives: no type would do.
        errors.append(f"{path}{seg}: expected {' or '.join(names)}, got {_kind(x)}" if names
                      else f"{path}{seg}: not allowed")
    else:
        errors.append(f"{path}{seg}: does not match any of the {keyword} alternatives")


def _mk_any_of(metas: list[_Meta]) -> Node:
    """anyOf: stop at the first alternative that matches."""
    nodes = [m.node for m in metas]

    def check_any_of(x, path, seg, errors):
        failures = []
        for node in nodes:
            errs: list[str] = []
            node(x, path, seg, errs)
            if not errs:
                return
            failures.append(errs)
        _no_match(metas, failures, x, path, seg, "anyOf", errors)
    return check_any_of


def _mk_one_of(metas: list[_Meta]) -> Node:
    """oneOf: exactly one alternative must match."""
    nodes = [m.node for m in metas]

    def check_one_of(x, path, seg, errors):
        failures = []
        matched = []
        for i, node in enumerate(nodes):
            errs: list[str] = []
            node(x, path, seg, errs)
            failures.append(errs)
            if not errs:
                matched.append(i)
        if not matched:
            _no_match(metas, failures, x, path, seg, "oneOf", errors)
        elif len(matched) > 1:
            which = ", ".join(str(i) for i in matched)
            errors.append(f"{path}{seg}: must match exactly one of the oneOf alternatives, "
                          f"but matches {len(matched)} ({which})")
    return check_one_of


def _mk_not(inner: Node) -> Node:
    """not: the inner schema must fail."""
    def check_not(x, path, seg, errors):
        errs: list[str] = []
        inner(x, path, seg, errs)
        if not errs:
            errors.append(f"{path}{seg}: must not match the 'not' schema")
    return check_not


# ---------------------------------------------------------------------------------------
# check(): problems with the schema itself


def check(schema: Any) -> list[str]:
    """Return the problems of a schema as `path: message` strings; empty means usable."""
    hostile = _hostile(schema)
    if hostile is not None:
        return [f"$: {hostile}"]
    problems: list[str] = []
    _check(schema, "$", problems)
    return problems


def _check(schema: Any, path: str, out: list[str]) -> None:
    """Append the problems of one (sub)schema at `path`."""
    if schema is True or schema is False:
        return
    if not isinstance(schema, dict):
        out.append(f"{path}: must be a schema (object or boolean), got {_kind(schema)}")
        return
    start = len(out)
    for key, value in schema.items():
        checker = _CHECKERS.get(key)
        if checker is None:
            out.append(f"{path}: unsupported keyword {_q(key)}")
        else:
            checker(value, path, key, out)
    for low, high in (("minimum", "maximum"), ("minLength", "maxLength"),
                      ("minItems", "maxItems")):
        a = schema.get(low)
        if a is not None:
            b = schema.get(high)
            if _is_number(a) and _is_number(b) and a > b:
                out.append(f"{path}: {low} {_js(a)} is greater than {high} {_js(b)}")
    if "default" in schema and len(out) == start:
        _compile(schema)[0](schema["default"], path + ".default", "", out)


def _ck_type(value: Any, path: str, key: str, out: list[str]) -> None:
    """type: a known name or a non-empty list of distinct known names."""
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


def _ck_properties(value: Any, path: str, key: str, out: list[str]) -> None:
    """properties: an object of schemas."""
    if not isinstance(value, dict):
        out.append(f"{path}.properties: must be an object mapping names to schemas, "
                   f"got {_kind(value)}")
        return
    for name, sub in value.items():
        _check(sub, f"{path}.properties{_seg(name)}", out)


def _ck_string_list(value: Any, path: str, key: str, out: list[str]) -> None:
    """required: a list of distinct strings."""
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        out.append(f"{path}.{key}: must be a list of strings")
    elif len(set(value)) != len(value):
        out.append(f"{path}.{key}: names must not repeat")


def _ck_subschema(value: Any, path: str, key: str, out: list[str]) -> None:
    """additionalProperties, items, not: a schema."""
    if isinstance(value, list):
        out.append(f"{path}.{key}: must be a schema (object or boolean), got array"
                   + (" (tuple-form items is not supported)" if key == "items" else ""))
        return
    _check(value, f"{path}.{key}", out)


def _ck_schema_list(value: Any, path: str, key: str, out: list[str]) -> None:
    """anyOf, oneOf, allOf: a non-empty list of schemas."""
    if not isinstance(value, list) or not value:
        out.append(f"{path}.{key}: must be a non-empty list of schemas")
        return
    for i, sub in enumerate(value):
        _check(sub, f"{path}.{key}[{i}]", out)


def _ck_enum(value: Any, path: str, key: str, out: list[str]) -> None:
    """enum: a non-empty list."""
    if not isinstance(value, list):
        out.append(f"{path}.enum: must be a list, got {_kind(value)}")
    elif not value:
        out.append(f"{path}.enum: must not be empty")


def _ck_list(value: Any, path: str, key: str, out: list[str]) -> None:
    """examples: a list."""
    if not isinstance(value, list):
        out.append(f"{path}.{key}: must be a list, got {_kind(value)}")


def _ck_any(value: Any, path: str, key: str, out: list[str]) -> None:
    """const and default take any value (default is checked against its schema later)."""


def _ck_string(value: Any, path: str, key: str, out: list[str]) -> None:
    """description, title, format: a string."""
    if not isinstance(value, str):
        out.append(f"{path}.{key}: must be a string, got {_kind(value)}")


def _ck_number(value: Any, path: str, key: str, out: list[str]) -> None:
    """minimum, maximum and the exclusive bounds: a finite number."""
    if not _is_number(value):
        out.append(f"{path}.{key}: must be a number, got {_kind(value)}")
    elif isinstance(value, float) and not math.isfinite(value):
        out.append(f"{path}.{key}: must be a finite number")


def _ck_positive(value: Any, path: str, key: str, out: list[str]) -> None:
    """multipleOf: a number greater than 0."""
    if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)) or not value > 0:
        out.append(f"{path}.{key}: must be a number greater than 0")


def _ck_count(value: Any, path: str, key: str, out: list[str]) -> None:
    """minLength, maxLength, minItems, maxItems: a non-negative integer."""
    if not (_is_number(value) and value >= 0
            and (isinstance(value, int) or value.is_integer())):
        out.append(f"{path}.{key}: must be a non-negative integer")


def _ck_bool(value: Any, path: str, key: str, out: list[str]) -> None:
    """uniqueItems: a boolean."""
    if not isinstance(value, bool):
        out.append(f"{path}.{key}: must be a boolean, got {_kind(value)}")


def _ck_pattern(value: Any, path: str, key: str, out: list[str]) -> None:
    """pattern: a string that compiles as a Python regular expression."""
    if not isinstance(value, str):
        out.append(f"{path}.pattern: must be a string, got {_kind(value)}")
        return
    if len(value) > PATTERN_MAX:
        out.append(f"{path}.pattern: longer than {PATTERN_MAX} characters")
        return
    try:
        re.compile(value)
    except re.error as exc:
        out.append(f"{path}.pattern: invalid regular expression: {exc}")
        return
    except (RecursionError, OverflowError, MemoryError, ValueError):
        out.append(f"{path}.pattern: regular expression too complex")
        return
    problem = pattern_input_max(value)
    if isinstance(problem, str):
        out.append(f"{path}.pattern: {problem}")


# ---------------------------------------------------------------------------------------
# Pattern cost: how long a string a pattern may be matched against within the step budget


class _Ambiguous(Exception):
    """A repeated part of a pattern can match the same text in more than one way."""


_INF = math.inf
_ZERO_WIDTH = frozenset({_sre.AT, _sre.ASSERT, _sre.ASSERT_NOT})
_REPEATS = frozenset(op for op in (getattr(_sre, "MAX_REPEAT"), getattr(_sre, "MIN_REPEAT"),
                                   getattr(_sre, "POSSESSIVE_REPEAT", None)) if op is not None)
_ATOMIC = getattr(_sre, "ATOMIC_GROUP", None)
_IGNORECASE = _sre.SRE_FLAG_IGNORECASE
_MULTILINE = _sre.SRE_FLAG_MULTILINE
_MODE_FLAGS = _IGNORECASE | _MULTILINE      # the flags the cost estimate depends on
_PATTERN_CACHE: dict[str, int | str] = {}


def pattern_input_max(pattern: str) -> int | str:
    """The longest string `pattern` may be searched in within PATTERN_STEPS_MAX, or why it is refused.

    The pattern must compile. Cached: skills share patterns, and loading must stay cheap.
    """
    found = _PATTERN_CACHE.get(pattern)
    if found is None:
        try:
            found = _input_max(pattern)
        except _Ambiguous:
            found = ("prone to catastrophic backtracking: a repeated part can match the same text "
                     "in more than one way (nested quantifiers like (a+)+, overlapping alternatives "
                     "like (a|ab)*)")
        except (RecursionError, OverflowError, MemoryError, ValueError, re.error):
            found = "regular expression too complex"
        if len(_PATTERN_CACHE) >= CACHE_MAX:
            _PATTERN_CACHE.clear()
        _PATTERN_CACHE[pattern] = found
    return found


def _input_max(pattern: str) -> int | str:
    parsed = _sre_parse.parse(pattern)
    flags = parsed.state.flags
    mode = flags & _MODE_FLAGS
    first = parsed.data[0] if parsed.data else None
    anchored = (first is not None and first[0] is _sre.AT and not flags & _sre.SRE_FLAG_MULTILINE
                and first[1] in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING))

    # The ways are bounded by c * n**k for input length n (computed once); each way is tried
    # with a scan of up to the match's width, and re.search tries each start position unless
    # the pattern is anchored. After the whole pattern nothing can fail: no character follows.
    c, k = _ways(parsed.data, mode, _NOTHING)
    width = parsed.getwidth()[1]

    def steps(n: int) -> float:
        try:
            return c * float(n) ** k * min(width + 1, n + 1) * (1 if anchored else n + 1)
        except OverflowError:
            return _INF

    if steps(PATTERN_INPUT_MAX) <= PATTERN_STEPS_MAX:
        return PATTERN_INPUT_MAX
    if steps(PATTERN_INPUT_MIN) > PATTERN_STEPS_MAX:
        return (f"too slow to match: its backtracking grows too fast with the input length "
                f"(fewer than {PATTERN_INPUT_MIN} characters could be checked in time)")
    lo, hi = PATTERN_INPUT_MIN, PATTERN_INPUT_MAX      # steps(lo) fits, steps(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if steps(mid) <= PATTERN_STEPS_MAX else (lo, mid)
    return lo


# Ways are (c, k): at most c * n**k ways for an input of n characters (n >= 1).
_ONE = (1.0, 0)


def _times(a: tuple, b: tuple) -> tuple:
    return a[0] * b[0], a[1] + b[1]


def _count(choices: int) -> tuple:
    """Ways for a choice among `choices` counts, at most one per input position."""
    return (float(choices), 0) if choices <= PATTERN_INPUT_MAX else (1.0, 1)


def _ways(items, mode: int, follow: "_Chars | None" = None) -> tuple:
    """An upper bound (c, k) on the ways a sequence can match at one position of an n-character
    string: c * n**k. `follow` is what can come right after the sequence (None = anything)."""
    total = _ONE
    for i, (op, av) in enumerate(items):
        if op is _sre.SUBPATTERN or op is _ATOMIC or op is _sre.BRANCH or op in _REPEATS:
            after = _follow(items[i + 1:], mode, follow)
        if op is _sre.SUBPATTERN:
            w = _ways(av[-1], mode | (av[1] & _MODE_FLAGS), after)
        elif op is _ATOMIC:
            w = _ways(av, mode, after)
        elif op is _sre.ASSERT or op is _sre.ASSERT_NOT:
            # Zero width, so the pattern's width does not count its scan: count it here.
            w = _times(_ways(av[1].data, mode), _count(av[1].getwidth()[1] + 1))
        elif op is _sre.BRANCH:
            alternatives = av[1]
            ws = [_ways(b, mode, after) for b in alternatives]
            firsts = [_first(b, mode) for b in alternatives]
            # Alternatives that start with distinct characters: at most one can go on.
            if _disjoint(firsts):
                w = (max(c for c, _ in ws), max(k for _, k in ws))
            else:
                w = (sum(c for c, _ in ws), max(k for _, k in ws))
        elif op is _sre.GROUPREF_EXISTS:
            yes, no = _ways(av[1], mode), _ways(av[2], mode) if av[2] else _ONE
            w = (yes[0] + no[0], max(yes[1], no[1]))
        elif op in _REPEATS:
            w = _repeat_ways(av, mode, after)
        else:
            w = _ONE
        total = _times(total, w)
    return total


def _repeat_ways(av, mode: int, after: "_Chars | None") -> tuple:
    """Ways for a repeat {low,high} of body; raise _Ambiguous when iterations can split text several ways."""
    low, high, body = av
    if low != high and body.getwidth() == (1, 1) and _ways(body.data, mode) == _ONE:
        chars = _first(body.data, mode)[0]
        if after == _NOTHING or (chars is not None and after is not None and _chars_disjoint(chars, after)):
            return _ONE       # a run of single characters that what follows cannot start: one way
        if after == _AT_END:
            return (2.0, 0)   # `$` holds at the end or before a final newline only
    # Within the body, what follows its end is the next iteration or what comes after the repeat.
    again = _first(body.data, mode)
    inner_follow = None if again[0] is None or again[1] or after is None else _union(again[0], after)
    wb = _ways(body.data, mode, inner_follow)
    if high == low:
        try:
            return wb[0] ** low, wb[1] * low
        except OverflowError:
            return _INF, 0
    # One way per start position means every iteration's end is forced, so only the number of
    # iterations is a choice — unless the body can also match nothing, where iterations blur.
    width_lo, width_hi = body.getwidth()
    if wb != _ONE or (width_lo == 0 and width_hi != 0):
        raise _Ambiguous()
    return _count(high - low + 1)


def _follow(rest, mode: int, follow: "_Chars | None") -> "_Chars | None":
    """What can come after an item: the start of the rest of its sequence, or the sequence's follow."""
    chars, nullable = _first(rest, mode)
    if not nullable:
        return chars
    return None if chars is None or follow is None else _union(chars, follow)


# A set of characters: (negated, literal code points, categories among space/digit/word).
_Chars = tuple
_NOTHING: _Chars = (False, frozenset(), frozenset())
_CATEGORIES = {_sre.CATEGORY_DIGIT: "digit", _sre.CATEGORY_SPACE: "space", _sre.CATEGORY_WORD: "word"}
_NOT_CATEGORIES = {_sre.CATEGORY_NOT_DIGIT: "digit", _sre.CATEGORY_NOT_SPACE: "space",
                   _sre.CATEGORY_NOT_WORD: "word"}
_IN_CATEGORY = {"digit": str.isdecimal, "space": str.isspace,
                "word": lambda c: c.isalnum() or c == "_", "end": lambda c: False}
_END = frozenset({_sre.AT_END, _sre.AT_END_STRING})
# `$`: the end of the string, or a final newline; "end" is a category no character is in.
_AT_END: _Chars = (False, frozenset((10,)), frozenset(("end",)))


def _first(items, mode: int) -> "tuple[_Chars | None, bool]":
    """The characters a sequence can start with (None = unknown) and whether it can match empty."""
    chars: _Chars = _NOTHING
    for op, av in items:
        if op is _sre.AT and av in _END:   # with MULTILINE, `$` holds before any newline
            f, nullable = (False, frozenset((10,)), frozenset()) if mode & _MULTILINE else _AT_END, False
        elif op in _ZERO_WIDTH:
            continue
        elif op is _sre.SUBPATTERN:
            f, nullable = _first(av[-1], mode | (av[1] & _MODE_FLAGS))
        elif op is _ATOMIC:
            f, nullable = _first(av, mode)
        elif op is _sre.BRANCH:
            parts = [_first(b, mode) for b in av[1]]
            f = _NOTHING
            for part in parts:
                f = None if f is None or part[0] is None else _union(f, part[0])
            nullable = any(p[1] for p in parts)
        elif op in _REPEATS:
            f, nullable = _first(av[2], mode)
            nullable = nullable or av[0] == 0
        elif op is _sre.LITERAL:
            f, nullable = _caseless((False, frozenset((av,)), frozenset()), mode), False
        elif op is _sre.NOT_LITERAL:
            f, nullable = _caseless((True, frozenset((av,)), frozenset()), mode), False
        elif op is _sre.IN:
            f, nullable = _caseless(_class(av), mode), False
        elif op is _sre.ANY:
            f, nullable = (True, frozenset(), frozenset()), False
        else:  # group references, conditionals: anything, possibly empty
            f, nullable = None, True
        chars = None if f is None or chars is None else _union(chars, f)
        if chars is None or not nullable:
            return chars, False
    return chars, True


# Non-ASCII characters an ASCII letter matches under IGNORECASE (Kelvin sign, long s, dotted
# and dotless i), added to every letter's set: more characters only make the estimate safer.
_CASE_EXTRA = frozenset((0x212A, 0x17F, 0x130, 0x131))


def _caseless(chars: "_Chars | None", mode: int) -> "_Chars | None":
    """A set under IGNORECASE: ASCII letters gain their other case; non-ASCII ones make it unknown."""
    if chars is None or not mode & _IGNORECASE:
        return chars
    if any(c > 127 for c in chars[1]):
        return None
    letters = [chr(c) for c in chars[1] if chr(c).isalpha()]
    if not letters:
        return chars
    more = {ord(x) for ch in letters for x in (ch.lower(), ch.upper())} | _CASE_EXTRA
    return chars[0], chars[1] | more, chars[2]


def _class(items) -> "_Chars | None":
    """The set of a [...] class of literals, small ranges and categories; None when not that simple."""
    return _class_of(tuple(items))


@functools.lru_cache(maxsize=256)
def _class_of(items: tuple) -> "_Chars | None":
    lits: set = set()
    cats: set = set()
    negated = False
    for op, av in items:
        if op is _sre.LITERAL:
            lits.add(av)
        elif op is _sre.RANGE and av[1] - av[0] <= 0x6000:      # CJK (U+4E00-9FFF) included
            lits.update(range(av[0], av[1] + 1))
        elif op is _sre.NEGATE:
            negated = True
        elif op is _sre.CATEGORY and av in _CATEGORIES:
            cats.add(_CATEGORIES[av])
        elif op is _sre.CATEGORY and av in _NOT_CATEGORIES and len(items) == 1:
            return True, frozenset(), frozenset((_NOT_CATEGORIES[av],))       # \S, \D, \W
        else:
            return None
    return negated, frozenset(lits), frozenset(cats)


def _union(a: _Chars, b: _Chars) -> "_Chars | None":
    """a | b, when it can be written as a set of this kind."""
    if not a[0] and not b[0]:
        return False, a[1] | b[1], a[2] | b[2]
    if a == b or b == _NOTHING:
        return a
    if a == _NOTHING:
        return b
    return None


def _has(chars: _Chars, c: int) -> bool:
    """Whether a non-negated set holds the character c."""
    return c in chars[1] or any(_IN_CATEGORY[k](chr(c)) for k in chars[2])


def _covers(chars: _Chars, category: str) -> bool:
    """Whether a non-negated set holds every character of a category."""
    return category in chars[2] or (category == "digit" and "word" in chars[2])


@functools.lru_cache(maxsize=1024)
def _chars_disjoint(a: _Chars, b: _Chars) -> bool:
    """Whether no character is in both sets (cached: large classes take milliseconds)."""
    # "end" holds no character: only `$` itself compares with it (in _repeat_ways).
    a, b = (a[0], a[1], a[2] - {"end"}), (b[0], b[1], b[2] - {"end"})
    if a[0] and b[0]:
        return False
    if a[0]:
        a, b = b, a
    if b[0]:   # a within the complement of b's listed characters
        listed = (False, b[1], b[2])
        return (all(_covers(listed, k) for k in a[2])
                and all(_has(listed, c) for c in a[1] - b[1]))
    if a[1] & b[1] or _categories_of(a[1]) & b[2] or _categories_of(b[1]) & a[2]:
        return False
    return not any(x == y or {x, y} == {"digit", "word"} for x in a[2] for y in b[2])


@functools.lru_cache(maxsize=256)
def _categories_of(chars: frozenset) -> frozenset:
    """The categories (space, digit, word) some of these characters are in."""
    return frozenset(k for k, test in _IN_CATEGORY.items() if any(test(chr(c)) for c in chars))


def _disjoint(firsts: "list[tuple[_Chars | None, bool]]") -> bool:
    """True when no alternative can match empty and no two can start with the same character."""
    for i, (chars, nullable) in enumerate(firsts):
        if chars is None or nullable:
            return False
        if any(not _chars_disjoint(chars, other) for other, _ in firsts[:i]):
            return False
    return True


_CHECKERS: dict[str, Callable[[Any, str, str, list[str]], None]] = {
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
