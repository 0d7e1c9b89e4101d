"""Grants (SPEC §12): an approval whose code carried `+1h`, `+1d` or `+N次` lets later equal calls run
without a new code.

A grant is bound to one user, one skill and the exact parameters the owner approved (canonical JSON
of the params as stored, after defaults), and either to any call of that user or, when the approval
was asked during a scheduled task's turn, only to that task's calls (a chat grant also serves the
user's task calls: this is how "a task created with a High call may carry a grant" is read — the
grant comes from the approval of the task's own first High call, or from the same call approved in
chat). It ends at `expires_at` (a count grant too, after GRANT_COUNT_LIFE), when used up or revoked;
execute_shell and `- unconfined` skills never get more than GRANT_CAPPED seconds. N counts the
approving call (it is the first use).

What a grant allows is decided here, never by the database: each row carries `mac`, an HMAC keyed
with a key derived from the secret key (which the database never sees), over id, user, skill,
canonical params, task, uses_max, expires_at (whole epoch seconds) and approval id. A row whose MAC
does not match is `tampered` (audited, ignored; the call asks for a code as usual), so a database
writer cannot mint a grant or widen one (more uses, a later expiry, other params, skill, task or
user). `lookup`, a keyed digest of (user, skill), and the params compared as stored (jsonb text) find
a call's candidates in one indexed query, which also normalises the call's params. A use is one
compare-and-set UPDATE bound to every field the MAC covers, committed with its
`granted` audit row.

What the MAC cannot cover, `uses` and `revoked_at` (they change after the owner approved), this
process guards in memory: the highest `uses` it saw per grant and the grants it revoked; a row whose
uses went down or that was un-revoked is `tampered` too. Not handled: across a restart that memory is
gone, so a database writer can still reset `uses` or clear `revoked_at` of a genuine grant and get
calls the owner approved (same skill and params) run more often than approved — but only until its
MAC-bound `expires_at` (at most GRANT_COUNT_LIFE, GRANT_CAPPED for shell/unconfined), which is why
every grant expires. A writer can always end or spoil a grant (the call then asks again). Expiry is
judged by this daemon's wall clock, not the database's.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Callable

from .audit import redact
from .clock import SYSTEM, stamp
from .confirmation import canonical, escape_visible
from .limits import (GRANT_CANDIDATES_MAX, GRANT_CAPPED, GRANT_COUNT_LIFE, GRANT_DAY, GRANT_HOUR, GRANT_PARAMS_SHOWN,
                     GRANT_USE_TRIES, GRANT_USES_MAX, GRANTS_LISTED_MAX)
from .skills import Skill
from .store import Approval, AuditEntry, Grant, Store

log = logging.getLogger(__name__)

MAC_VERSION = "v1"
_MAC_LABEL = b"ias grant v1"             # the MAC key: HMAC(secret key, label); distinct from the code key
_LOOKUP_LABEL = b"ias grant lookup v1"
SUFFIX_RE = re.compile(r"\+(?:(1h)|(1d)|([0-9]{1,2})次)", re.IGNORECASE)
CAPPED_SKILLS = ("execute_shell",)       # besides every `- unconfined` skill

# The owner's words (Chinese, SPEC §12).
SUFFIX_HELP = (f"授权格式不对：请回复「确认码+1h」「确认码+1d」或「确认码+N次」（N 为 1–{GRANT_USES_MAX}），"
               "或只回复确认码。本次不计入尝试次数。")
NOT_SAVED = "（授权未能保存，之后仍需确认）"
NONE_ACTIVE = "没有有效的授权。"
REVOKE_USAGE = "用法：/revoke 编号 或 /revoke all（编号见 /grants）"


@dataclass(frozen=True, slots=True)
class Term:
    """What a code's suffix asks for: `seconds` of a time grant, or `uses` of a count grant (approving call
    included); `shown` names it for the owner."""
    seconds: int | None
    uses: int | None
    shown: str


def term(suffix: str) -> Term | None:
    """The grant `suffix` (the reply after its six digits, NFKC and stripped) asks for; None when malformed."""
    match = SUFFIX_RE.fullmatch(suffix)
    if match is None:
        return None
    if match[1]:
        return Term(GRANT_HOUR, None, "1 小时")
    if match[2]:
        return Term(GRANT_DAY, None, "1 天")
    uses = int(match[3])
    return Term(None, uses, f"{uses} 次") if 1 <= uses <= GRANT_USES_MAX else None


def capped(skill: Skill) -> bool:
    """Whether grants of `skill` last GRANT_CAPPED seconds at most: execute_shell and unconfined skills."""
    return skill.name in CAPPED_SKILLS or skill.sandbox.unconfined


def _epoch(moment: datetime) -> int | None:
    """Whole seconds since the epoch, or None for a moment between two (a grant never has one)."""
    seconds = moment.timestamp()
    return int(seconds) if seconds == int(seconds) else None


class Grants:
    """Creating, finding and using, listing and revoking the grants; the MAC decides what counts."""

    def __init__(self, store: Store, key: bytes, now: Callable[[], datetime] | None = None):
        self.store = store
        self._mac_key = hmac.new(key, _MAC_LABEL, hashlib.sha256).digest()
        self._lookup_key = hmac.new(key, _LOOKUP_LABEL, hashlib.sha256).digest()
        self.now = now or SYSTEM.now          # expiry is judged by the daemon's wall clock
        self._seen: dict[int, int] = {}         # grant id -> highest `uses` this process saw (verified rows only)
        self._revoked: set[int] = set()         # grants this process revoked

    def mac(self, grant: Grant) -> str:
        message = json.dumps([MAC_VERSION, grant.id, grant.user_id, grant.skill_name, canonical(grant.params),
                              grant.task_id, grant.uses_max, _epoch(grant.expires_at), str(grant.approval_id)],
                             ensure_ascii=False, separators=(",", ":"))
        return f"{MAC_VERSION}:" + hmac.new(self._mac_key, message.encode("utf-8"), hashlib.sha256).hexdigest()

    def lookup(self, user_id: str, skill_name: str) -> str:
        message = json.dumps([user_id, skill_name], ensure_ascii=False, separators=(",", ":"))
        return hmac.new(self._lookup_key, message.encode("utf-8"), hashlib.sha256).hexdigest()

    async def create(self, approved: Approval, skill: Skill, asked: Term, task_id: int | None) -> str:
        """The grant `asked` for along the approval `approved` (the daemon's copy, params as stored), its
        first use being the approving call; the note the owner's answer ends with. A store error only
        costs the grant (the approved call runs as approved)."""
        now = self.now()
        life = asked.seconds if asked.seconds is not None else GRANT_COUNT_LIFE
        cut = capped(skill) and life > GRANT_CAPPED
        life = min(life, GRANT_CAPPED) if capped(skill) else life
        try:
            draft = Grant(await self.store.grant_id(), now, approved.user_id, approved.skill_name, approved.params,
                          task_id, asked.uses, 1, (now + timedelta(seconds=life)).replace(microsecond=0),
                          approved.id, "", None)
            grant = replace(draft, mac=self.mac(draft))
            await self.store.create_grant(grant, self.lookup(grant.user_id, grant.skill_name),
                                          self._entry("grant_created", grant, skill, "created"))
        except Exception:
            log.exception("grant for %s (approval %s) not created", skill.name, approved.id)
            return NOT_SAVED
        self._seen[grant.id] = grant.uses
        return _note(asked, life, task_id is not None, cut)

    async def use(self, user_id: str, skill: Skill, params: dict, task_id: int | None) -> Grant | None:
        """Use a grant for this call (params after defaults; `task_id` of the task whose turn makes it, or
        None): the grant, its use audited (`granted`), or None (the call asks for a code as usual)."""
        lookup = self.lookup(user_id, skill.name)
        for _ in range(GRANT_USE_TRIES):
            now = self.now()
            raced = False
            stored, rows = await self.store.grant_candidates(lookup, params, task_id, now)
            for row in rows[:GRANT_CANDIDATES_MAX]:
                problem = self._problem(row, user_id, skill.name, stored, task_id)
                if problem is not None:
                    await self._tampered(row, skill, problem)
                    continue
                if not _usable(row, now):
                    continue
                used = await self.store.use_grant(row, now, self._entry("grant_used", row, skill, "granted",
                                                                        _uses(replace(row, uses=row.uses + 1))))
                if used is None:            # used, ended or changed since it was read: read them again
                    raced = True
                    continue
                self._seen[used.id] = max(self._seen.get(used.id, 0), used.uses)
                if (problem := self._problem(used, user_id, skill.name, stored, task_id)) is not None:
                    await self._tampered(used, skill, f"after use: {problem}")      # the UPDATE was bound to it
                    return None
                return used
            if not raced:
                return None
        return None

    def _problem(self, row: Grant, user_id: str, skill_name: str, params: dict, task_id: int | None) -> str | None:
        """Why `row` is not a grant the owner approved for this call; None if it is one."""
        if not hmac.compare_digest(self.mac(row), row.mac):
            return "MAC does not match"
        if (row.user_id, row.skill_name, canonical(row.params)) != (user_id, skill_name, canonical(params)):
            return "found for another call"         # its lookup digest was copied from another row
        if row.task_id is not None and row.task_id != task_id:
            return "bound to another task"
        if row.uses < self._seen.get(row.id, 0):
            return f"uses went down from {self._seen[row.id]} to {row.uses}"
        if row.id in self._revoked:
            return "revoked by this daemon, un-revoked in the database"
        return None

    async def _tampered(self, row: Grant, skill: Skill, problem: str) -> None:
        log.error("grant %s for %s does not match what the owner approved (%s); ignored", row.id, skill.name, problem)
        await self.store.audit(AuditEntry("grant_tampered", user_id=row.user_id, skill_name=skill.name,
                                          risk=skill.risk, decision="tampered", detail=f"grant={row.id}: {problem}"))

    @staticmethod
    def _entry(event: str, grant: Grant, skill: Skill, decision: str, detail: str | None = None) -> AuditEntry:
        return AuditEntry(event, user_id=grant.user_id, skill_name=grant.skill_name, params=redact(grant.params),
                          risk=skill.risk, approval_id=grant.approval_id, decision=decision,
                          detail=detail or _uses(grant))

    async def active(self, user_id: str) -> list[Grant]:
        """`user_id`'s grants that would serve a call now (verified; tampered rows left out), oldest first."""
        now = self.now()
        rows = await self.store.grants(user_id, now, GRANTS_LISTED_MAX)
        return [row for row in rows if _usable(row, now) and hmac.compare_digest(self.mac(row), row.mac)
                and row.user_id == user_id and row.uses >= self._seen.get(row.id, 0) and row.id not in self._revoked]

    async def listing(self, user_id: str) -> str:
        """/grants: each active grant with its id (what /revoke takes), skill, limit, task and parameters."""
        grants = await self.active(user_id)
        if not grants:
            return NONE_ACTIVE
        lines = ["有效的授权："]
        for grant in grants:
            limit = f"至 {stamp(grant.expires_at, seconds=False)}"
            if grant.uses_max is not None:
                limit = f"已用 {grant.uses}/{grant.uses_max} 次，{limit}"
            task = await self.store.task(grant.task_id) if grant.task_id is not None else None
            scope = "" if grant.task_id is None else \
                f"，仅定时任务「{escape_visible(task.name)[0] if task else grant.task_id}」"
            text = canonical(redact(grant.params))
            shown = escape_visible(text[:GRANT_PARAMS_SHOWN])[0] + ("…" if len(text) > GRANT_PARAMS_SHOWN else "")
            lines += [f"#{grant.id} {escape_visible(grant.skill_name)[0]}：{limit}{scope}", f"  参数：{shown}"]
        lines.append("用 /revoke 编号 或 /revoke all 撤销。")
        return "\n".join(lines)

    async def revoke(self, user_id: str, which: str) -> str:
        """/revoke N | /revoke all: end `user_id`'s grant N (or all of them), audited `grant_revoked` each."""
        which = which.strip().lower().lstrip("#")
        if which in ("all", "全部"):
            grant_id = None
        elif which.isascii() and which.isdigit() and len(which) <= 18:
            grant_id = int(which)
        else:
            return REVOKE_USAGE
        ids = await self.store.revoke_grants(user_id, grant_id, self.now(),
                                             AuditEntry("grant_revoked", user_id=user_id, decision="revoked"))
        self._revoked.update(ids)
        if grant_id is not None:
            return f"已撤销授权 #{grant_id}。" if ids else f"没有编号为 {grant_id} 的有效授权（/grants 查看）。"
        return f"已撤销全部授权（{len(ids)} 个）。" if ids else NONE_ACTIVE


def _usable(grant: Grant, now: datetime) -> bool:
    """Not revoked, used up or expired at `now` (checked here too: the database's filter is not trusted)."""
    return (grant.revoked_at is None and grant.expires_at > now
            and (grant.uses_max is None or grant.uses < grant.uses_max))


def _uses(grant: Grant) -> str:
    """A use's audit detail: `grant=ID uses=K/N`, or `uses=K until=…` for a time grant."""
    if grant.uses_max is not None:
        return f"grant={grant.id} uses={grant.uses}/{grant.uses_max}"
    return f"grant={grant.id} uses={grant.uses} until={grant.expires_at.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"


def _note(asked: Term, life: int, task: bool, cut: bool) -> str:
    """What the approval's answer adds: the grant made, its scope and limit, and whether it was capped."""
    whom = "本定时任务" if task else ""
    within = _duration(life)
    if asked.uses is not None:
        text = f"已授权{whom}相同参数共 {asked.uses} 次免确认（含本次），{within}内有效"
    else:
        text = f"已授权{whom} {within}内相同参数免确认"
    return f"（{text}；此技能最长授权 {_duration(GRANT_CAPPED)}）" if cut else f"（{text}）"


def _duration(seconds: int) -> str:
    if seconds % GRANT_DAY == 0:
        return f"{seconds // GRANT_DAY} 天"
    return f"{seconds // GRANT_HOUR} 小时" if seconds % GRANT_HOUR == 0 else f"{seconds // 60} 分钟"
