"""The skill registry: system skills overridden by user skills, reloaded without a restart.

`Registry.reload()` re-reads only the SKILL.md files whose stat signature changed; a parsed-spec
cache in the data directory makes the `skills` listing fast; the tools an `## MCP` server last
listed (cached per server) become skills named `<skill>__<tool>`. What a reload may not do (lower
a risk) and what the owner is told of it are decided in changes.py; `take_changes()` hands those
facts out.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import jsonschema as schema, speccache
from .changes import Change, Changes
from .errors import SkillError
from .limits import MCP_DESCRIPTION_MAX, MCP_SCHEMA_NODES_TOTAL, SCHEMA_NODES_MAX, SKILL_PARSE_SPLIT_MIN
from .sandbox import for_config, refusal
from .skills import NAME_RE, McpServer, McpTool, Skill, _clip, read_skill

log = logging.getLogger(__name__)


class Registry:
    """The loaded skills by name, with the problems (not loaded) and warnings (loaded) found.

    `reload()` re-reads only the SKILL.md files whose stat signature (mtime, size, inode) changed,
    so the daemon can call it before every turn. A skill whose new version does not load keeps
    its last good version; a problem is logged once, and queued once for `take_new_problems`.
    No risk goes down before the process restarts, and what changed is queued for `take_changes`
    (changes.py).
    """

    def __init__(self, skills: dict[str, Skill] | None = None, problems: tuple[str, ...] = (),
                 warnings: tuple[str, ...] = (), *, roots: tuple[tuple[Path, str], ...] = (),
                 allow_risk_downgrade: frozenset[str] | set[str] = frozenset(), cache: Path | None = None,
                 mcp_cache: Path | None = None, confine: Callable[[Skill | McpServer, str], str | None] | None = None,
                 lazy: bool = False):
        self.skills: dict[str, Skill] = dict(skills or {})
        self.problems = tuple(problems)
        self.warnings = tuple(warnings)
        self.generation = 0                  # bumped on every change of the loaded set
        self._roots = roots
        self._allow = frozenset(allow_risk_downgrade)
        # Keyed by the SKILL.md's path as text (thousands of Path objects cost more than the parsing).
        self._seen: dict[str, tuple] = {}    # SKILL.md -> stat signature at its last parse
        self._dirs: dict[str, tuple[str, str | None]] = {}   # SKILL.md -> its directory's name, root resolved
        self._parsed: dict[str, Skill | McpServer | SkillError] = {}
        self._good: dict[str, Skill | McpServer] = {}    # last version of each file that loaded
        self._reported: set[str] = set()
        self._unreported: list[str] = []
        self._sorted: list[Skill] | None = None
        self._cache = cache                  # parsed specs by stat signature (for `ias skills`), or None
        self._lazy = lazy                    # validators built at first use (a listing calls none)
        self.servers: dict[str, McpServer] = {}     # `## MCP` skills by name
        self._mcp_cache = mcp_cache          # the directory of each MCP server's last tool list, or None
        self._confine = confine              # (spec, source) -> why its sandbox keeps it from loading here, or None
        self._listed: dict[str, tuple[McpServer, Listing]] = {}   # server -> its last listing, and for which spec
        self.changes = Changes()

    def get(self, name: str) -> Skill | None:
        return self.skills.get(name)

    def compiled(self, server: str) -> dict:
        """The tool schemas compiled for `server`'s last listing (for mcp_skills to reuse)."""
        listed = self._listed.get(server)
        return listed[1].compiled if listed is not None else {}

    def set_tools(self, server: McpServer, listing: Listing) -> bool:
        """A server's tools as listed now (start, `tools/list_changed`): its old tool skills give way.
        A name taken by a skill of another kind is left to that skill. Whether the listing holds only
        tools of the first listing, unchanged (changes.py)."""
        as_first = self.changes.as_first(server, listing.digests)
        self._listed[server.name] = (server, listing)
        made = self.changes.hold(self.changes.tools(server, listing.skills, listing.digests))
        for name in [n for n, s in self.skills.items() if s.mcp is not None and s.mcp.server == server.name]:
            del self.skills[name]
        for name, skill in made.items():
            if name not in self.skills:
                self.skills[name] = skill
        self.generation += 1
        self._sorted = None
        return as_first

    def take_changes(self) -> list[Change]:
        """Skills added or changed since the last call (none for those loaded at start), each handed out once."""
        return self.changes.take()

    def __iter__(self):
        if self._sorted is None:
            self._sorted = sorted(self.skills.values(), key=lambda s: s.name)
        return iter(self._sorted)

    def __len__(self) -> int:
        return len(self.skills)

    def _scan(self) -> dict[str, tuple]:
        """Every SKILL.md directly under the roots (its path as text), with its stat signature; no file is read.
        Its directory's name, and its root resolved (once per root) unless the directory is a link, go to `_dirs`."""
        found: dict[str, tuple] = {}
        self._dirs = {}
        for root, source in self._roots:
            try:
                entries = sorted(os.scandir(root), key=lambda e: e.name)
                real_root = os.path.realpath(root)
            except OSError:
                continue
            for entry in entries:
                name = entry.name
                if name.startswith("."):      # as glob("*/SKILL.md") did: hidden directories are not skills
                    continue
                path = entry.path + "/SKILL.md"
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                try:
                    self._dirs[path] = (name, None if entry.is_symlink() else real_root)
                except OSError:
                    self._dirs[path] = (name, None)
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
        cached = speccache.read(self._cache) if self._cache else {}
        todo = []
        for path, signature in seen.items():
            if self._seen.get(path) != signature:
                hit = cached.get(path)
                if hit is not None and hit[0] == signature:
                    self._parsed[path] = hit[1]
                else:
                    todo.append(path)
        parsed, encoded = self._parse(todo, seen)
        self._parsed.update(parsed)
        fresh = any(not isinstance(outcome, McpServer) for outcome in parsed.values())   # servers are not cached
        for gone in set(self._parsed) - set(seen):
            del self._parsed[gone]
            self._good.pop(gone, None)
        self._seen = seen
        cacheable = sum(not isinstance(outcome, McpServer) for outcome in self._parsed.values())
        if self._cache and (fresh or len(cached) != cacheable):
            speccache.write(self._cache, {path: (seen[path], self._parsed[path]) for path in seen}, encoded)
        problems: list[str] = []
        system: dict[str, Skill] = {}
        user: dict[str, Skill] = {}
        servers: dict[str, McpServer] = {}
        tool_warnings: list[str] = []
        for path, signature in seen.items():
            source, outcome = signature[0], self._parsed[path]
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
                listing = self._listing(outcome)
                if listing is not None:
                    found.update(self.changes.tools(outcome, listing.skills, listing.digests))
                    problems.extend(listing.problems)
                    tool_warnings.extend(listing.warnings)
                continue
            found[outcome.name] = outcome
        skills, warnings = _merge(system, user, self._allow)
        self.changes.files({**{n: s for n, s in skills.items() if s.mcp is None}, **servers}, first)
        skills = self.changes.hold(skills)
        changed = first or skills != self.skills
        self.skills, self.problems, self.warnings = skills, tuple(problems), (*tool_warnings, *warnings)
        self.servers = servers
        if changed:
            self.generation += 1
            self._sorted = None
        return changed

    def _parse(self, paths: list[str], seen: dict[str, tuple]) -> tuple[dict, speccache.Encoded | None]:
        """The outcome of each SKILL.md of `paths` (for a listing of thousands on two CPUs, in two parts at once),
        and those already encoded for the cache (speccache.parse_split)."""
        def parse(path: str) -> Skill | McpServer | SkillError:
            name, real_root = self._dirs[path]
            try:
                return read_skill(path, name, seen[path][0], self._lazy,
                                  f"{real_root}/{name}" if real_root is not None else None)
            except SkillError as exc:
                return exc
        # Only a listing forks, only with a CPU to spare, and never beside another thread (which may hold a lock).
        if (self._lazy and len(paths) >= SKILL_PARSE_SPLIT_MIN and len(os.sched_getaffinity(0)) > 1
                and threading.active_count() == 1):
            return speccache.parse_split(paths, seen, parse)
        return {path: parse(path) for path in paths}, None

    def _listing(self, server: McpServer) -> Listing | None:
        """The server's tools as skills: its last listing in this process when the spec is the same, else the
        cached list (its compiled schemas reused), else None."""
        listed = self._listed.get(server.name)
        if listed is not None and listed[0] == server:
            return listed[1]
        tools = cached_tools(self._mcp_cache, server) if self._mcp_cache is not None else None
        if not tools:
            return None
        listing = mcp_skills(server, tools, self._allow, self.compiled(server.name))
        self._listed[server.name] = (server, listing)
        return listing

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


def _merge(system: dict[str, Skill], user: dict[str, Skill], allow_risk_downgrade) -> tuple[dict[str, Skill], list[str]]:
    """User skills over system skills; an override never lowers the risk unless allowed."""
    warnings: list[str] = []
    skills = dict(system)
    for name, skill in user.items():
        base = system.get(name)
        if base is not None:
            if base.high and not skill.high and name not in allow_risk_downgrade:
                warnings.append(f"{skill.directory}/SKILL.md:1: user skill '{name}' may not lower the risk of the "
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
                  confine: Callable[[Skill | McpServer, str], str | None] | None = None, lazy: bool = False) -> Registry:
    """Load system skills, then user skills over them; one bad skill never stops the others.
    `cache`: a file of parsed specs by stat signature, read and refreshed (for fast listing).
    An `## MCP` skill's tools come from the last tool list cached in `mcp_cache` (see ias/mcp/servers.py),
    so listing never waits for a server. `lazy`: validators built at their first use (see skills.parse_skill)."""
    roots = tuple((Path(d), source) for d, source in ((system_dir, "system"), (user_dir, "user")) if d)
    reg = Registry(roots=roots, allow_risk_downgrade=allow_risk_downgrade, cache=cache, mcp_cache=mcp_cache,
                   confine=confine, lazy=lazy)
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
    return [f"{skill.directory}/SKILL.md:{skill.parameters_line}: High skill parameters without a title "
            f"(their label in the approval message): {', '.join(untitled)}"]


def registry(config, cached: bool = False) -> Registry:
    """The registry for a Config: system skills, the user's skills dir, its downgrade allow-list;
    `cached`: through $IAS_DATA_DIR/skills.cache.json, validators built at first use (the `skills` listing)."""
    return load_registry(config.system_skills_dir, config.skills_dir, config.allow_risk_downgrade,
                         config.skills_cache if cached else None, config.mcp_cache,
                         confine=load_problem(config), lazy=cached)


# -- MCP tools as skills --

_NOT_NAME = re.compile(r"[^a-z0-9_]")


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


@dataclass(frozen=True, slots=True)
class Listing:
    """A server's `tools/list` as skills, with the risks its SKILL.md and annotations give (the first-listing
    rule and the floor come after, in changes.py)."""
    skills: dict[str, Skill]
    problems: list[str]                    # tools left out
    warnings: list[str]
    digests: dict[str, str] = field(default_factory=dict)    # every listed tool -> _digest of what it says
    compiled: dict = field(default_factory=dict, repr=False)  # tool digest -> _Compiled (reused by the next listing)


@dataclass(frozen=True, slots=True)
class _Compiled:
    """One tool schema made into a validator, or why not; `nodes`: the budget it took."""
    nodes: int
    relaxed: dict | None = None
    dropped: tuple[str, ...] = ()
    validator: Callable[[object], list[str]] | None = None
    problems: tuple[str, ...] = ()
    too_large: bool = False


def _digest(tool: dict) -> str:
    """What a change of makes a tool High until the restart: its name, title, description, schema, annotations."""
    import hashlib                      # here: only MCP tools are digested (~5 ms of every listing)
    said = [tool.get(key) for key in ("name", "title", "description", "annotations", "inputSchema")]
    return hashlib.sha256(json.dumps(said, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
                          .encode("utf-8", "surrogatepass")).hexdigest()


def _compile(given: dict, budget: int) -> _Compiled:
    """`given` relaxed and compiled within `budget` schema nodes (at most SCHEMA_NODES_MAX)."""
    if budget <= 0:
        return _Compiled(0, too_large=True)
    nodes = [budget]
    try:
        relaxed, dropped = schema.relax(given, nodes)
        return _Compiled(budget - nodes[0], relaxed, tuple(dropped), schema.compile(relaxed))
    except schema.SchemaError as exc:
        return _Compiled(budget - max(nodes[0], 0), problems=tuple(exc.problems), too_large=nodes[0] < 0)


def mcp_skills(server: McpServer, tools: list, allow: frozenset[str] | set[str] = frozenset(),
               compiled: dict | None = None) -> Listing:
    """A server's tools (as `tools/list` gave them) as skills; the problems (tools left out) and warnings.

    Bounded by size: each schema may expand to SCHEMA_NODES_MAX nodes, all of them together to
    MCP_SCHEMA_NODES_TOTAL; past either the tool is left out with a warning. `compiled` (a former
    listing's) saves compiling a schema again. CPU-bound: the daemon calls it in a worker thread."""
    where = f"{server.path}:{server.line}"
    skills: dict[str, Skill] = {}
    problems: list[str] = []
    warnings: list[str] = []
    digests: dict[str, str] = {}
    reused = compiled or {}
    kept: dict[str, _Compiled] = {}
    left = MCP_SCHEMA_NODES_TOTAL
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            problems.append(f"{where}: mcp server '{server.name}' listed a tool without a name")
            continue
        raw = tool["name"]
        given = tool.get("inputSchema")
        try:
            key = _digest(tool)
            digests.setdefault(raw, key)
        except (ValueError, TypeError, RecursionError):
            problems.append(f"{where}: tool '{_clip(raw)}' cannot be read (nested too deep)")
            continue
        if server.tools is not None and raw not in server.tools:
            continue
        name = tool_skill_name(server.name, raw)
        label = f"{where}: tool '{_clip(raw)}' ({name})"
        if not NAME_RE.match(name) or name in skills:
            problems.append(f"{label}: the name breaks ^[a-z][a-z0-9_]{{0,63}}$ or is taken by another tool")
            continue
        if given is None:
            given = {"type": "object"}
        if not isinstance(given, dict) or given.get("type", "object") != "object":
            problems.append(f"{label}: inputSchema must be a JSON Schema object with \"type\": \"object\"")
            continue
        made = kept.get(key) or reused.get(key)
        if made is None or made.nodes > left:
            made = _compile(given, min(SCHEMA_NODES_MAX, left))
        left -= made.nodes
        whole = made.nodes >= SCHEMA_NODES_MAX      # refused for its own size, not for what the others took
        if not made.too_large or whole:
            kept[key] = made
        if made.too_large:
            warnings.append(f"{label}: not loaded: its schema passes " + (
                f"{SCHEMA_NODES_MAX} nodes after $ref expansion" if whole
                else f"what is left of {MCP_SCHEMA_NODES_TOTAL} schema nodes for all of the server's tools"))
            continue
        if made.validator is None:
            problems.extend(f"{label}: {_clip(p, 300)}" for p in made.problems)
            continue
        warnings.extend(f"{label}: {d}; ignored for validation (the model still sees it)" for d in made.dropped)
        risk = server.tools.get(raw, server.risk) if server.tools is not None else server.risk
        annotations = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else {}
        # Annotations can only raise a risk (readOnlyHint never lowers one): they are the server's word.
        destructive = annotations.get("destructiveHint") is True or (
            annotations.get("readOnlyHint") is False and annotations.get("destructiveHint") is not False)
        if destructive and risk == "low" and name not in allow:
            warnings.append(f"{label}: the server marks it destructive; kept High (allow it with "
                            "[skills] allow_risk_downgrade in ias.toml)")
            risk = "high"
        description = tool.get("description") if isinstance(tool.get("description"), str) else ""
        title = tool.get("title") if isinstance(tool.get("title"), str) else raw
        description = description.strip()[:MCP_DESCRIPTION_MAX] or title.strip() or raw
        skills[name] = Skill(name=name, title=title, description=description, risk=risk,
                             parameters=made.relaxed, execute="", timeout=server.timeout, env=server.env,
                             directory=server.directory, validator=made.validator, source=server.source,
                             parameters_line=server.line, kind="mcp", mcp=McpTool(server.name, raw, given),
                             sandbox=server.sandbox, trusted=server.trusted)
    listed = {t.get("name") for t in tools if isinstance(t, dict)}
    for missing in sorted(set(server.tools or ()) - listed):
        warnings.append(f"{where}: '## Tools' names '{_clip(missing)}', which the server does not list")
    return Listing(skills, problems, warnings, digests, kept)


def load_problem(config):
    """For the registry: (spec, source) -> why that skill does not load under `config`'s sandbox, or None —
    a `## Sandbox` path inside the data directory or the repository, or a user skill or MCP server on a host
    below the full level. The level is probed only when such a skill is there."""
    box = for_config(config)
    refused_here = functools.cache(lambda: refusal(config, box))     # the same for every skill

    def problem(spec, source: str) -> str | None:
        user = source == "user" or isinstance(spec, McpServer)
        return box.refused(spec.sandbox) or (refused_here() if user else None)
    return problem
