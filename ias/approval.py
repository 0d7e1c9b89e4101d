"""The approval gate's heart: confirmation codes, their HMAC, the owner's message and replies.

A High-risk call creates one `pending_approvals` row, sends the owner a message rendered from
that row (the only place the code ever appears) and waits, event-driven, until the owner's
reply or the timeout settles it. Every transition is one compare-and-set UPDATE in the store,
committed with its audit row, so a code works at most once even with concurrent replies.
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
from .skills import Skill
from .store import Approval, AuditEntry, Store

log = logging.getLogger(__name__)

HASH_VERSION = "v1"
KEY_MIN_BYTES = 32
MAX_ATTEMPTS = 3                 # also the schema default of attempts_left
CODE_RE = re.compile(r"[0-9]{6}")
CANCEL_WORDS = ("0", "取消")

Notify = Callable[[str], Awaitable[bool]]     # send a text to the owner; False = not delivered


def load_key(path: Path) -> bytes:
    """Read the HMAC key, creating a random one (0600) on first start; refuse a readable-by-others file."""
    path = Path(path)
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:          # e.g. IAS_DATA_DIR names a file
            raise ConfigError(f"cannot create the directory of secret key {path}: {exc.strerror}") from None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"cannot create secret key {path}: {exc.strerror}") from None
        else:
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
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


def escape_visible(text: str) -> str:
    """Show control, bidi, zero-width and other invisible characters as escapes (`\\n`, `\\u202e`)."""
    out = []
    for char in text:
        if char == "\n":
            out.append("\\n")
        elif char == "\t":
            out.append("\\t")
        elif char == "\r":
            out.append("\\r")
        elif unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs", "Cn") or char == "\u3164":
            out.append(f"\\u{ord(char):04x}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08x}")
        else:
            out.append(char)
    return "".join(out)


def _minutes(timeout: float) -> str:
    return f"{int(timeout // 60)}分钟" if timeout % 60 == 0 else f"{timeout:g}秒"


def render(row: Approval, code: str, timeout: float) -> str:
    """The owner's confirmation message, from the stored row (never from model text)."""
    lines = ["⚠️ 操作确认", f"技能：{escape_visible(row.skill_name)}", "参数："]
    for key in sorted(row.params):
        value = row.params[key]
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        lines.append(f"{escape_visible(str(key))}: {escape_visible(shown)}")
    if not row.params:
        lines[-1] += "（无）"
    lines += [f"确认码：{code}", "回复确认码以继续", "回复 0 或「取消」以取消",
              f"({_minutes(timeout)}内有效，最多{MAX_ATTEMPTS}次尝试)"]
    return "\n".join(lines)


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
    """How an approval ended: status approved|rejected|expired, and the row (params to run)."""
    status: str
    approval: Approval | None


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
        self._turns: dict[str, asyncio.Lock] = {}

    def waiting(self, user_id: str) -> bool:
        return user_id in self._waiting

    @staticmethod
    def _entry(skill: Skill, detail: str | None = None):
        """An audit-row builder for a transition, named after the status the row ends in."""
        def build(row: Approval) -> AuditEntry:
            decision = "wrong_code" if row.status == "pending" else row.status
            return AuditEntry(f"approval_{decision}", user_id=row.user_id, skill_name=row.skill_name,
                              params=redact(row.params), risk=skill.risk, approval_id=row.id,
                              decision=decision, detail=detail)
        return build

    async def request(self, user_id: str, skill: Skill, params: dict, notify: Notify | None) -> Outcome:
        """Ask the owner to confirm this call and wait for the outcome; calls queue per user."""
        async with self._turns.setdefault(user_id, asyncio.Lock()):
            return await self._request(user_id, skill, params, notify)

    async def _request(self, user_id: str, skill: Skill, params: dict, notify: Notify | None) -> Outcome:
        approval_id = uuid.uuid4()
        code = new_code()
        try:
            row = await self.store.create_approval(
                approval_id, user_id, skill.name, params, self.timeout,
                lambda stored: code_hash(self.key, approval_id, user_id, skill.name, stored, code),
                AuditEntry("approval_requested", user_id=user_id, skill_name=skill.name, params=redact(params),
                           risk=skill.risk, approval_id=approval_id, decision="pending"))
        except StoreError as exc:          # e.g. another process holds this user's pending approval
            log.warning("approval for %s not created: %s; the call is denied", skill.name, exc)
            return Outcome("expired", None)
        waiter = _Waiter(row, skill, asyncio.get_running_loop().create_future())
        self._waiting[user_id] = waiter
        try:
            delivered = False
            if notify is not None:
                try:
                    delivered = await notify(render(row, code, self.timeout))
                except Exception:
                    log.exception("approval %s: sending the confirmation message failed", approval_id)
            if not delivered:
                log.warning("approval %s for %s could not be delivered; ending it as expired", approval_id, skill.name)
                return await self._close(waiter, "expired", "delivery_failed")
            remaining = max(0.0, (row.expires_at - row.created_at).total_seconds())
            try:
                return await asyncio.wait_for(asyncio.shield(waiter.done), remaining)
            except asyncio.TimeoutError:
                return await self._close(waiter, "expired", "timeout")
        finally:
            if self._waiting.get(user_id) is waiter:
                del self._waiting[user_id]
            if not waiter.done.done():
                waiter.done.cancel()

    async def _close(self, waiter: _Waiter, status: str, detail: str) -> Outcome:
        """End a pending approval (rejected/expired); if a reply settled it first, report that instead."""
        row = await self.store.close_approval(
            waiter.approval.id, status, self._entry(waiter.skill, detail))
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
            won = await self.store.approve(row.id, user_id, self._entry(waiter.skill))
            if won is None:
                return ended
            if not waiter.done.done():
                waiter.done.set_result(Outcome("approved", won))
            return f"已确认，正在执行：{name}"
        spent = await self.store.spend_attempt(row.id, user_id, self._entry(waiter.skill, "wrong code"))
        if spent is None:
            return ended
        if spent.status == "rejected":
            if not waiter.done.done():
                waiter.done.set_result(Outcome("rejected", spent))
            return f"确认码错误，操作已取消：{name}"
        return f"确认码错误，还剩 {spent.attempts_left} 次"

    async def expire_leftovers(self) -> list[Approval]:
        """At start: every pending row belongs to a process that is gone; expire it (reason restart)."""
        return await self.store.expire_leftovers(lambda row: AuditEntry(
            "approval_expired", user_id=row.user_id, skill_name=row.skill_name, params=redact(row.params),
            approval_id=row.id, decision="expired", detail="restart"))
