"""The package's shape, computed from the source: the import graph of ias/ has no cycle and no import
from a lower layer to a higher one, and no module is over LINES_MAX lines.

Every import counts: at module level, inside functions (lazy) and under TYPE_CHECKING, since each
is a dependency a reader must follow. Known offenders are listed (ALLOWED_FOR_NOW, LONG_FOR_NOW)
until their fix lands; an entry that no longer offends fails too, so the lists only shrink.
Not checked: imports built at run time (importlib), and skill scripts (resources/, skills/).
"""
from __future__ import annotations

import ast
import shutil
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ias"

# Lowest first: a module may import its own layer and those below, never one above. A module is placed by its
# name, or failing that by its nearest listed package (`ias.channels` places every module under ias/channels/).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("foundation", frozenset({          # no state, no I/O beyond files: named limits, errors, formats, parsing
        "ias", "ias.errors", "ias.limits", "ias.jsonschema", "ias.schema", "ias.cron", "ias.locks", "ias.migrations", "ias.supervisor",
        "ias.systemd", "ias.catalog", "ias.clock", "ias.envfile"})),
    ("services", frozenset({            # one outside thing each: the database, the model, settings, notifiers
        "ias.store", "ias.auditchain", "ias.audit", "ias.unwritten", "ias.monitor", "ias.pgcluster", "ias.config",
        "ias.notifiers", "ias.sdk", "ias.llm", "ias.processes", "ias.service", "ias.datadir", "ias.inbox"})),
    ("skills", frozenset({              # skills: parsed, sandboxed, run, approved, scheduled
        "ias.sandbox", "ias.skills", "ias.speccache", "ias.changes", "ias.registry", "ias.outcome", "ias.runner", "ias.mcp",
        "ias.handlers", "ias.results", "ias.scheduler", "ias.confirmation", "ias.grants", "ias.approval", "ias.memory",
        "ias.outgoing"})),
    ("channels", frozenset({"ias.channels"})),
    ("delivery", frozenset({"ias.outbox"})),
    ("turns", frozenset({"ias.gate", "ias.stopping", "ias.slash", "ias.agent", "ias.router", "ias.budget",
                         "ias.status"})),
    ("entry", frozenset({"ias.app", "ias.daemon", "ias.oneoff", "ias.commands", "ias.doctor", "ias.setup",
                         "ias.backup", "ias.cli"})),
)

# Imports that break the rules today, each until the change named beside it lands (issue 23): then delete
# the line (this test fails while a listed edge is gone, so the list cannot go stale).
ALLOWED_FOR_NOW: frozenset[tuple[str, str]] = frozenset()

LINES_MAX = 500
LONG_FOR_NOW: frozenset[str] = frozenset()


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that module `name` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from . import schema` imports the module ias.schema; `from .store import Store` imports ias.store
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:      # `import ias.channels.base.x` → the module it names
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def layer(name: str) -> int:
    """The index in LAYERS of module `name` or of its nearest package listed (never `ias` itself for a
    module of the package); KeyError if it has none."""
    parts = name.split(".")
    for candidate in (".".join(parts[:n]) for n in range(len(parts), 1 if len(parts) > 1 else 0, -1)):
        for index, (_, members) in enumerate(LAYERS):
            if candidate in members:
                return index
    raise KeyError(name)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


class ImportGraphTest(unittest.TestCase):
    def setUp(self):
        self.graph = import_graph()
        self.edges = {(source, target) for source, targets in self.graph.items() for target in targets}

    def test_every_module_has_a_layer(self):
        missing = []
        for name in self.graph:
            try:
                layer(name)
            except KeyError:
                missing.append(name)
        self.assertEqual(missing, [], "place each new module in LAYERS")
        listed = {member for _, members in LAYERS for member in members}
        self.assertEqual(sorted(listed - set(self.graph)), [], "LAYERS names modules that no longer exist")

    def test_no_cycle(self):
        graph = {source: {t for t in targets if (source, t) not in ALLOWED_FOR_NOW}
                 for source, targets in self.graph.items()}
        self.assertEqual(cycles(graph), [])

    def test_no_import_from_a_lower_layer_to_a_higher_one(self):
        upward = sorted(f"{source} ({LAYERS[layer(source)][0]}) imports {target} ({LAYERS[layer(target)][0]})"
                        for source, target in self.edges - ALLOWED_FOR_NOW if layer(target) > layer(source))
        self.assertEqual(upward, [])

    def test_allowed_for_now_is_not_stale(self):
        self.assertEqual(sorted(ALLOWED_FOR_NOW - self.edges), [], "these imports are gone: delete them from "
                                                                   "ALLOWED_FOR_NOW")
        needed = {(s, t) for s, t in ALLOWED_FOR_NOW
                  if layer(t) > layer(s) or any(s in c and t in c for c in cycles(self.graph))}
        self.assertEqual(sorted(ALLOWED_FOR_NOW - needed), [], "these imports break no rule: delete them from "
                                                               "ALLOWED_FOR_NOW")

    def test_the_graph_sees_lazy_and_type_checking_imports(self):
        """A circle hidden in a function and under TYPE_CHECKING is still found."""
        graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
        self.assertEqual(cycles(graph), [["a", "b", "c"]])
        source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store import Store\n"
                  "def f():\n    from . import schema\n    import ias.channels.base\n")
        where = Path(tempfile.mkdtemp(prefix="ias-layout-"))
        self.addCleanup(shutil.rmtree, where, True)
        path = where / "probe.py"
        path.write_text(source, encoding="utf-8")
        self.assertEqual(imports("ias.probe", path, {"ias.store", "ias.schema", "ias.channels.base"}),
                         {"ias.store", "ias.schema", "ias.channels.base"})


class SizeTest(unittest.TestCase):
    def test_no_module_over_the_line_limit(self):
        lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules().items()}
        self.assertEqual(sorted(f"{name}: {n} lines" for name, n in lengths.items()
                                if n > LINES_MAX and name not in LONG_FOR_NOW), [])
        self.assertEqual(sorted(name for name in LONG_FOR_NOW if lengths.get(name, 0) <= LINES_MAX), [],
                         f"these are {LINES_MAX} lines or fewer now: delete them from LONG_FOR_NOW")



class DocumentedLayoutTest(unittest.TestCase):
    """docs/development.md's layout tree names every module of the package, once, and nothing else."""

    def test_the_tree_matches_the_package(self):
        text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
        tree = text.split("## Layout", 1)[1].split("```", 2)[1]
        listed, folders = [], []
        for line in tree.splitlines()[1:]:
            if not line.strip():
                continue
            depth = (len(line) - len(line.lstrip(" "))) // 2
            name = line.split()[0]
            del folders[depth:]
            if name.endswith("/"):
                folders.append(name.rstrip("/"))
            else:
                self.assertTrue(line.split(maxsplit=1)[1:], f"{name}: one line saying what it decides")
                listed.append("/".join([*folders, name]))
        self.assertEqual(len(listed), len(set(listed)), "a module listed twice")
        actual = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
        self.assertEqual(sorted(listed), actual)


if __name__ == "__main__":
    unittest.main()
