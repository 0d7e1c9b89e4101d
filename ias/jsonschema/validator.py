"""The validator compiler: a checked schema becomes nested closures that validate an instance.

Each schema becomes one closure ("node") plus its type constraint; the keywords of one JSON
type are checked inline in a single closure, because Python's call overhead, not the checks
themselves, dominates validation time. The closures copy what they need, so later edits to the
schema do not affect a compiled validator. Compiling takes tens of microseconds; validating a
typical call, one or two. The schema must have passed `schema.check`: nothing here reports a
problem with the schema itself.

Semantics worth knowing: booleans are not numbers; 1.0 is an integer; enum, const and
uniqueItems use JSON equality (1 == 1.0, True != 1); when a value has the wrong `type`, the
other keywords of that schema are not reported for it; anyOf/oneOf failures give one
summarizing error (or the errors of the only alternative whose type fits).

Hostile instances: a validator refuses instances nested deeper than JSON_DEPTH_MAX, without
recursion; where the schema describes every container it accepts ("closed", e.g.
additionalProperties false and typed items) the check is skipped, since such a schema rejects
anything deeper than itself, and nothing recurses into an instance except along the schema.
The string and number keywords are compiled by scalars.py, where a string longer than its
`pattern` may be matched against (patterns.pattern_input_max) is refused before matching.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from .values import (DEPTH_MESSAGE, KIND, LEAF_TYPES, TYPE_NAMES, canon, canon_instance, kind, render, segment,
                     too_deep)
from .scalars import Node, number_node, size_bounds, string_node

_MISSING = object()
Validator = Callable[[object], "list[str]"]


def build(schema: object, compiled: dict | None = None) -> Validator:
    """A validator(instance) -> `path: message` errors for a schema check() accepted.

    `compiled` holds subschemas compiled already for this schema (by node_of, while check()
    validated their defaults); they are not compiled again.
    """
    node = _guarded(schema, _compile(schema, {} if compiled is None else compiled).node)

    def validator(instance: object) -> list[str]:
        """Return the instance's errors as `path: message` strings; empty means valid."""
        errors: list[str] = []
        node(instance, "$", "", errors)
        return errors
    return validator


def node_of(schema: object, compiled: dict) -> Node:
    """The unguarded node of a schema check() accepted, for values no deeper than JSON_DEPTH_MAX;
    `compiled` keeps it and its subschemas' for build()."""
    return _compile(schema, compiled).node


def _guarded(schema: object, node: Node) -> Node:
    """The root node plus the depth limit for instances, checked only where the schema leaves
    the depth open: a valid instance of a closed schema is no deeper than the schema."""
    if _closed(schema):
        return node
    names = _closed_but_extra(schema)

    def guarded(x, path, seg, errors):
        t = type(x)
        if t in LEAF_TYPES or (names is not None and t is dict and x.keys() <= names) or not too_deep(x):
            node(x, path, seg, errors)
        else:
            errors.append(f"{path}{seg}: {DEPTH_MESSAGE}")
    return guarded


def _closed(schema: object) -> bool:
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


def _closed_but_extra(schema: object) -> frozenset | None:
    """For an object schema closed but for additional properties, its property names."""
    if not isinstance(schema, dict) or schema.get("type") not in ("object", ["object"]):
        return None
    props = schema.get("properties", {})
    return frozenset(props) if all(map(_closed, props.values())) else None


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

    def type_fits(self, x: object) -> bool:
        """Return True when x passes this schema's `type` keyword."""
        if self.kinds is None:
            return True
        k = kind(x)
        return k in self.kinds or (self.int_floats and k == "number" and x.is_integer())


def _accept(x: object, path: str, seg: str, errors: list) -> None:
    """The `true` schema."""


def _admit(x: object, path: str, seg: str, errors: list) -> bool:
    """The type check of a node whose caller has dispatched on the type already: a subclass passes."""
    return True


def _reject(x: object, path: str, seg: str, errors: list) -> None:
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
# What passes a dispatched node's type check at once: its family's Python types (any JSON type's
# for a schema without `type`); anything else goes to _admit.
_FAMILY_TYPES = {family: frozenset(t for t, f in _TYPE_FAMILY.items() if f == family) for family in _FAMILY.values()}
_JSON_TYPES = frozenset(_TYPE_FAMILY)
_PY_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
             "null": (type(None),), "object": (dict,), "array": (list,)}
_FAMILY_KEYWORDS = {
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                         "multipleOf"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems", "uniqueItems"}),
}


def _family(x: object) -> str | None:
    """Return the keyword family of a value, or None for non-JSON values."""
    return _TYPE_FAMILY.get(type(x)) or _FAMILY.get(kind(x))


def _compile(schema: object, memo: dict[int, _Meta]) -> _Meta:
    """Compile a schema that check() accepted into a _Meta, once per subschema object in `memo`
    (by id(): every key's schema is alive while the memo is)."""
    meta = memo.get(id(schema))
    if meta is None:
        meta = memo[id(schema)] = _compile_one(schema, memo)
    return meta


def _compile_one(schema: object, memo: dict[int, _Meta]) -> _Meta:
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
        sub_meta = _compile(sub, memo)
        if sub_meta is not _TRUE:
            generic.append(sub_meta.node)
    if "anyOf" in schema:
        generic.append(_mk_any_of([_compile(s, memo) for s in schema["anyOf"]]))
    if "oneOf" in schema:
        generic.append(_mk_one_of([_compile(s, memo) for s in schema["oneOf"]]))
    if "not" in schema:
        generic.append(_mk_not(_compile(schema["not"], memo).node))
    tail = tuple(generic)
    keys = schema.keys()
    if "type" not in schema:
        return _Meta(_mk_untyped(_parts(schema, memo), tail), None, False)

    kinds, int_floats, fast, type_ok = _type_check(tuple(names))
    if len(families) == 1:
        (family,) = families
        own = _FAMILY_KEYWORDS.get(family)
        if (own is not None and not own.isdisjoint(keys)) or (
                inline_values and ("enum" in keys or "const" in keys)):
            # The family's node checks the type itself: one call per value. With a tail, the type is
            # checked once, then the family's keywords and the tail's nodes, in that order.
            if not tail:
                node = _family_node(family, schema, fast, type_ok, inline_values, memo)
            else:
                node = _family_node(family, schema, _FAMILY_TYPES[family], _admit, inline_values, memo)
                node = _mk_typed(fast, type_ok, (node, *tail))
        elif not tail:
            return _Meta(_mk_typed(fast, type_ok, tail), kinds, int_floats, fast)
        else:
            node = _mk_typed(fast, type_ok, tail)
    else:
        node = _mk_dispatch(_parts(schema, memo), fast, type_ok, tail)
    return _Meta(node, kinds, int_floats)


@functools.lru_cache(maxsize=256)
def _type_check(names: tuple[str, ...]) -> tuple[frozenset, bool, frozenset, Callable]:
    """For a `type` keyword: the JSON types it accepts, whether integral floats count, the Python
    types that pass at once, and the slow-path check. Shared by every schema with that `type`:
    1,000 loaded skills keep one of each instead of a closure per property."""
    int_floats = "integer" in names and "number" not in names
    kinds = frozenset(names) | ({"integer"} if "number" in names else frozenset())
    expected = " or ".join(names)
    fast = frozenset(t for k in kinds for t in _PY_TYPES[k])

    def type_ok(x, path, seg, errors):
        """Slow path for subclasses and integral floats: report and return False on a mismatch."""
        k = KIND.get(type(x)) or kind(x)
        if k in kinds or (int_floats and k == "number" and x.is_integer()):
            return True
        errors.append(f"{path}{seg}: expected {expected}, got {k}")
        return False
    return kinds, int_floats, fast, type_ok


def _parts(schema: dict, memo: dict[int, _Meta]) -> dict[str, Node]:
    """Return a node per type family the schema has keywords for, for values already dispatched to
    it by type (a subclass of the family's types is admitted)."""
    keys = schema.keys()
    return {family: _family_node(family, schema, _FAMILY_TYPES[family], _admit, False, memo)
            for family in _FAMILY_KEYWORDS if not _FAMILY_KEYWORDS[family].isdisjoint(keys)}


def _family_node(family: str, schema: dict, fast: frozenset, type_ok: Callable,
                 values: bool, memo: dict[int, _Meta]) -> Node:
    """The node for a family's keywords: strings and numbers in scalars.py, containers here.
    It checks the type itself (`fast`, `type_ok`: see scalars.py). The schema's other
    keywords (its tail: allOf, anyOf …) are not the family's: the caller runs them after it."""
    if family == "object":
        return _mk_object(schema, fast, type_ok, memo)
    if family == "array":
        return _mk_array(schema, fast, type_ok, memo)
    return (string_node if family == "string" else number_node)(schema, fast, type_ok, values)


def _mk_untyped(parts: dict[str, Node], tail: tuple[Node, ...]) -> Node:
    """Node for a schema without `type`: type-specific keywords apply to their own types only."""
    if parts:
        return _mk_dispatch(parts, _JSON_TYPES, _admit, tail)
    if len(tail) == 1:
        return tail[0]

    def node(x, path, seg, errors):
        for c in tail:
            c(x, path, seg, errors)
    return node


def _mk_typed(fast: frozenset, type_ok: Callable, tail: tuple[Node, ...]) -> Node:
    """Node for a typed schema whose keywords are all in `tail` (a family's node first, if any):
    the type checked once, then each node in order."""
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
    """Node for a schema allowing several types (e.g. ["string", "null"]), or any (`_admit`):
    each family's keywords apply to values of that family only, then the tail's nodes."""
    get = parts.get

    def node(x, path, seg, errors):
        if type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        fn = get(_TYPE_FAMILY.get(type(x)) or _family(x))
        if fn is not None:
            fn(x, path, seg, errors)
        for c in tail:
            c(x, path, seg, errors)
    return node


def _mk_object(schema: dict, fast: frozenset, type_ok: Callable, memo: dict[int, _Meta]) -> Node:
    """properties, required and additionalProperties."""
    get = schema.get
    required = tuple(get("required", ()))
    # name -> (path segment, node, Python types that pass without calling the node)
    members: dict[str, tuple[str, Node, frozenset] | None] = {}
    for name, sub in (get("properties") or {}).items():
        meta = _compile(sub, memo)
        members[name] = None if meta is _TRUE else (segment(name), meta.node, meta.leaf or _NONE)
    extra = get("additionalProperties", True)
    extra_node = None if extra is True or extra is False else _compile(extra, memo).node
    if extra_node is _accept:
        extra, extra_node = True, None
    forbid_extra = extra is False
    scan = forbid_extra or extra_node is not None or any(members.values())
    member = members.get
    required_set = frozenset(required)

    def object_node(x, path, seg, errors):
        if type(x) not in fast and not type_ok(x, path, seg, errors):
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
                        errors.append(f"{here}{segment(k)}: additional property not allowed")
                    elif extra_node is not None:
                        extra_node(v, here, segment(k), errors)
                elif p is not None and type(v) not in p[2]:
                    p[1](v, here, p[0], errors)
    return object_node


def _mk_array(schema: dict, fast: frozenset, type_ok: Callable, memo: dict[int, _Meta]) -> Node:
    """items, minItems, maxItems and uniqueItems."""
    get = schema.get
    sized, lo, hi, refuse_size = size_bounds(schema, "minItems", "maxItems", "item", "must contain {}")
    unique = get("uniqueItems") is True
    item_meta = _compile(get("items", True), memo)
    item = None if item_meta is _TRUE else item_meta.node
    leaf = item_meta.leaf

    def array_node(x, path, seg, errors):
        if type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        n = len(x)
        if sized and not lo <= n <= hi:
            refuse_size(x, path, seg, errors)
        if unique:
            seen: dict = {}
            for i, v in enumerate(x):
                j = seen.setdefault(canon_instance(v), i)
                if j != i:
                    errors.append(f"{path}{seg}: items must be unique ([{j}] and [{i}] are equal)")
                    break
        if item is not None:
            here = path + seg
            if leaf is not None:
                for i, v in enumerate(x):
                    if type(v) not in leaf:
                        item(v, here, f"[{i}]", errors)
            elif n <= len(_INDEX):
                for v, index in zip(x, _INDEX):
                    item(v, here, index, errors)
            else:
                for i, v in enumerate(x):
                    item(v, here, f"[{i}]", errors)
    return array_node


_INDEX = tuple(f"[{i}]" for i in range(64))


def _mk_enum(values: list) -> Node:
    """enum, for any type (JSON equality via canon)."""
    allowed = frozenset(map(canon, values))
    message = f"must be one of {render(values)}"

    def check_enum(x, path, seg, errors):
        t = type(x)
        # Strings and numbers are their own canonical form; skip the call for them.
        if (x if t is str or t is int or t is float else canon_instance(x)) not in allowed:
            errors.append(f"{path}{seg}: {message}")
    return check_enum


def _mk_const(value: object) -> Node:
    """const, for any type (JSON equality via canon)."""
    want = canon(value)
    message = f"must be equal to {render(value)}"

    def check_const(x, path, seg, errors):
        if canon_instance(x) != want:
            errors.append(f"{path}{seg}: {message}")
    return check_const


def _no_match(metas: list[_Meta], failures: list[list[str]], x: object, path: str, seg: str,
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
        errors.append(f"{path}{seg}: expected {' or '.join(names)}, got {kind(x)}" if names
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
