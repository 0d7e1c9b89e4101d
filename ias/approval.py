"""The approval gate's heart: confirmation codes, their HMAC, the owner's message and replies.

A High-risk call creates one `pending_approvals` row, sends the owner a message rendered from
that row (the only place the code ever appears) and waits, event-driven, until the owner's
reply or the timeout settles it. Every transition is one compare-and-set UPDATE in the store,
committed with its audit row, so a code works at most once even with concurrent replies. The
store gets finished values: the HMAC over the params as the row will hold them
(`Store.normalised`), and each transition's audit row.
A call is not asked at all when its message would not fit one WeChat message, or when the
owner's message that led to it already asked APPROVALS_PER_TURN approvals (`TurnBudget`).
Not handled: approving from a different user or channel than the one the call came from.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import unicodedata
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from .audit import redact
from .errors import ConfigError, StoreError
from .limits import APPROVALS_PER_TURN, MARKS_RUN_MAX, SPACES_RUN_MAX, WECHAT_TEXT_MAX
from .locks import UserLocks
from .skills import Skill
from .store import Approval, AuditEntry, Store

log = logging.getLogger(__name__)

HASH_VERSION = "v1"
KEY_MIN_BYTES = 32
MAX_ATTEMPTS = 3                 # also the schema default of attempts_left
CODE_RE = re.compile(r"[0-9]{6}")
CANCEL_WORDS = ("0", "取消")

# Send a text to the owner: True (delivered), False (cannot be), or an asyncio.Event set once a message
# held back (window shut) went out; the approval then waits its normal timeout for it.
Notify = Callable[[str], Awaitable["bool | asyncio.Event"]]


def load_key(path: Path) -> bytes:
    """Read the HMAC key, creating a random one (0600) on first start; refuse a readable-by-others file."""
    path = Path(path)
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:          # e.g. IAS_DATA_DIR names a file
            raise ConfigError(f"cannot create the directory of secret key {path}: {exc.strerror}") from None
        # Written aside, then linked into place: a process starting at the same moment sees either
        # no key or the whole key, never an empty file (link, unlike rename, refuses to replace).
        draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
            try:
                os.link(draft, path)
            except FileExistsError:
                pass
        except OSError as exc:
            raise ConfigError(f"cannot create secret key {path}: {exc.strerror}") from None
        finally:
            try:
                os.unlink(draft)
            except OSError:
                pass
    try:
        mode = path.stat().st_mode
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read secret key {path}: {exc.strerror}") from None
    if mode & 0o077:
        raise ConfigError(f"secret key {path} is readable by others; run: chmod 600 {path}")
    if len(key) < KEY_MIN_BYTES:
        raise ConfigError(f"secret key {path} is shorter than {KEY_MIN_BYTES} bytes")
    return key


def new_code() -> str:
    return f"{secrets.randbelow(10 ** 6):06d}"


def canonical(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def code_hash(key: bytes, approval_id: uuid.UUID, user_id: str, skill_name: str, params: dict, code: str) -> str:
    """HMAC-SHA256 over one JSON array binding the code to this exact approval and call."""
    message = json.dumps([HASH_VERSION, str(approval_id), user_id, skill_name, canonical(params), code],
                         ensure_ascii=False, separators=(",", ":"))
    return f"{HASH_VERSION}:" + hmac.new(key, message.encode("utf-8"), hashlib.sha256).hexdigest()


# Characters that draw nothing (or nothing distinctive) beyond categories Cc/Cf/Zs/Zl/Zp/Co/Cs/Cn:
# Hangul fillers, the braille blank, the ideographic half fill space, invisible combining marks
# (grapheme joiner, Khmer inherent vowels, Mongolian and other variation selectors).
BLANK_LOOKING = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x303F, 0x3164, 0xFFA0]
    + list(range(0x180B, 0x1810)) + list(range(0xFE00, 0xFE10)) + list(range(0xE0100, 0xE01F0)))
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp", "Co", "Cs", "Cn"})
MARKS = frozenset({"Mn", "Me", "Mc"})
_ESCAPE_LIKE = re.compile(r"\\(?:[\\ntr]|u[0-9a-f]{4}|U[0-9a-f]{8})")
SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _code_point(char: str) -> str:
    return f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}"


def _invisible(char: str) -> bool:
    if char == " ":
        return False
    return ord(char) in BLANK_LOOKING or unicodedata.category(char) in INVISIBLE_CATEGORIES


def escape_visible(text: str) -> str:
    """Show every character that could hide or disguise something as an escape (`\\n`, `\\u3000`).

    Escaped: control, format (bidi, zero-width, tags), separators and every space but a plain
    one, private-use, surrogates, unassigned, blank-looking letters and symbols, combining marks
    without a visible base or in runs longer than MARKS_RUN_MAX, and runs of plain spaces
    longer than SPACES_RUN_MAX. A backslash that would read as one of these escapes is doubled.
    """
    out: list[str] = []
    i, n = 0, len(text)
    based = False           # the previous character shown was a visible base for combining marks
    while i < n:
        char = text[i]
        if char == " ":
            j = i
            while j < n and text[j] == " ":
                j += 1
            out.append(" " * (j - i) if j - i <= SPACES_RUN_MAX else "\\u0020" * (j - i))
            i, based = j, False
            continue
        if unicodedata.category(char) in MARKS and ord(char) not in BLANK_LOOKING:
            j = i
            while j < n and unicodedata.category(text[j]) in MARKS and ord(text[j]) not in BLANK_LOOKING:
                j += 1
            run = text[i:j]
            out.append(run if based and len(run) <= MARKS_RUN_MAX else "".join(map(_code_point, run)))
            i, based = j, False
            continue
        if char in SHORT_ESCAPES:
            out.append(SHORT_ESCAPES[char])
            based = False
        elif _invisible(char):
            out.append(_code_point(char))
            based = False
        elif char == "\\" and _ESCAPE_LIKE.match(text, i):
            out.append("\\\\")
            based = False
        else:
            out.append(char)
            based = True
        i += 1
    return "".join(out)


def _minutes(timeout: float) -> str:
    return f"{int(timeout // 60)}分钟" if timeout % 60 == 0 else f"{timeout:g}秒"


HEADER = "⚠️ 操作确认"
# The message's own words: a label holding one of them is quoted, so it never reads as the message.
OWN_WORDS = ("操作确认", "技能", "参数", "确认码", "回复", "取消", "有效", "尝试")


def _label(key: str, spec: object) -> str:
    """A parameter's label for people: the property's `title`, else its key; quoted if it echoes the message."""
    title = spec.get("title") if isinstance(spec, dict) else None
    label = title.strip() if isinstance(title, str) and title.strip() else key
    label = escape_visible(label[:WECHAT_TEXT_MAX + 1])       # cut: see render()
    if any(word in unicodedata.normalize("NFKC", label) for word in OWN_WORDS):
        return f"「{label}」"
    return label


def _ordered(params: dict, parameters: dict | None) -> list[str]:
    """Keys in the schema's property order (as the SKILL.md author wrote them), then the rest sorted."""
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    known = [k for k in properties if k in params] if isinstance(properties, dict) else []
    return known + sorted(k for k in params if k not in known)


def render(row: Approval, code: str, timeout: float, parameters: dict | None = None) -> str:
    """The owner's confirmation message (SPEC §6.4), from the stored row (never from model text).

    `parameters` is the skill's schema, for labels and order. Every parameter line starts with
    "· " and has no raw line break or invisible character, so no parameter can pose as a line of
    the message itself. The result may be longer than one WeChat message; such a message is
    never sent (`fits`), and only then may a value be cut short.
    """
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    lines = [HEADER, "", f"技能：{escape_visible(row.skill_name)}", "参数："]
    for key in _ordered(row.params, parameters):
        value = row.params[key]
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        spec = properties.get(key) if isinstance(properties, dict) else None
        # Escaping never shortens, so a value cut past one message's length still cannot fit:
        # the cut only keeps a 10 MB argument from costing seconds before it is refused.
        lines.append(f"· {_label(str(key), spec)}：{escape_visible(shown[:WECHAT_TEXT_MAX + 1])}")
    if not row.params:
        lines.append("（无）")
    lines += ["", f"确认码：{code}", "回复确认码以继续", "回复 0 或「取消」以取消",
              f"({_minutes(timeout)}内有效，最多{MAX_ATTEMPTS}次尝试)"]
    return "\n".join(lines)


def fits(message: str) -> bool:
    """Whether a confirmation message goes out as one WeChat message (never split across several)."""
    return len(message) <= WECHAT_TEXT_MAX


def parse_reply(text: str) -> str | None:
    """'code' for exactly six ASCII digits, 'cancel' for 0/取消, None for anything else (after NFKC)."""
    normal = unicodedata.normalize("NFKC", text).strip()
    if normal in CANCEL_WORDS:
        return "cancel"
    if CODE_RE.fullmatch(normal):
        return "code"
    return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an approval ended: status approved|rejected|expired, or too_long|too_many when it was
    never asked; and the row (params to run)."""
    status: str
    approval: Approval | None


class TurnBudget:
    """The approvals asked during one owner message (one agent turn): at most APPROVALS_PER_TURN."""
    __slots__ = ("asked",)

    def __init__(self) -> None:
        self.asked = 0


@dataclass(slots=True)
class _Waiter:
    approval: Approval
    skill: Skill
    done: asyncio.Future


class Approvals:
    """Pending approvals of this process: one at a time per user, settled by replies or timeout."""

    def __init__(self, store: Store, key: bytes, timeout: float):
        self.store = store
        self.key = key
        self.timeout = timeout
        self._waiting: dict[str, _Waiter] = {}
        self._turns = UserLocks()

    @staticmethod
    def _entry(row: Approval, decision: str, risk: str | None, detail: str | None = None) -> AuditEntry:
        """The audit row of a transition of `row`, named after its decision."""
        return AuditEntry(f"approval_{decision}", user_id=row.user_id, skill_name=row.skill_name,
                          params=redact(row.params), risk=risk, approval_id=row.id, decision=decision,
                          detail=detail)

    async def request(self, user_id: str, skill: Skill, params: dict, notify: Notify | None,
                      turn: TurnBudget | None = None) -> Outcome:
        """Ask the owner to confirm this call and wait for the outcome; calls queue per user.

        Not asked (nothing stored, one audit row): a message that would not fit one WeChat
        message (too_long), or a call past the turn's APPROVALS_PER_TURN (too_many).
        """
        preview = Approval(uuid.UUID(int=0), None, None, user_id, skill.name, params, "", MAX_ATTEMPTS,
                           "pending", None, None)
        refusal = None
        if not fits(render(preview, "0" * 6, self.timeout, skill.parameters)):
            refusal = "too_long"
        elif turn is not None and turn.asked >= APPROVALS_PER_TURN:
            refusal = "too_many"
        if refusal is not None:
            log.warning("approval for %s not asked: %s", skill.name, refusal)
            await self.store.audit(AuditEntry("approval_refused", user_id=user_id, skill_name=skill.name,
                                              params=redact(params), risk=skill.risk, decision=refusal))
            return Outcome(refusal, None)
        if turn is not None:
            turn.asked += 1
        async with self._turns.hold(user_id):
            return await self._request(user_id, skill, params, notify)

    async def _request(self, user_id: str, skill: Skill, params: dict, notify: Notify | None) -> Outcome:
        approval_id = uuid.uuid4()
        code = new_code()
        try:
            # Hashed over the params as stored (jsonb rewrites numbers), which verification reads back.
            stored = await self.store.normalised(params)
            row = await self.store.create_approval(
                approval_id, user_id, skill.name, stored, self.timeout,
                code_hash(self.key, approval_id, user_id, skill.name, stored, code),
                AuditEntry("approval_requested", user_id=user_id, skill_name=skill.name, params=redact(params),
                           risk=skill.risk, approval_id=approval_id, decision="pending"))
        except StoreError as exc:          # e.g. another process holds this user's pending approval
            log.warning("approval for %s not created: %s; the call is denied", skill.name, exc)
            return Outcome("expired", None)
        waiter = _Waiter(row, skill, asyncio.get_running_loop().create_future())
        self._waiting[user_id] = waiter
        try:
            message = render(row, code, self.timeout, skill.parameters)
            if not fits(message):       # only if the stored row reads longer than the call (jsonb numbers)
                await self._close(waiter, "expired", "too_long")
                return Outcome("too_long", None)
            delivered = False
            if notify is not None:
                try:
                    delivered = await notify(message)
                except Exception:
                    log.exception("approval %s: sending the confirmation message failed", approval_id)
            if not delivered:
                log.warning("approval %s for %s could not be delivered; ending it as expired", approval_id, skill.name)
                return await self._close(waiter, "expired", "delivery_failed")
            remaining = max(0.0, (row.expires_at - row.created_at).total_seconds())
            try:
                return await asyncio.wait_for(asyncio.shield(waiter.done), remaining)
            except asyncio.TimeoutError:
                held_back = isinstance(delivered, asyncio.Event) and not delivered.is_set()
                return await self._close(waiter, "expired", "delivery_failed" if held_back else "timeout")
        finally:
            if self._waiting.get(user_id) is waiter:
                del self._waiting[user_id]
            if not waiter.done.done():
                waiter.done.cancel()

    async def _close(self, waiter: _Waiter, status: str, detail: str) -> Outcome:
        """End a pending approval (rejected/expired); if a reply settled it first, report that instead."""
        row = await self.store.close_approval(
            waiter.approval.id, status, self._entry(waiter.approval, status, waiter.skill.risk, detail))
        if row is None:
            if waiter.done.done() and not waiter.done.cancelled():
                return waiter.done.result()
            row = await self.store.approval(waiter.approval.id)
            status = row.status if row else "expired"
            if status == "pending":
                status = "expired"
        outcome = Outcome(status, row)
        if not waiter.done.done():
            waiter.done.set_result(outcome)
        return outcome

    async def redeem(self, user_id: str, text: str) -> str | None:
        """Handle the owner's reply to their pending approval; returns the text to answer, None if not waiting."""
        waiter = self._waiting.get(user_id)
        if waiter is None:
            return None
        name = waiter.skill.name
        kind = parse_reply(text)
        if kind is None:
            return f"有一个操作正在等待确认（{name}）：请回复 6 位确认码，或回复 0 或「取消」取消。"
        ended = f"该操作已结束：{name}"
        if kind == "cancel":
            outcome = await self._close(waiter, "rejected", "cancel")
            return f"已取消：{name}" if outcome.status == "rejected" else ended
        code = unicodedata.normalize("NFKC", text).strip()
        try:
            row = await self.store.approval(waiter.approval.id)
        except StoreError:
            log.exception("approval %s: cannot read the row; denying", waiter.approval.id)
            return "暂时无法验证确认码，请稍后再试。"
        if row is None or row.status != "pending":
            return ended
        expected = code_hash(self.key, row.id, row.user_id, row.skill_name, row.params, code)
        if row.user_id == user_id and hmac.compare_digest(expected, row.code_hash):
            won = await self.store.approve(row.id, user_id, self._entry(row, "approved", waiter.skill.risk))
            if won is None:
                return ended
            if not waiter.done.done():
                waiter.done.set_result(Outcome("approved", won))
            return f"已确认，正在执行：{name}"
        spent = await self.store.spend_attempt(row.id, user_id,
                                               self._entry(row, "wrong_code", waiter.skill.risk, "wrong code"))
        if spent is None:
            return ended
        if spent.status == "rejected":
            if not waiter.done.done():
                waiter.done.set_result(Outcome("rejected", spent))
            return f"确认码错误，操作已取消：{name}"
        return f"确认码错误，还剩 {spent.attempts_left} 次"

    async def expire_leftovers(self) -> list[Approval]:
        """At start: every pending row belongs to a process that is gone; expire it (reason restart)."""
        expired = []
        for row in await self.store.approvals(limit=None):
            closed = await self.store.close_approval(row.id, "expired", self._entry(row, "expired", None, "restart"))
            if closed is not None:
                expired.append(closed)
        return expired
