"""The gate every skill call passes, from the LLM, `/run` or `ias run`: validate, approve, run, audit.

The LLM-visible results are fixed strings (SPEC §5–6): the model learns whether a call ran and
what it returned, never how the owner was asked. Fail closed: when the audit row cannot be
written, nothing runs.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Callable

from . import schema
from .approval import Approvals, Notify
from .audit import redact
from .runner import Runner
from .skills import Registry
from .store import AuditEntry, Store

log = logging.getLogger(__name__)


def rejected(name: str) -> dict:
    return {"success": False, "error": f"用户拒绝了你的调用：{name}"}


def unconfirmed(name: str) -> dict:
    return {"success": False, "error": f"用户没有确认操作：{name}"}


class Gate:
    """Validation, the approval of High-risk calls, the run itself and its audit rows."""

    def __init__(self, registry: Registry, runner: Runner, store: Store, approvals: Approvals):
        self.registry = registry
        self.runner = runner
        self.store = store
        self.approvals = approvals
        self._validators: dict[str, Callable[[object], list[str]]] = {}   # compiled once per skill

    async def call(self, user_id: str, name: str, arguments: dict | str | None, notify: Notify | None = None) -> dict:
        """Call skill `name` for `user_id`; `notify` reaches the owner for an approval (None = cannot ask)."""
        skill = self.registry.get(name)
        if skill is None:
            await self.store.audit(AuditEntry("skill_unknown", user_id=user_id, skill_name=str(name)[:200]))
            return {"success": False, "error": f"未知技能：{name}"}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return await self._invalid(user_id, skill, None, [f"$: arguments are not valid JSON ({exc.msg})"])
            except (ValueError, RecursionError) as exc:     # past the int digit limit, or the parser's stack
                why = "nested too deeply" if isinstance(exc, RecursionError) else "a number has too many digits"
                return await self._invalid(user_id, skill, None, [f"$: arguments are not usable JSON ({why})"])
        if arguments is None:
            arguments = {}
        params = schema.apply_defaults(arguments, skill.parameters)
        validator = self._validators.get(name)
        if validator is None:
            validator = self._validators[name] = schema.compile(skill.parameters)
        errors = validator(params)
        if errors:
            return await self._invalid(user_id, skill, params, errors)

        approval_id = None
        decision = "auto"
        if skill.high:
            outcome = await self.approvals.request(user_id, skill, params, notify)
            if outcome.status == "rejected":
                return rejected(name)
            if outcome.status != "approved":
                return unconfirmed(name)
            params = outcome.approval.params        # exactly what the owner saw and confirmed
            approval_id = outcome.approval.id
            decision = "approved"

        await self.store.audit(AuditEntry("skill_started", user_id=user_id, skill_name=name, params=redact(params),
                                          risk=skill.risk, approval_id=approval_id, decision=decision))
        started = time.monotonic()
        result = await self.runner.run(skill, params)
        llm = result.to_llm()
        await self.store.audit(AuditEntry(
            "skill_finished", user_id=user_id, skill_name=name, risk=skill.risk, approval_id=approval_id,
            decision="timeout" if result.timed_out else decision, exit_code=result.exit_code,
            duration_ms=int((time.monotonic() - started) * 1000), output_size=result.output_size,
            truncated=result.truncated or result.overflowed))
        if approval_id is not None:
            await self.store.record_result(approval_id, llm)
        return llm

    async def _invalid(self, user_id: str, skill, params, errors: list[str]) -> dict:
        await self.store.audit(AuditEntry("skill_invalid", user_id=user_id, skill_name=skill.name,
                                          params=redact(params) if isinstance(params, dict) else None,
                                          risk=skill.risk, decision="invalid", detail="；".join(errors)[:2000]))
        return {"success": False, "error": "参数错误：" + "；".join(errors)}
