"""JSON values as Python holds them: type names, JSON equality, message rendering, and the
limits hostile JSON is held to.

JSON text from a SKILL.md or from the model's tool arguments is parsed by `loads`, which refuses
nesting deeper than JSON_DEPTH_MAX and numbers longer than JSON_NUMBER_MAX characters (and NaN,
Infinity, floats that overflow) before `json.loads` runs. Values already parsed are measured by
`hostile` and `too_deep`, breadth first, one level at a time: no recursion, no per-value
bookkeeping.

JSON equality is what enum, const and uniqueItems use: 1 == 1.0, True != 1 (`canon` gives JSON-
equal values equal keys).
"""
from __future__ import annotations

import json
import math
import re

from ..limits import JSON_DEPTH_MAX, JSON_NUMBER_MAX

TYPE_NAMES = ("string", "integer", "number", "boolean", "object", "array", "null")
KIND = {str: "string", int: "integer", float: "number", bool: "boolean",
        type(None): "null", dict: "object", list: "array"}
LEAF_TYPES = frozenset({str, bool, float, int, type(None)})
DEPTH_MESSAGE = f"nested deeper than {JSON_DEPTH_MAX} levels"

_INT_LIMIT = 10 ** JSON_NUMBER_MAX
_NUMBER_MESSAGE = f"number with more than {JSON_NUMBER_MAX} digits"
_TEXT_TYPES = frozenset({str, bool, float, type(None)})


def too_deep(value: object) -> bool:
    """Whether containers nest deeper than JSON_DEPTH_MAX (the validator's hot path: one
    comprehension per level). Numbers are not checked here: huge ints are harmless to
    validate, and JSON text is limited by loads()."""
    if not isinstance(value, (dict, list, tuple)):
        return False
    level = [value]
    for _ in range(JSON_DEPTH_MAX):
        below = [v for c in level for v in (c.values() if isinstance(c, dict) else c)
                 if type(v) not in LEAF_TYPES]
        level = [v for v in below if isinstance(v, (dict, list, tuple))]
        if not level:
            return False
    return True


def hostile(value: object) -> str | None:
    """Why a value is too deep or holds too large a number to handle safely, or None."""
    t = type(value)
    if t is str or t is bool or t is float or value is None:
        return None
    if t is int or not isinstance(value, (dict, list)):
        return _NUMBER_MESSAGE if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT else None
    # Breadth first, one level at a time: no recursion, no per-value bookkeeping.
    level = [value]
    depth = 0
    while level:
        depth += 1
        if depth > JSON_DEPTH_MAX:
            return DEPTH_MESSAGE
        below = [v for c in level for v in (c.values() if isinstance(c, dict) else c)
                 if type(v) not in _TEXT_TYPES]
        for v in below:
            if isinstance(v, int) and not isinstance(v, bool) and not -_INT_LIMIT < v < _INT_LIMIT:
                return _NUMBER_MESSAGE
        level = [v for v in below if isinstance(v, (dict, list))]
    return None


# A string (kept whole, so brackets inside it are skipped), a bracket, a number, or a
# constant json accepts but JSON does not have.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]|[\]}]|-?[0-9][-+.0-9eE]*|NaN|-?Infinity')


# What a number over the limits must contain (possibly inside a string: then the full scan in
# loads() decides): past JSON_NUMBER_MAX characters, either the integer or the fraction part has
# half of them in a row, or the exponent has 3 digits; and NaN and Infinity are no JSON.
_SUSPECT_NUMBER = re.compile(rf"[0-9](?:[0-9]{{{JSON_NUMBER_MAX // 2 - 3}}}|[eE][-+]?[0-9]{{3}})")


_DIGITS = "0123456789"


def _too_big_float(token: str) -> bool:
    """Whether a number literal overflows a float (json.loads would give inf)."""
    try:
        return math.isinf(float(token))
    except ValueError:  # not a number after all: json.loads reports it
        return False


def loads(text: str) -> object:
    """json.loads with the depth and number limits checked first; raise json.JSONDecodeError.

    json.loads itself recurses per nesting level and parses any number of digits, so a
    hostile document would raise RecursionError or ValueError instead.
    """
    if (text.count("[") + text.count("{") <= JSON_DEPTH_MAX and "NaN" not in text and "Infinity" not in text
            and (not any(d in text for d in _DIGITS) or _SUSPECT_NUMBER.search(text) is None)):
        return json.loads(text)          # cannot nest too deep, nor hold a number out of limits
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = text[m.start()]
        if c == '"':
            continue
        if c == "[" or c == "{":
            depth += 1
            if depth > JSON_DEPTH_MAX:
                raise json.JSONDecodeError(DEPTH_MESSAGE, text, m.start())
        elif c == "]" or c == "}":
            depth -= 1
        elif m.group() in ("NaN", "Infinity", "-Infinity"):
            raise json.JSONDecodeError(f"{m.group()} is not a JSON number", text, m.start())
        elif m.end() - m.start() > JSON_NUMBER_MAX:
            raise json.JSONDecodeError(_NUMBER_MESSAGE, text, m.start())
        elif not m.group().lstrip("-").isdigit() and _too_big_float(m.group()):
            raise json.JSONDecodeError("number out of range", text, m.start())
    return json.loads(text)


# ---------------------------------------------------------------------------------------
# Type names, equality and rendering for messages


def kind(x: object) -> str:
    """Return the JSON type name of a value (integral floats count as "number")."""
    k = KIND.get(type(x))
    if k is not None:
        return k
    for cls, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                      (dict, "object"), (list, "array")):
        if isinstance(x, cls):
            return name
    return type(x).__name__


def render(value: object) -> str:
    """Render a value as compact-ish JSON for a message."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def segment(name: object) -> str:
    """Return the path segment for an object member."""
    if isinstance(name, str) and name.isidentifier():
        return "." + name
    return "[" + render(name if isinstance(name, str) else str(name)) + "]"


def canon(v: object) -> object:
    """Return a hashable key such that JSON-equal values get equal keys."""
    t = type(v)
    if t is str or t is int or t is float or v is None:
        return v
    if t is bool:
        return ("b", v)
    if t is list:
        return ("a", tuple(map(canon, v)))
    if t is dict:
        return ("o", frozenset((k, canon(x)) for k, x in v.items()))
    if isinstance(v, bool):
        return ("b", bool(v))
    if isinstance(v, (str, int, float)):
        return v
    if isinstance(v, (list, tuple)):
        return ("a", tuple(map(canon, v)))
    if isinstance(v, dict):
        return ("o", frozenset((k, canon(x)) for k, x in v.items()))
    return ("?", id(v))


def canon_instance(v: object) -> object:
    """canon() of an instance value, which may be nested too deep to recurse into."""
    if type(v) in LEAF_TYPES or not too_deep(v):
        return canon(v)
    return ("deep", id(v))       # equal to nothing a schema holds



def plural(n: int, word: str) -> str:
    """Return '1 item' / '2 items'."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
