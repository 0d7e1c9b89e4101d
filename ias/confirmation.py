"""The owner's confirmation message (SPEC §6.4): what a High call's approval shows, character by character.

Rendered from the daemon's own copy of the pending row, never from model text. Characters are
shown by an allow-list (`escape_visible`); labels come only from what the skill's schema
declares; no parameter can produce a line that starts like one of the message's own lines.
Not handled: sending the message or reading replies (`approval`), splitting a message (one that
does not fit one WeChat message is never sent: `fits`).
"""
from __future__ import annotations

import json
import unicodedata

from .limits import SPACES_RUN_MAX, WECHAT_TEXT_MAX
from .outgoing import file_note
from .store import Approval

MAX_ATTEMPTS = 3                 # code attempts per approval; also the schema default of attempts_left


def canonical(params: dict) -> str:
    """The one text of a call's parameters that codes and grants are keyed over (keys sorted, no spaces)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# SPEC §6.4's allow-list: the characters the owner's message shows as they are. Every other one
# is shown as an escape, `\u{0430}`, and marks its line. Beyond printable ASCII and the CJK
# ideographs (unified, every extension, compatibility; assigned ones only, by their names), only
# the punctuation of Chinese text: CJK brackets and marks, the fullwidth forms of ASCII
# punctuation, the yen/yuan sign, curly quotes, ellipsis, em dash and middle dot. Left out on
# purpose: the ideographic and half fill spaces, tone marks (combining), Hangzhou numerals (〡
# reads as |), Kangxi and supplementary radicals (drawn like ideographs), fullwidth letters and
# digits (look-alikes of ASCII), the fullwidth backslash (it would draw an escape), halfwidth
# forms, the en dash (reads as a hyphen).
PUNCTUATION = frozenset(
    "、。〃々〆〇〈〉《》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟"
    "！＂＃＄％＆＇（）＊＋，－．／：；＜＝＞？＠［］＾＿｀｛｜｝～￥"
    "“”‘’…—·")
IDEOGRAPH_NAMES = ("CJK UNIFIED IDEOGRAPH-", "CJK COMPATIBILITY IDEOGRAPH-")
SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
SPECIAL_MARK = " ⚠️含特殊字符"        # ends a parameter line whose label or value shows an escape


def _allowed(char: str) -> bool:
    code = ord(char)
    if 0x20 <= code < 0x7F:
        return True
    return char in PUNCTUATION or (code >= 0x3400 and unicodedata.name(char, "").startswith(IDEOGRAPH_NAMES))


def _code_point(char: str) -> str:
    return f"\\u{{{ord(char):04x}}}"


def escape_visible(text: str) -> tuple[str, bool]:
    """`text` as the owner's message shows it, and whether any character had to be escaped.

    Shown as is: the allow-list above, and plain spaces except at either end or in runs longer
    than SPACES_RUN_MAX (padding). Every other character is an escape: `\\n`, `\\t`, `\\r`,
    else `\\u{hex}`. A backslash is doubled where it would otherwise read as the start of an
    escape (before n, t, r, u or another backslash), so a value cannot draw an escape it lacks
    and the shown text reads back to exactly one text.
    """
    pieces: list[str] = []
    special = False
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == " ":
            j = i
            while j < n and text[j] == " ":
                j += 1
            if i == 0 or j == n or j - i > SPACES_RUN_MAX:
                pieces += [_code_point(" ")] * (j - i)
                special = True
            else:
                pieces.append(" " * (j - i))
            i = j
            continue
        if _allowed(char):
            pieces.append(char)
        else:
            pieces.append(SHORT_ESCAPES.get(char) or _code_point(char))
            special = True
        i += 1
    for k in range(len(pieces) - 2, -1, -1):          # from the end: a doubled one counts for the next
        if pieces[k] == "\\" and pieces[k + 1][0] in "\\ntru":
            pieces[k] = "\\\\"
    return "".join(pieces), special


def _minutes(timeout: float) -> str:
    return f"{int(timeout // 60)}分钟" if timeout % 60 == 0 else f"{timeout:g}秒"


HEADER = "⚠️ 操作确认"
# The message's own words: a label holding one of them is quoted, so it never reads as the message.
OWN_WORDS = ("操作确认", "技能", "参数", "确认码", "回复", "取消", "有效", "尝试")


UNDECLARED = "未声明参数 "          # before the key of a parameter the schema's `properties` does not declare


def _label(key: str, spec: object) -> tuple[str, bool]:
    """A declared parameter's label for people: its `title`, else its key; quoted if it echoes the
    message. Also whether it shows an escape."""
    title = spec.get("title") if isinstance(spec, dict) else None
    label = title.strip() if isinstance(title, str) and title.strip() else key
    label, special = escape_visible(label[:WECHAT_TEXT_MAX + 1])       # cut: see _line()
    if any(word in unicodedata.normalize("NFKC", label) for word in OWN_WORDS):
        label = f"「{label}」"
    return label, special


def _line(label: str, special: bool, value: object) -> str:
    """One parameter line: always "· ", never a raw line break; marked when it shows an escape."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    # Escaping never shortens, so a value cut past one message's length still cannot fit:
    # the cut only keeps a 10 MB argument from costing seconds before it is refused.
    shown, escaped = escape_visible(text[:WECHAT_TEXT_MAX + 1])
    return f"· {label}：{shown}{SPECIAL_MARK if special or escaped else ''}"


def render(row: Approval, code: str, timeout: float, parameters: dict | None = None) -> str:
    """The owner's confirmation message (SPEC §6.4), from the daemon's copy of the row (never model text).

    `parameters` is the skill's schema: its `properties` give labels and order. A parameter it
    does not declare comes after the declared ones as `未声明参数 KEY`, so the model never
    chooses a label. Every parameter line starts with "· " and shows only allow-listed
    characters (the rest escaped, the line marked), so no parameter can pose as a line of the
    message itself or hide what it holds. The result may be longer than one WeChat message;
    such a message is never sent (`fits`), and only then may a value be cut short.
    """
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    declared = [k for k in properties if k in row.params] if isinstance(properties, dict) else []
    lines = [HEADER, "", f"技能：{escape_visible(row.skill_name)[0]}", "参数："]
    for key in declared:
        lines.append(_line(*_label(str(key), properties[key]), row.params[key]) + file_note(properties[key], row.params[key]))
    for key in sorted(k for k in row.params if k not in declared):
        shown, special = escape_visible(str(key)[:WECHAT_TEXT_MAX + 1])
        lines.append(_line(UNDECLARED + shown, special, row.params[key]))
    if not row.params:
        lines.append("（无）")
    lines += ["", f"确认码：{code}", "回复确认码以继续", "回复 0 或「取消」以取消",
              f"({_minutes(timeout)}内有效，最多{MAX_ATTEMPTS}次尝试)"]
    return "\n".join(lines)


def fits(message: str) -> bool:
    """Whether a confirmation message goes out as one WeChat message (never split across several)."""
    return len(message) <= WECHAT_TEXT_MAX
