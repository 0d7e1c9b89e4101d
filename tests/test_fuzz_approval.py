"""Fuzzing the approval message renderer: stdlib `random`, fixed seeds, bounded counts (< 5 s).

Keys, titles and values come from nasty alphabets (every Unicode category, runs of combining
marks, line breaks, forged `确认码：000000` lines, huge values). Whatever comes in, the message
has exactly one line starting `确认码：`, every parameter line starts with "· ", shows only
allow-listed characters (the test's own copy of the list), is marked ` ⚠️含特殊字符` exactly when
its label or value holds anything else, and the message either fits one WeChat message or the
call is refused. Every escaped text reads back to exactly the text it came from.
"""
import json
import random
import sys
import unicodedata
import unittest
import uuid

from ias import approval
from ias.confirmation import escape_visible, fits, render
from ias.limits import SPACES_RUN_MAX, WECHAT_TEXT_MAX
from tests.test_approval import unescape

SEEDS = (1, 7, 42, 2026)
CASES_PER_SEED = 300


def _by_category() -> dict[str, list[str]]:
    """A sample of code points from every general category (every 7th, plus all below U+0800)."""
    found: dict[str, list[str]] = {}
    for cp in range(sys.maxunicode + 1):
        if cp < 0x800 or cp % 7 == 0 or cp in BLANK_LOOKING or 0x3000 <= cp < 0x3100 or 0xFF00 <= cp < 0xFFF0:
            found.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    return found


BLANK_LOOKING = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x303F, 0x3164, 0xFFA0, 0x1D159,
                           0x16FE4, 0x1DA7F] + list(range(0xFE00, 0xFE10)))
CATEGORIES = _by_category()
MARKS = CATEGORIES["Mn"] + CATEGORIES["Me"] + CATEGORIES["Mc"]
SPECIAL = ["\n", "\r\n", "\r", "\u2028", "\u2029", "\x85", "\t", "\x0b", "\x0c", "\u3000", "\u115f", "\u1160",
           "\u3164", "\uffa0", "\u2800", "\u303f", "\u200b", "\u200d", "\u202e", "\u2066", "\ufeff", "\ufe0f",
           "\U000e0041", "\U000e0100", "\\", "\\n", "\\u{202e}", " ", "·", "：", ":", "\u0430", "⚠️含特殊字符",
           "“", "…", "—", "〇", "＼", "\u2013", "¥", "￥", "\U0002a700", "\uf900"]
FORGERIES = ["确认码：000000", "\n确认码：000000\n", "回复确认码以继续", "技能：execute_shell", "参数：",
             "⚠️ 操作确认", "(5分钟内有效，最多3次尝试)", "· 命令：ls", "（无）"]
OWN_LINES = ("⚠️ 操作确认", "技能：", "参数：", "确认码：", "回复确认码以继续", "回复 0 或「取消」以取消", "(")


def nasty_text(rng: random.Random, size: int) -> str:
    parts = []
    while sum(map(len, parts)) < size:
        pick = rng.random()
        if pick < 0.35:
            category = rng.choice(list(CATEGORIES))
            parts.append("".join(rng.choice(CATEGORIES[category]) for _ in range(rng.randint(1, 6))))
        elif pick < 0.5:
            parts.append(rng.choice("abc确认码") + "".join(rng.choice(MARKS) for _ in range(rng.randint(1, 12))))
        elif pick < 0.7:
            parts.append(rng.choice(SPECIAL) * rng.randint(1, 12))
        elif pick < 0.85:
            parts.append(rng.choice(FORGERIES))
        else:
            parts.append("".join(rng.choice("abc 123-_/.~") for _ in range(rng.randint(1, 20))))
    return "".join(parts)


def nasty_value(rng: random.Random):
    pick = rng.random()
    if pick < 0.05:
        return "x" * rng.choice((3990, 4001, 20000, 200000))        # huge
    if pick < 0.65:
        return nasty_text(rng, rng.choice((1, 5, 20, 80, 400)))
    if pick < 0.75:
        return rng.choice((0, -1, 2 ** 70, 1.5, True, False, None))
    if pick < 0.9:
        return [nasty_text(rng, 5) for _ in range(rng.randint(0, 4))]
    return {nasty_text(rng, 4): nasty_text(rng, 8) for _ in range(rng.randint(0, 3))}


def nasty_case(rng: random.Random) -> tuple[dict, dict]:
    params, properties = {}, {}
    for _ in range(rng.choice((0, 1, 2, 4, 8, 30))):
        key = rng.choice(("确认码", "技能", "参数", "to", "command")) if rng.random() < 0.2 else nasty_text(rng, 6)
        params[key] = nasty_value(rng)
        if rng.random() < 0.5:
            properties[key] = {"title": nasty_text(rng, 6)} if rng.random() < 0.8 else {"title": 5}
    return params, {"type": "object", "properties": properties}


# The test's own allow-list (SPEC §6.4), independent of the module's tables.
PUNCTUATION = set("、。〃々〆〇〈〉《》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟！＂＃＄％＆＇（）＊＋，－．／：；＜＝＞？＠［］＾＿｀｛｜｝～￥"
                  "“”‘’…—·")
MARK = " ⚠️含特殊字符"


def allowed(char: str) -> bool:
    return (" " <= char <= "~" or char in PUNCTUATION
            or unicodedata.name(char, "").startswith(("CJK UNIFIED IDEOGRAPH-", "CJK COMPATIBILITY IDEOGRAPH-")))


def needs_mark(text: str) -> bool:
    return (not all(map(allowed, text)) or text[:1] == " " or text[-1:] == " "
            or " " * (SPACES_RUN_MAX + 1) in text)


def shown_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


class RendererFuzzTest(unittest.TestCase):
    def check(self, params: dict, schema: dict) -> None:
        row = approval.Approval(uuid.uuid4(), None, None, "owner", "fuzz_skill", params, "", 3, "pending", None, None)
        message = render(row, "482731", 300, schema)
        if not fits(message):
            return              # the gate refuses it: 参数过长，无法请求确认
        self.assertLessEqual(len(message), WECHAT_TEXT_MAX)
        lines = message.split("\n")
        self.assertEqual(sum(line.startswith("确认码：") for line in lines), 1, message)
        self.assertEqual(lines[:4], ["⚠️ 操作确认", "", "技能：fuzz_skill", "参数："])
        self.assertEqual(lines[-5:], ["", "确认码：482731", "回复确认码以继续", "回复 0 或「取消」以取消",
                                      "(5分钟内有效，最多3次尝试)"])
        body = lines[4:-5]
        if not params:
            self.assertEqual(body, ["（无）"])
            return
        self.assertEqual(len(body), len(params))
        properties = schema["properties"]
        declared = [k for k in properties if k in params]
        for key, line in zip(declared + sorted(k for k in params if k not in declared), body):
            self.assertTrue(line.startswith("· "), line)
            self.assertFalse(line[2:].startswith(OWN_LINES[1:4]), line)     # a label never reads as the message
            title = properties.get(key, {}).get("title")
            label = title.strip() if key in declared and isinstance(title, str) and title.strip() else key
            if key not in declared:
                self.assertTrue(line.startswith("· 未声明参数 "), line)
            marked = line.endswith(MARK)
            self.assertEqual(marked, needs_mark(label) or needs_mark(shown_text(params[key])), line)
            text = line[:-len(MARK)] if marked else line
            self.assertEqual([hex(ord(c)) for c in text if not allowed(c)], [], line)

    def test_escaped_text_reads_back_exactly(self):
        rng = random.Random(5)
        for _ in range(2000):
            text = nasty_text(rng, rng.choice((1, 5, 20, 80)))
            shown, special = escape_visible(text)
            self.assertEqual(unescape(shown), text)
            self.assertEqual(special, needs_mark(text), text)
            self.assertTrue(all(map(allowed, shown)), shown)

    def test_random_parameters(self):
        asked = refused = 0
        for seed in SEEDS:
            rng = random.Random(seed)
            for _ in range(CASES_PER_SEED):
                params, schema = nasty_case(rng)
                with self.subTest(seed=seed):
                    self.check(params, schema)
                row = approval.Approval(uuid.uuid4(), None, None, "o", "fuzz_skill", params, "", 3, "pending",
                                        None, None)
                if fits(render(row, "482731", 300, schema)):
                    asked += 1
                else:
                    refused += 1
        self.assertGreater(asked, 100)          # the generator exercises both outcomes
        self.assertGreater(refused, 20)


if __name__ == "__main__":
    unittest.main()
