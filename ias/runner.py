"""Run a skill's bash script in its own process group: the script executor (`Runner.run -> Outcome`).

This is the only module that spawns skill processes. A run is `bash -c <Execute>`
spawned with an argument list (never a shell string built from parameters), in the
skill's directory, in a new session, with the parameters as JSON on stdin and in
`IAS_PARAMS` / `IAS_PARAM_<KEY>`: parameters only ever reach the script as data.

Handled, and why:
- The environment is built from an empty dict: the default would hand every skill
  the daemon's secrets (OPENAI_API_KEY, the database URL) and NOTIFY_SOCKET. A
  skill gets PATH, LANG, TZ, a private HOME, the IAS_* variables and only the
  names it lists in `## Env`; a listed name cannot replace one of those.
- Timeout and shutdown signal the whole process group (`os.killpg`): SIGTERM, `kill_grace`
  seconds, SIGKILL (a cancelled call, e.g. by the stop word: CANCEL_GRACE). `proc.kill()` would
  reach bash only and leave its children alive holding the pipes, so the output would never end.
- When bash exits, the pipes are drained for at most DRAIN_TIMEOUT and whatever it
  left running in its group is then terminated the same way: a run never outlives
  its call, and its HOME (a fresh 0700 directory) is removed afterwards. A group
  whose members are all zombies (a container whose init never reaps) counts as gone.
- stdout is kept up to OUTPUT_HELD_MAX bytes; past that the group is killed and the
  rest discarded, so a flood cannot grow the daemon. stderr keeps its tail only.
- stdin is written without blocking while output is read; a script that exits
  without reading it is fine.
- A run's HOME is named after the process that owns it, so `processes.recover()` can end
  what a dead daemon's runs left running. Where `setpriv` exists, bash runs with
  PR_SET_PDEATHSIG=SIGKILL: if the daemon dies, the group leader dies with it at once.
  (The /proc and process-group primitives live in processes.py.)
- Files a result names for the owner are copied out before HOME goes (outgoing.py; HOME is then on disk).
- `execute` reports the process's facts (`RunResult`); `run`, the executor interface
  (outcome.py), turns them into the model's result (results.of_run) and the audit's facts.
- Environment limits: Linux caps one environment string at 128 KiB and cannot carry
  NUL, so an IAS_PARAMS or IAS_PARAM_* value that contains NUL, is not valid UTF-8
  (a lone surrogate) or is longer than ENV_VALUE_MAX bytes is left out; so is one
  that would take the parameter variables past ENV_TOTAL_MAX bytes, and two keys
  that map to the same name both are. The script always gets every parameter on
  stdin.
- The sandbox (sandbox.py builds the command line; SPEC 10): a skill and an MCP server
  run inside bubblewrap, as an unprivileged user when iAs is root, seeing only the
  system's read-only files, the Python, the helper, its own directory (read-only), a
  private HOME (a tmpfs at the run directory's path, so the host's run directory stays
  empty and is never written by another user) and /tmp, and no network unless `## Sandbox`
  says `- network`. Its pid namespace ends with the call: a process that left the group
  (`setsid`, a double fork) is killed by the kernel when the script's first process exits,
  so nothing outlives the call. The group's leader is then bwrap, which SIGTERM would kill
  at once (and the sandbox with it): SIGTERM goes to the other members, so a script still
  gets its grace period; bwrap reports a death by signal as 128+N, turned back into -N
  when the runner sent the signals. The level is probed once per process, in a thread.

Not handled:
- A `- unconfined` skill (High, approved call by call) and every skill on a host without
  the full sandbox level run as the daemon's user, outside any sandbox; there a process
  that leaves the group escapes killpg, the drain is bounded, and the escapee is left
  running. What may run at all is decided by the approval gate, not here.

`loop.subprocess_exec` with an own protocol is used rather than
`asyncio.create_subprocess_exec`: on Python 3.11.7+ `Process.wait()` waits for the
pipes to close as well, so an escapee holding stdout would block it forever, and
`Process` has no public way to close the pipes. The exec is the same.
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .clock import ZONE_NAME
from .limits import (CANCEL_GRACE, DRAIN_TIMEOUT, ENV_TOTAL_MAX, ENV_VALUE_MAX, KILL_GRACE, OUTPUT_HELD_MAX,
                     REAP_WAIT, STDERR_HELD_MAX)
from . import outgoing, results
from .outcome import Outcome, RunResult
from .processes import end_leftovers, group_alive, identity, pdeathsig, remove_tree, signal_group, terminate
from .sandbox import Policy, Sandbox, with_trust_store
from .skills import RESERVED_ENV, Skill

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_NOT_ENV_NAME = re.compile(r"[^A-Z0-9_]")


@dataclass(frozen=True, slots=True, eq=False)
class Server:
    """A running MCP server process: its pipes (the process's streams) and its private HOME."""
    name: str
    process: asyncio.subprocess.Process
    home: str
    sandboxed: bool = True       # its group leader is bwrap: SIGTERM goes to the others (see signal_group)


_SERVER_VAR = re.compile(r"\$(?:\{(IAS_PYTHON|IAS_HOME|IAS_SKILL_DIR)\}|(IAS_PYTHON|IAS_HOME|IAS_SKILL_DIR)\b)")


@dataclass(slots=True, eq=False)
class _Run:
    """Bookkeeping for one run, shared with kill_all()."""
    stop: asyncio.Event = field(default_factory=asyncio.Event)   # overflow or shutdown: end the run now
    done: asyncio.Event = field(default_factory=asyncio.Event)
    sandboxed: bool = False
    signalled: bool = False      # the runner signalled the group (an exit status over 128 is then a signal's)


class _Output(asyncio.SubprocessProtocol):
    """Collects a run's output as it arrives and signals its exit and the end of its output."""

    def __init__(self, stop: asyncio.Event):
        self.stdout = bytearray()
        self.stdout_size = 0
        self.stderr = bytearray()
        self.overflowed = False
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()
        self._stop = stop
        self._open = {1, 2}
        self._transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport) -> None:
        self._transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 2:
            self.stderr += data
            if len(self.stderr) > STDERR_HELD_MAX:
                del self.stderr[:-STDERR_HELD_MAX]
            return
        self.stdout_size += len(data)
        room = OUTPUT_HELD_MAX - len(self.stdout)
        if room > 0:
            self.stdout += data[:room]
        if self.stdout_size > OUTPUT_HELD_MAX and not self.overflowed:
            self.overflowed = True
            if not self.exited.is_set():
                # The writer blocks on the full pipe until the group is killed; after bash has
                # exited nobody would resume, so a leftover's flood is read and dropped instead.
                self._transport.get_pipe_transport(1).pause_reading()
            self._stop.set()

    def discard_rest(self) -> None:
        """After an overflow kill: read the pipe to its end without holding anything."""
        pipe = self._transport.get_pipe_transport(1)
        if pipe is not None and not pipe.is_closing():
            pipe.resume_reading()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open:
            self.closed.set()

    def process_exited(self) -> None:
        self.exited.set()


class Runner:
    """Spawns skills and keeps track of the ones running, so shutdown can end them."""

    def __init__(self, *, repo_root: Path, run_dir: Path, environ: Mapping[str, str] | None = None,
                 python: str = sys.executable, kill_grace: float = KILL_GRACE, sandbox: Sandbox | None = None,
                 outgoing: Path | None = None, inbox: Path | None = None):
        self._repo_root = os.path.abspath(repo_root)
        self._outgoing, self._inbox = outgoing, inbox      # files a result names: copied to, and also taken from
        self._run_dir = Path(os.path.abspath(run_dir))
        self.sandbox = sandbox or Sandbox(repo_root=self._repo_root, data_dir=self._run_dir.parent, python=python)
        self._environ = os.environ if environ is None else environ
        self._python = python
        self._kill_grace = kill_grace
        self._runs: set[_Run] = set()
        self._servers: set[Server] = set()

    @property
    def run_dir(self) -> Path:
        """Where the runs' HOME directories are made."""
        return self._run_dir

    @property
    def running(self) -> int:
        """Number of skills running now."""
        return len(self._runs)

    async def run(self, skill: Skill, params: dict, user: str | None = None) -> Outcome:
        """The executor interface: run script skill `skill` and report its Outcome (`user` plays no part)."""
        run = await self.execute(skill, params)
        return Outcome(skill.name, results.of_run(run), duration=run.duration, output_size=run.output_size,
                       truncated=results.truncated(run), timed_out=run.timed_out, exit_code=run.exit_code,
                       files=run.files)

    async def execute(self, skill: Skill, params: dict, *, timeout: float | None = None) -> RunResult:
        """Run `skill` with `params` (defaults already applied), wait for it to end; the process's facts."""
        limit = float(skill.timeout if timeout is None else timeout)
        entry = _Run()
        self._runs.add(entry)
        try:
            return await self._run(skill, params, limit, entry)
        finally:
            self._runs.discard(entry)
            entry.done.set()

    async def kill_all(self) -> None:
        """Daemon shutdown: terminate every running group concurrently and wait for their runs to return."""
        runs = list(self._runs)
        for entry in runs:
            entry.stop.set()
        await asyncio.gather(*(entry.done.wait() for entry in runs))

    async def _run(self, skill: Skill, params: dict, limit: float, entry: _Run) -> RunResult:
        text = _params_json(params)
        directory = os.path.abspath(skill.directory)
        if not self.sandbox.probed:         # once per process: a sandbox is started to see what works
            await asyncio.to_thread(self.sandbox.level)
        output = _Output(entry.stop)
        home = None
        try:
            try:
                self._run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                pid, start = identity()
                home = tempfile.mkdtemp(prefix=f"run-{pid}-{start}-", dir=self._run_dir)
                env = self._environment(skill, params, text, directory, home)
                bash = shutil.which("bash", path=env["PATH"])    # said here: setpriv/bwrap would use words of their own
                if bash is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "bash")
                argv, entry.sandboxed = self._contained([bash, "-c", skill.execute], skill.sandbox, directory, home, env,
                                                        keep_home=self._outgoing is not None)
                transport, _ = await asyncio.get_running_loop().subprocess_exec(
                    lambda: output, *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    cwd=directory, env=env, start_new_session=True)
            except (OSError, ValueError) as exc:
                log.warning("skill %s: spawn failed: %s", skill.name, exc)
                return RunResult(skill=skill.name, exit_code=127, stdout="", stderr=f"spawn failed: {_reason(exc)}",
                                 timed_out=False, overflowed=False, timeout=limit, duration=0.0, output_size=0,
                                 started_at=time.monotonic())
            started = time.monotonic()
            stdin = transport.get_pipe_transport(0)
            stdin.write(text.encode("utf-8"))
            stdin.close()   # once flushed; EPIPE from a script that never reads stdin is ignored
            try:
                timed_out = await self._supervise(skill.name, transport.get_pid(), output, started + limit, entry)
                duration = time.monotonic() - started
            finally:
                transport.close()
            ended = transport.get_returncode() == 0 and not timed_out and not output.overflowed
            taken = await outgoing.collect(bytes(output.stdout), output.stdout_size, ended, (home, self._inbox), self._outgoing)
        finally:
            if home is not None:
                await remove_tree(home)
        code = transport.get_returncode()
        if entry.sandboxed and entry.signalled and code is not None and 128 < code < 160:
            code = 128 - code       # bwrap reports a signal's death as 128+N, as a shell does
        result = RunResult(
            skill=skill.name, exit_code=code,
            stdout=output.stdout.decode("utf-8", "replace"),
            stderr=_lstrip_partial(output.stderr).decode("utf-8", "replace"),
            timed_out=timed_out, overflowed=output.overflowed, timeout=limit,
            duration=duration, output_size=output.stdout_size, started_at=started, files=taken[0], refused=taken[1])
        log.info("skill %s ended: exit %s in %.3fs, %d bytes out%s%s", skill.name, result.exit_code,
                 result.duration, result.output_size, ", timed out" if timed_out else "",
                 ", overflowed" if output.overflowed else "")
        return result

    async def _supervise(self, name: str, pgid: int, output: _Output, deadline: float, entry: _Run) -> bool:
        """Wait for the run to end, ending its group when it must; whether it timed out."""
        log.info("skill %s started (pid %d)", name, pgid)   # a session leader: its pid is the group id
        try:
            exited = asyncio.ensure_future(output.exited.wait())
            stopped = asyncio.ensure_future(entry.stop.wait())
            try:
                await asyncio.wait((exited, stopped), timeout=max(0.0, deadline - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                exited.cancel()
                stopped.cancel()
            timed_out = False
            if not output.exited.is_set():
                timed_out = not entry.stop.is_set()
                why = "timed out" if timed_out else "output overflow" if output.overflowed else "shutdown"
                log.warning("skill %s: %s; terminating group %d", name, why, pgid)
                entry.signalled = True
                await terminate(pgid, entry.sandboxed, self._kill_grace)
                await output.exited.wait()   # reaped
            if output.overflowed:
                output.discard_rest()
            await _wait_for(output.closed, DRAIN_TIMEOUT)
            if group_alive(pgid):
                if not entry.sandboxed:
                    log.warning("skill %s: terminating what it left running in group %d", name, pgid)
                await end_leftovers(pgid, entry.sandboxed, self._kill_grace)
                await _wait_for(output.closed, DRAIN_TIMEOUT)
            if not output.closed.is_set():
                log.warning("skill %s: output still open after the drain; a process left its group", name)
            return timed_out
        except BaseException:   # cancelled: a short grace lets a script end a group of its own (execute_shell's)
            entry.signalled = True
            try:
                await terminate(pgid, entry.sandboxed, CANCEL_GRACE)
            finally:
                signal_group(pgid, signal.SIGKILL)
                # Reaped before the caller closes the transport: close() polls a child that asyncio's watcher is
                # reaping too, and the loser logs "Unknown child process pid N, will report returncode 255".
                await _wait_for(output.exited, REAP_WAIT)
            raise

    def _contained(self, argv: list[str], policy: Policy, directory: str, home: str,
                   env: dict[str, str], keep_home: bool = False) -> tuple[list[str], bool]:
        """`argv` as spawned: in the sandbox (SPEC 10), unless `- unconfined` or the host has no full level;
        and whether it is. Raises PermissionError for a policy that may not run (a path inside the data dir)."""
        if policy.unconfined or not self.sandbox.level().full:
            return [*pdeathsig(), *argv], False
        policy = with_trust_store(policy, env)
        refused = self.sandbox.refused(policy)
        if refused:
            raise PermissionError(errno.EACCES, refused)
        if keep_home and self.sandbox.root:
            os.chown(home, *self.sandbox.account())
        return self.sandbox.command(argv, policy, directory=directory, home=home, keep_home=keep_home), True

    def _environment(self, skill: Skill, params: dict, text: str, directory: str, home: str) -> dict[str, str]:
        """The child's whole environment, built from nothing."""
        env = self._base_environment(skill.name, skill.env, directory, home)
        env.update(_param_environment(params, text))
        return env

    def _base_environment(self, name: str, names: tuple[str, ...], directory: str, home: str) -> dict[str, str]:
        """What every child gets: the fixed variables plus the `## Env` names, nothing else of ours."""
        env = {}
        for key in names:
            value = self._environ.get(key)
            if value is not None and key not in RESERVED_ENV and not key.startswith("IAS_PARAM_"):
                env[key] = value
        env.update(
            PATH=self._environ.get("PATH") or DEFAULT_PATH,
            LANG="C.UTF-8",
            TZ=ZONE_NAME,
            HOME=home,
            IAS_SKILL=name,
            IAS_SKILL_DIR=directory,
            IAS_PYTHON=self._python,
            IAS_HOME=self._repo_root,
            PYTHONPATH=os.path.join(self._repo_root, "resources", "lib"),     # the ias_skill helper
            PYTHONDONTWRITEBYTECODE="1",        # a skill leaves nothing behind in the repository
        )
        return env

    # -- long-lived MCP servers (ias/mcp/ speaks to them; they are spawned and ended here) --

    def server_command(self, words: tuple[str, ...], directory: str) -> list[str]:
        """An `## MCP` command line's words with $IAS_PYTHON, $IAS_HOME and $IAS_SKILL_DIR put in."""
        values = {"IAS_PYTHON": self._python, "IAS_HOME": self._repo_root, "IAS_SKILL_DIR": directory}
        return [_SERVER_VAR.sub(lambda m: values[m[1] or m[2]], word) for word in words]

    async def start_server(self, name: str, words: tuple[str, ...], directory: Path, env_names: tuple[str, ...],
                           line_max: int, policy: Policy = Policy()) -> Server:
        """Start an MCP server (no shell) in its own session, in its directory, with a scrubbed environment and
        a private HOME under the run directory (so `recover` ends it if this process dies); raises OSError."""
        directory = os.path.abspath(directory)
        if not self.sandbox.probed:
            await asyncio.to_thread(self.sandbox.level)
        self._run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        pid, start = identity()
        home = tempfile.mkdtemp(prefix=f"run-{pid}-{start}-mcp-", dir=self._run_dir)
        try:
            env = self._base_environment(name, env_names, directory, home)
            argv = self.server_command(words, directory)
            program = (shutil.which(argv[0], path=env["PATH"]) if "/" not in argv[0]
                       else argv[0] if os.access(os.path.join(directory, argv[0]), os.X_OK) else None)
            if program is None:    # said here: behind setpriv the exec error would be setpriv's words
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
            command, sandboxed = self._contained([program, *argv[1:]], replace(policy, unconfined=False), directory,
                                                 home, env)
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, cwd=directory, env=env, start_new_session=True, limit=line_max)
        except BaseException:
            await remove_tree(home)
            raise
        server = Server(name, proc, home, sandboxed)
        self._servers.add(server)
        log.info("mcp server %s started (pid %d)", name, proc.pid)
        return server

    async def stop_server(self, server: Server, grace: float) -> None:
        """stdin closed, `grace` seconds to leave; then SIGTERM to the group, kill_grace, SIGKILL; reaped."""
        proc = server.process
        try:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
            if proc.returncode is None:
                try:
                    await asyncio.wait_for(proc.wait(), grace)
                except asyncio.TimeoutError:
                    await terminate(proc.pid, server.sandboxed, self._kill_grace)
            if group_alive(proc.pid):          # what it left behind in its group
                await end_leftovers(proc.pid, server.sandboxed, self._kill_grace)
            if not await _wait_for_process(proc, DRAIN_TIMEOUT):
                log.warning("mcp server %s: a process that left its group still holds its pipes", server.name)
        except BaseException:
            signal_group(proc.pid, signal.SIGKILL)
            raise
        finally:
            self._servers.discard(server)
            await remove_tree(server.home)
        log.info("mcp server %s stopped (exit %s)", server.name, proc.returncode)


def _params_json(params: dict) -> str:
    """The stdin/IAS_PARAMS text; escaped to ASCII only when a lone surrogate makes it unencodable."""
    text = json.dumps(params, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(params)
    return text


def _param_environment(params: dict, text: str) -> dict[str, str]:
    """IAS_PARAMS and IAS_PARAM_<KEY>, leaving out values the environment cannot carry."""
    env = {}
    budget = ENV_TOTAL_MAX
    size = _env_size(text)
    if size <= budget:
        env["IAS_PARAMS"] = text
        budget -= size
    names = Counter(_param_name(key) for key in params)
    for key, value in params.items():
        name = _param_name(key)
        if names[name] > 1:
            continue
        value = _param_text(value)
        size = _env_size(value)
        if size <= budget:
            env[name] = value
            budget -= size
    return env


def _param_name(key: str) -> str:
    return "IAS_PARAM_" + _NOT_ENV_NAME.sub("_", str(key).upper())


def _param_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value)   # true/false, null, numbers


def _env_size(value: str) -> int:
    """Bytes `value` takes in the environment; past ENV_VALUE_MAX when it cannot go there at all."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return ENV_TOTAL_MAX + 1
    return size if "\0" not in value and size <= ENV_VALUE_MAX else ENV_TOTAL_MAX + 1


async def _wait_for(event: asyncio.Event, timeout: float) -> bool:
    """Wait for `event` at most `timeout` seconds; whether it was set."""
    if event.is_set():
        return True
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


async def _wait_for_process(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Wait for a reaped process's pipes to close (Process.wait waits for both); whether they did in time."""
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc)


def _lstrip_partial(tail: bytes) -> bytes:
    """Drop the continuation bytes of a character cut off at the start of a kept tail."""
    i = 0
    while i < min(3, len(tail)) and 0x80 <= tail[i] <= 0xBF:
        i += 1
    return bytes(tail[i:])
