"""Validator throughput of ias.jsonschema against the jsonschema package, on skill-like schemas;
and the slowest validation of an accepted `pattern` found against adversarial strings."""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ias import jsonschema as ias_schema  # noqa: E402
from ias.jsonschema.patterns import pattern_input_max  # noqa: E402

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
      {"to": "not an email", "subject": "Hi", "body": "x",
       "cc": ["b@example.com", "b@example.com"]},
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

ROUNDS = 15          # interleaved rounds; the best round of each contender counts
ROUND_SECONDS = 0.02


def _timer(fn, pairs):
    """Return a function timing one batch of fn(validator, instance) over all pairs."""
    batch = 1

    def run() -> float:
        """Seconds per validation in one batch."""
        start = time.perf_counter()
        for _ in range(batch):
            for v, inst in pairs:
                fn(v, inst)
        return (time.perf_counter() - start) / (batch * len(pairs))

    while True:  # size the batch to about ROUND_SECONDS
        if run() * batch * len(pairs) >= ROUND_SECONDS / 4:
            batch *= 4
            return run
        batch *= 2


def _rates(timers: dict) -> dict:
    """Validations per second for each timer: best of ROUNDS interleaved rounds."""
    best = {name: float("inf") for name in timers}
    for _ in range(ROUNDS):
        for name, run in timers.items():
            best[name] = min(best[name], run())
    return {name: 1.0 / t for name, t in best.items()}


def _check_micros() -> float:
    """Microseconds per check() of a bench schema (best round), for the skill-loading budget."""
    schemas = [s for s, _ in CASES]
    run = _timer(lambda s, _: ias_schema.check(s), [(s, None) for s in schemas])
    return min(run() for _ in range(ROUNDS)) * 1e6


# Patterns known to backtrack (each refused or given a short input limit by check()), and the
# pieces random patterns are built from.
HARD_PATTERNS = [
    r"^(a+)+$", r"(a|ab)*c", r"(a|a)*", r"\w+@", r"^a*a*$", r"^a*a*a*$", r"(a|b)*c", r".*a.*b",
    r"^\s*[a-z]+\s*=\s*\S+\s*$", r"^[^@]*@.*$", r"^(\S+)\s(\S+)$", r"a{1,1000}b", r"(\d{1,3}\.){3}\d{1,3}",
    r"^(.*?,){11}P", r"(x{1,2}){12}y", r"^(\w|\d)*$", r"(\w+)\s(\w+)", r"^[a-z]+(-[a-z]+)*$", r"(?:a|b|c)+d",
    r"^.{0,5000}$", r"a{0,400}a{0,400}b", r"(?=a*a*b)a", r"^(a|b|c)*?d$", r"(a?){30}a{30}",
]
_ATOMS = ["a", "b", "-", r"\.", r"\s", r"\w", r"\d", r"\S", "[^a]", "[ab]", ".", "(?:ab)", "@"]
_QUANTS = ["", "", "*", "+", "?", "{1,3}", "{0,50}", "*?", "{2}"]
_UNITS = ["a", "ab", "a-", " ", "a ", "1.", "@", "aaab", "a\n", "-a", "a@a."]


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    """A random regular expression of the pieces above, possibly nested."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        if depth < 2 and rng.random() < 0.3:
            inner = "|".join(_random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3)))
            parts.append(f"(?:{inner})" + rng.choice(_QUANTS))
        else:
            parts.append(rng.choice(_ATOMS) + rng.choice(_QUANTS))
    return ("^" if rng.random() < 0.4 else "") + "".join(parts) + ("$" if rng.random() < 0.5 else "")


def _best_ms(validator, value: str, runs: int) -> float:
    """The fastest of `runs` validations of value, in milliseconds."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        validator(value)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def worst_pattern(random_patterns: int = 400, seed: int = 7) -> dict:
    """Time every accepted pattern (HARD_PATTERNS and random ones) against adversarial strings
    at its input limit and at 100 KB; return the slowest validation found."""
    rng = random.Random(seed)
    patterns = HARD_PATTERNS + [_random_pattern(rng) for _ in range(random_patterns)]
    worst = {"ms": 0.0, "pattern": None, "input": None, "accepted": 0, "refused": 0}
    for pattern in patterns:
        schema = {"type": "string", "pattern": pattern}
        if ias_schema.check(schema):
            worst["refused"] += 1
            continue
        worst["accepted"] += 1
        validator = ias_schema.compile(schema)
        limit = pattern_input_max(pattern)
        for unit in _UNITS:
            for size in (limit, 100_000):
                for tail in ("!", "\n", ""):
                    value = (unit * (size // len(unit) + 1))[:size - len(tail)] + tail
                    ms = _best_ms(validator, value, 1)
                    if ms > worst["ms"]:
                        ms = _best_ms(validator, value, 3)     # other processes' noise is not the pattern's
                    if ms > worst["ms"]:
                        worst.update(ms=ms, pattern=pattern, input=f"{unit!r} x {size:,} + {tail!r}")
    return worst


def main() -> dict:
    """Measure and print validations/s for ias.jsonschema and jsonschema; return the figures."""
    worst = worst_pattern()
    print(f"patterns: {worst['accepted']} accepted, {worst['refused']} refused; slowest validation "
          f"{worst['ms']:.1f} ms: {worst['pattern']!r} against {worst['input']}")
    check_us = _check_micros()
    print(f"check(): {check_us:.1f} us per schema (target well under 100 us)")
    compiled = [(ias_schema.compile(s), inst) for s, insts in CASES for inst in insts]
    raw = [(s, inst) for s, insts in CASES for inst in insts]
    timers = {"validator": _timer(lambda v, inst: v(inst), compiled),
              "validate": _timer(lambda s, inst: ias_schema.validate(inst, s), raw)}
    result = {"validator": None, "validate": None, "jsonschema": None,
              "ratio": None, "ratio_validate": None, "check_us": check_us, "worst_pattern": worst}
    try:
        import jsonschema
    except ImportError:
        result.update(_rates(timers))
        print(f"validator: {result['validator']:,.0f} validations/s (compiled); "
              f"validate(): {result['validate']:,.0f}/s; jsonschema not installed")
        return result
    theirs = [(jsonschema.Draft202012Validator(s), inst) for s, insts in CASES for inst in insts]
    # Sanity: both must agree on validity (jsonschema ignores `format` unless asked to,
    # so every instance here that fails a format is also invalid for another reason).
    for (v, inst), (jv, _) in zip(compiled, theirs):
        if (not v(inst)) != jv.is_valid(inst):
            raise RuntimeError(f"ias.jsonschema and the jsonschema package disagree on {inst!r}")
    timers["jsonschema"] = _timer(lambda v, inst: v.is_valid(inst), theirs)
    result.update(_rates(timers))
    result["ratio"] = result["validator"] / result["jsonschema"]
    result["ratio_validate"] = result["validate"] / result["jsonschema"]
    print(f"validator: {result['validator']:,.0f} validations/s; "
          f"jsonschema {result['jsonschema']:,.0f}/s; "
          f"ratio {result['ratio']:.1f}x (target >= 10x)")
    print(f"validate(): {result['validate']:,.0f} validations/s (checks and compiles every call); "
          f"ratio {result['ratio_validate']:.1f}x")
    return result


if __name__ == "__main__":
    main()
