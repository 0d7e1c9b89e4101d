"""What one skill call did, whichever executor ran it: the one shape the gate audits and returns.

An executor is anything with `async run(skill, params, user) -> Outcome`: the script runner
(runner.Runner), the built-in handlers (handlers.Handlers) and the MCP servers (mcp.Servers).
The gate picks one by `Skill.kind` and never asks which it was; the `skill_finished` audit row
and the result the model reads come from the Outcome alone.

Not handled here: what the model reads is made by results.py (each executor calls it), and an
executor's own facts (a process's stdout and stderr, an MCP server's raw answer) stay with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .skills import Skill


@dataclass(frozen=True, slots=True)
class Outcome:
    """One call's end. Fields that do not apply to an executor are None or their zero, never made up."""
    skill: str
    result: dict                   # what the model reads (results.py made it)
    duration: float = 0.0          # seconds the executor spent on the call
    output_size: int = 0           # bytes the call produced: a script's stdout, a handler's or server's answer
    truncated: bool = False        # the model sees less than the call produced
    timed_out: bool = False        # ended by the skill's timeout
    exit_code: int | None = None   # a script's exit status (negative = killed by that signal); None: no process ran

    @property
    def success(self) -> bool:
        return self.result.get("success") is True

    def audit(self) -> dict:
        """The `skill_finished` columns this call fills (AuditEntry keywords); `decision` is the gate's."""
        return {"exit_code": self.exit_code, "output_size": self.output_size, "truncated": self.truncated,
                "duration_ms": int(self.duration * 1000)}


class Executor(Protocol):
    """Runs a skill of one kind; every member returns an Outcome and raises only when cancelled."""

    async def run(self, skill: Skill, params: dict, user: str) -> Outcome: ...
