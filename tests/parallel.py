"""`make test-fast` in parallel: the test modules spread over worker processes, each with a database of its own.

`python -m tests.parallel [-j N] [MODULE ...]` (default: every tests/test_*.py, N = WORKERS). Most of a test's
time is spent waiting (a server's reply, a subprocess, a short injected timeout), so a few processes on
two cores finish well before one. Each worker is `python -m tests.parallel --worker`: it takes module names
on a pipe, runs each with unittest, and answers one JSON line per module on another (its stdin, stdout and
stderr stay the run's: a green run still prints nothing but the summary). Its database: its own throwaway cluster
(tests.support), or, when IAS_TEST_DATABASE_URL is set, a database created on that server for it (LISTEN
channels and advisory locks are per database, so workers never see each other's). Modules are handed out
largest file first, one at a time, to whichever worker is free.

Not handled: parallelism inside a module (a module's classes share a process, as under `discover`); a worker
that dies mid-module is reported as that module's error, its remaining modules run on the others.
`make test` keeps `python -m unittest discover -s tests -t .` (SPEC §9): this runner is only the fast loop's.
"""
from __future__ import annotations

import argparse
import gc
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
WORKERS = 3             # processes: the suite mostly waits, so two cores keep three busy
COUNTS = ("run", "failures", "errors", "skipped", "unexpected", "noisy")


def modules() -> list[str]:
    """Every test module, largest file first (a rough weight: the long ones start early, the tail is short)."""
    files = sorted(TESTS.glob("test_*.py"), key=lambda path: (-path.stat().st_size, path.name))
    return [f"tests.{path.stem}" for path in files]


# ---- worker ----

def run_module(name: str) -> dict:
    """Run one module with unittest; its counts, its report (failures and errors as unittest prints them) and
    what it printed besides (`noise`: whatever reached the process's stdout or stderr, its children's too)."""
    stream = io.StringIO()
    started = time.monotonic()
    with tempfile.TemporaryFile() as printed:
        sys.stdout.flush()
        sys.stderr.flush()
        kept = os.dup(1), os.dup(2)
        os.dup2(printed.fileno(), 1)
        os.dup2(printed.fileno(), 2)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")    # as unittest.main: ResourceWarning shown
                suite = unittest.defaultTestLoader.loadTestsFromName(name)
                result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
                gc.collect()                        # what the module left unclosed warns now, as its own noise
        except Exception as exc:                    # an import error
            return {"module": name, "seconds": 0.0, "run": 0, "failures": 0, "errors": 1, "skipped": 0,
                    "unexpected": 0, "noise": "", "report": f"ERROR: cannot import {name}: {exc!r}\n"}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, saved in zip((1, 2), kept):
                os.dup2(saved, fd)
                os.close(saved)
        printed.seek(0)
        noise = printed.read().decode(errors="replace")
    seconds = time.monotonic() - started
    stream.seek(0)
    report = "".join(line for line in stream if not line.startswith(("Ran ", "OK", "FAILED")))
    return {"module": name, "seconds": seconds, "run": result.testsRun, "failures": len(result.failures),
            "errors": len(result.errors), "skipped": len(result.skipped),
            "unexpected": len(result.unexpectedSuccesses), "noise": noise,
            "report": report.rstrip("\n-") + "\n\n" if not result.wasSuccessful() else ""}


def worker(orders_fd: int, reply_fd: int) -> None:
    for fd in (orders_fd, reply_fd):
        os.set_inheritable(fd, False)               # a test's children never hold the run's pipes
    replies = os.fdopen(reply_fd, "w", buffering=1)
    for line in os.fdopen(orders_fd, "r"):
        name = line.strip()
        if not name:
            break
        replies.write(json.dumps(run_module(name)) + "\n")


# ---- parent ----

@dataclass
class Worker:
    process: subprocess.Popen
    orders: io.TextIOBase
    replies: io.TextIOBase
    module: str | None = None
    buffer: str = ""


@dataclass
class Totals:
    counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    reports: list = field(default_factory=list)
    times: dict = field(default_factory=dict)

    def add(self, result: dict) -> None:
        for key in COUNTS:
            self.counts[key] += result.get(key, 0)
        self.times[result["module"]] = result["seconds"]
        if result["report"]:
            self.reports.append(result["report"])
        if result.get("noise"):                     # a green run prints nothing: output is a failure of its own
            self.counts["noisy"] += 1
            self.reports.append(f"{'=' * 70}\nNOISE: {result['module']} printed (a green run prints nothing but "
                                f"the summary)\n{'-' * 70}\n{result['noise'].rstrip()}\n\n")


class Databases:
    """One database per worker on IAS_TEST_DATABASE_URL's server (none needed without it: each worker starts
    its own cluster). Dropped when the run ends."""

    def __init__(self, url: str):
        self.url = url
        self.names: list[str] = []

    def create(self) -> str:
        import psycopg
        from psycopg.conninfo import make_conninfo
        name = f"ias_test_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        self.names.append(name)
        return make_conninfo(self.url, dbname=name)

    def drop(self) -> None:
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as conn:
            for name in self.names:
                conn.execute(f"DROP DATABASE IF EXISTS {name}")


def start_worker(environ: dict[str, str]) -> Worker:
    """A worker taking orders and replying on pipes of their own: stdin, stdout and stderr stay the run's."""
    orders_in, orders_out = os.pipe()
    replies_in, replies_out = os.pipe()
    process = subprocess.Popen([sys.executable, "-m", "tests.parallel", "--worker", str(orders_in), str(replies_out)],
                               cwd=TESTS.parent, env=environ, pass_fds=(orders_in, replies_out))
    os.close(orders_in)
    os.close(replies_out)
    return Worker(process, os.fdopen(orders_out, "w", buffering=1), os.fdopen(replies_in, "r"))


def run(names: list[str], count: int) -> int:
    started = time.monotonic()
    url = os.environ.get("IAS_TEST_DATABASE_URL", "").strip()
    databases = Databases(url) if url else None
    pending = list(names)
    totals = Totals()
    workers: list[Worker] = []
    selector = selectors.DefaultSelector()

    def hand_out(worker: Worker) -> None:
        worker.module = pending.pop(0) if pending else None
        try:
            worker.orders.write((worker.module or "") + "\n")
        except BrokenPipeError:
            pass                                    # it died: its reader meets EOF and reports the module

    def stop(signum, _frame) -> None:               # `timeout`, a CI limit: workers clean up their clusters
        for worker in workers:
            worker.process.terminate()
        for worker in workers:
            worker.process.wait()
        if databases is not None:
            databases.drop()
        os._exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        for _ in range(min(count, len(names))):
            environ = dict(os.environ)
            if databases is not None:
                environ["IAS_TEST_DATABASE_URL"] = databases.create()
            worker = start_worker(environ)
            workers.append(worker)
            selector.register(worker.replies, selectors.EVENT_READ, worker)
            hand_out(worker)
        busy = len(workers)
        while busy:
            for key, _ in selector.select():
                worker = key.data
                chunk = os.read(worker.replies.fileno(), 65536).decode()
                if not chunk:                       # the worker is gone
                    selector.unregister(worker.replies)
                    busy -= 1
                    if worker.module:
                        totals.add({"module": worker.module, "seconds": 0.0, "run": 0, "failures": 0, "errors": 1,
                                    "skipped": 0, "unexpected": 0,
                                    "report": f"ERROR: the worker running {worker.module} exited "
                                              f"({worker.process.wait()})\n"})
                        worker.module = None
                    continue
                worker.buffer += chunk
                while "\n" in worker.buffer:
                    line, worker.buffer = worker.buffer.split("\n", 1)
                    totals.add(json.loads(line))
                    sys.stderr.write(".")               # one per module, as unittest's one per test
                    sys.stderr.flush()
                    hand_out(worker)
        for worker in workers:
            worker.orders.close()
            worker.process.wait()
            worker.replies.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if databases is not None:
            databases.drop()
    return summary(totals, time.monotonic() - started)


def summary(totals: Totals, seconds: float) -> int:
    out = sys.stderr
    out.write("\n")
    for report in totals.reports:
        out.write(report)
    if os.environ.get("IAS_TEST_TIMES"):            # the per-module figures, for finding the slow ones
        for name, taken in sorted(totals.times.items(), key=lambda item: -item[1]):
            out.write(f"{taken:7.2f} s  {name}\n")
    counts = totals.counts
    out.write("-" * 70 + f"\nRan {counts['run']} tests in {seconds:.3f}s ({len(totals.times)} modules, "
              f"in parallel)\n\n")
    problems = [f"{key}={counts[key]}" for key in ("failures", "errors", "unexpected", "noisy") if counts[key]]
    skipped = [f"skipped={counts['skipped']}"] if counts["skipped"] else []
    out.write(("FAILED" if problems else "OK") + (f" ({', '.join(problems + skipped)})" if problems + skipped
                                                  else "") + "\n")
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.parallel", description=__doc__.split("\n")[0])
    parser.add_argument("-j", "--jobs", type=int, default=WORKERS, help=f"worker processes (default {WORKERS})")
    parser.add_argument("--worker", type=int, nargs=2, metavar="FD", help=argparse.SUPPRESS)
    parser.add_argument("modules", nargs="*", help="test modules (default: every tests/test_*.py)")
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(*args.worker)
        return 0
    return run(args.modules or modules(), max(1, args.jobs))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
