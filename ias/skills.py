"""SKILL.md parsing: one skill directory into a Skill (or, for `## MCP`, an McpServer).

The set of loaded skills, its reload and caches live in registry.py."""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import shlex
import stat
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import jsonschema as schema
from .errors import SkillError
from .limits import SKILL_FILE_MAX, SKILL_TIMEOUT_DEFAULT, SKILL_TIMEOUT_MAX
from .sandbox import Policy, inside, parse_permission

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Skill:
    """One loaded skill: everything the gate, its executor and the LLM need.

    `kind` says which executor runs it (the gate dispatches on it): "script" runs `execute` (## Execute)
    in a process, "builtin" runs the in-process handler `builtin` (## Builtin), "mcp" calls the tool
    `mcp` of an MCP server. Only the field of its kind is set; the others are empty."""
    name: str
    title: str
    description: str
    risk: str                     # "low" | "high"
    parameters: dict              # JSON Schema (object)
    execute: str                  # kind "script": the bash script of ## Execute ("" for the other kinds)
    timeout: float                # seconds
    env: tuple[str, ...]          # names passed through from the daemon's environment
    directory: str                # resolved, absolute (text: a Path per skill costs a large listing ~5 %)
    validator: Callable[[object], list[str]] = field(repr=False, compare=False)   # compiled `parameters`
    source: str = "user"          # "system" | "user"
    overrides: bool = False       # a user skill replacing a system skill of the same name
    parameters_line: int = 1      # line of the ## Parameters JSON block in SKILL.md, for warnings
    kind: str = "script"          # "script" | "builtin" | "mcp": which executor runs it (KINDS)
    builtin: str | None = None    # kind "builtin": the handler ## Builtin names (one of BUILTIN_NAMES)
    mcp: McpTool | None = None    # kind "mcp": the server and its tool
    sandbox: Policy = Policy()    # ## Sandbox: what it may reach beyond the default (SPEC 10)
    trusted: bool = False         # ## Trusted: its output is not untrusted outside text (memory.py's taint rule)

    def __post_init__(self) -> None:
        if (self.kind not in KINDS or (self.kind == "builtin") != (self.builtin is not None)
                or (self.kind == "mcp") != (self.mcp is not None)):
            raise ValueError(f"skill {self.name}: kind {self.kind!r} with builtin={self.builtin!r}, "
                             f"mcp={self.mcp!r}")

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
    directory: str                # resolved, absolute
    description: str
    source: str = "user"
    line: int = 1                 # line of `## MCP`, for problems found when the server runs
    sandbox: Policy = Policy()
    trusted: bool = False         # ## Trusted: its tools' output is not untrusted outside text

    @property
    def path(self) -> str:
        return self.directory + "/SKILL.md"


_UNBOXED = Policy()                     # no `## Sandbox`: the default sandbox (one shared, it is frozen)
KINDS = ("script", "builtin", "mcp")     # how a skill runs; the gate has one executor for each
REPO_ROOT = Path(__file__).resolve().parent.parent
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
    "sandbox": "sandbox", "沙箱": "sandbox",
    "trusted": "trusted", "可信": "trusted",
}
REQUIRED_SECTIONS = ("risk", "parameters")
# The `## Builtin` vocabulary: the in-process handlers a SKILL.md may name (handlers.py implements each).
BUILTIN_NAMES = frozenset({"tasks.list", "tasks.manage", "skills.find", "memory.remember", "memory.recall",
                           "memory.forget"})
RISKS = {"low": "low", "high": "high", "低": "low", "高": "high"}
# The structure of a SKILL.md, after a "\n" (each line is preceded by one; a token ends before the next):
# an ATX heading (CommonMark: up to 3 spaces of indent, a space or tab or nothing after the #s), or a fenced
# code block whole, through its closing line or, unclosed, to the end (a backtick fence's info string has no
# backtick; the closing fence, of the same character and at least as long, has no info string).
TOKEN_RE = re.compile(r"""\n(?=[ ]{0,3}[\#`~])(?:                                   # (most lines are neither: told at once)
    ([ ]{0,3}(\#{1,6})(?:[ \t]([^\n]*))?(?![^\n]))                        # 1: the line, 2: the #s, 3: the rest
  | ([ ]{0,3})(`{3,}(?=[^`\n]*(?![^\n]))|~{3,})[ \t]*(\S*)[^\n]*     # 4: indent, 5: fence, 6: info string
    ((?:\n[^\n]*)*?)                                                    # 7: the content lines, each after a \n
    (?:\n[ ]{0,3}\5(?:(?<=`)`*|(?<=~)~*)[ \t]*(?![^\n]) | (\Z))         # the closing line, or 8: the end
)""", re.VERBOSE)
TOKEN_GROUPS = 8
TIMEOUT_RE = re.compile(r"^([0-9]{1,6})\s*(s|秒|seconds?)?$", re.IGNORECASE)


# A section's fenced code block, and a `##` section. A large listing builds thousands of each: a named tuple
# and a plain class cost half of what frozen dataclasses do.
_Block = namedtuple("_Block", ("lang", "text", "line"))     # line: the number of its first content line


class _Section:
    """Its prose: its lines outside code fences, as (number of the first, "\n" + the lines joined)."""
    __slots__ = ("heading", "line", "prose", "blocks")

    def __init__(self, heading: str, line: int) -> None:
        self.heading = heading
        self.line = line
        self.prose: list[tuple[int, str]] = []
        self.blocks: list[_Block] = []


def _split(text: str) -> tuple[str, str, dict[str, _Section], list[str]]:
    """Split SKILL.md into title, preamble (the text before the first `##`) and `##` sections, ignoring
    headings inside code fences. One regex split cuts out the headings and the fenced blocks (a few in a
    file); the prose between them comes whole."""
    # Lines end at "\n" only (str.splitlines() would also split at \f, \v, \x85, U+2028...), and lose one "\r".
    if "\r" in text:
        text = text.replace("\r\n", "\n")
        if text.endswith("\r"):
            text = text[:-1]
    parts = TOKEN_RE.split("\n" + text)     # prose, then each token's groups and the prose after it
    title = ""
    preamble: list[tuple[int, str]] = []
    prose = preamble                 # (line number, "\n" + lines): the preamble's, then the current section's
    sections: dict[str, _Section] = {}
    problems: list[str] = []
    current: _Section | None = None
    last = 0                         # the number of the last line before the next part
    if parts[0]:
        prose.append((1, parts[0]))
        last = parts[0].count("\n")
    tokens = iter(parts)
    next(tokens)
    # Each token's groups and the prose after it, taken TOKEN_GROUPS + 1 at a time from the one iterator.
    for line, hashes, rest, indent, marker, lang, body, unclosed, after in zip(*[tokens] * (TOKEN_GROUPS + 1)):
        number = last + 1            # of the token's first line
        if marker is not None:
            if unclosed is not None:
                problems.append(f"{number}: unclosed code fence")
            elif current is not None:
                if indent:       # content lines lose up to the opening fence's indent (CommonMark)
                    body = "\n".join([b[min(len(indent), len(b) - len(b.lstrip(" "))):] for b in body.split("\n")])
                current.blocks.append(_Block(lang.lower(), body[1:], number + 1))
            last = number + body.count("\n") + (unclosed is None)
        else:
            last = number
            heading = ""
            if hashes == "##" or (hashes == "#" and current is None and not title):
                heading = rest.strip(" \t") if rest else ""
                if heading[-1:] == "#":           # a closing run of #s, perhaps
                    heading = _heading_text(rest)
            if hashes == "##":
                lower = heading.lower()
                key = SECTION_ALIASES.get(lower) or "other:" + lower
                if key in sections and key[:6] != "other:":
                    problems.append(f"{number}: duplicate section '## {_clip(heading)}' (first at line {sections[key].line})")
                current = _Section(heading, number)
                prose = current.prose
                sections.setdefault(key, current)
            elif heading:
                title = heading
            else:
                prose.append((number, "\n" + line))
        if after:
            prose.append((last + 1, after))
            last += after.count("\n")
    return title, "".join([chunk for _, chunk in preamble]), sections, problems


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
    if len(section.prose) == 1:       # the common case, one plain line (`Low`, `30`, `yes`), told at once
        first, chunk = section.prose[0]
        value = chunk.strip()
        if value and "\n" not in value and value[0] not in "-*`<" and value[-1] != "`":
            return [(first + chunk.count("\n", 0, chunk.find(value)) - 1, value)]
    out = []
    for first, chunk in section.prose:
        for number, line in enumerate(chunk.split("\n")[1:], first):
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


def parse_skill(path: Path, text: str, source: str = "user", lazy: bool = False,
                real: str | None = None) -> Skill | McpServer:
    """Parse one SKILL.md (an `## MCP` one gives its McpServer); raise SkillError with every problem found.
    `lazy`: the schema is checked now but its validator built at its first use (the `skills` listing, which
    validates nothing, skips half the work). `real`: the skill directory's resolved path when the caller
    knows it (a registry resolves its root once, not each of thousands of skills)."""
    return _parse(str(path), path.parent.name, text, source, lazy, real)


def _parse(where: str, name: str, text: str, source: str, lazy: bool, real: str | None) -> Skill | McpServer:
    """parse_skill of the SKILL.md at `where` (a path as text) in the directory `name`."""
    problems: list[str] = []
    real = real or os.path.realpath(os.path.dirname(where))
    if not NAME_RE.match(name):
        problems.append(f"{where}:1: skill name '{name}' (the directory name) must match ^[a-z][a-z0-9_]{{0,63}}$")

    title, preamble, sections, structural = _split(text.removeprefix("\ufeff"))   # a BOM is no text
    if structural:
        problems.extend(f"{where}:{p}" for p in structural)
    description = preamble.strip() or title
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
    if "execute" not in sections and "builtin" not in sections and not mcp:
        problems.append(f"{where}:1: missing required section '## Execute'")
    elif "execute" in sections and "builtin" in sections:
        problems.append(f"{where}:{sections['builtin'].line}: a skill has either '## Execute' or '## Builtin', not both")

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
                        # once per load; the gate uses it per call (`loads` held the JSON to its limits)
                        if not lazy:
                            validator = schema.compile(parameters)
                        elif checked := schema.check(parameters, measured=True):
                            raise schema.SchemaError(checked)
                        else:
                            validator = schema.compile_later(parameters)
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
        section = sections["builtin"]
        lines = _text(section)
        value = lines[0][1] if lines else ""
        if value in BUILTIN_NAMES and len(lines) == 1:
            builtin = value
        else:
            line = lines[0][0] if lines else section.line
            problems.append(f"{where}:{line}: unknown built-in handler '{_clip(value)}' "
                            f"(one line, one of: {', '.join(sorted(BUILTIN_NAMES))})")

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

    policy = _sandbox_section(sections["sandbox"], risk, mcp, real, problems, where) if "sandbox" in sections \
        else _UNBOXED
    trusted = "trusted" in sections and _trusted(sections["trusted"], problems, where)
    if mcp:
        command, tools = _mcp_sections(sections, problems, where)
        if problems:
            raise SkillError(problems)
        return McpServer(name=name, command=command, risk=risk, tools=tools, timeout=timeout, env=tuple(env),
                         directory=real, description=description, source=source,
                         line=sections["mcp"].line, sandbox=policy, trusted=trusted)
    if problems:
        raise SkillError(problems)
    return Skill(name=name, title=title or name, description=description, risk=risk,
                 parameters=parameters, execute=execute, timeout=timeout, env=tuple(env),
                 directory=real, validator=validator, source=source, parameters_line=parameters_line,
                 kind="builtin" if builtin is not None else "script", builtin=builtin, sandbox=policy,
                 trusted=trusted)


def _trusted(section: _Section, problems: list[str], where: str) -> bool:
    """`## Trusted`: empty or `yes` (the skill's output is the owner's own data, not outside text)."""
    lines = _text(section)
    if not lines or (len(lines) == 1 and lines[0][1].lower() in ("yes", "是")):
        return True
    problems.append(f"{where}:{lines[0][0]}: '## Trusted' is empty or says yes, got '{_clip(lines[0][1])}'")
    return False


def _sandbox_section(section: _Section, risk: str, mcp: bool, directory: str, problems: list[str],
                     where: str) -> Policy:
    """`## Sandbox` of the skill in (resolved) `directory`: one permission a line (SPEC 10). A PATH overlapping the repository this iAs runs from or
    the skills' own tree is refused here; the runner refuses the data directory too (known only with a config)."""
    lines = []
    for number, line in _text(section):
        try:
            kind, path = parse_permission(line)
        except ValueError as exc:
            problems.append(f"{where}:{number}: {exc}, got '{_clip(line)}'")
            continue
        if kind == "unconfined" and (mcp or risk != "high"):
            problems.append(f"{where}:{number}: '- unconfined' is for a High skill only (approved call by call)"
                            + ("; an MCP server always runs in the sandbox" if mcp else ""))
            continue
        if path is not None and not path.startswith("~/"):
            overlap = [root for root in (REPO_ROOT, os.path.dirname(directory))
                       if inside(path, root) or inside(root, path)]
            if overlap:
                problems.append(f"{where}:{number}: sandbox path {path} may not overlap the repository or the skills ({overlap[0]})")
                continue
        lines.append(line)
    return Policy.from_lines(lines)


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


def load_skill(directory: Path, source: str = "user", lazy: bool = False, real: str | None = None) -> Skill | McpServer:
    """Load the skill in `directory` (its SKILL.md); raise SkillError on any problem, whatever it is.
    `lazy`, `real`: see parse_skill."""
    path = Path(directory) / "SKILL.md"
    return read_skill(str(path), path.parent.name, source, lazy, real)


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def read_skill(path: str, name: str, source: str, lazy: bool, real: str | None) -> Skill | McpServer:
    """load_skill of the SKILL.md at `path` (as text, as a registry scans it) in the directory `name`."""
    try:
        # Opened without blocking and checked before reading: not a FIFO or device, which could block or never end.
        fd = os.open(path, _OPEN_FLAGS)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                if stat.S_ISDIR(st.st_mode):      # said as open() says it
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), fd)
                raise OSError(f"not a regular file: {path}")
            # Up to SKILL_FILE_MAX + 1 bytes or the end of the file: its size says how much to ask for; a file
            # that gave more than that has grown, and is read on (a short read of a regular file is its end).
            data = os.read(fd, min(st.st_size, SKILL_FILE_MAX) + 1)
            while st.st_size < len(data) <= SKILL_FILE_MAX and (more := os.read(fd, SKILL_FILE_MAX + 1 - len(data))):
                data += more
        finally:
            os.close(fd)
        if len(data) > SKILL_FILE_MAX:
            raise SkillError([f"{path}:1: SKILL.md is larger than {SKILL_FILE_MAX // 1024} KiB"])
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SkillError([f"{path}:{line}: not UTF-8 (byte {exc.start})"]) from None
    except OSError as exc:
        raise SkillError([f"{path}:1: cannot read: {exc}"]) from None
    try:
        return _parse(path, name, text, source, lazy, real)
    except SkillError:
        raise
    except Exception as exc:  # noqa: BLE001 - one bad skill must never stop the others
        log.warning("skill %s: unexpected %s while loading", path, type(exc).__name__, exc_info=True)
        raise SkillError([f"{path}:1: cannot load: {type(exc).__name__}: {str(exc)[:200]}"]) from None
