"""What one skill call did, whichever executor ran it: the one shape the gate audits and returns.

An executor is anything with `async run(skill, params, user) -> Outcome`: the script runner
(runner.Runner), the built-in handlers (handlers.Handlers) and the MCP servers (mcp.Servers).
The gate picks one by `Skill.kind` and never asks which it was; the `skill_finished` audit row
and the result the model reads come from the Outcome alone.

`RunResult` is the script runner's own facts about one process (its output, why it ended),
kept here beside Outcome so results.py can read them without importing the runner.

Not handled here: what the model reads is made by results.py (each executor calls it); an MCP
server's raw answer stays in ias/mcp/.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .outgoing import OutFile, Refused
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
    files: tuple[OutFile, ...] = ()    # files for the owner, copied out of the run (only a script returns files)

    @property
    def success(self) -> bool:
        return self.result.get("success") is True

    def audit(self) -> dict:
        """The `skill_finished` columns this call fills (AuditEntry keywords); `decision` is the gate's."""
        return {"exit_code": self.exit_code, "output_size": self.output_size, "truncated": self.truncated,
                "duration_ms": int(self.duration * 1000)}


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one run did: exit status, held output and why it ended — facts only; `results.of_run`
    turns them into what the model sees."""
    skill: str
    exit_code: int | None        # negative = killed by that signal
    stdout: str                  # held stdout, at most OUTPUT_HELD_MAX bytes before decoding
    stderr: str                  # the tail of stderr
    timed_out: bool
    overflowed: bool             # stdout passed OUTPUT_HELD_MAX and the group was killed
    timeout: float               # the timeout that applied
    duration: float              # seconds from spawn to the end of the run
    output_size: int             # stdout bytes seen, held or not
    started_at: float            # time.monotonic() right after the spawn
    files: tuple[OutFile, ...] = ()      # the files its result named that were copied out (outgoing.take)
    refused: tuple[Refused, ...] = ()    # and those that were not, with why


class Executor(Protocol):
    """Runs a skill of one kind; every member returns an Outcome and raises only when cancelled."""

    async def run(self, skill: Skill, params: dict, user: str) -> Outcome: ...
