"""The listing's parse helper: a large uncached tree parsed in two parts at once, the second by a forked child
whose answer comes back as cache entries. It must give exactly what one process gives, and a child that fails
or lies may only cost time."""
import json
import os
import shutil
import tempfile
import threading
import unittest
from pathlib import Path
from unittest import mock

from ias import speccache
from ias.errors import SkillError
from ias.registry import load_registry
from ias.skills import read_skill
from tests import skillset
from tests.support import REPO

ACTIVE_COUNT = threading.active_count        # the real one (the tests pretend to be alone)

MCP = """# Time server

Tells the time.

## Risk Level
Low

## MCP
mcp-server-time
"""


def tree(root: Path) -> Path:
    """40 skills: good ones of several shapes, some that do not load, an MCP server, and a directory that is
    no skill (no SKILL.md)."""
    for name in skillset.write(root)[40:]:
        shutil.rmtree(root / name)
    names = sorted(p.name for p in root.iterdir())
    for name in names[:4]:                      # not loaded: each says why
        path = root / name / "SKILL.md"
        path.write_text(path.read_text(encoding="utf-8").replace("Low", "Medium"), encoding="utf-8")
    (root / "zz_time").mkdir()
    (root / "zz_time" / "SKILL.md").write_text(MCP, encoding="utf-8")
    (root / "zz_not_a_skill").mkdir()
    return root


def outcomes(registry) -> tuple:
    return [repr(s) for s in registry], registry.problems, registry.servers


def cached(file: Path) -> dict:
    return {path: (signature, outcome.problems if isinstance(outcome, SkillError) else outcome)
            for path, (signature, outcome) in speccache.read(file).items()}


class SplitTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-split-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.skills = tree(self.tmp / "skills")
        for patch in (mock.patch("ias.registry.SKILL_PARSE_SPLIT_MIN", 8),          # 41 files are plenty to split
                      # as alone as a listing is (other tests of this process may have left threads behind,
                      # none of them touching what the child does)
                      mock.patch("ias.registry.threading.active_count", lambda: 1)):
            patch.start()
            self.addCleanup(patch.stop)

    def load(self, cache: str):
        return load_registry(REPO / "resources" / "skills", self.skills, cache=self.tmp / cache, lazy=True)

    def test_the_split_listing_and_cache_are_those_of_one_process(self):
        forked, fork = [], os.fork

        def spy():
            pid = fork()
            if pid:
                forked.append(pid)
            return pid
        with mock.patch("os.fork", spy):
            split = self.load("split.json")
        self.assertEqual(len(forked), 1)
        with self.assertRaises(ChildProcessError):            # the child was waited for
            os.waitpid(forked[0], os.WNOHANG)
        with mock.patch("ias.registry.SKILL_PARSE_SPLIT_MIN", 10**6), mock.patch("os.fork", side_effect=AssertionError):
            alone = self.load("alone.json")
        self.assertEqual(outcomes(split), outcomes(alone))
        self.assertEqual(len(split.problems), 4)
        self.assertEqual(list(split.servers), ["zz_time"])
        self.assertEqual(cached(self.tmp / "split.json"), cached(self.tmp / "alone.json"))
        system = len(list((REPO / "resources" / "skills").glob("*/SKILL.md")))
        self.assertEqual(len(cached(self.tmp / "split.json")), 40 + system)          # all but the server
        with mock.patch("os.fork", side_effect=AssertionError("a cached listing parses nothing")):
            self.assertEqual(outcomes(self.load("split.json")), outcomes(alone))

    def paths(self) -> tuple[list[str], dict[str, tuple]]:
        paths = sorted(f"{d}/SKILL.md" for d in map(str, self.skills.iterdir()) if not d.endswith("not_a_skill"))
        return paths, {path: ("user", i) for i, path in enumerate(paths)}

    def parse(self, path: str):
        try:
            return read_skill(path, Path(path).parent.name, "user", True, None)
        except SkillError as exc:
            return exc

    def assertWhole(self, got: dict, paths: list[str]) -> None:
        self.assertEqual(sorted(got), paths)
        for path in paths:
            want = self.parse(path)
            self.assertEqual(got[path].problems if isinstance(want, SkillError) else got[path],
                             want.problems if isinstance(want, SkillError) else want)

    def test_a_child_that_dies_or_sends_garbage_or_other_signatures_costs_only_time(self):
        paths, signatures = self.paths()
        parent, encoded = os.getpid(), speccache._encoded

        def dies(path):
            if os.getpid() != parent:
                os._exit(3)
            return self.parse(path)

        def garbage(entries, given=None):
            yield b'{"version": 5, "entries": {"/etc/passwd": [["user", 1], null, ["x"]]'

        def stale(entries, given=None):          # as if the files had changed since they were stat'ed
            yield from encoded({path: (("user", -1), outcome) for path, (_, outcome) in entries.items()})
        for parse, sends in ((dies, encoded), (self.parse, garbage), (self.parse, stale)):
            with self.subTest(parse=parse.__name__, sends=sends.__name__), mock.patch.object(speccache, "_encoded", sends):
                got, sent = speccache.parse_split(paths, signatures, parse)
            self.assertIsNone(sent)                       # nothing of it is written to the cache as it came
            self.assertWhole(got, paths)
        got, sent = speccache.parse_split(paths, signatures, self.parse)
        self.assertWhole(got, paths)
        self.assertEqual(sent.paths, frozenset(paths[len(paths) * 11 // 20:]) - {str(self.skills / "zz_time/SKILL.md")})

    def test_no_fork_beside_a_thread_when_it_fails_or_for_a_daemon(self):
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            with mock.patch("os.fork", side_effect=AssertionError("forked beside a thread")), \
                    mock.patch("ias.registry.threading.active_count", ACTIVE_COUNT):
                self.assertEqual(len(self.load("thread.json").problems), 4)
        finally:
            stop.set()
            thread.join()
        with mock.patch("os.fork", side_effect=OSError(11, "Resource temporarily unavailable")) as fork:
            self.assertEqual(len(self.load("failed.json").problems), 4)
        self.assertEqual(fork.call_count, 1)
        with mock.patch("os.fork", side_effect=AssertionError("a daemon's registry forked")):
            load_registry(None, self.skills)


class ListingTest(unittest.TestCase):
    def test_a_listing_of_a_thousand_new_skills_is_what_one_process_loads(self):
        """`ias skills --json` on a fresh data directory (split at the real threshold) against the registry."""
        import subprocess
        import sys
        tmp = Path(tempfile.mkdtemp(prefix="ias-split-cli-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        skillset.write(tmp / "skills")
        env = {**os.environ, "IAS_SKILLS_DIR": str(tmp / "skills"), "IAS_DATA_DIR": str(tmp / "data")}
        result = subprocess.run([sys.executable, str(REPO / "ias.py"), "skills", "--json"], capture_output=True,
                                text=True, env=env, cwd=REPO, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        alone = load_registry(REPO / "resources" / "skills", tmp / "skills")
        self.assertEqual([(r["name"], r["risk"], r["timeout"], r["description"]) for r in json.loads(result.stdout)],
                         [(s.name, s.risk, s.timeout, s.description) for s in alone])
