"""Built-in skills: the in-process handlers a SKILL.md's `## Builtin` section names.

The spec (description, risk, parameters, timeout) still comes from SKILL.md, and the gate
validates, approves and audits a built-in call exactly as a script skill's; only the execution
differs: `Handlers.run` calls a handler here instead of spawning a process, and returns the
same `Outcome` as every executor (no exit code: no process ran). So no database URL reaches
any skill's environment and no `ias` process starts per call. The names a SKILL.md may use are
the grammar's (`skills.BUILTIN_NAMES`); `HANDLERS` maps each to its method here. The memory
skills only dispatch to `memory.Memory`, which decides what is kept and whether it is used.

Not handled: a handler cannot be cancelled mid-statement by its timeout beyond what asyncio
cancellation gives (a database statement in flight is abandoned, not rolled back twice).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Awaitable, Callable

from . import results
from .clock import TZ
from .cron import describe, parse_schedule
from .errors import IasError
from .limits import FIND_SKILLS_DEFAULT, MEMORY_RECALL_DEFAULT
from .memory import Memory, Refused
from .outcome import Outcome
from .registry import Registry
from .scheduler import TaskError, add_task, remove_task, set_enabled, update_task
from .skills import Skill
from .store import Store

# `## Builtin` name (skills.BUILTIN_NAMES) -> method of Handlers.
HANDLERS = {"tasks.list": "tasks_list", "tasks.manage": "tasks_manage", "skills.find": "skills_find",
            "memory.remember": "memory_remember", "memory.recall": "memory_recall", "memory.forget": "memory_forget"}


class Handlers:
    """The handlers, over the objects they need."""

    def __init__(self, store: Store, registry: Registry, rank: Callable[[str, int], list[str]],
                 memory: Memory | None = None):
        self.store = store
        self.registry = registry
        self.rank = rank                  # (query, limit) -> skill names, best first
        self.memory = memory              # the memory skills' (memory.py decides; these only dispatch)

    async def run(self, skill: Skill, params: dict, user_id: str) -> Outcome:
        """Run the handler `skill.builtin` within the skill's timeout."""
        handler: Callable[[dict, str], Awaitable[dict]] = getattr(self, HANDLERS[skill.builtin])
        started = time.monotonic()
        try:
            result = await asyncio.wait_for(handler(params, user_id), skill.timeout)
        except TimeoutError:
            return Outcome(skill.name, results.timed_out(skill.name, skill.timeout),
                           duration=time.monotonic() - started, timed_out=True)
        except IasError as exc:            # a store error: the call failed, the model hears why
            return Outcome(skill.name, results.handler_failed(str(exc)), duration=time.monotonic() - started)
        size = len(json.dumps(result, ensure_ascii=False).encode("utf-8"))
        shown = results.of_handler(result)
        return Outcome(skill.name, shown, duration=time.monotonic() - started, output_size=size,
                       truncated=shown is not result)

    async def tasks_list(self, params: dict, user_id: str) -> dict:
        tasks = await self.store.tasks(include_disabled=bool(params.get("include_disabled")))
        return {"success": True, "tasks": [task_json(t, upcoming(t)[:1]) for t in tasks]}

    async def tasks_manage(self, params: dict, user_id: str) -> dict:
        action = params["action"]
        try:
            if action == "add":
                missing = [k for k in ("name", "schedule", "text") if not params.get(k)]
                if missing:
                    return _fail(f"add needs: {', '.join(missing)}")
                task = await add_task(self.store, user_id, params["name"], params["schedule"],
                                      params.get("kind", "reminder"), params["text"])
                return {"success": True, "action": action, "task": task_json(task, upcoming(task))}
            if "id" not in params:
                return _fail(f"{action} needs the task id (see list_scheduled_tasks)")
            task_id = params["id"]
            if action == "delete":
                await remove_task(self.store, task_id)
                return {"success": True, "action": action, "task": {"removed": task_id}}
            if action == "update":
                changes = {k: params[k] for k in ("name", "schedule", "kind", "text") if k in params}
                if not changes:
                    return _fail("update needs at least one of name, schedule, kind, text")
                task = await update_task(self.store, task_id, **changes)
            else:
                task = await set_enabled(self.store, task_id, action == "resume")
        except TaskError as exc:
            return _fail(str(exc))
        return {"success": True, "action": action, "task": task_json(task, upcoming(task))}

    async def skills_find(self, params: dict, user_id: str) -> dict:
        limit = params.get("limit", FIND_SKILLS_DEFAULT)
        found = []
        for name in self.rank(str(params.get("query", "")), limit):
            skill = self.registry.get(name)
            if skill is not None:
                found.append({"name": name, "description": one_line(skill.description)})
        return {"success": True, "skills": found}

    async def memory_remember(self, params: dict, user_id: str) -> dict:
        try:
            row, same = await self._memory().remember(user_id, str(params.get("text", "")))
        except Refused as exc:
            return _fail(str(exc))
        if row is None:
            return {"success": True, "id": same, "status": "active", "note": "already remembered"}
        result = {"success": True, "id": row.id, "status": row.status}
        if row.status != "active":
            result["note"] = (f"this turn read outside content, so the memory is kept unverified and not used "
                              f"until the owner checks it (/memory ok {row.id})")
        return result

    async def memory_recall(self, params: dict, user_id: str) -> dict:
        found = await self._memory().recall(user_id, str(params.get("query", "")),
                                            params.get("limit", MEMORY_RECALL_DEFAULT))
        return {"success": True, "memories": [{"id": i, "text": text} for i, text in found]}

    async def memory_forget(self, params: dict, user_id: str) -> dict:
        try:
            row = await self._memory().forget(user_id, params["id"], by="forget")
        except Refused as exc:
            return _fail(str(exc))
        if row is None:
            return _fail(f"no memory {params['id']} (see recall)")
        return {"success": True, "forgotten": row.id}

    def _memory(self) -> Memory:
        if self.memory is None:
            raise RuntimeError("a memory skill ran but the handlers were built without memory")
        return self.memory


def _fail(message: str) -> dict:
    return {"success": False, "error": message}


def one_line(text: str, limit: int = 160) -> str:
    """The first line of a description, cut to `limit` characters."""
    first = text.strip().split("\n", 1)[0].strip()
    return first if len(first) <= limit else first[:limit - 1] + "…"


def upcoming(task) -> list:
    """The task's next run and the two after it, in Beijing time; none when paused or done."""
    if not task.enabled or task.next_run_at is None:
        return []
    first = task.next_run_at.astimezone(TZ)
    return [first, *describe(parse_schedule(task.schedule, anchor=task.created_at), first, 2)]


def task_json(task, runs: list) -> dict:
    """A task as `ias tasks --json` and the task skills show it."""
    return {"id": task.id, "name": task.name, "schedule": task.schedule, "kind": task.kind, "text": task.text,
            "enabled": task.enabled, "user": task.user_id,
            "next_runs": [t.strftime("%Y-%m-%d %H:%M:%S") for t in runs]}
