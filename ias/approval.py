"""The approval gate's heart: confirmation codes, their HMAC, the owner's message and replies.

A High-risk call creates one `pending_approvals` row, sends the owner a message rendered from
the daemon's own copy of that row (the only place the code ever appears) and waits,
event-driven, until the owner's reply or the timeout settles it. Every transition is one
compare-and-set UPDATE in the store, committed with its audit row and bound to the row still
being that copy (user, skill, params, HMAC), so a code works at most once even with concurrent
replies, and what runs is the copy the owner saw: a database writer who approves, edits or
deletes the row gets a `tampered` ending, never a run. The store gets finished values: the HMAC
over the params as the row will hold them (`Store.normalised`), and each transition's audit row.
The message itself is confirmation.py's. A code may carry a grant suffix (SPEC §12: `+1h`, `+1d`,
`+N次`): the approval then also creates the grant (grants.py), bound to the approved row.
The time limit is the daemon's own, on the monotonic clock: the wait's timer, and a deadline
checked before each code. The row's `expires_at` is stamped by the database's wall clock and
only informs; a jump of the wall clock neither ends an approval early nor keeps it open.
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Awaitable, Callable

from .audit import redact
from .clock import SYSTEM
from .confirmation import MAX_ATTEMPTS, canonical, fits, render
from .errors import ConfigError, StoreError
from .grants import SUFFIX_HELP, Grants, Term, term as grant_term
from .limits import APPROVALS_PER_TURN
from .locks import UserLocks
from .skills import Skill
from .store import Approval, AuditEntry, Store

log = logging.getLogger(__name__)

HASH_VERSION = "v1"
KEY_MIN_BYTES = 32
CODE_RE = re.compile(r"[0-9]{6}(\+.*)?", re.DOTALL)     # the suffix asks for a grant (grants.py)
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


def code_hash(key: bytes, approval_id: uuid.UUID, user_id: str, skill_name: str, params: dict, code: str) -> str:
    """HMAC-SHA256 over one JSON array binding the code to this exact approval and call."""
    message = json.dumps([HASH_VERSION, str(approval_id), user_id, skill_name, canonical(params), code],
                         ensure_ascii=False, separators=(",", ":"))
    return f"{HASH_VERSION}:" + hmac.new(key, message.encode("utf-8"), hashlib.sha256).hexdigest()



def parse_reply(text: str) -> str | None:
    """'code' for exactly six ASCII digits, alone or with a `+` suffix (a grant, well-formed or not), 'cancel'
    for 0/取消, None for anything else (after NFKC and strip)."""
    normal = unicodedata.normalize("NFKC", text).strip()
    if normal in CANCEL_WORDS:
        return "cancel"
    if CODE_RE.fullmatch(normal):
        return "code"
    return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an approval ended: status approved|rejected|expired|tampered, or too_long|too_many when
    it was never asked; and for approved, the daemon's copy of the row, whose params are what
    the owner was shown and what runs."""
    status: str
    approval: Approval | None


class TurnBudget:
    """The approvals asked during one owner message (one agent turn): at most APPROVALS_PER_TURN; and the
    scheduled task whose turn it is (None: the owner's own message), which a grant approved in it is bound to."""
    __slots__ = ("asked", "task_id")

    def __init__(self, task_id: int | None = None) -> None:
        self.asked = 0
        self.task_id = task_id


@dataclass(slots=True)
class _Waiter:
    approval: Approval          # the daemon's copy of the row, as rendered to the owner
    skill: Skill
    done: asyncio.Future
    lock: asyncio.Lock          # one transition at a time, so a settled outcome is never second-guessed
    deadline: float = float("inf")      # monotonic; set when the wait starts, after the message went out
    task_id: int | None = None          # the scheduled task whose turn asked (a grant approved here is its)


def _tampering(row: Approval | None, bound: Approval) -> str | None:
    """What another writer changed in the row against the daemon's copy `bound`; None if nothing."""
    if row is None:
        return "row deleted"
    changed = [name for name in ("id", "user_id", "skill_name", "code_hash")
               if getattr(row, name) != getattr(bound, name)]
    if canonical(row.params) != canonical(bound.params):
        changed.append("params")
    return f"{', '.join(changed)} changed" if changed else None


TAMPERED = "待确认的操作在数据库中被改动，未执行：{name}"


class Approvals:
    """Pending approvals of this process: one at a time per user, settled by replies or timeout.

    Only the code approves. The daemon keeps its own copy of each pending row, the one it
    rendered; what runs is that copy's params, and every transition is bound to the row still
    holding them (and the HMAC). A row another writer changed, approved or deleted never runs:
    the approval ends `tampered` (the model hears it was not confirmed), whatever ends it.
    """

    def __init__(self, store: Store, key: bytes, timeout: float, monotonic: Callable[[], float] = SYSTEM.monotonic,
                 grants: Grants | None = None):
        self.store = store
        self.grants = grants            # makes the grant a code's suffix asks for (None: a suffix is ignored)
        self.key = key
        self.timeout = timeout
        self.monotonic = monotonic
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
            return await self._request(user_id, skill, params, notify, None if turn is None else turn.task_id)

    async def _request(self, user_id: str, skill: Skill, params: dict, notify: Notify | None,
                       task_id: int | None) -> Outcome:
        approval_id = uuid.uuid4()
        code = new_code()
        try:
            # Hashed over the params as stored (jsonb rewrites numbers), which verification reads back.
            stored = await self.store.normalised(params)
            hashed = code_hash(self.key, approval_id, user_id, skill.name, stored, code)
            row = await self.store.create_approval(
                approval_id, user_id, skill.name, stored, self.timeout, hashed,
                AuditEntry("approval_requested", user_id=user_id, skill_name=skill.name, params=redact(params),
                           risk=skill.risk, approval_id=approval_id, decision="pending"))
        except StoreError as exc:          # e.g. another process holds this user's pending approval
            log.warning("approval for %s not created: %s; the call is denied", skill.name, exc)
            return Outcome("expired", None)
        # The daemon's copy: what it hashed and renders, whatever the INSERT returned (a trigger may rewrite it).
        bound = Approval(approval_id, row and row.created_at, row and row.expires_at, user_id, skill.name, stored,
                         hashed, MAX_ATTEMPTS, "pending", None, None)
        waiter = _Waiter(bound, skill, asyncio.get_running_loop().create_future(), asyncio.Lock(), task_id=task_id)
        self._waiting[user_id] = waiter
        try:
            if _tampering(row, bound) is not None:
                return await self._tampered(waiter, row)
            message = render(bound, code, self.timeout, skill.parameters)
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
            waiter.deadline = self.monotonic() + self.timeout
            try:
                return await asyncio.wait_for(asyncio.shield(waiter.done), self.timeout)
            except asyncio.TimeoutError:
                held_back = isinstance(delivered, asyncio.Event) and not delivered.is_set()
                return await self._close(waiter, "expired", "delivery_failed" if held_back else "timeout")
        finally:
            if self._waiting.get(user_id) is waiter:
                del self._waiting[user_id]
            if not waiter.done.done():
                waiter.done.cancel()

    @staticmethod
    def _settle(waiter: _Waiter, outcome: Outcome) -> Outcome:
        if not waiter.done.done():
            waiter.done.set_result(outcome)
        return outcome

    @staticmethod
    def _settled(waiter: _Waiter) -> Outcome | None:
        """How the approval ended, if it did; a wait given up (its turn cancelled) counts as expired."""
        if not waiter.done.done():
            return None
        return Outcome("expired", None) if waiter.done.cancelled() else waiter.done.result()

    async def _close(self, waiter: _Waiter, status: str, detail: str) -> Outcome:
        """End a pending approval (rejected/expired); if a reply settled it first, report that instead."""
        async with waiter.lock:
            if (settled := self._settled(waiter)) is not None:
                return settled
            return await self._close_locked(waiter, status, detail)

    async def _close_locked(self, waiter: _Waiter, status: str, detail: str) -> Outcome:
        bound = waiter.approval
        row = await self.store.close_approval(bound.id, status, self._entry(bound, status, waiter.skill.risk, detail),
                                              bound)
        if row is not None:
            return self._settle(waiter, Outcome(status, None))
        return await self._unmatched(waiter)

    async def _unmatched(self, waiter: _Waiter) -> Outcome:
        """A transition matched no row: it ended elsewhere, ran out of time, or another writer changed it.

        Called under the waiter's lock, before this process settled the approval, so a row that
        says `approved` was approved by someone else.
        """
        bound = waiter.approval
        row = await self.store.approval(bound.id)
        if row is not None and _tampering(row, bound) is None:
            if row.status in ("rejected", "expired"):           # e.g. another daemon's start expired it
                return self._settle(waiter, Outcome(row.status, None))
            if row.status == "pending":                          # e.g. a code past expires_at from another caller
                closed = await self.store.close_approval(
                    bound.id, "expired", self._entry(bound, "expired", waiter.skill.risk, "timeout"), bound)
                if closed is not None:
                    return self._settle(waiter, Outcome("expired", None))
                row = await self.store.approval(bound.id)
        return await self._tampered(waiter, row)

    async def _tampered(self, waiter: _Waiter, row: Approval | None) -> Outcome:
        """Another writer changed, approved or deleted the row: end it, audit `tampered`, run nothing."""
        bound = waiter.approval
        reason = _tampering(row, bound) or f"status {row.status} set by another writer"
        log.error("approval %s for %s: the stored row was tampered with (%s); nothing runs", bound.id,
                  bound.skill_name, reason)
        await self.store.close_tampered(bound.id, self._entry(bound, "tampered", waiter.skill.risk, reason))
        return self._settle(waiter, Outcome("tampered", None))

    def asking(self, user_id: str) -> str | None:
        """The skill whose confirmation `user_id` is being asked for now (its message is sent while it is), or
        None: the name as data, for whoever delivers the message, never read back out of its text."""
        waiter = self._waiting.get(user_id)
        return waiter.skill.name if waiter is not None else None

    async def redeem(self, user_id: str, text: str) -> str | None:
        """Handle the owner's reply to their pending approval; returns the text to answer, None if not waiting."""
        waiter = self._waiting.get(user_id)
        if waiter is None:
            return None
        name = waiter.skill.name
        kind = parse_reply(text)
        if kind is None:
            return f"有一个操作正在等待确认（{name}）：请回复 6 位确认码，或回复 0 或「取消」取消。"
        if kind == "cancel":
            outcome = await self._close(waiter, "rejected", "cancel")
            return f"已取消：{name}" if outcome.status == "rejected" else self._ended(outcome, name)
        normal = unicodedata.normalize("NFKC", text).strip()
        asked = grant_term(normal[6:]) if len(normal) > 6 else None
        if len(normal) > 6 and asked is None:
            return SUFFIX_HELP                  # a malformed grant suffix costs no attempt
        async with waiter.lock:
            if (settled := self._settled(waiter)) is not None:
                return self._ended(settled, name)
            return await self._try_code(waiter, normal[:6], asked)

    async def _try_code(self, waiter: _Waiter, code: str, asked: Term | None = None) -> str:
        """One code attempt against the daemon's copy, under the waiter's lock; the text to answer. A right
        code with a grant suffix (`asked`) also creates the grant (the approving call is its first use)."""
        bound, name, risk = waiter.approval, waiter.skill.name, waiter.skill.risk
        if self.monotonic() >= waiter.deadline:         # its time is up; the timer has not fired yet
            return self._ended(await self._close_locked(waiter, "expired", "timeout"), name)
        attempt = code_hash(self.key, bound.id, bound.user_id, bound.skill_name, bound.params, code)
        if hmac.compare_digest(attempt, bound.code_hash):
            won = await self.store.approve(bound, attempt, self._entry(bound, "approved", risk), within_deadline=True)
            if won is None:
                return self._ended(await self._unmatched(waiter), name)
            if _tampering(won, bound) is not None:           # the approving UPDATE returned another row
                return self._ended(await self._tampered(waiter, won), name)
            approved = replace(bound, status="approved")
            self._settle(waiter, Outcome("approved", approved))     # first: nothing may come between it and approve
            note = "" if asked is None or self.grants is None else \
                await self.grants.create(approved, waiter.skill, asked, waiter.task_id)
            return f"已确认，正在执行：{name}{note}"
        spent = await self.store.spend_attempt(bound, self._entry(bound, "wrong_code", risk, "wrong code"),
                                               within_deadline=True)
        if spent is None or _tampering(spent, bound) is not None:
            outcome = await (self._unmatched(waiter) if spent is None else self._tampered(waiter, spent))
            return self._ended(outcome, name)
        if spent.status == "rejected":
            self._settle(waiter, Outcome("rejected", None))
            return f"确认码错误，操作已取消：{name}"
        return f"确认码错误，还剩 {spent.attempts_left} 次"

    @staticmethod
    def _ended(outcome: Outcome, name: str) -> str:
        return TAMPERED.format(name=name) if outcome.status == "tampered" else f"该操作已结束：{name}"

    async def reject(self, user_id: str, detail: str) -> bool:
        """End `user_id`'s pending approval as rejected (the stop word: `detail` stop); whether one was."""
        waiter = self._waiting.get(user_id)
        return waiter is not None and (await self._close(waiter, "rejected", detail)).status == "rejected"

    async def expire_leftovers(self) -> list[Approval]:
        """At start: every pending row belongs to a process that is gone; expire it (reason restart).

        Nothing is ever run here: a row some other writer set to approved is left as it is.
        """
        expired = []
        for row in await self.store.approvals(limit=None):
            closed = await self.store.close_approval(row.id, "expired", self._entry(row, "expired", None, "restart"))
            if closed is not None:
                expired.append(closed)
        return expired
