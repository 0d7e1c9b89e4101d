"""Shared test support: a real PostgreSQL per test run, a fresh schema per test, small fakes.

The database is `IAS_TEST_DATABASE_URL` when set, else a throwaway embedded cluster created
on first use and removed at exit. No PostgreSQL is a failure, never a skip. A StoreTestCase's schema is
made (migrated) ahead and dropped after by tests/schema_maker.py's process, while tests wait.

The model in process is `ScriptedLLM`; the wire (the SDK, retries, deadlines, replies other
servers really send) is tests/servers/llm.py's. `FAST` is set by `make test-fast`: tests that run
iAs as a process or a cluster of their own skip themselves (`slow`); `make test` and CI run all.
"""
from __future__ import annotations

import asyncio
import atexit
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from ias.app import App, build
from ias.auditchain import AuditChain
from ias.channels.base import FAILED, SENT, Channel
from ias.config import Config
from ias.llm import Reply, ToolCall, Usage
from ias.pgcluster import Cluster
from ias.store import Store
from tests.schema_maker import schema_dsn

# iAs imports the SDK on its first request: 1-3 s (more beside other suites) that would come out of whatever
# deadline a test gives that request. Imported here once per test process instead; tests/test_llm.py checks
# the first request's import in a fresh interpreter.
importlib.import_module("openai")

REPO = Path(__file__).resolve().parent.parent
SKILL_LIB = str(REPO / "resources" / "lib")
FIXTURES = Path(__file__).resolve().parent / "fixtures"

_server: dict = {}        # "dsn", and "maker": the schema maker once started


def server_dsn() -> str:
    """The DSN of the test server, starting the throwaway cluster on first call."""
    if "dsn" not in _server:
        url = os.environ.get("IAS_TEST_DATABASE_URL", "").strip()
        if url:
            _server["dsn"] = url
        else:
            root = Path(tempfile.mkdtemp(prefix="ias-test-pg-"))
            os.chmod(root, 0o755)
            cluster = Cluster(root / "pg", fsync=False)
            try:
                _server["dsn"] = cluster.start()
            except Exception as exc:
                shutil.rmtree(root, ignore_errors=True)
                raise RuntimeError(f"tests need PostgreSQL and none could be started: {exc}") from exc

            def cleanup() -> None:
                cluster.stop()
                shutil.rmtree(root, ignore_errors=True)
            atexit.register(cleanup)
            if threading.current_thread() is threading.main_thread() \
                    and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                def terminated(signum, _frame) -> None:     # `timeout`, a CI limit: no cluster left behind
                    if "maker" in _server:
                        _server["maker"].process.kill()
                    cleanup()
                    os._exit(128 + signum)
                signal.signal(signal.SIGTERM, terminated)
    return _server["dsn"]


def fresh_schema_dsn() -> tuple[str, str]:
    """A DSN whose search_path is a new, empty schema (and the schema's name)."""
    dsn = server_dsn()
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return schema_dsn(dsn, name), name


def migrated_schema_dsn() -> tuple[str, str]:
    """As fresh_schema_dsn, the schema already at the latest migration (made ahead by tests/schema_maker.py)."""
    name = _maker().take()
    return schema_dsn(server_dsn(), name), name


def drop_schema(name: str) -> None:
    """Drop a test's schema, in the schema maker's process: the next test does not wait for it."""
    _maker().drop(name)


class _SchemaMaker:
    """The process of tests/schema_maker.py for this test process (its own throwaway files removed at exit)."""

    def __init__(self, dsn: str):
        self.errors = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "tests.schema_maker", dsn], cwd=REPO, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors)
        self.lock = threading.Lock()

    def take(self) -> str:
        with self.lock:
            name = self.process.stdout.readline().strip()
            if not name:
                self.errors.seek(0)
                raise RuntimeError("tests/schema_maker.py stopped: " + self.errors.read().decode(errors="replace"))
            self.process.stdin.write("make\n")
            self.process.stdin.flush()
            return name

    def drop(self, name: str) -> None:
        with self.lock:
            self.process.stdin.write(f"drop {name}\n")
            self.process.stdin.flush()

    def close(self) -> None:
        """Drop what is left, before the cluster stops."""
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self.errors.close()


def _maker() -> _SchemaMaker:
    if "maker" not in _server:
        dsn = server_dsn()
        _server["maker"] = maker = _SchemaMaker(dsn)
        atexit.register(maker.close)       # runs before the cluster's cleanup, registered earlier
    return _server["maker"]


FAST = os.environ.get("IAS_TEST_FAST", "") == "1"
# Slow: runs iAs as a process of its own (daemon, command, helper) or a PostgreSQL cluster of its own.
slow = unittest.skipIf(FAST, "runs iAs as a process or a cluster of its own: skipped by make test-fast (make test "
                             "runs it)")

# unittest's IsolatedAsyncioTestCase runs its loop in debug mode, which logs every step of a task over 0.1 s as
# "Executing <Task …> took N seconds". Two kinds are not the daemon holding its loop, and are dropped:
# - a test's own coroutine (test_*, asyncSetUp, asyncTearDown) blocking on purpose: `ias` run as a process,
#   SQL through `sql()`, a FlakyStore losing its database, writing a few hundred skills;
# - a step of the daemon's own tasks under SLOW_CALLBACK seconds: on a machine running other suites a
#   10 ms step takes 0.2 s, and 0.6 s with four test processes on two cores. A step over it (e.g. importing openai on the loop, 1-3 s) is still reported.
# And "Close running child process: kill …": the runner, cancelled, sends SIGKILL to a skill's group and closes
# its transport before the child is reaped (asyncio reaps it after); debug mode only.
SLOW_CALLBACK = 1.0
_TEST_STEP = re.compile(r"coro=<\w+\.(?:test_\w*|asyncSetUp|asyncTearDown)\(\)")


class _DebugLoopNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Executing %s took %.3f seconds" and len(record.args) == 2:
            handle, seconds = record.args
            return seconds >= SLOW_CALLBACK and not _TEST_STEP.search(str(handle))
        return not str(record.msg).startswith("Close running child process")


logging.getLogger("asyncio").addFilter(_DebugLoopNoise())
# psycopg logs "error ignored terminating <AsyncPipeline [BAD]>: the connection is lost" when a test cuts a
# store's connections on purpose (FlakyStore.lose, a killed server); the store meets the loss as an error of its own.
logging.getLogger("psycopg").addFilter(lambda record: not str(record.msg).startswith("error ignored terminating"))


def test_chain(test: unittest.TestCase) -> AuditChain:
    """A fresh audit chain key, and a head file in a directory removed after `test`."""
    where = Path(tempfile.mkdtemp(prefix="ias-chain-"))
    test.addCleanup(shutil.rmtree, where, True)
    return AuditChain.derive(os.urandom(32), where / "audit.head")


class StoreTestCase(unittest.IsolatedAsyncioTestCase):
    """A test with `self.store` on its own fresh schema (schema.sql applied)."""

    @classmethod
    def setUpClass(cls) -> None:
        server_dsn()        # start the cluster outside the event loop

    async def asyncSetUp(self) -> None:
        self.dsn, self.schema_name = migrated_schema_dsn()
        self.chain = test_chain(self)
        self.store = await Store.open(self.dsn, chain=self.chain)

    async def asyncTearDown(self) -> None:
        await self.store.close()
        await asyncio.to_thread(drop_schema, self.schema_name)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        """Run SQL directly (outside the store) on this test's schema; returns rows if any."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def task_runs(self, task_id: int) -> list[SimpleNamespace]:
        """A task's runs, newest first, read with SQL (attributes named as the columns)."""
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
            rows = conn.execute("SELECT * FROM task_runs WHERE task_id = %s ORDER BY id DESC", (task_id,)).fetchall()
        return [SimpleNamespace(**row) for row in rows]


class FakeClock:
    """Simulated time with `ias.clock.Clock`'s interface, for every test: the wall clock (`at`, aware; a
    test sets it or makes it jump alone) and the monotonic clock (`seconds`); `advance` moves both."""

    def __init__(self, at: datetime, seconds: float = 1000.0):
        self.at = at
        self.seconds = seconds

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.seconds

    def timestamp(self) -> float:
        """The wall clock in seconds since the epoch, for what takes that (the WeChat channel's `now`)."""
        return self.at.timestamp()

    def advance(self, seconds: float) -> None:
        """Time passes: both clocks move on."""
        self.at += timedelta(seconds=seconds)
        self.seconds += seconds


class FakeOwner:
    """The owner at the other end of a channel: records every message, can refuse delivery."""

    def __init__(self, deliver: bool = True):
        self.deliver = deliver
        self.messages: list[str] = []
        self.arrived = asyncio.Event()

    async def notify(self, text: str) -> bool:
        self.messages.append(text)
        self.arrived.set()
        return self.deliver

    async def code(self, timeout: float = 10) -> str:
        """Wait for a confirmation message and return its code."""
        await asyncio.wait_for(self.arrived.wait(), timeout)
        self.arrived.clear()
        match = CODE_LINE.search(self.messages[-1])
        assert match, self.messages[-1]
        return match.group(1)


CODE_LINE = re.compile(r"确认码：(\d{6})")


class FlakyStore:
    """A second store on a test's schema whose database can be taken away as when its server dies: `lose()`
    sends new connections to a closed port and cuts the open ones, idle or busy (found by their
    application_name); `restore()` gives the database back."""

    def __init__(self, store: Store, tag: str):
        self.store = store
        self.tag = tag
        self.kept = store.dsn

    @classmethod
    async def open(cls, dsn: str, chain: AuditChain) -> FlakyStore:
        tag = "ias-flaky-" + uuid.uuid4().hex[:8]
        return cls(await Store.open(make_conninfo(dsn, application_name=tag), chain=chain), tag)

    def lose(self) -> None:
        from tests.servers import closed_port
        self.store.dsn = f"host=127.0.0.1 port={closed_port()} dbname=ias user=ias"
        with psycopg.connect(server_dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                         (self.tag,))
            deadline = time.monotonic() + 10
            while conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = %s", (self.tag,)).fetchall():
                assert time.monotonic() < deadline, "the flaky store's connections did not end"
                time.sleep(0.01)

    def restore(self) -> None:
        self.store.dsn = self.kept


class GateTestCase(StoreTestCase):
    """A store plus the objects `app.build` wires over `system_skills` and `user_skills` (default:
    tests/fixtures/gate): `self.app`, and its registry, runner, approvals and gate as attributes.

    The runner's environment is `runner_environ()`: PATH plus what a subclass adds (e.g. the
    base URL of a local server started before `super().asyncSetUp()`).
    """
    approval_timeout = 5.0
    system_skills: Path | None = None
    user_skills: Path | None = FIXTURES / "gate"

    def runner_environ(self) -> dict[str, str]:
        return {"PATH": os.environ["PATH"]}

    async def asyncSetUp(self) -> None:
        await super().asyncSetUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-gate-"))
        self.key = os.urandom(32)
        self.use(self.build())
        self.marker = granted("marker")       # mark_high writes it: GRANTS, as its ## Sandbox says
        self.owner = FakeOwner()

    def build(self, *, environ: dict[str, str] | None = None, store: Store | None = None, **options) -> App:
        """`app.build` over this test's store (or `store`), key and data directory; `options` go to build
        (llm, now, channels, primary …); `environ` replaces `runner_environ()`."""
        config = Config(data_dir=self.tmp, system_skills_dir=self.system_skills, skills_dir=self.user_skills,
                        approval_timeout=self.approval_timeout,
                        environ=self.runner_environ() if environ is None else environ)
        return build(config, store or self.store, key=self.key, **options)

    def use(self, app: App) -> App:
        """Make `app` this test's: self.app and its registry, runner, approvals, gate, agent and router."""
        self.app = app
        self.registry, self.runner, self.approvals, self.gate = app.registry, app.runner, app.approvals, app.gate
        self.agent, self.router = app.agent, app.router
        return app

    async def asyncTearDown(self) -> None:
        # As the daemon stops (app.run): skills end, their calls record how they ended, turns still in flight
        # (a console line answered late) are cancelled. Else they meet a dropped schema after the test and print
        # "Task exception was never retrieved" and unclosed-connection warnings into a green run.
        await self.app.runner.kill_all()
        await self.app.gate.drain(5)
        if self.app.router is not None:         # built without a model and channels: none
            await self.app.router.cancel()
            await self.app.gate.drain(5)
        await super().asyncTearDown()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def runs(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0

    def call_high(self, user: str = "owner", notify=None, **params):
        """Start a High call in the background; returns its task."""
        params.setdefault("marker", str(self.marker))
        return asyncio.create_task(self.gate.call(user, "mark_high", params, notify or self.owner.notify))


class SkillsTestCase(GateTestCase):
    """The gate over the shipped skills (resources/skills and skills/)."""
    system_skills = REPO / "resources" / "skills"
    user_skills = REPO / "skills"


GRANTS = Path("/tmp/ias-test-grants")     # where fixture skills may write: their `## Sandbox` grants it
_granted: list[Path] = []


def granted(stem: str) -> Path:
    """A fresh path in GRANTS (sticky and open to the sandbox user), removed when the tests end: where a
    fixture skill leaves its pid file or marker for the test (never the repository or the data dir)."""
    GRANTS.mkdir(exist_ok=True)
    os.chmod(GRANTS, 0o1777)
    path = GRANTS / f"{stem}-{uuid.uuid4().hex}"
    _granted.append(path)
    return path


@atexit.register
def _remove_granted() -> None:
    for path in _granted:
        for name in (path, path.with_name(path.name + ".tmp")):
            try:
                name.unlink()
            except OSError:
                pass


def fixture_copy(test: unittest.TestCase, name: str) -> Path:
    """tests/fixtures/NAME copied into a temporary directory, its symlinks made files: a sandboxed skill sees
    its own directory only, so a script linked in from tests/servers must be there for real."""
    root = Path(tempfile.mkdtemp(prefix=f"ias-fixture-{name}-"))
    test.addCleanup(shutil.rmtree, root, True)
    shutil.copytree(FIXTURES / name, root / name)
    return root / name


def skill_pgid(pidfile: Path) -> int:
    """The host's process group of the running skill given `pidfile` (its own $$ is its sandbox's pid)."""
    pids = with_env(f"IAS_PARAM_PIDFILE={pidfile}")
    if not pids:
        raise AssertionError(f"no running skill was given {pidfile}")
    return os.getpgid(pids[0])


def with_env(marker: str) -> list[int]:
    """Host pids of the live processes whose environment holds `marker` (`NAME=value`): a sandboxed skill's
    processes, whatever pid namespace they are in (their own pids mean nothing out here)."""
    wanted = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rpartition(b")")[2].split()[0]
        except OSError:
            continue
        if wanted in environ and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


async def until(predicate, timeout: float = 10) -> None:
    """Wait for an observable end state that has no event of its own (a file written, a flag flipped)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.01)


def load_script(path: Path, name: str):
    """Import a skill script as a module, for the helpers a subprocess test cannot reach."""
    if SKILL_LIB not in sys.path:     # what the runner's PYTHONPATH gives a skill
        sys.path.append(SKILL_LIB)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keep_root_logging(test: unittest.TestCase) -> None:
    """Undo, when `test` ends, what the code it runs does to the root logger: `cli.main`'s basicConfig leaves a
    stderr handler that would print every later test's logs into the run."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    def restore() -> None:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    test.addCleanup(restore)


def capture_logs(test: unittest.TestCase) -> list[logging.LogRecord]:
    """Every log record emitted (at any level) until the test ends."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    root = logging.getLogger()
    test.addCleanup(root.setLevel, root.level)
    test.addCleanup(root.removeHandler, handler)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    return records


class FakeChannel(Channel):
    """A channel without a window whose posts are recorded (and can be refused: FAILED); `wait_for()` waits
    for one. Files are recorded in `files` as (user, name, bytes, caption, texts sent before it)."""

    def __init__(self, name: str = "fake", deliver: bool = True):
        self.name = name
        self.deliver = deliver
        self.sent: list[tuple[str, str]] = []
        self.files: list[tuple[str, str, bytes, str | None, int]] = []
        self._arrived = asyncio.Condition()

    async def start(self, deliver) -> None:
        self.inbound = deliver

    async def stop(self) -> None:
        pass

    async def post(self, user_id: str, text: str, client_id: str) -> str:
        async with self._arrived:
            self.sent.append((user_id, text))
            self._arrived.notify_all()
        return SENT if self.deliver else FAILED

    async def send_file(self, user_id: str, path: Path, caption: str | None, client_id: str) -> str:
        if not self.deliver:
            return FAILED
        async with self._arrived:
            if caption:
                self.sent.append((user_id, caption))
            self.files.append((user_id, path.name, path.read_bytes(), caption, len(self.sent)))
            self._arrived.notify_all()
        return SENT

    async def wait_for(self, needle: str, timeout: float = 10) -> str:
        """The first sent text containing `needle` (waiting for it if need be)."""
        async def find():
            async with self._arrived:
                while True:
                    for _, text in self.sent:
                        if needle in text:
                            return text
                    await self._arrived.wait()
        return await asyncio.wait_for(find(), timeout)


class ScriptedLLM:
    """The model in process (simonw/llm's MockModel): what `ias.llm.LLM` offers the agent, `complete(messages,
    tools) -> Reply` and `close()`, answered from a script with no HTTP and no SDK.

    A step is a Reply (`answer`, `ask`) or an exception to raise (e.g. `LLMError`, as after the endpoint's
    retries). Each request is kept as the JSON body it would be on the wire (`bodies`; `requests` decoded), so
    a test sees what the model was sent, not the agent's lists as they are later. A call past the script is
    recorded in `problems` and raises AssertionError into the turn; `assert_complete()` fails on either.
    Not the wire: retries, deadlines and calls written as text are tests/servers/llm.py's.
    """
    model = "test-model"

    def __init__(self, *steps: Reply | Exception, repeat_last: bool = False):
        self.steps = list(steps)
        self.repeat_last = repeat_last          # the last step answers every later request
        self.bodies: list[str] = []
        self.problems: list[str] = []
        self.closed = False

    def script(self, *steps: Reply | Exception) -> None:
        self.steps.extend(steps)

    async def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        self.bodies.append(json.dumps({"model": self.model, "messages": messages, "tools": tools}, ensure_ascii=False))
        await asyncio.sleep(0)                  # a request is a point where the turn can be cancelled
        if self.closed or not self.steps:
            self.problems.append("the model was called after close()" if self.closed
                                 else "the model was called more often than scripted")
            raise AssertionError(self.problems[-1])
        step = self.steps[0] if (self.repeat_last and len(self.steps) == 1) else self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    async def close(self) -> None:
        self.closed = True

    @property
    def requests(self) -> list[dict]:
        """Every request as its decoded body: {"model", "messages", "tools"}."""
        return [json.loads(body) for body in self.bodies]

    def assert_complete(self) -> None:
        """Fail if the model was called past its script, or scripted steps were never requested."""
        if self.problems:
            raise AssertionError("; ".join(self.problems))
        if self.steps and not self.repeat_last:
            raise AssertionError(f"{len(self.steps)} scripted model replies were never requested")


def answer(content: str | None, usage: Usage | None = None) -> Reply:
    """A model reply with this text (and these tokens: None, nothing is counted)."""
    return Reply(content, (), ScriptedLLM.model, usage)


def ask(*calls: tuple[str, dict | str], usage: Usage | None = None) -> Reply:
    """A model reply asking for `calls`, (name, arguments) pairs; arguments may be raw JSON text."""
    return Reply(None, tuple(ToolCall(f"call_{i}", name, args if isinstance(args, str) else json.dumps(args))
                             for i, (name, args) in enumerate(calls)), ScriptedLLM.model, usage)
