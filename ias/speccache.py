"""Parsed skill specs as JSON: the `skills` listing's cache file, and the answer of the helper that parses
part of a large uncached tree.

The cache maps each SKILL.md (its path as text) to its stat signature and parse outcome, a skill's spec
or the problems that kept it from loading; a registry reuses an entry whose signature still matches.
An `## MCP` server is never cached (its tools are cached apart, ias/mcp/servers.py). A cache that cannot
be read is only slower, never wrong: missing, of another version or damaged, it counts as empty.

`parse_split` parses thousands of new SKILL.md files on two CPUs: the last 45 % in a forked child,
whose outcomes come back through a pipe in the cache's format, meanwhile the rest here. The
listing uses it (the registry of a running daemon never forks). Whatever the child does not give back
(it failed, was killed, or the outcome is a server) is parsed here, so its failure only costs time.

Not handled: the child's work is not bounded by time (it parses what this process would have parsed);
a cache entry is trusted as the data directory is (its owner wrote it).
"""
from __future__ import annotations

import json
import logging
import operator
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import jsonschema as schema
from .errors import SkillError
from .limits import SKILL_CACHE_BATCH
from .sandbox import Policy
from .skills import McpServer, Skill

log = logging.getLogger(__name__)

Outcome = Skill | McpServer | SkillError

VERSION = 5       # 2: the ## Sandbox policy; 3: Skill.kind; 4: Skill.trusted; 5: a spec as a list
# A cached spec: these fields of its Skill in this order, then env, directory and sandbox as JSON values.
_FIELDS = ("name", "title", "description", "risk", "parameters", "execute", "timeout", "source",
           "parameters_line", "kind", "builtin", "trusted")
_values = operator.attrgetter(*_FIELDS)
_HEAD = b'{"version": %d, "entries": {' % VERSION


def read(file: Path) -> dict[str, tuple[tuple, Skill | SkillError]]:
    """The outcomes cached by `write`: path -> (signature, outcome); empty when missing, stale or damaged."""
    try:
        return _decoded(file.read_bytes())
    except OSError:
        return {}


@dataclass(frozen=True, slots=True)
class Encoded:
    """Outcomes as the parse helper sent them: their paths, and their entries as the cache's text."""
    paths: frozenset[str]
    entries: bytes          # `"path": [...], ...`: the inside of the cache's "entries" object


def write(file: Path, entries: dict[str, tuple[tuple, Outcome]], given: Encoded | None = None) -> None:
    """Cache every outcome but a server's (written whole, then renamed into place); those `given` as their text."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        temporary = file.with_name(f".{file.name}.{os.getpid()}")
        with open(temporary, "wb") as f:
            for chunk in _encoded(entries, given):
                f.write(chunk)
        os.replace(temporary, file)
    except OSError as exc:
        log.debug("skill cache %s not written: %s", file, exc)


def _encoded(entries: dict[str, tuple[tuple, Outcome]], given: Encoded | None = None) -> Iterator[bytes]:
    """The cache's JSON text, in pieces: path -> [signature, spec] for a skill, [signature, null, problems] for
    one that did not load. In batches (thousands of specs as one text cost more in memory than in writing);
    ASCII: CJK escaped. The entries `given` are taken as they are."""
    out = []
    pieces = [given.entries] if given is not None and given.entries else []
    for path, (signature, outcome) in entries.items():
        if given is not None and path in given.paths:
            continue
        if isinstance(outcome, SkillError):
            out.append((path, [signature, None, outcome.problems]))
        elif not isinstance(outcome, McpServer):
            out.append((path, [signature, [*_values(outcome), outcome.env, outcome.directory, outcome.sandbox.lines()]]))
    yield _HEAD
    for start in range(0, len(out), SKILL_CACHE_BATCH):
        pieces.append(json.dumps(dict(out[start:start + SKILL_CACHE_BATCH]), check_circular=False)[1:-1].encode("ascii"))
    for i, piece in enumerate(pieces):
        yield b", " + piece if i else piece
    yield b"}}"


def _decoded(data: bytes) -> dict[str, tuple[tuple, Skill | SkillError]]:
    """The outcomes in a text `_encoded` wrote; empty when it is of another version or damaged."""
    try:
        data = json.loads(data)
        if data.get("version") != VERSION:
            return {}
        out = {}
        for path, (signature, spec, *problems) in data["entries"].items():
            if spec is None:
                outcome = SkillError([str(p) for p in problems[0]])
            else:
                *values, env, directory, sandbox = spec
                fields = dict(zip(_FIELDS, values, strict=True))
                outcome = Skill(**fields, env=tuple(env), directory=directory,
                                validator=schema.compile_later(fields["parameters"]), sandbox=Policy.from_lines(sandbox))
            out[path] = (tuple(signature), outcome)
        return out
    except Exception:  # noqa: BLE001 - a cache that cannot be read is only slower, never wrong
        return {}


def parse_split(paths: list[str], signatures: dict[str, tuple],
                parse: Callable[[str], Outcome]) -> tuple[dict[str, Outcome], Encoded | None]:
    """`parse` of each path, the last ones in a forked child meanwhile (see the module's docstring); and the
    child's answer as it came, for `write` to take as it is (None when any of it was not taken)."""
    # The child's share is a little under half: it runs on copied pages and encodes its answer, and this
    # process decodes that answer after its own share (on an idle machine the two end together).
    mine = len(paths) * 11 // 20
    try:
        reader, writer = os.pipe()
    except OSError:
        return {path: parse(path) for path in paths}, None
    try:
        child = os.fork()
    except OSError:
        os.close(reader)
        os.close(writer)
        return {path: parse(path) for path in paths}, None
    if child == 0:                        # never returns: its answer goes into the pipe, then it exits
        code = 1
        try:
            os.close(reader)
            with open(writer, "wb") as pipe:
                for chunk in _encoded({path: (signatures[path], parse(path)) for path in paths[mine:]}):
                    pipe.write(chunk)
            code = 0
        finally:
            os._exit(code)              # nothing of the parent's (buffered output, atexit) runs twice
    os.close(writer)
    try:
        with open(reader, "rb") as pipe:      # closed before the wait however this ends: the child never blocks
            outcomes = {path: parse(path) for path in paths[:mine]}
            text = pipe.read()
    finally:
        os.waitpid(child, 0)
    answer = _decoded(text)
    taken = 0
    for path in paths[mine:]:
        given = answer.get(path)
        if given is not None and given[0] == signatures[path]:
            outcomes[path] = given[1]
            taken += 1
        else:                           # not sent (a server, or the child failed): parsed here
            outcomes[path] = parse(path)
    if taken < len(paths) - mine:
        log.debug("skill parse helper gave %d of %d outcomes; the rest parsed here", taken, len(paths) - mine)
    whole = taken == len(answer) and text.startswith(_HEAD) and text.endswith(b"}}")
    return outcomes, Encoded(frozenset(answer), text[len(_HEAD):-2]) if whole else None
