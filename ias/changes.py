"""What this process has seen of its skills: the floor under every risk, and what the owner is told.

Three rules of SPEC §5, in one place so that a reviewer can read them in one sitting:

- A reload never lowers a risk: a name that was High at any time since the process started stays
  High until the next restart, whatever a SKILL.md now says (an edit down to Low, a new skill
  planted under the name of a High one, a user skill over a system skill).
- A Low risk is never inferred for an MCP tool: it keeps the Low that `## Risk Level` or `## Tools`
  gives it only while it is the tool of the server's first listing in this process (from the
  cached list when there is one, else the first `tools/list`), unchanged in name, title,
  description, schema and annotations, from the same command line. A tool that appears later or
  changes is High until the restart.
- The owner is told once of every added skill and every change of a skill's risk, `## Execute`
  (or `## Builtin`), `## Sandbox`, `## MCP` (and `## Tools`) or `## Env` — never of the set
  loaded at start. A server's tools are told one by one only when they appear or change under an
  unchanged command line (a new command is told once, as the server's change).

Facts only: `take()` hands out `Change`s; the daemon's wiring turns them into the owner's messages.
Not handled: a restart by the owner is the only way to lower a risk again, and nothing is persisted
across restarts except what the MCP tool cache holds.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from .skills import McpServer, Skill

log = logging.getLogger(__name__)

ADDED, LOWERED, MODIFIED = "added", "lowered", "modified"
_LOGGED = {ADDED: "added", LOWERED: "asks for a lower risk; kept High until the restart", MODIFIED: "changed"}


@dataclass(frozen=True, slots=True)
class Change:
    """One change the owner hears about once: a skill `added`, its risk `lowered` (held High until the
    restart), or otherwise `modified`."""
    name: str
    kind: str


def _state(spec: Skill | McpServer) -> tuple:
    """What a change of is told: risk, how it runs (## Execute, ## Builtin, ## MCP with ## Tools), ## Sandbox, ## Env,
    ## Trusted."""
    sandbox = getattr(spec, "sandbox", None)
    if isinstance(spec, McpServer):
        return ("mcp", spec.risk, tuple(sorted((spec.tools or {}).items())), spec.command, sandbox, spec.env, spec.trusted)
    return ("skill", spec.risk, spec.execute, spec.builtin, sandbox, spec.env, spec.trusted)


def _lowered(name: str, before: tuple | None, after: tuple, high: set[str]) -> bool:
    """Whether `after` asks for less than what was High: the risk, or (a server) one of its `## Tools`."""
    if after[1] == "low" and (name in high if before is None else before[1] == "high"):
        return True
    if after[0] != "mcp" or before is None or before[0] != "mcp":
        return False
    was = dict(before[2])
    return any(risk == "low" and was.get(tool) == "high" for tool, risk in after[2])


class Changes:
    """The High names, the last told state of each SKILL.md, each server's first listing, the changes not yet taken."""

    def __init__(self):
        self.high: set[str] = set()                      # every name that was High since the process started
        self._states: dict[str, tuple] = {}              # SKILL.md name -> _state at the last reload
        self._first: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}   # server -> (command, tool -> digest)
        self._told: set[tuple[str, str]] = set()         # (tool skill, kind) told already
        self._pending: list[Change] = []

    def files(self, specs: dict[str, Skill | McpServer], first: bool) -> None:
        """The SKILL.md skills and servers loaded now; a Change for each one added or changed (none on `first`)."""
        states = {name: _state(spec) for name, spec in specs.items()}
        if not first:
            for name, after in states.items():
                before = self._states.get(name)
                if before == after:
                    continue
                kind = LOWERED if _lowered(name, before, after, self.high) else ADDED if before is None else MODIFIED
                self._queue(Change(name, kind))
        self._states = states
        self.high.update(name for name, spec in specs.items() if isinstance(spec, McpServer) and spec.risk == "high")

    def as_first(self, server: McpServer, digests: dict[str, str]) -> bool:
        """Whether a listing holds nothing but tools of the server's first listing, unchanged (or is the first)."""
        first = self._first.get(server.name)
        return first is None or (first[0] == server.command and all(first[1].get(t) == d for t, d in digests.items()))

    def tools(self, server: McpServer, skills: dict[str, Skill], digests: dict[str, str]) -> dict[str, Skill]:
        """A server's tool skills with the first-listing rule applied; the first listing seen is remembered."""
        first = self._first.get(server.name)
        if first is None:
            self._first[server.name] = (server.command, dict(digests))
            return skills
        command, known = first
        out = {}
        for name, skill in skills.items():
            tool = skill.mcp.tool
            if command == server.command and known.get(tool) == digests.get(tool):
                out[name] = skill
                continue
            out[name] = replace(skill, risk="high")
            kind = ADDED if tool not in known else MODIFIED
            if command == server.command and (name, kind) not in self._told:
                self._told.add((name, kind))
                self._queue(Change(name, kind), " after the server's first listing; High until the restart")
        return out

    def hold(self, skills: dict[str, Skill]) -> dict[str, Skill]:
        """`skills` with every name that was High kept High; their High names are remembered."""
        out = {name: replace(skill, risk="high") if not skill.high and name in self.high else skill
               for name, skill in skills.items()}
        self.high.update(name for name, skill in out.items() if skill.high)
        return out

    def _queue(self, change: Change, why: str = "") -> None:
        # Logged too: a one-off command (`ias run`) has no owner to tell but its terminal.
        log.warning("skill %s %s%s", change.name, _LOGGED[change.kind], why)
        self._pending.append(change)

    def take(self) -> list[Change]:
        """The changes found since the last call, oldest first (each is handed out once)."""
        changes, self._pending = self._pending, []
        return changes
