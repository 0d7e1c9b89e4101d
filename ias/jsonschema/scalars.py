"""Validator nodes for string and number schemas: length, pattern, format, bounds, multipleOf,
and enum/const checked inline (a string or number is its own JSON-equality key).

Each builder returns a node for values of its family. With `fast` (the Python types the schema
accepts) it checks the type itself; without, the caller has dispatched on the type already.
"""
from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Callable

from .formats import FORMATS
from .values import canon, plural, render
from ..limits import PATTERN_INPUT_MAX
from .patterns import pattern_input_max

_MISSING = object()

# A node checks one value: node(value, path, seg, errors) appends "path: message" strings,
# where the value's path is path + seg (joined only when needed, mostly for messages).
Node = Callable[[Any, str, str, list], None]


def string_node(schema: dict, fast: frozenset | None, type_ok: Callable | None,
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
    too_long_msg = f"must be at most {plural(pattern_max, 'character')} long to be matched against pattern '{pattern}'"
    test, label = FORMATS.get(get("format"), (None, ""))
    matched = search is not None or test is not None
    lo_msg = f"must be at least {plural(lo, 'character')} long"
    hi_msg = f"must be at most {plural(hi, 'character')} long" if hi != math.inf else ""
    pattern_msg = f"must match pattern '{pattern}'"
    format_msg = f"must be a valid {label}"
    guard = fast is not None

    # Keywords are grouped behind one flag each: absent groups cost a single test.
    def node(x, path, seg, errors):
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
            # A str is its own canonical form (see canon).
            if allowed is not None and x not in allowed:
                errors.append(f"{path}{seg}: {enum_msg}")
            if want is not _MISSING and x != want:
                errors.append(f"{path}{seg}: {const_msg}")
        if tail:
            for c in tail:
                c(x, path, seg, errors)
    return node


def number_node(schema: dict, fast: frozenset | None, type_ok: Callable | None,
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

    def node(x, path, seg, errors):
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
            # An int or float is its own canonical form (see canon).
            if allowed is not None and x not in allowed:
                errors.append(f"{path}{seg}: {enum_msg}")
            if want is not _MISSING and x != want:
                errors.append(f"{path}{seg}: {const_msg}")
        if tail:
            for c in tail:
                c(x, path, seg, errors)
    return node


def _fraction(x: int | float) -> Fraction:
    """Exact value of a number as written: repr(0.1) is '0.1', so this gives 1/10."""
    return Fraction(x) if isinstance(x, int) else Fraction(repr(float(x)))


def _num(x: Any) -> str:
    """Render a number (or None) for a message, as JSON would."""
    return "" if x is None else repr(x) if isinstance(x, int) else render(x)


def _values(schema: dict, inline: bool) -> tuple[frozenset | None, str, Any, str]:
    """Return (allowed, message, wanted, message) for enum and const checked inline."""
    allowed, want, enum_msg, const_msg = None, _MISSING, "", ""
    if inline and "enum" in schema:
        allowed = frozenset(map(canon, schema["enum"]))
        enum_msg = f"must be one of {render(schema['enum'])}"
    if inline and "const" in schema:
        want = canon(schema["const"])
        const_msg = f"must be equal to {render(schema['const'])}"
    return allowed, enum_msg, want, const_msg
