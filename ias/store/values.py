"""Every value is storable (the boundary rule). Each connection's adapters pass every `str`
parameter and every Jsonb value through `storable()` on the way in:
- text: a NUL character or a lone surrogate (invalid UTF-8 decoded with surrogateescape,
  `"\\ud800"` in model JSON) becomes U+FFFD, the replacement character; a valid surrogate pair
  becomes the character it encodes. The same rule applies to JSON strings and object keys
  (two keys that become equal keep the last value);
- JSON numbers: NaN, Infinity and -Infinity become the strings "NaN", "Infinity", "-Infinity";
- JSON nesting deeper than STORED_JSON_DEPTH: the deeper part becomes the string
  TOO_DEEP, walked without recursion, so no input raises RecursionError here.
Lookups use the same adapters, so a key written with such characters is found again.

Not handled: values on the way out (what was stored is storable already), and callers' own
values: only storage is sanitised, callers keep their originals (what the model sees).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

import psycopg
from psycopg.types.json import set_json_dumps
from psycopg.types.string import StrBinaryDumper, StrDumperUnknown

from ..limits import STORED_JSON_DEPTH

TOO_DEEP = "…(nested too deep to store)"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _text(value: str) -> str:
    """`value` with NUL and lone surrogates replaced by U+FFFD (surrogate pairs joined)."""
    if _UNSTORABLE.search(value) is None:
        return value
    joined = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return joined.replace("\x00", "\ufffd")


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE.get(value, "NaN")
    return value


def storable(value: Any) -> Any:
    """A copy of a JSON-like value that PostgreSQL accepts (the rule in the module docstring)."""
    if not isinstance(value, (dict, list, tuple)):
        return _scalar(value)
    root: list = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, value, 1)]    # (container, slot, value, depth)
    while stack:
        parent, slot, item, depth = stack.pop()
        if not isinstance(item, (dict, list, tuple)):
            parent[slot] = _scalar(item)
        elif depth > STORED_JSON_DEPTH:
            parent[slot] = TOO_DEEP
        elif isinstance(item, dict):
            parent[slot] = copy = dict.fromkeys(_scalar(key) for key in item)
            # Pushed in reverse, popped in order: of two keys made equal, the last one's value wins.
            stack.extend((copy, _scalar(key), child, depth + 1) for key, child in reversed(item.items()))
        else:
            parent[slot] = copy = [None] * len(item)
            stack.extend((copy, i, child, depth + 1) for i, child in enumerate(item))
    return root[0]


def json_text(value: Any) -> str:
    """`value` as the JSON text stored for it (storable, compact, not ASCII-escaped)."""
    return json.dumps(storable(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _StorableStr(StrDumperUnknown):
    def dump(self, obj: str):
        return super().dump(_text(obj))


class _StorableStrBinary(StrBinaryDumper):
    def dump(self, obj: str):
        return super().dump(_text(obj))


def make_storable(conn: psycopg.AsyncConnection) -> None:
    """Route this connection's text and JSON parameters through the sanitiser (the store boundary)."""
    conn.adapters.register_dumper(str, _StorableStrBinary)
    conn.adapters.register_dumper(str, _StorableStr)          # last: the one `%s` uses
    set_json_dumps(json_text, conn)
