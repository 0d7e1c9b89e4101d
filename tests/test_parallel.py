"""tests/parallel.py, `make test-fast`'s runner: counts, reports, and a module that prints fails the run."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

from tests import parallel

REPO = Path(__file__).resolve().parent.parent

CASES = {
    "quiet_case": """
        import unittest
        class Quiet(unittest.TestCase):
            def test_passes(self):
                pass
            @unittest.skip("not today")
            def test_skipped(self):
                pass
        """,
    "noisy_case": """
        import logging, sys, unittest
        class Noisy(unittest.TestCase):
            def test_logs_and_prints(self):
                logging.getLogger("somewhere").warning("a warning nobody asked for")
                print("a stray line")
            def test_fails(self):
                self.assertEqual(1, 2)
        """,
}


class ParallelRunnerTest(unittest.TestCase):
    def setUp(self):
        self.where = Path(tempfile.mkdtemp(prefix="ias-parallel-"))
        self.addCleanup(shutil.rmtree, self.where, True)
        for name, text in CASES.items():
            (self.where / f"{name}.py").write_text(textwrap.dedent(text))

    def test_a_module_s_counts_report_and_what_it_printed(self):
        sys.path.insert(0, str(self.where))
        self.addCleanup(sys.path.remove, str(self.where))
        quiet, noisy = parallel.run_module("quiet_case"), parallel.run_module("noisy_case")
        self.assertEqual({k: quiet[k] for k in ("run", "failures", "errors", "skipped", "noise", "report")},
                         {"run": 2, "failures": 0, "errors": 0, "skipped": 1, "noise": "", "report": ""})
        self.assertEqual((noisy["run"], noisy["failures"]), (2, 1))
        self.assertIn("FAIL: test_fails", noisy["report"])
        self.assertIn("AssertionError: 1 != 2", noisy["report"])
        self.assertEqual(noisy["noise"], "a warning nobody asked for\na stray line\n")
        self.assertEqual(parallel.run_module("no_such_case")["errors"], 1)

    def test_workers_run_every_module_and_noise_fails_the_run(self):
        environ = {**os.environ, "PYTHONPATH": str(self.where)}
        for modules, code, last in ((["quiet_case"], 0, "OK (skipped=1)"),
                                    (["quiet_case", "noisy_case"], 1, "FAILED (failures=1, noisy=1, skipped=1)")):
            done = subprocess.run([sys.executable, "-m", "tests.parallel", "-j", "2", *modules], cwd=REPO,
                                  env=environ, capture_output=True, text=True, timeout=60)
            self.assertEqual(done.returncode, code, done.stderr)
            self.assertEqual(done.stdout, "")
            lines = done.stderr.splitlines()
            self.assertEqual(lines[-1], last)
            self.assertRegex(done.stderr, rf"Ran {2 * len(modules)} tests in [\d.]+s \({len(modules)} modules")
        self.assertIn("NOISE: noisy_case printed", done.stderr)
        self.assertIn("a stray line", done.stderr)
