"""The gate every skill call passes, from the LLM, `/run` or `ias run`: validate, approve, run, audit.

What the model sees is made by results.py (SPEC §5–6) from the facts gathered here: the model
learns whether a call ran and what it returned, never how the owner was asked. Fail closed:
when the audit row cannot be written, nothing runs.

Once a skill has started, its end is always recorded: the `skill_finished` row and an approved
call's result are written by a task the supervisor shields (its RECORDS group), which neither a
cancelled turn nor a shutdown interrupts (shutdown waits for it, and for the calls still running).
If the store refuses them (the database is down), the owner is told that the call ran, and they
are kept in memory and written when the database is back (a daemon that stops first keeps them in
a file for its next start), so the call is never taken for interrupted. `skill_started` and `skill_finished` carry the same `detail`, a call
tag naming the call and the process that ran it (`call=… pid=… start=…`), so the next daemon
start can give each call whose process died mid-run a `skill_interrupted` row — never a re-run.

Which executor runs a skill is looked up by `Skill.kind` in the mapping the gate is given
(outcome.py: every executor returns one `Outcome`, which alone fills `skill_finished`); the
gate never asks how a skill runs. A call in flight is one frozen `Call`.

A High call first looks for a grant (grants.py) of its user, skill and exact parameters (and task):
one that is used runs the call without asking, decision `granted`, the grant's id in the call tag.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from . import jsonschema as schema, outgoing, results
from .approval import Approvals, Notify, TurnBudget
from .grants import Grants
from .audit import redact
from .limits import ARGUMENTS_MAX, TOOL_NAME_SHOWN
from .memory import taint
from .outcome import Executor, Outcome
from .outgoing import OutFile
from .processes import alive, identity
from .registry import Registry
from .skills import Skill
from .store import AuditEntry, Store
from .supervisor import RECORDS, Supervisor
from .unwritten import End, Unwritten

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Call:
    """A call let through the gate and started: what its `skill_finished` row and approval result need."""
    user_id: str
    skill: Skill
    approval_id: int | None       # the owner's approval of a High call; None for a Low one
    decision: str                 # "auto" | "approved" | "granted"
    tag: str                      # `detail` of its skill_started and skill_finished rows (call_tag)
    started: float                # time.monotonic() when it started
    notify: Notify | None         # reaches the owner when the end of an approved call cannot be saved


class Gate:
    """Validation, the approval of High-risk calls, the run itself and its audit rows."""

    def __init__(self, registry: Registry, executors: Mapping[str, Executor], store: Store, approvals: Approvals,
                 mcp=None, *, supervisor: Supervisor, grants: Grants | None = None):
        self.registry = registry
        self.executors = executors       # Skill.kind -> what runs skills of that kind
        self.mcp = mcp                   # mcp.Servers: finds the tools of a server never listed yet
        self.store = store
        self.approvals = approvals
        self.grants = grants             # High calls the owner granted ahead (None: every one asks)
        self.supervisor = supervisor     # records each call's end; its RECORDS group holds the calls running
        self.records = supervisor.scope(RECORDS)
        self.unwritten = Unwritten(store)        # ends the database refused, until it takes them (a daemon: a file)
        self.calls: dict[str, int] = {}          # user -> their skill calls running now (what a stop word ends)

    async def call(self, user_id: str, name: str, arguments: dict | str | None, notify: Notify | None = None,
                   turn: TurnBudget | None = None, *, for_owner: list[OutFile] | None = None) -> dict:
        """Call skill `name` for `user_id`; `notify` reaches the owner for an approval (None = cannot ask);
        `turn` counts the approvals asked for one owner message; `for_owner` collects the files the call returns
        for the owner (None: the caller cannot send files, and their copies are removed)."""
        size = results.arguments_size(arguments)
        if size > ARGUMENTS_MAX:                # before any lookup or parsing: nothing of it is kept
            await self.store.audit(AuditEntry("skill_refused", user_id=user_id, skill_name=str(name)[:TOOL_NAME_SHOWN],
                                              decision="arguments_too_long",
                                              detail=f"arguments of {size} bytes (limit {ARGUMENTS_MAX})"))
            return results.too_long(name)
        skill = self.registry.get(name)
        if skill is None and self.mcp:
            skill = await self.mcp.discover(str(name))         # a tool of a server never listed yet
        if skill is None:
            await self.store.audit(AuditEntry("skill_unknown", user_id=user_id, skill_name=str(name)[:200]))
            return results.unknown_skill(name)
        if isinstance(arguments, str):
            try:
                arguments = schema.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return await self._invalid(user_id, skill, None, [results.not_json(exc.msg)])
        if arguments is None:
            arguments = {}
        params = schema.apply_defaults(arguments, skill.parameters)
        errors = skill.validator(params)
        if errors:
            return await self._invalid(user_id, skill, params, errors)

        approval_id = None
        decision = "auto"
        tag = call_tag()
        grant = None
        if skill.high and self.grants is not None:
            grant = await self.grants.use(user_id, skill, params, turn.task_id if turn is not None else None)
        if grant is not None:               # the approved params, as the grant's verified row holds them
            params, decision, tag = grant.params, "granted", f"{tag} grant={grant.id}"
        elif skill.high:
            outcome = await self.approvals.request(user_id, skill, params, notify, turn)
            if outcome.status != "approved":
                return results.refused(outcome.status, name)
            # Exactly what the owner saw and confirmed: the approval's copy in this process's memory,
            # never params read back from the database (a writer there cannot choose what runs).
            params = outcome.approval.params
            approval_id = outcome.approval.id
            decision = "approved"

        await self.store.audit(AuditEntry("skill_started", user_id=user_id, skill_name=name, params=redact(params),
                                          risk=skill.risk, approval_id=approval_id, decision=decision, detail=tag))
        call = Call(user_id, skill, approval_id, decision, tag, time.monotonic(), notify)
        taint(skill)                            # an untrusted skill's output taints the turn's memories (memory.py)
        with self.records.hold(), self._running(user_id):     # shutdown waits for the run and its record
            try:
                outcome = await self._executor(skill).run(skill, params, user_id)
            except asyncio.CancelledError:      # the executor ended the run; record that it ended
                self.records.spawn(self._record(call, None), f"end of {name} (cancelled)")
                raise
            await self.supervisor.shield(self._record(call, outcome), f"end of {name}")
        if for_owner is not None:
            for_owner.extend(outcome.files)
        elif outcome.files:
            await asyncio.to_thread(outgoing.discard, outcome.files)
            return results.files_dropped(outcome.result)
        return outcome.result

    @contextmanager
    def _running(self, user_id: str) -> Iterator[None]:
        self.calls[user_id] = self.calls.get(user_id, 0) + 1
        try:
            yield
        finally:
            self.calls[user_id] -= 1
            if not self.calls[user_id]:
                del self.calls[user_id]

    def _executor(self, skill: Skill) -> Executor:
        """What runs skills of `skill.kind`: a `## Execute` script, a `## Builtin` handler, an MCP tool."""
        executor = self.executors.get(skill.kind)
        if executor is None:
            raise RuntimeError(f"{skill.kind} skill {skill.name} but no {skill.kind} executor was given")
        return executor

    async def _record(self, call: Call, outcome: Outcome | None) -> None:
        """skill_finished and the approval's result; if the store refuses, the owner hears the call ran."""
        if outcome is None:
            ended = {"decision": "cancelled", "duration_ms": int((time.monotonic() - call.started) * 1000)}
            llm = results.interrupted(call.skill.name)
        else:
            ended = {**outcome.audit(), "decision": "timeout" if outcome.timed_out else call.decision}
            llm = outcome.result
        entry = AuditEntry("skill_finished", user_id=call.user_id, skill_name=call.skill.name, risk=call.skill.risk,
                           approval_id=call.approval_id, detail=call.tag, **ended)
        end = End(entry, call.approval_id, llm if call.approval_id is not None else None)
        if await end.write(self.store):
            return
        if call.approval_id is not None and call.notify is not None:
            try:
                await call.notify(NOT_SAVED.format(name=call.skill.name))
            except Exception:
                log.exception("approval %s: telling the owner that the result was not saved failed", call.approval_id)
        # Kept and written when the database is back (see unwritten.py); shutdown waits for it (`drain`).
        self.records.spawn(self.unwritten.keep(end), f"unwritten end of {call.skill.name}")

    async def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every started run has recorded its end (and every other record of the
        supervisor is written); whether all did. The daemon's stop does this through `Supervisor.close`."""
        if await self.records.wait(timeout):
            return True
        log.error("%d skill calls or records did not end within %.0fs", self.records.active, timeout)
        return False

    async def record_interrupted(self) -> int:
        """At daemon start: a `skill_interrupted` row for each call whose process died mid-run (never a re-run).

        Calls of processes that still run (a one-off command sharing this database) are left
        alone. An approved call gets the interrupted result, so it never looks un-run.
        """
        count = 0
        for row in await self.store.unfinished_calls():
            match = _CALL_TAG.fullmatch(row.detail or "")
            if match is None or alive(int(match[1]), int(match[2])):
                continue
            log.warning("skill %s (%s) was interrupted: its process ended before the skill did", row.skill_name,
                        row.detail)
            await self.store.audit(AuditEntry(
                "skill_interrupted", user_id=row.user_id, skill_name=row.skill_name, risk=row.risk,
                approval_id=row.approval_id, decision="interrupted", detail=row.detail))
            if row.approval_id is not None:
                await self.store.record_result(row.approval_id, results.interrupted(row.skill_name or ""))
            count += 1
        return count

    async def _invalid(self, user_id: str, skill, params, errors: list[str]) -> dict:
        await self.store.audit(AuditEntry("skill_invalid", user_id=user_id, skill_name=skill.name,
                                          params=redact(params) if isinstance(params, dict) else None,
                                          risk=skill.risk, decision="invalid", detail="；".join(errors)[:2000]))
        return results.invalid(errors)


# -- the end of a run: what the owner hears when it was not saved, and the tag matching its audit rows --

NOT_SAVED = "操作已执行，但结果暂未能保存（数据库恢复后补记）：{name}"
_CALL_TAG = re.compile(r"call=[0-9a-f]{32} pid=(\d+) start=(\d+)(?: grant=\d+)?")


def call_tag() -> str:
    """The `detail` of a call's skill_started and skill_finished rows: the call and its process."""
    pid, start = identity()
    return f"call={uuid.uuid4().hex} pid={pid} start={start}"
