"""Random hostile input, fixed seeds: the SKILL.md parser, the JSON loader, check(), the validator and cron
raise nothing but their own errors (SkillError, JSONDecodeError, SchemaError, CronError)."""
import json
import random
import tempfile
import unittest
from datetime import datetime, timezone
from pathlib import Path

from ias import jsonschema as schema
from ias.cron import CronError, describe, next_after, parse_schedule
from ias.errors import SkillError
from ias.skills import load_skill, parse_skill

ODD = ["\f", "\v", "\x85", "\u2028", "\u2029", "\r", "\t", "\ufeff", "\x00", "\u3000", "`", "~", "#", "\\", '"']
HEADINGS = ["Risk Level", "Parameters", "Execute", "Timeout", "Env", "风险等级", "参数", "执行", "超时", "环境变量", "Notes", ""]
KEYWORDS = ["type", "properties", "required", "additionalProperties", "enum", "const", "default", "description",
            "title", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
            "maxLength", "pattern", "format", "items", "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf",
            "allOf", "not", "examples", "$ref", "if"]
PATTERN_PIECES = ["a", "b", "(", ")", "|", "*", "+", "?", "{1,3}", "{2}", "[ab]", "[^a]", ".", r"\s", r"\w", r"\d",
                  "^", "$", "(?:", "(?=", "(?!", r"\1", "(?i)", "*?", "-"]


def nested_json(rng: random.Random) -> str:
    depth = rng.choice([3, 63, 64, 65, 500, 5000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}"), ('{"not":', "}")])
    return opener * depth + rng.choice(["1", "{}", "[]", ""]) + closer * depth


def number(rng: random.Random):
    return rng.choice([0, -1, 1.5, 10**99, -(10**100), 10**400, 1e308, float("inf"), float("nan"), True, 2**63])


def random_schema(rng: random.Random, depth: int = 0):
    if depth > 3 or rng.random() < 0.15:
        return rng.choice([True, False, {}, {"type": "string"}, number(rng), "x", None, []])
    out = {}
    for key in rng.sample(KEYWORDS, rng.randint(0, 5)):
        if key in ("properties",):
            out[key] = {rng.choice(["a", "b", "确认码", "", "1"]): random_schema(rng, depth + 1) for _ in range(2)}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = random_schema(rng, depth + 1)
        elif key in ("anyOf", "oneOf", "allOf"):
            out[key] = [random_schema(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        elif key == "type":
            out[key] = rng.choice(["string", "integer", "number", "object", "array", "null", "boolean",
                                   ["string", "null"], "float", [], ["string", "string"]])
        elif key == "pattern":
            out[key] = "".join(rng.choice(PATTERN_PIECES) for _ in range(rng.randint(0, 10)))
        elif key in ("required", "enum", "examples"):
            out[key] = [random_value(rng) for _ in range(rng.randint(0, 3))]
        elif key in ("const", "default"):
            out[key] = random_value(rng)
        elif key == "format":
            out[key] = rng.choice(["date", "time", "date-time", "email", "ipv4", "uri", "other", 1])
        else:
            out[key] = number(rng) if rng.random() < 0.7 else random_value(rng)
    return out


def random_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 4 or roll < 0.5:
        return rng.choice([None, True, False, 0, -5, 1.0, 2.5, 10**99, 10**101, "", "a" * rng.randint(0, 3000),
                           "2026-02-29", "1.2.3.4", "x@y.z", "\u2028\x00", "aaaaaaaaaaaaaaaaaaaaaaaaaaaa!"])
    if roll < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b", "c", "确认码"]): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def deep_value(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


def skill_document(rng: random.Random) -> str:
    lines = []
    if rng.random() < 0.3:
        lines.append("\ufeff")
    lines.append(rng.choice(["# Title", "#Title", "   # T #", "", "#"]))
    lines.append("A description" + rng.choice(ODD) + "text.")
    for _ in range(rng.randint(0, 8)):
        indent = " " * rng.randint(0, 4)
        hashes = "#" * rng.randint(1, 3)
        sep = rng.choice([" ", "\t", "", "  "])
        lines.append(f"{indent}{hashes}{sep}{rng.choice(HEADINGS)}{rng.choice(['', ' ##', '#'])}")
        for _ in range(rng.randint(0, 3)):
            roll = rng.random()
            if roll < 0.4:
                fence = rng.choice(["```", "~~~", "````", "``"])
                lang = rng.choice(["json", "bash", "sh", "", "json title=\"p\"", "JSON", "py"])
                body = rng.choice([json.dumps(random_schema(rng), default=str), nested_json(rng),
                                   '{"type": "object", "properties": {"n": {"maximum": ' + "9" * rng.choice([5, 5000]) + "}}}",
                                   "echo hi", '{"type": "object"}', "{oops"])
                lines += [" " * rng.randint(0, 4) + fence + lang, body]
                if rng.random() < 0.85:
                    lines.append(" " * rng.randint(0, 3) + fence + rng.choice(["", "`", "~", " x"]))
            elif roll < 0.7:
                lines.append(rng.choice(["Low", "High", "低", "高", "Medium", "9" * rng.choice([3, 5000]), "30s",
                                         "- TOKEN, OTHER", "PATH", "`x`"]))
            else:
                lines.append("".join(rng.choice(ODD + ["a", " ", "中"]) for _ in range(rng.randint(0, 12))))
    return "\n".join(lines)


class SkillParserFuzz(unittest.TestCase):
    def test_parse_skill(self):
        rng = random.Random(1101)
        for i in range(400):
            text = skill_document(rng)
            try:
                parse_skill(Path("/skills/fuzz/SKILL.md"), text)
            except SkillError as exc:
                for problem in exc.problems:
                    self.assertRegex(problem, r"^/skills/fuzz/SKILL\.md:\d+: ", (i, problem[:200]))
                    self.assertLess(len(problem), 2000)

    def test_load_skill_bytes(self):
        rng = random.Random(1102)
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / "fuzz"
            directory.mkdir()
            for _ in range(100):
                data = skill_document(rng).encode("utf-8")
                if rng.random() < 0.5:
                    at = rng.randrange(len(data) + 1)
                    data = data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[at:]
                (directory / "SKILL.md").write_bytes(data)
                try:
                    load_skill(directory)
                except SkillError:
                    pass


class SchemaFuzz(unittest.TestCase):
    def test_check_and_validate(self):
        rng = random.Random(1103)
        accepted = 0
        for _ in range(1500):
            candidate = random_schema(rng)
            problems = schema.check(candidate)
            self.assertIsInstance(problems, list)
            instances = [random_value(rng) for _ in range(3)] + [deep_value(rng.choice([10, 70, 600]))]
            if problems:
                with self.assertRaises(schema.SchemaError):
                    schema.compile(candidate)
                continue
            accepted += 1
            validator = schema.compile(candidate)
            for instance in instances:
                errors = validator(instance)
                self.assertIsInstance(errors, list)
                self.assertEqual(errors, schema.validate(instance, candidate))
                schema.apply_defaults(instance, candidate)
                for error in errors:
                    self.assertRegex(error, r"^\$")
                    self.assertNotIn("expected , got", error)
        self.assertGreater(accepted, 300)          # the generator reaches the validator, not only check()

    def test_loads(self):
        rng = random.Random(1104)
        pieces = ["[", "]", "{", "}", '"', "\\", ":", ",", "1", "-", "e", "9" * 120, "1e999", "NaN", "Infinity",
                  "true", "null", " ", "\u2028", '"a"']
        for _ in range(2000):
            text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
            if rng.random() < 0.05:
                text = nested_json(rng)
            try:
                schema.loads(text)
            except json.JSONDecodeError:
                pass


class CronFuzz(unittest.TestCase):
    def test_parse_schedule_and_next_after(self):
        rng = random.Random(1105)
        tokens = ["*", "*/7", "0", "59", "60", "1-5", "5-1", "MON", "jan-mar", "L", "?", "#", ",", "/", "-", "29", "2",
                  "9" * 5000, "7", "@daily", "@reboot", "every", "10s", "9s", "2026-02-29", "08:00", "+08:00",
                  "9999-12-31", "23:59", "0001-01-01", "T", "\u0663"]
        fields = ["*", "*/7", "0", "1-5", "29", "2", "MON", "*/15", "0,30", "7", "5/10", "31", "FEB", "12"]
        afters = [datetime(1, 1, 1, tzinfo=timezone.utc), datetime(1, 1, 2), datetime(2026, 3, 4, 10, 17),
                  datetime(9999, 12, 31, 23, 59), datetime(9999, 12, 31, 15, 59, tzinfo=timezone.utc),
                  datetime(2089, 3, 1), datetime(9998, 1, 1)]
        parsed_count = 0
        for _ in range(1500):
            if rng.random() < 0.6:     # mostly plausible fields, now and then a hostile one
                text = " ".join(rng.choice(fields) if rng.random() < 0.95 else rng.choice(tokens) for _ in range(5))
            else:
                text = " ".join(rng.choice(tokens) for _ in range(rng.choice([1, 2, 5, 5, 5, 6])))
            try:
                parsed = parse_schedule(text, anchor=rng.choice(afters))
            except CronError as exc:
                self.assertLess(len(str(exc)), 300)
                continue
            parsed_count += 1
            after = rng.choice(afters)
            for call in (lambda: parsed.next_after(after), lambda: describe(parsed, after, 2),
                         lambda: next_after(text, after) if parsed.kind == "cron" else None):
                try:
                    result = call()
                except CronError:
                    continue
                if isinstance(result, datetime) and after.tzinfo is not None:
                    self.assertGreater(result, after)
        self.assertGreater(parsed_count, 50)


if __name__ == "__main__":
    unittest.main()
