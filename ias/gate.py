"""The gate every skill call passes, from the LLM, `/run` or `ias run`: validate, approve, run, audit.

What the model sees is made by results.py (SPEC §5–6) from the facts gathered here: the model
learns whether a call ran and what it returned, never how the owner was asked. Fail closed:
when the audit row cannot be written, nothing runs.

Once a skill has started, its end is always recorded: the `skill_finished` row and an approved
call's result are written by a task of their own, which neither a cancelled turn nor a
shutdown interrupts (shutdown waits for it, see `drain`). If the store refuses them (the
database is down), the owner is told that the call ran, and they are kept in memory and written
when the database is back (a daemon that stops first keeps them in a file for its next start),
so the call is never taken for interrupted. `skill_started` and `skill_finished` carry the same `detail`, a call
tag naming the call and the process that ran it (`call=… pid=… start=…`), so the next daemon
start can give each call whose process died mid-run a `skill_interrupted` row — never a re-run.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid

from . import results, schema
from .approval import Approvals, Notify, TurnBudget
from .audit import redact
from .builtins import Builtins
from .limits import ARGUMENTS_MAX, TOOL_NAME_SHOWN
from .runner import Runner, RunResult, alive, identity
from .registry import Registry
from .store import AuditEntry, Store
from .unwritten import End, Unwritten

log = logging.getLogger(__name__)


class Gate:
    """Validation, the approval of High-risk calls, the run itself and its audit rows."""

    def __init__(self, registry: Registry, runner: Runner, store: Store, approvals: Approvals,
                 builtins: Builtins | None = None, mcp=None):
        self.registry = registry
        self.runner = runner
        self.builtins = builtins
        self.mcp = mcp                                    # mcp.Servers: runs the skills made of MCP tools
        self.store = store
        self.approvals = approvals
        self._inflight: set[asyncio.Future] = set()       # runs started whose end is not recorded yet
        self._finishing: set[asyncio.Task] = set()
        self.unwritten = Unwritten(store)        # ends the database refused, until it takes them (a daemon: a file)

    async def call(self, user_id: str, name: str, arguments: dict | str | None, notify: Notify | None = None,
                   turn: TurnBudget | None = None) -> dict:
        """Call skill `name` for `user_id`; `notify` reaches the owner for an approval (None = cannot ask);
        `turn` counts the approvals asked for one owner message."""
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
        if skill.high:
            outcome = await self.approvals.request(user_id, skill, params, notify, turn)
            if outcome.status != "approved":
                return results.refused(outcome.status, name)
            # Exactly what the owner saw and confirmed: the approval's copy in this process's memory,
            # never params read back from the database (a writer there cannot choose what runs).
            params = outcome.approval.params
            approval_id = outcome.approval.id
            decision = "approved"

        tag = call_tag()
        await self.store.audit(AuditEntry("skill_started", user_id=user_id, skill_name=name, params=redact(params),
                                          risk=skill.risk, approval_id=approval_id, decision=decision, detail=tag))
        started = time.monotonic()
        running = asyncio.get_running_loop().create_future()     # resolved once the end is recorded
        self._inflight.add(running)
        finishing = None
        try:
            try:
                result, llm = await self._execute(skill, params, user_id)
            except asyncio.CancelledError:       # the runner killed the group; record that it ended
                finishing = self._finish(running, user_id, skill, approval_id, decision, tag, started, None,
                                         results.interrupted(name), notify)
                raise
            finishing = self._finish(running, user_id, skill, approval_id, decision, tag, started, result, llm, notify)
            await asyncio.shield(finishing)
            return llm
        finally:
            if finishing is None:                # the runner failed: nothing to record, nothing to wait for
                self._inflight.discard(running)
                running.set_result(None)

    async def _execute(self, skill, params: dict, user_id: str):
        """Run the skill by its kind — an MCP tool through its server, a `## Builtin` handler in
        process, else its `## Execute` script; (facts, the model-visible result)."""
        if skill.mcp is not None:
            call = await self.mcp.call(skill, params)
            return call, results.of_mcp(call)
        if skill.builtin is not None:
            if self.builtins is None:
                raise RuntimeError(f"built-in skill {skill.name} but no built-in handlers were given")
            run = await self.builtins.run(skill, params, user_id)
        else:
            run = await self.runner.run(skill, params)
        return run, results.of_run(run)

    def _finish(self, running: asyncio.Future, user_id: str, skill, approval_id, decision: str, tag: str,
                started: float, result: RunResult | None, llm: dict, notify: Notify | None) -> asyncio.Task:
        """Record the end of a run in a task of its own, so no cancellation can cut it short."""
        task = asyncio.ensure_future(self._record(user_id, skill, approval_id, decision, tag, started, result, llm,
                                                  notify))
        self._finishing.add(task)

        def done(_task) -> None:
            self._finishing.discard(task)
            self._inflight.discard(running)
            if not running.done():
                running.set_result(None)
        task.add_done_callback(done)
        return task

    async def _record(self, user_id: str, skill, approval_id, decision: str, tag: str, started: float,
                      result: RunResult | None, llm: dict, notify: Notify | None) -> None:
        """skill_finished and the approval's result; if the store refuses, the owner hears the call ran."""
        ended = {"decision": "cancelled"} if result is None else {
            "decision": "timeout" if result.timed_out else decision, "exit_code": result.exit_code,
            "output_size": result.output_size, "truncated": results.truncated(result)}
        entry = AuditEntry("skill_finished", user_id=user_id, skill_name=skill.name, risk=skill.risk,
                           approval_id=approval_id, detail=tag, duration_ms=int((time.monotonic() - started) * 1000),
                           **ended)
        end = End(entry, approval_id, llm if approval_id is not None else None)
        if await end.write(self.store):
            return
        if approval_id is not None and notify is not None:
            try:
                await notify(NOT_SAVED.format(name=skill.name))
            except Exception:
                log.exception("approval %s: telling the owner that the result was not saved failed", approval_id)
        # Kept and written when the database is back (see unwritten.py); shutdown waits for it (`drain`).
        keeper = asyncio.ensure_future(self.unwritten.keep(end))
        self._finishing.add(keeper)
        keeper.add_done_callback(self._finishing.discard)

    async def drain(self, timeout: float) -> bool:
        """Shutdown: wait up to `timeout` s until every started run has recorded its end; whether all did."""
        pending = [f for f in (*self._inflight, *self._finishing) if not f.done()]
        if not pending:
            return True
        done, left = await asyncio.wait(pending, timeout=timeout)
        if left:
            log.error("%d skill calls did not record their end within %.0fs", len(left), timeout)
        return not left

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
_CALL_TAG = re.compile(r"call=[0-9a-f]{32} pid=(\d+) start=(\d+)")


def call_tag() -> str:
    """The `detail` of a call's skill_started and skill_finished rows: the call and its process."""
    pid, start = identity()
    return f"call={uuid.uuid4().hex} pid={pid} start={start}"
