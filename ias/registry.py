"""The skill registry: system skills overridden by user skills, reloaded without a restart.

`Registry.reload()` re-reads only the SKILL.md files whose stat signature changed; a parsed-spec
cache in the data directory makes the `skills` listing fast; the tools an `## MCP` server last
listed (cached per server) become skills named `<skill>__<tool>`.
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .errors import SkillError
from .limits import MCP_DESCRIPTION_MAX
from .sandbox import Policy
from .skills import NAME_RE, McpServer, McpTool, Skill, _clip, load_skill

log = logging.getLogger(__name__)


class Registry:
    """The loaded skills by name, with the problems (not loaded) and warnings (loaded) found.

    `reload()` re-reads only the SKILL.md files whose stat signature (mtime, size, inode) changed,
    so the daemon can call it before every turn. A skill whose new version does not load keeps
    its last good version; a problem is logged once, and queued once for `take_new_problems`.
    """

    def __init__(self, skills: dict[str, Skill] | None = None, problems: tuple[str, ...] = (),
                 warnings: tuple[str, ...] = (), *, roots: tuple[tuple[Path, str], ...] = (),
                 allow_risk_downgrade: frozenset[str] | set[str] = frozenset(), cache: Path | None = None,
                 mcp_cache: Path | None = None, confine: Callable[[Skill | McpServer, str], str | None] | None = None):
        self.skills: dict[str, Skill] = dict(skills or {})
        self.problems = tuple(problems)
        self.warnings = tuple(warnings)
        self.generation = 0                  # bumped on every change of the loaded set
        self._roots = roots
        self._allow = frozenset(allow_risk_downgrade)
        self._seen: dict[Path, tuple] = {}   # SKILL.md -> stat signature at its last parse
        self._parsed: dict[Path, Skill | McpServer | SkillError] = {}
        self._good: dict[Path, Skill | McpServer] = {}   # last version of each file that loaded
        self._reported: set[str] = set()
        self._unreported: list[str] = []
        self._sorted: list[Skill] | None = None
        self._cache = cache                  # parsed specs by stat signature (for `ias skills`), or None
        self.servers: dict[str, McpServer] = {}     # `## MCP` skills by name
        self._mcp_cache = mcp_cache          # the directory of each MCP server's last tool list, or None
        self._confine = confine              # (spec, source) -> why its sandbox keeps it from loading here, or None

    def get(self, name: str) -> Skill | None:
        return self.skills.get(name)

    def set_tools(self, server: str, skills: dict[str, Skill]) -> None:
        """A server's tools as listed now (start, `tools/list_changed`): its old tool skills give way.
        A name taken by a skill of another kind is left to that skill."""
        for name in [n for n, s in self.skills.items() if s.mcp is not None and s.mcp.server == server]:
            del self.skills[name]
        for name, skill in skills.items():
            if name not in self.skills:
                self.skills[name] = skill
        self.generation += 1
        self._sorted = None

    def __iter__(self):
        if self._sorted is None:
            self._sorted = sorted(self.skills.values(), key=lambda s: s.name)
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self.skills)

    def _scan(self) -> dict[Path, tuple]:
        """Every SKILL.md directly under the roots, with its stat signature; no file is read."""
        found: dict[Path, tuple] = {}
        for root, source in self._roots:
            try:
                entries = sorted(os.scandir(root), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if entry.name.startswith("."):      # as glob("*/SKILL.md") did: hidden directories are not skills
                    continue
                path = Path(entry.path) / "SKILL.md"
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                found[path] = (source, st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns)
        return found

    def reload(self) -> bool:
        """Notice added, changed and removed skills; whether the loaded set changed."""
        if not self._roots:                 # built from given skills: nothing to read
            return False
        seen = self._scan()
        if seen == self._seen and self.generation:
            return False
        first = not self.generation
        cached = _read_cache(self._cache) if self._cache else {}
        fresh = False
        for path, signature in seen.items():
            if self._seen.get(path) != signature:
                hit = cached.get(str(path))
                if hit is not None and hit[0] == signature:
                    self._parsed[path] = hit[1]
                    continue
                try:
                    self._parsed[path] = load_skill(path.parent, signature[0])
                except SkillError as exc:
                    self._parsed[path] = exc
                fresh = fresh or not isinstance(self._parsed[path], McpServer)   # servers are not cached
        for gone in set(self._parsed) - set(seen):
            del self._parsed[gone]
            self._good.pop(gone, None)
        self._seen = seen
        cacheable = sum(not isinstance(outcome, McpServer) for outcome in self._parsed.values())
        if self._cache and (fresh or len(cached) != cacheable):
            _write_cache(self._cache, {path: (seen[path], self._parsed[path]) for path in seen})
        problems: list[str] = []
        system: dict[str, Skill] = {}
        user: dict[str, Skill] = {}
        servers: dict[str, McpServer] = {}
        tool_warnings: list[str] = []
        for path, (source, *_rest) in seen.items():
            outcome = self._parsed[path]
            if isinstance(outcome, SkillError):
                problems.extend(outcome.problems)
                self._report(outcome.problems, kept=not first and path in self._good)
                outcome = self._good.get(path)
                if outcome is None:
                    continue
            else:
                self._good[path] = outcome
            refused = self._confine(outcome, source) if self._confine is not None else None
            if refused:
                problems.append(f"{path}:1: not loaded: {refused}")
                continue
            found = system if source == "system" else user
            if isinstance(outcome, McpServer):
                servers[outcome.name] = outcome
                tools = cached_tools(self._mcp_cache, outcome) if self._mcp_cache is not None else None
                if tools:
                    made, bad, warned = mcp_skills(outcome, tools, self._allow)
                    found.update(made)
                    problems.extend(bad)
                    tool_warnings.extend(warned)
                continue
            found[outcome.name] = outcome
        skills, warnings = _merge(system, user, self._allow)
        changed = first or skills != self.skills
        self.skills, self.problems, self.warnings = skills, tuple(problems), (*tool_warnings, *warnings)
        self.servers = servers
        if changed:
            self.generation += 1
            self._sorted = None
        return changed

    def _report(self, problems: list[str], kept: bool) -> None:
        new = [p for p in problems if p not in self._reported]
        self._reported.update(new)
        for line in new:
            log.warning("skill not loaded%s: %s", " (its last good version stays)" if kept else "", line)
        if self.generation:
            self._unreported.extend(new)

    def take_new_problems(self) -> list[str]:
        """Problems found by a reload since the first load and not yet handed out (to tell the owner once)."""
        lines, self._unreported = self._unreported, []
        return lines


CACHE_VERSION = 2       # 2: the ## Sandbox policy
_CACHED_FIELDS = ("name", "title", "description", "risk", "parameters", "execute", "timeout", "source",
                  "parameters_line", "builtin")


def _lazy(parameters: dict) -> Callable[[object], list[str]]:
    """The validator of a schema checked when it was cached, compiled at its first use."""
    compiled: Callable[[object], list[str]] | None = None

    def validate(instance: object) -> list[str]:
        nonlocal compiled
        if compiled is None:
            from . import schema
            compiled = schema.compile(parameters)
        return compiled(instance)
    return validate


def _read_cache(file: Path) -> dict[str, tuple[tuple, Skill | SkillError]]:
    """The parsed specs cached by `_write_cache`; empty when missing, stale in format or damaged."""
    try:
        data = json.loads(file.read_bytes())
        if data.get("version") != CACHE_VERSION:
            return {}
        out = {}
        for path, (signature, spec) in data["entries"].items():
            if isinstance(spec, list):
                outcome = SkillError([str(p) for p in spec])
            else:
                outcome = Skill(**{k: spec[k] for k in _CACHED_FIELDS}, env=tuple(spec["env"]),
                                directory=Path(spec["directory"]), validator=_lazy(spec["parameters"]),
                                sandbox=Policy.from_lines(spec["sandbox"]))
            out[path] = (tuple(signature), outcome)
        return out
    except Exception:  # noqa: BLE001 - a cache that cannot be read is only slower, never wrong
        return {}


def _write_cache(file: Path, entries: dict) -> None:
    """Cache every parse outcome by its file's stat signature (written whole, then renamed into place)."""
    out = {}
    for path, (signature, outcome) in entries.items():
        if isinstance(outcome, McpServer):        # parsed again each time: its tools are cached apart
            continue
        if isinstance(outcome, SkillError):
            spec = list(outcome.problems)
        else:
            spec = {k: getattr(outcome, k) for k in _CACHED_FIELDS}
            spec.update(env=list(outcome.env), directory=str(outcome.directory), sandbox=outcome.sandbox.lines())
        out[str(path)] = [list(signature), spec]
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        temporary = file.with_name(f".{file.name}.{os.getpid()}")
        temporary.write_text(json.dumps({"version": CACHE_VERSION, "entries": out}, ensure_ascii=False),
                             encoding="utf-8")
        os.replace(temporary, file)
    except OSError as exc:
        log.debug("skill cache %s not written: %s", file, exc)


def _merge(system: dict[str, Skill], user: dict[str, Skill], allow_risk_downgrade) -> tuple[dict[str, Skill], list[str]]:
    """User skills over system skills; an override never lowers the risk unless allowed."""
    warnings: list[str] = []
    skills = dict(system)
    for name, skill in user.items():
        base = system.get(name)
        if base is not None:
            if base.high and not skill.high and name not in allow_risk_downgrade:
                warnings.append(f"{skill.directory / 'SKILL.md'}:1: user skill '{name}' may not lower the risk of the "
                                "system skill it replaces; kept High (allow it with [skills] allow_risk_downgrade in ias.toml)")
                skill = replace(skill, risk="high")
            skill = replace(skill, overrides=True)
        skills[name] = skill
    for warning in warnings:
        log.warning("%s", warning)
    # For `skills check`, not the log: every command would repeat them.
    warnings.extend(w for skill in skills.values() if skill.high for w in _untitled(skill))
    return skills, warnings


def load_registry(system_dir: Path | None, user_dir: Path | None,
                  allow_risk_downgrade: frozenset[str] | set[str] = frozenset(), cache: Path | None = None,
                  mcp_cache: Path | None = None,
                  confine: Callable[[Skill | McpServer, str], str | None] | None = None) -> Registry:
    """Load system skills, then user skills over them; one bad skill never stops the others.
    `cache`: a file of parsed specs by stat signature, read and refreshed (for fast listing).
    An `## MCP` skill's tools come from the last tool list cached in `mcp_cache` (see mcp.py),
    so listing never waits for a server."""
    roots = tuple((Path(d), source) for d, source in ((system_dir, "system"), (user_dir, "user")) if d)
    reg = Registry(roots=roots, allow_risk_downgrade=allow_risk_downgrade, cache=cache, mcp_cache=mcp_cache,
                   confine=confine)
    reg.reload()
    return reg


def _untitled(skill: Skill) -> list[str]:
    """A warning naming a High skill's parameters without a `title` (their label for the owner)."""
    props = skill.parameters.get("properties")
    if not isinstance(props, dict):
        return []
    untitled = [key for key, sub in props.items() if not (isinstance(sub, dict) and isinstance(sub.get("title"), str))]
    if not untitled:
        return []
    return [f"{skill.directory / 'SKILL.md'}:{skill.parameters_line}: High skill parameters without a title "
            f"(their label in the approval message): {', '.join(untitled)}"]


SKILLS_CACHE = "skills.cache.json"      # in $IAS_DATA_DIR


def registry(config, cached: bool = False) -> Registry:
    """The registry for a Config: system skills, the user's skills dir, its downgrade allow-list;
    `cached`: through $IAS_DATA_DIR/skills.cache.json (the `skills` listing)."""
    from .sandbox import load_problem
    return load_registry(config.system_skills_dir, config.skills_dir, config.allow_risk_downgrade,
                         config.data_dir / SKILLS_CACHE if cached else None, mcp_cache(config),
                         confine=load_problem(config))


# -- MCP tools as skills --

_NOT_NAME = re.compile(r"[^a-z0-9_]")


def mcp_cache(config) -> Path:
    """Where the last tool list of each MCP server is kept."""
    return config.data_dir / "mcp"


def tool_skill_name(server: str, tool: str) -> str:
    """`<skill>__<tool>`, lower-cased, other characters `_` (may still break the name rule: checked by the caller)."""
    return f"{server}__{_NOT_NAME.sub('_', tool.lower())}"


def cached_tools(cache: Path, server: McpServer) -> list | None:
    """The tool list last written for `server` (by the same command line), else None."""
    try:
        data = json.loads((cache / f"{server.name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("command") != list(server.command) or not isinstance(data.get("tools"), list):
        return None
    return data["tools"]


def write_tools(cache: Path, server: McpServer, tools: list) -> None:
    """Keep a server's tool list for the next command (written aside, then renamed into place)."""
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = cache / f"{server.name}.json"
    temp = target.with_suffix(f".{os.getpid()}.tmp")
    temp.write_text(json.dumps({"command": list(server.command), "tools": tools}, ensure_ascii=False), encoding="utf-8")
    os.replace(temp, target)


def mcp_skills(server: McpServer, tools: list, allow: frozenset[str] | set[str] = frozenset()
               ) -> tuple[dict[str, Skill], list[str], list[str]]:
    """A server's tools (as `tools/list` gave them) as skills; and the problems (tools left out) and warnings."""
    from . import schema
    where = f"{server.path}:{server.line}"
    skills: dict[str, Skill] = {}
    problems: list[str] = []
    warnings: list[str] = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            problems.append(f"{where}: mcp server '{server.name}' listed a tool without a name")
            continue
        raw = tool["name"]
        if server.tools is not None and raw not in server.tools:
            continue
        name = tool_skill_name(server.name, raw)
        label = f"{where}: tool '{_clip(raw)}' ({name})"
        if not NAME_RE.match(name) or name in skills:
            problems.append(f"{label}: the name breaks ^[a-z][a-z0-9_]{{0,63}}$ or is taken by another tool")
            continue
        given = tool.get("inputSchema")
        if given is None:
            given = {"type": "object"}
        if not isinstance(given, dict) or given.get("type", "object") != "object":
            problems.append(f"{label}: inputSchema must be a JSON Schema object with \"type\": \"object\"")
            continue
        relaxed, dropped = schema.relax(given)
        warnings.extend(f"{label}: {d}; ignored for validation (the model still sees it)" for d in dropped)
        try:
            validator = schema.compile(relaxed)
        except schema.SchemaError as exc:
            problems.extend(f"{label}: {_clip(p, 300)}" for p in exc.problems)
            continue
        risk = server.tools.get(raw, server.risk) if server.tools is not None else server.risk
        annotations = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else {}
        destructive = annotations.get("destructiveHint") is True or (
            annotations.get("readOnlyHint") is False and annotations.get("destructiveHint") is not False)
        if destructive and risk == "low" and name not in allow:
            warnings.append(f"{label}: the server marks it destructive; kept High (allow it with "
                            "[skills] allow_risk_downgrade in ias.toml)")
            risk = "high"
        description = tool.get("description") if isinstance(tool.get("description"), str) else ""
        title = tool.get("title") if isinstance(tool.get("title"), str) else raw
        description = description.strip()[:MCP_DESCRIPTION_MAX] or title
        skills[name] = Skill(name=name, title=title, description=description, risk=risk,
                             parameters=relaxed, execute="", timeout=server.timeout, env=server.env,
                             directory=server.directory, validator=validator, source=server.source,
                             parameters_line=server.line, mcp=McpTool(server.name, raw, given), sandbox=server.sandbox)
    listed = {t.get("name") for t in tools if isinstance(t, dict)}
    for missing in sorted(set(server.tools or ()) - listed):
        warnings.append(f"{where}: '## Tools' names '{_clip(missing)}', which the server does not list")
    return skills, problems, warnings
