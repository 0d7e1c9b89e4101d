"""SKILL.md parsing and the skill registry (system skills overridden by user skills)."""
from __future__ import annotations

import json
import logging
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import SkillError
from .limits import MCP_DESCRIPTION_MAX, SKILL_FILE_MAX, SKILL_TIMEOUT_DEFAULT, SKILL_TIMEOUT_MAX

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Skill:
    """One loaded skill: everything the gate, the runner and the LLM need."""
    name: str
    title: str
    description: str
    risk: str                     # "low" | "high"
    parameters: dict              # JSON Schema (object)
    execute: str                  # the bash script of ## Execute
    timeout: float                # seconds
    env: tuple[str, ...]          # names passed through from the daemon's environment
    directory: Path
    validator: Callable[[object], list[str]] = field(repr=False, compare=False)   # compiled `parameters`
    source: str = "user"          # "system" | "user"
    overrides: bool = False       # a user skill replacing a system skill of the same name
    parameters_line: int = 1      # line of the ## Parameters JSON block in SKILL.md, for warnings
    builtin: str | None = None    # the in-process handler of ## Builtin (then `execute` is empty)
    mcp: McpTool | None = None    # run as a tool of an MCP server instead of `execute`

    @property
    def high(self) -> bool:
        return self.risk == "high"


@dataclass(frozen=True, slots=True)
class McpTool:
    """How a skill made from an MCP tool is called: its server, the server's own name for the tool, and the
    schema the server announced (what the model sees; `Skill.parameters` is the part iAs validates)."""
    server: str
    tool: str
    schema: dict


@dataclass(frozen=True, slots=True)
class McpServer:
    """A SKILL.md with `## MCP`: how to start the server, and the risk of its tools."""
    name: str
    command: tuple[str, ...]      # the words of the one command line (no shell)
    risk: str                     # default risk of its tools
    tools: dict | None            # `## Tools`: server tool name -> risk; when given, only these are exposed
    timeout: float                # seconds per call
    env: tuple[str, ...]
    directory: Path
    description: str
    source: str = "user"
    line: int = 1                 # line of `## MCP`, for problems found when the server runs

    @property
    def path(self) -> Path:
        return self.directory / "SKILL.md"


NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names the runner sets itself; a skill cannot ask for the daemon's value of these.
RESERVED_ENV = frozenset({"PATH", "LANG", "TZ", "HOME", "IAS_SKILL", "IAS_SKILL_DIR",
                          "IAS_PARAMS", "IAS_PYTHON", "IAS_HOME", "PYTHONPATH",
                          "PYTHONDONTWRITEBYTECODE"})
SECTION_ALIASES = {
    "risk level": "risk", "风险等级": "risk",
    "parameters": "parameters", "参数": "parameters",
    "execute": "execute", "执行": "execute",
    "timeout": "timeout", "超时": "timeout",
    "env": "env", "环境变量": "env",
    "builtin": "builtin", "内置": "builtin",
    "mcp": "mcp", "tools": "tools", "工具": "tools",
}
REQUIRED_SECTIONS = ("risk", "parameters")
EXECUTION_SECTIONS = ("execute", "builtin")     # exactly one of them says how the skill runs
RISKS = {"low": "low", "high": "high", "低": "low", "高": "high"}
# CommonMark: up to 3 spaces of indent; ATX headings need a space or tab (or nothing) after
# the #s; a backtick fence's info string has no backtick; a closing fence has no info string.
HEADING_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]|$)")
FENCE_RE = re.compile(r"^( {0,3})(`{3,}(?=[^`]*$)|~{3,})[ \t]*(\S*)")
CLOSE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*$")
TIMEOUT_RE = re.compile(r"^([0-9]{1,6})\s*(s|秒|seconds?)?$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class _Block:
    lang: str
    text: str
    line: int          # line number of the first content line


@dataclass(slots=True)
class _Section:
    heading: str
    line: int
    lines: list[tuple[int, str]]     # (line number, text) outside code fences
    blocks: list[_Block]


def _split(text: str) -> tuple[str, list[tuple[int, str]], dict[str, _Section], list[str]]:
    """Split SKILL.md into title, preamble lines and `##` sections, ignoring headings inside code fences."""
    title = ""
    preamble: list[tuple[int, str]] = []
    sections: dict[str, _Section] = {}
    duplicates: list[str] = []
    current: _Section | None = None
    fence: tuple[str, int, str, int, list[str]] | None = None   # (marker, indent, lang, first line, lines)
    # Lines end at "\n" only: str.splitlines() would also split at \f, \v, \x85, U+2028...
    lines = text.split("\n")
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    for number, line in enumerate(lines, 1):
        if fence is not None:
            marker, indent, lang, first, body = fence
            close = CLOSE_RE.match(line) if line.lstrip(" ")[:1] == marker[0] else None
            if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
                if current is not None:
                    current.blocks.append(_Block(lang, "\n".join(body), first))
                fence = None
            else:
                # Content lines lose up to the opening fence's indent (CommonMark).
                body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            continue
        lead = line[:1] if line[:1] != " " else line.lstrip(" ")[:1]   # prose skips the expressions
        level, heading = 0, ""
        if lead == "`" or lead == "~":
            match = FENCE_RE.match(line)
            if match:
                fence = (match.group(2), len(match.group(1)), match.group(3).lower(), number + 1, [])
                continue
        elif lead == "#":
            heading_match = HEADING_RE.match(line)
            if heading_match:
                level, heading = len(heading_match.group(1)), _heading_text(line[heading_match.end():])
        if level == 2:
            key = SECTION_ALIASES.get(heading.lower(), "other:" + heading.lower())
            if key in sections and not key.startswith("other:"):
                duplicates.append(f"{number}: duplicate section '## {_clip(heading)}' (first at line {sections[key].line})")
            current = _Section(heading, number, [], [])
            sections.setdefault(key, current)
            continue
        if current is None:
            if not title and level == 1 and heading:
                title = heading
            else:
                preamble.append((number, line))
        else:
            current.lines.append((number, line))
    if fence is not None:
        duplicates.append(f"{fence[3] - 1}: unclosed code fence")
    return title, preamble, sections, duplicates


def _heading_text(rest: str) -> str:
    """An ATX heading's text: stripped, without a closing run of #s (CommonMark)."""
    rest = rest.strip(" \t")
    bare = rest.rstrip("#")
    if bare != rest and (not bare or bare[-1] in " \t"):
        rest = bare.rstrip(" \t")
    return rest


def _clip(value: str, limit: int = 40) -> str:
    """A value quoted in a message, cut short: a hostile file must not make a huge message."""
    return value if len(value) <= limit else value[:limit] + "…"


def _text(section: _Section) -> list[tuple[int, str]]:
    """The non-empty prose lines of a section, stripped of list markers and backticks."""
    out = []
    for number, line in section.lines:
        line = line.strip().lstrip("-*").strip().strip("`").strip()
        if line and not line.startswith("<!--"):
            out.append((number, line))
    return out


def _one_block(section: _Section, langs: tuple[str, ...], problems: list[str], where: str) -> _Block | None:
    blocks = [b for b in section.blocks if b.lang in langs]
    if len(blocks) != 1:
        what = "no" if not blocks else f"{len(blocks)}"
        problems.append(f"{where}:{section.line}: '## {section.heading}' needs exactly one ```{langs[0]} block, found {what}")
        return None
    return blocks[0]


def parse_skill(path: Path, text: str, source: str = "user") -> Skill | McpServer:
    """Parse one SKILL.md (an `## MCP` one gives its McpServer); raise SkillError with every problem found."""
    from . import schema   # imported here so `skills` listing stays cheap when nothing is parsed

    where = str(path)
    problems: list[str] = []
    directory = path.parent
    name = directory.name
    if not NAME_RE.match(name):
        problems.append(f"{where}:1: skill name '{name}' (the directory name) must match ^[a-z][a-z0-9_]{{0,63}}$")

    title, preamble, sections, structural = _split(text.removeprefix("\ufeff"))   # a BOM is no text
    problems.extend(f"{where}:{p}" for p in structural)
    description = "\n".join(line for _, line in preamble).strip() or title
    if not description:
        problems.append(f"{where}:1: missing description (the text before the first ## heading)")

    mcp = "mcp" in sections
    if mcp:
        problems.extend(f"{where}:{sections[key].line}: '## {sections[key].heading}' cannot go with '## MCP' "
                        "(the server's tools bring their own)" for key in ("parameters", "execute") if key in sections)
    elif "tools" in sections:
        problems.append(f"{where}:{sections['tools'].line}: '## Tools' belongs to an MCP skill (one with '## MCP')")
    for key in REQUIRED_SECTIONS if not mcp else ("risk",):
        if key not in sections:
            heading = {"risk": "Risk Level", "parameters": "Parameters"}[key]
            problems.append(f"{where}:1: missing required section '## {heading}'")
    kinds = [key for key in EXECUTION_SECTIONS if key in sections]
    if not kinds and not mcp:
        problems.append(f"{where}:1: missing required section '## Execute'")
    elif len(kinds) > 1:
        problems.append(f"{where}:{sections[kinds[1]].line}: a skill has either '## Execute' or '## Builtin', not both")

    risk = "high"
    if "risk" in sections:
        section = sections["risk"]
        lines = _text(section)
        value = lines[0][1] if lines else ""
        if value.lower() in RISKS and len(lines) == 1:
            risk = RISKS[value.lower()]
        else:
            line = lines[0][0] if lines else section.line
            problems.append(f"{where}:{line}: unknown risk level '{_clip(value)}' (expected Low or High)")

    parameters: dict = {}
    validator = None
    parameters_line = 1
    if "parameters" in sections:
        block = _one_block(sections["parameters"], ("json",), problems, where)
        if block is not None:
            try:
                parameters = schema.loads(block.text)
            except json.JSONDecodeError as exc:
                problems.append(f"{where}:{block.line + exc.lineno - 1}: invalid JSON in ## Parameters: {exc.msg}")
            else:
                if not isinstance(parameters, dict) or parameters.get("type") != "object":
                    problems.append(f"{where}:{block.line}: ## Parameters must be a JSON Schema with \"type\": \"object\"")
                else:
                    try:
                        validator = schema.compile(parameters)      # once per load; the gate uses it per call
                    except schema.SchemaError as exc:
                        problems.extend(f"{where}:{block.line}: {_clip(p, 300)}" for p in exc.problems)
                parameters_line = block.line

    execute = ""
    if "execute" in sections:
        block = _one_block(sections["execute"], ("bash", "sh", "shell"), problems, where)
        if block is not None:
            execute = block.text
            if not execute.strip():
                problems.append(f"{where}:{block.line}: ## Execute block is empty")

    builtin = None
    if "builtin" in sections:
        from .builtins import HANDLERS
        section = sections["builtin"]
        lines = _text(section)
        value = lines[0][1] if lines else ""
        if value in HANDLERS and len(lines) == 1:
            builtin = value
        else:
            line = lines[0][0] if lines else section.line
            problems.append(f"{where}:{line}: unknown built-in handler '{_clip(value)}' "
                            f"(one line, one of: {', '.join(sorted(HANDLERS))})")

    timeout = float(SKILL_TIMEOUT_DEFAULT)
    if "timeout" in sections:
        section = sections["timeout"]
        lines = _text(section)
        value = lines[0][1] if lines else ""
        match = TIMEOUT_RE.match(value)
        if match and 1 <= int(match.group(1)) <= SKILL_TIMEOUT_MAX and len(lines) == 1:
            timeout = float(match.group(1))
        else:
            line = lines[0][0] if lines else section.line
            problems.append(f"{where}:{line}: timeout must be whole seconds from 1 to {SKILL_TIMEOUT_MAX}, got '{_clip(value)}'")

    env: list[str] = []
    if "env" in sections:
        for number, line in _text(sections["env"]):
            for item in re.split(r"[\s,，]+", line):
                item = item.strip("`")
                if not item:
                    continue
                if not ENV_NAME_RE.match(item):
                    problems.append(f"{where}:{number}: '{_clip(item)}' is not an environment variable name")
                elif item in RESERVED_ENV or item.startswith("IAS_PARAM_"):
                    problems.append(f"{where}:{number}: '{item}' is set by the runner and cannot be passed through")
                elif item not in env:
                    env.append(item)

    if mcp:
        command, tools = _mcp_sections(sections, problems, where)
        if problems:
            raise SkillError(problems)
        return McpServer(name=name, command=command, risk=risk, tools=tools, timeout=timeout, env=tuple(env),
                         directory=directory.resolve(), description=description, source=source,
                         line=sections["mcp"].line)
    if problems:
        raise SkillError(problems)
    return Skill(name=name, title=title or name, description=description, risk=risk,
                 parameters=parameters, execute=execute, timeout=timeout, env=tuple(env),
                 directory=directory.resolve(), validator=validator, source=source, parameters_line=parameters_line,
                 builtin=builtin)


def _mcp_sections(sections: dict, problems: list[str], where: str) -> tuple[tuple[str, ...], dict | None]:
    """`## MCP` (one command line, split as a shell would but never run by one) and `## Tools`."""
    section = sections["mcp"]
    lines = [(n, line) for n, line in _text(section)] + [(b.line, b.text.strip()) for b in section.blocks]
    command: tuple[str, ...] = ()
    if len(lines) != 1 or "\n" in lines[0][1]:
        problems.append(f"{where}:{section.line}: '## MCP' needs exactly one line: the command that starts the server")
    else:
        try:
            command = tuple(shlex.split(lines[0][1]))
        except ValueError as exc:
            problems.append(f"{where}:{lines[0][0]}: cannot split the '## MCP' command line: {exc}")
        else:
            if not command or not command[0]:
                problems.append(f"{where}:{lines[0][0]}: '## MCP' command line is empty")
    if "tools" not in sections:
        return command, None
    tools: dict[str, str] = {}
    for number, line in _text(sections["tools"]):
        tool, colon, value = line.rpartition(":") if ":" in line else line.rpartition("：")
        tool = tool.strip().strip("`").strip()
        risk = RISKS.get(value.strip().lower())
        if not tool or risk is None:
            problems.append(f"{where}:{number}: '## Tools' lines are 'tool: Low' or 'tool: High', got '{_clip(line)}'")
        elif tool in tools:
            problems.append(f"{where}:{number}: tool '{_clip(tool)}' is listed twice")
        else:
            tools[tool] = risk
    return command, tools


def load_skill(directory: Path, source: str = "user") -> Skill | McpServer:
    """Load the skill in `directory` (its SKILL.md); raise SkillError on any problem, whatever it is."""
    path = Path(directory) / "SKILL.md"
    try:
        if not path.is_file():    # not a FIFO or device, which could block or never end
            raise OSError(f"not a regular file: {path}")
        with path.open("rb") as f:
            data = f.read(SKILL_FILE_MAX + 1)
        if len(data) > SKILL_FILE_MAX:
            raise SkillError([f"{path}:1: SKILL.md is larger than {SKILL_FILE_MAX // 1024} KiB"])
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SkillError([f"{path}:{line}: not UTF-8 (byte {exc.start})"]) from None
    except OSError as exc:
        raise SkillError([f"{path}:1: cannot read: {exc}"]) from None
    try:
        return parse_skill(path, text, source)
    except SkillError:
        raise
    except Exception as exc:  # noqa: BLE001 - one bad skill must never stop the others
        log.warning("skill %s: unexpected %s while loading", path, type(exc).__name__, exc_info=True)
        raise SkillError([f"{path}:1: cannot load: {type(exc).__name__}: {str(exc)[:200]}"]) from None


class Registry:
    """The loaded skills by name, with the problems (not loaded) and warnings (loaded) found.

    `reload()` re-reads only the SKILL.md files whose stat signature (mtime, size, inode) changed,
    so the daemon can call it before every turn. A skill whose new version does not load keeps
    its last good version; a problem is logged once, and queued once for `take_new_problems`.
    """

    def __init__(self, skills: dict[str, Skill] | None = None, problems: tuple[str, ...] = (),
                 warnings: tuple[str, ...] = (), *, roots: tuple[tuple[Path, str], ...] = (),
                 allow_risk_downgrade: frozenset[str] | set[str] = frozenset(), cache: Path | None = None,
                 mcp_cache: Path | None = None):
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


CACHE_VERSION = 1
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
                                directory=Path(spec["directory"]), validator=_lazy(spec["parameters"]))
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
            spec.update(env=list(outcome.env), directory=str(outcome.directory))
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
                  mcp_cache: Path | None = None) -> Registry:
    """Load system skills, then user skills over them; one bad skill never stops the others.
    `cache`: a file of parsed specs by stat signature, read and refreshed (for fast listing).
    An `## MCP` skill's tools come from the last tool list cached in `mcp_cache` (see mcp.py),
    so listing never waits for a server."""
    roots = tuple((Path(d), source) for d, source in ((system_dir, "system"), (user_dir, "user")) if d)
    reg = Registry(roots=roots, allow_risk_downgrade=allow_risk_downgrade, cache=cache, mcp_cache=mcp_cache)
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
    return load_registry(config.system_skills_dir, config.skills_dir, config.allow_risk_downgrade,
                         config.data_dir / SKILLS_CACHE if cached else None, mcp_cache(config))


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
                             parameters_line=server.line, mcp=McpTool(server.name, raw, given))
    listed = {t.get("name") for t in tools if isinstance(t, dict)}
    for missing in sorted(set(server.tools or ()) - listed):
        warnings.append(f"{where}: '## Tools' names '{_clip(missing)}', which the server does not list")
    return skills, problems, warnings
