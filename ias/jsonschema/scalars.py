"""Validator nodes for string and number schemas: length, pattern, format, bounds, multipleOf,
and enum/const checked inline (a string or number is its own JSON-equality key).

Each builder returns a node for values of its family that checks the type itself: a value whose
Python type is in `fast` passes at once, any other goes to `type_ok` (which reports a mismatch
and returns False; where the caller has dispatched on the type already, it accepts everything).
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable

from .formats import FORMATS
from .values import canon, plural, render
from ..limits import PATTERN_INPUT_MAX
from .patterns import pattern_input_max

_MISSING = object()

# A node checks one value: node(value, path, seg, errors) appends "path: message" strings,
# where the value's path is path + seg (joined only when needed, mostly for messages).
Node = Callable[[object, str, str, list], None]


def string_node(schema: dict, fast: frozenset, type_ok: Callable, values: bool) -> Node:
    """String keywords, plus enum/const when `values`."""
    get = schema.get
    allowed, refuse = _values(schema, values)
    sized, lo, hi, refuse_size = size_bounds(schema, "minLength", "maxLength", "character", "must be {} long")
    pattern = get("pattern")
    search = None if pattern is None else re.compile(pattern).search
    # check() refused patterns it cannot bound; longer strings are refused before matching.
    pattern_max = PATTERN_INPUT_MAX if pattern is None else pattern_input_max(pattern)
    too_long_msg = f"must be at most {plural(pattern_max, 'character')} long to be matched against pattern '{pattern}'"
    test, label = FORMATS.get(get("format"), (None, ""))
    matched = search is not None or test is not None
    pattern_msg = f"must match pattern '{pattern}'"
    format_msg = f"must be a valid {label}"

    # Keywords are grouped behind one flag each: absent groups cost a single test.
    def node(x, path, seg, errors):
        if type(x) not in fast and not type_ok(x, path, seg, errors):
            return
        if sized and not lo <= len(x) <= hi:
            refuse_size(x, path, seg, errors)
        if matched:
            if search is not None:
                if len(x) > pattern_max:
                    errors.append(f"{path}{seg}: {too_long_msg}")
                elif search(x) is None:
                    errors.append(f"{path}{seg}: {pattern_msg}")
            if test is not None and not test(x):
                errors.append(f"{path}{seg}: {format_msg}")
        if allowed is not None and x not in allowed:
            refuse(x, path, seg, errors)
    return node


def number_node(schema: dict, fast: frozenset, type_ok: Callable, values: bool) -> Node:
    """Number keywords, plus enum/const when `values`."""
    get = schema.get
    allowed, refuse = _values(schema, values)
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

    def node(x, path, seg, errors):
        if type(x) not in fast and not type_ok(x, path, seg, errors):
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
        if allowed is not None and x not in allowed:
            refuse(x, path, seg, errors)
    return node


def size_bounds(schema: dict, low: str, high: str, unit: str, template: str) -> tuple[bool, int, float, Node]:
    """For a pair of size keywords (minLength/maxLength, minItems/maxItems): whether they bound the
    size at all, the bounds (0 and inf when absent), and the node reporting a value out of them
    (`template` around "at least 2 items"). check() refused a low bound above the high one."""
    lo = int(schema.get(low, 0))
    hi = math.inf if schema.get(high) is None else int(schema[high])
    too_small = template.format(f"at least {plural(lo, unit)}")
    too_large = "" if hi == math.inf else template.format(f"at most {plural(hi, unit)}")

    def refuse(x, path, seg, errors):
        errors.append(f"{path}{seg}: {too_small if len(x) < lo else too_large}")
    return lo > 0 or hi != math.inf, lo, hi, refuse


def _fraction(x: int | float):             # -> fractions.Fraction
    """Exact value of a number as written: repr(0.1) is '0.1', so this gives 1/10."""
    from fractions import Fraction      # here: only multipleOf needs it (~3 ms of every start)
    return Fraction(x) if isinstance(x, int) else Fraction(repr(float(x)))


def _num(x: object) -> str:
    """Render a number (or None) for a message, as JSON would."""
    return "" if x is None else repr(x) if isinstance(x, int) else render(x)


def _values(schema: dict, inline: bool) -> tuple[frozenset | None, Node]:
    """For enum and const checked inline: the values that pass both (None: neither is there, or
    not inline) and the node reporting a value outside them. A str, int or float is its own
    canonical form (see canon), so a value is looked up as it is."""
    enum = frozenset(map(canon, schema["enum"])) if inline and "enum" in schema else None
    want = canon(schema["const"]) if inline and "const" in schema else _MISSING
    enum_msg = "" if enum is None else f"must be one of {render(schema['enum'])}"
    const_msg = "" if want is _MISSING else f"must be equal to {render(schema['const'])}"

    def refuse(x, path, seg, errors):
        if enum is not None and x not in enum:
            errors.append(f"{path}{seg}: {enum_msg}")
        if want is not _MISSING and x != want:
            errors.append(f"{path}{seg}: {const_msg}")
    if want is _MISSING:
        return enum, refuse
    return frozenset({want}) if enum is None else enum & {want}, refuse
