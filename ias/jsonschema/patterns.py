"""Regular expression safety for a schema's `pattern`: which patterns are refused, and how long
a string an accepted one may be matched against.

A pattern is parsed with Python's own regex parser (never run) and refused when a repeated
part can match the same text in more than one way (`(a+)+`, `(a|ab)*`): such patterns
backtrack exponentially. For the others the backtracking work is estimated as c * n**k ways
per start position for an input of n characters, and `pattern_input_max` gives the longest
input that stays within PATTERN_STEPS_MAX (at most PATTERN_INPUT_MAX); the validator refuses
longer strings before matching, so no accepted pattern blocks for more than milliseconds. A
pattern that cannot take PATTERN_INPUT_MIN characters within the budget is refused.

Repeats whose iterations are delimited (the body matches one way per position, and what
follows it cannot start it) count once: `^[a-z]+(-[a-z]+)*$` is accepted. The estimate is
deliberately conservative otherwise: unanchored overlapping runs such as `[a-z]+x` are refused.
"""
from __future__ import annotations

import functools
import math
import re

try:  # Python's own regex parser: re._parser since 3.11, sre_parse before
    from re import _constants as _sre, _parser as _sre_parse
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_constants as _sre  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from ..limits import PATTERN_INPUT_MAX, PATTERN_INPUT_MIN, PATTERN_MAX, PATTERN_STEPS_MAX


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a schema's `pattern` (too long, invalid, too slow to match), or None."""
    if len(pattern) > PATTERN_MAX:
        return f"longer than {PATTERN_MAX} characters"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"invalid regular expression: {exc}"
    except (RecursionError, OverflowError, MemoryError, ValueError):
        return "regular expression too complex"
    limit = pattern_input_max(pattern)
    return limit if isinstance(limit, str) else None


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


@functools.lru_cache(maxsize=1024)
def pattern_input_max(pattern: str) -> int | str:
    """The longest string `pattern` may be searched in within PATTERN_STEPS_MAX, or why it is refused.

    The pattern must compile. Cached: skills share patterns, and loading must stay cheap.
    """
    try:
        return _input_max(pattern)
    except _Ambiguous:
        return ("prone to catastrophic backtracking: a repeated part can match the same text "
                "in more than one way (nested quantifiers like (a+)+, overlapping alternatives "
                "like (a|ab)*)")
    except (RecursionError, OverflowError, MemoryError, ValueError, re.error):
        return "regular expression too complex"


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
