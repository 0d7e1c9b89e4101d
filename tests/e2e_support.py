"""End-to-end harness: iAs run the way the README says, from a fresh copy of the repository.

A `Copy` is the repository's files (what git tracks, plus new files it does not ignore; never
.venv/ or var/) copied into a temporary directory. Every command runs as
`sys.executable <copy>/ias.py …` with cwd = the copy and default settings, so the state lives in
`<copy>/var` and the database is the embedded cluster in `<copy>/var/pg`. The interpreter is the
test's (the venv's, which has openai and psycopg); the `ias` package it imports is the copy's,
because the script's directory comes first on sys.path.

Children get the test's environment minus IAS_*, OPENAI_*, PG* and systemd's variables, plus
what a test adds. Each runs in its own session. `Copy.reset()` kills whatever a test left
running — our commands and daemons, the skills whose pid files we read, the copy's PostgreSQL
(pg_ctl stop as the data directory's owner, then SIGKILL by pid) — so a failing test never
leaks processes into the next one. Nothing here knows iAs's internals: it reads what a user
sees (stdout, stderr, the terminal, `ias audit`) and, where the contract names a table, the
database through the cluster's own socket.

Not handled: a machine whose umask keeps the postgres user out of the copy (the copy's root
is made 0755, the rest follows the umask).
"""
from __future__ import annotations

import json
import os
import pty
import queue
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.servers.llm import LLMServer, calls, text

REPO = Path(__file__).resolve().parent.parent
CODE_LINE = re.compile(r"确认码：(\d{6})")
STEP = 60.0            # seconds any single step (a command, a daemon start, a reply) may take
POLL = 0.05            # seconds between checks of a file or a process table
ECHO = "回声："         # what the echo model puts before the owner's message
NOT_INHERITED = ("IAS_", "OPENAI_", "PG", "NOTIFY_SOCKET", "WATCHDOG_", "LISTEN_")

# User skills installed into every copy's skills/ (the README's way of adding a skill).
E2E_SKILLS = {
    "e2e_hold": """# Hold

Writes "PGID HOME" to `pidfile`, then waits until the file `until` exists (or 300 s without it).

## Risk Level
Low

## Parameters
```json
{"type": "object", "properties": {"pidfile": {"type": "string"}, "until": {"type": "string"}},
 "required": ["pidfile"], "additionalProperties": false}
```

## Execute
```bash
echo "$$ $HOME" > "$IAS_PARAM_PIDFILE.tmp" && mv "$IAS_PARAM_PIDFILE.tmp" "$IAS_PARAM_PIDFILE"
if [ -n "${IAS_PARAM_UNTIL:-}" ]; then
  while [ ! -e "$IAS_PARAM_UNTIL" ]; do sleep 0.05; done
  echo released
else
  sleep 300
fi
```

## Timeout
600
""",
    "e2e_home": """# Home writer

Writes a file under `~` (like many tools' caches do) and prints where `~` was.

## Risk Level
Low

## Parameters
```json
{"type": "object", "properties": {}, "additionalProperties": false}
```

## Execute
```bash
mkdir -p "$HOME/.cache/e2e" && echo kept > "$HOME/.cache/e2e/file" && echo "$HOME"
```
""",
}


def child_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without iAs's, the LLM's, libpq's and systemd's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
    env.update(extra or {})
    return env


def repo_files() -> list[str]:
    """Relative paths of the repository's files: git's tracked and new unignored ones, else a walk."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True, timeout=STEP).stdout
        return [p for p in out.decode("utf-8", "surrogateescape").split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "var", "__pycache__", "build"}
        found = []
        for top, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
            found += [os.path.relpath(os.path.join(top, f), REPO) for f in files]
        return found


@dataclass(frozen=True, slots=True)
class Proc:
    """One process seen in /proc."""
    pid: int
    state: str
    ppid: int
    pgid: int
    cmdline: list[str]
    cwd: str


def processes() -> list[Proc]:
    """Every process readable in /proc (zombies included, with their state)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                cwd = ""
        except OSError:
            continue
        found.append(Proc(int(entry), fields[0].decode(), int(fields[1]), int(fields[2]), cmdline, cwd))
    return found


def skill_group(marker: str) -> int:
    """The host's process group of the live skill whose environment holds `marker` (`NAME=value`)."""
    wanted = marker.encode()
    for proc in processes():
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if proc.state not in ("Z", "X") and wanted in f.read().split(b"\0"):
                    return proc.pgid
        except OSError:
            continue
    raise AssertionError(f"no running skill with {marker} in its environment")


def group_alive(pgid: int) -> list[Proc]:
    """The live (not zombie) members of process group `pgid`."""
    return [p for p in processes() if p.pgid == pgid and p.state not in ("Z", "X")]


def wait_until(predicate, timeout: float = STEP) -> bool:
    """Poll `predicate` every POLL seconds until it holds or `timeout` passes; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(POLL)


class EchoLLM(LLMServer):
    """The suite's OpenAI-compatible endpoint answering every request with ECHO + the owner's last message.

    While `tool` is set to (name, arguments), a request ending with the owner's message is
    answered with that tool call instead; the request carrying its result gets the echo.
    """

    def __init__(self):
        super().__init__([text("")], repeat_last=True)
        self.tool: tuple[str, dict] | None = None

    def _next(self, raw: bytes) -> dict:
        super()._next(raw)
        messages = json.loads(raw)["messages"]
        if self.tool is not None and messages[-1]["role"] == "user":
            return calls(self.tool)
        return text(ECHO + next(m["content"] for m in reversed(messages) if m["role"] == "user"))


def llm_env(server: LLMServer) -> dict[str, str]:
    """What a child needs to reach `server` (the local endpoint accepts the key sk-test)."""
    return {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url, "IAS_MODEL": "test-model"}


@dataclass(frozen=True, slots=True)
class Result:
    """A finished command: exit code and its output decoded as UTF-8 (invalid bytes replaced)."""
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"


class Copy:
    """A fresh copy of the repository in a temporary directory, and what runs in it."""

    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="ias-e2e-"))
        # Pid files and release files: outside the copy (a skill may write nothing of the repository),
        # granted to the e2e skills by their `## Sandbox`, writable by the user skills run as.
        self.scratch = Path(tempfile.mkdtemp(prefix="ias-e2e-scratch-"))
        try:
            os.chmod(self.root, 0o755)      # the postgres OS user must reach var/pg
            os.chmod(self.scratch, 0o777)
            for rel in repo_files():
                source = REPO / rel
                if source.is_file():
                    (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, self.root / rel)
            for name, spec in E2E_SKILLS.items():
                (self.root / "skills" / name).mkdir(parents=True)
                (self.root / "skills" / name / "SKILL.md").write_text(
                    f"{spec}\n## Sandbox\n- write: {self.scratch}\n", encoding="utf-8")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self.pgdata = self.root / "var" / "pg"
        self.procs: list[subprocess.Popen] = []
        self.prefix: list[str] = []         # what runs each command (e.g. as another user); nothing by default
        self.skill_groups: set[int] = set()
        self._names = 0

    # -- running commands ------------------------------------------------------------------
    def argv(self, *args: str | bytes) -> list[str | bytes]:
        return [*self.prefix, sys.executable, str(self.root / "ias.py"), *args]

    def spawn(self, *args: str | bytes, env: dict[str, str] | None = None, **popen) -> subprocess.Popen:
        """Start `ias ARGS…` in the copy, in its own session; killed by reset() if still running."""
        proc = subprocess.Popen(self.argv(*args), cwd=self.root, env=child_environ(env), start_new_session=True,
                                **popen)
        self.procs.append(proc)
        return proc

    def ias(self, *args: str | bytes, env: dict[str, str] | None = None, timeout: float = STEP) -> Result:
        """Run `ias ARGS…` to its end, stdin from /dev/null; fails the test if it outlives `timeout`."""
        proc = self.spawn(*args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return finish(proc, timeout)

    def confirm(self, *args: str, env: dict[str, str] | None = None, timeout: float = STEP) -> tuple[Result, str]:
        """Run `ias ARGS…` on a terminal, type the confirmation code it shows; (result, what the terminal showed).

        stdin and stderr are a pty (the confirmation message goes to stderr), stdout a pipe.
        """
        master, slave = pty.openpty()
        try:
            proc = self.spawn(*args, env=env, stdin=slave, stderr=slave, stdout=subprocess.PIPE)
        finally:
            os.close(slave)
        screen, out = bytearray(), bytearray()
        typed = False
        streams = {master: screen, proc.stdout.fileno(): out}
        deadline = time.monotonic() + timeout
        try:
            while streams and time.monotonic() < deadline:
                ready, _, _ = select.select(list(streams), [], [], POLL * 2)
                for fd in ready:
                    try:
                        data = os.read(fd, 65536)
                    except OSError:             # EIO: the terminal's last writer is gone
                        data = b""
                    if data:
                        streams[fd].extend(data)
                    else:
                        del streams[fd]
                if not typed and (match := CODE_LINE.search(screen.decode("utf-8", "replace"))):
                    os.write(master, match.group(1).encode() + b"\n")
                    typed = True
                if proc.poll() is not None and proc.stdout.fileno() not in streams:
                    break
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                raise AssertionError(f"`ias {' '.join(args)}` still running after {timeout:g}s; terminal:\n"
                                     f"{screen.decode('utf-8', 'replace')[-3000:]}") from None
        finally:
            os.close(master)
            proc.stdout.close()
        shown = screen.decode("utf-8", "replace")
        if not typed:
            raise AssertionError(f"`ias {' '.join(args)}` never showed a confirmation code; terminal:\n{shown[-3000:]}"
                                 f"\n--- stdout\n{out.decode('utf-8', 'replace')[-3000:]}")
        return Result(proc.returncode, out.decode("utf-8", "replace"), shown), shown

    def daemon(self, env: dict[str, str] | None = None) -> "Daemon":
        return Daemon(self, env)

    # -- what the skills and the audit log say ---------------------------------------------
    def name(self, stem: str) -> Path:
        """A fresh path in the scratch directory."""
        self._names += 1
        return self.scratch / f"{stem}-{self._names}"

    def read_pidfile(self, path: Path, watch: subprocess.Popen | None = None,
                     timeout: float = STEP) -> tuple[int, Path]:
        """Wait for an e2e_hold pid file: (the skill's process group, its HOME resolved against the copy).

        Fails at once if `watch` (the process that should run the skill) exits first.
        """
        def ready():
            if path.exists():
                return True
            if watch is not None and watch.poll() is not None:
                raise AssertionError(f"the process running the skill exited ({watch.returncode}) before it started")
            return False
        if not wait_until(ready, timeout):
            raise AssertionError(f"the skill never wrote {path} within {timeout:g}s")
        _pid, home = path.read_text().strip().split(" ", 1)
        pgid = skill_group(f"IAS_PARAM_PIDFILE={path}")      # its own $$ is a pid of its sandbox's namespace
        self.skill_groups.add(pgid)
        return pgid, self.root / home     # a relative HOME would be relative to the copy at best

    def audit_lines(self) -> list[str]:
        """Every row `ias audit` shows (a large --limit)."""
        result = self.ias("audit", "--limit", "10000")
        if result.returncode != 0:
            raise AssertionError(f"`ias audit` failed: {result.describe()}")
        return result.stdout.splitlines()

    # -- the embedded cluster --------------------------------------------------------------
    def cluster_processes(self) -> list[Proc]:
        """Live processes of the copy's cluster: its postmaster (-D path), its children (cwd = data dir), pg_ctl."""
        pgdata = str(self.pgdata)
        return [p for p in processes() if p.pid != os.getpid() and p.state not in ("Z", "X")
                and (p.cwd == pgdata or any(pgdata in a for a in p.cmdline))]

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid from postmaster.pid, if that process is alive."""
        try:
            pid = int((self.pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if any(p.pid == pid for p in self.cluster_processes()) else None

    def connect_sql(self):
        """A psycopg connection to the iAs database of the running cluster (the one with pending_approvals)."""
        import psycopg
        sockets = sorted(self.pgdata.glob(".s.PGSQL.*"))
        if not sockets:
            raise AssertionError("the cluster is not running: no socket in the data directory")
        base = {"host": str(self.pgdata), "port": sockets[0].name.rsplit(".", 1)[1], "user": "postgres",
                "passfile": str(self.pgdata.with_name("pg.password"))}
        with psycopg.connect(**base, dbname="postgres", autocommit=True) as conn:
            names = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")]
        for dbname in names:
            conn = psycopg.connect(**base, dbname=dbname, autocommit=True)
            if conn.execute("SELECT to_regclass('pending_approvals')").fetchone()[0] is not None:
                return conn
            conn.close()
        raise AssertionError(f"no database of the cluster has a pending_approvals table ({names})")

    def stop_cluster(self) -> None:
        """pg_ctl stop (as the data directory's owner) if the cluster runs, then SIGKILL whatever is left of it."""
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                pg_ctl = Path(os.readlink(f"/proc/{pid}/exe")).with_name("pg_ctl")
                owner = self.pgdata.stat().st_uid
                subprocess.run([str(pg_ctl), "stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-t", "30"],
                               cwd="/", env=child_environ(), capture_output=True, timeout=STEP,
                               user=owner if os.geteuid() == 0 and owner != 0 else None)
            except (OSError, subprocess.SubprocessError):
                pass
        for proc in self.cluster_processes():
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        wait_until(lambda: not self.cluster_processes(), 10)
        # A killed postmaster lingers as a zombie until init reaps it (late, in some containers),
        # and PostgreSQL takes the zombie's pid in postmaster.pid and the socket's lock file for a
        # live server: wait for the reaping, so the next test starts from a cleanly stopped cluster.
        stale = [self.pgdata / "postmaster.pid", *self.pgdata.glob(".s.PGSQL.*.lock")]
        pids = set()
        for path in stale:
            try:
                pids.add(int(path.read_text().split("\n", 1)[0]))
            except (OSError, ValueError):
                pass
        wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), STEP)
        if self.postmaster_pid() is None:
            (self.pgdata / "postmaster.pid").unlink(missing_ok=True)

    # -- cleaning up -----------------------------------------------------------------------
    def reset(self) -> None:
        """Kill what the test left running (commands, daemons, skills) and stop the cluster."""
        for proc in self.procs:
            kill_group(proc)
        self.procs.clear()
        root = str(self.root)
        for pgid in self.skill_groups:
            for proc in group_alive(pgid):
                if proc.cwd.startswith(root):      # still one of ours, not a reused pid
                    try:
                        os.kill(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
        self.skill_groups.clear()
        self.stop_cluster()

    def remove(self) -> None:
        self.reset()
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def tree(self, *tops: str) -> set[str]:
        """Every path (files and directories) below the copy's `tops`, relative to the copy."""
        found = set()
        for top in tops:
            for base, dirs, files in os.walk(self.root / top):
                found.update(os.path.relpath(os.path.join(base, n), self.root) for n in (*dirs, *files))
        return found


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a process started by Copy.spawn and its session's group; reap it; close its pipes."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream:
            try:
                stream.close()
            except OSError:
                pass


def finish(proc: subprocess.Popen, timeout: float = STEP) -> Result:
    """Wait for a process with piped stdout/stderr; fail the test (after killing it) past `timeout`."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{proc.args[2:]} still running after {timeout:g}s; stderr:\n"
                             f"{(err or b'').decode('utf-8', 'replace')[-3000:]}") from None
    return Result(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


class Daemon:
    """The daemon of a copy, driven through its console channel: lines to stdin, replies from stdout.

    stdout lines are queued by a reader thread; stderr (the log) is kept whole for failure messages.
    """

    def __init__(self, copy: Copy, env: dict[str, str] | None = None):
        self.proc = copy.spawn(env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.log.append), daemon=True).start()

    @staticmethod
    def _read(stream, put) -> None:
        for raw in stream:
            put(raw.decode("utf-8", "replace").rstrip("\n"))
        put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        return "\n".join(line for line in list(self.log) if line is not None)

    def send(self, line: str | bytes) -> None:
        """One line to the console (bytes as they are, so a test can send invalid UTF-8)."""
        try:
            self.proc.stdin.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass                                 # it died; the caller finds out by the missing reply

    def next_line(self, timeout: float = STEP) -> str | None:
        """The next stdout line, or None at EOF or after `timeout`."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list[str]:
        """Lines already printed and not yet read."""
        lines = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return lines
            if line is not None:
                lines.append(line)

    def reply(self, message: str, timeout: float = STEP) -> str | None:
        """Send `message` and return the first line printed after it (None: no reply in time)."""
        self.drain()
        self.send(message)
        return self.next_line(timeout)

    def wait_for(self, needle: str, timeout: float = STEP) -> str | None:
        """The first stdout line containing `needle` (None: EOF or timeout)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            line = self.next_line(left)
            if line is None:
                return None
            if needle in line:
                return line
        return None

    def terminate(self, timeout: float = STEP) -> int:
        """SIGTERM the daemon (only it, as systemd's KillMode=mixed does first) and wait for its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the daemon did not exit within {timeout:g}s of SIGTERM; log:\n"
                                 f"{self.stderr()[-3000:]}") from None

    def kill9(self) -> None:
        """kill -9 of the daemon alone (its skills and PostgreSQL live in other sessions)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STEP)


class NotifySocket:
    """A systemd-style NOTIFY_SOCKET, to learn when a daemon says READY=1."""

    def __init__(self, directory: Path):
        self.path = str(directory / f"notify-{os.getpid()}-{time.monotonic_ns()}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)

    def ready(self, timeout: float) -> bool:
        """Whether a READY=1 datagram arrives within `timeout`."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.sock], [], [], left)[0]:
                return False
            if b"READY=1" in self.sock.recv(4096).split(b"\n"):
                return True
        return False

    def close(self) -> None:
        self.sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass
