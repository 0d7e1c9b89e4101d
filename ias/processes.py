"""Processes and process groups: who is alive (/proc), ending a group, and recovery after a crash.

The primitives the runner uses on the processes it spawns (runner.py is the only module that
spawns skill processes and MCP servers):
- A process is named by (pid, start time) — `identity()` — so a recycled pid is never taken
  for the process that once had it; `alive()` checks that pair.
- A group is ended by `terminate` (SIGTERM, a grace period, SIGKILL) or, once its first process
  is gone, by `end_leftovers`. A sandboxed group's leader is bwrap, which SIGTERM would kill at
  once (and the sandbox with it): SIGTERM then goes to the other members. A group whose members
  are all zombies (a container whose init never reaps) counts as gone.
- Where util-linux's `setpriv` exists, `pdeathsig()` is the prefix that makes a spawned leader
  die with the daemon (PR_SET_PDEATHSIG=SIGKILL, set before it execs, so no preexec_fn in a
  threaded process).
- A run's HOME is named after the process that owns it (`run-<pid>-<start time>-…`), so the
  next daemon start can tell the leftovers of a dead process (kill -9, power loss) from the
  runs of a one-off command sharing the data directory right now: `recover()` ends what a dead
  owner's runs left running (found by their HOME in /proc/<pid>/environ) and removes their
  run directories.

Not handled: a process that left its group (outside the sandbox) is out of reach of killpg;
`recover` finds a leftover only by its HOME, so one that changed its environment is left running.
Linux only (/proc).
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .limits import KILL_POLL, LEFTOVER_POLL

log = logging.getLogger(__name__)

_RUN_DIR = re.compile(r"run-(\d+)-(\d+)-[^/]+")
_setpriv: list[str] | None = None        # the pdeathsig prefix, once known ([] = not available)


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot), None when it is gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] in (b"Z", b"X") else int(fields[19])


def identity() -> tuple[int, int]:
    """This process, as (pid, start time): unlike a pid alone, never the same for two processes."""
    pid = os.getpid()
    return pid, process_start(pid) or 0


def alive(pid: int, start: int) -> bool:
    """Whether the process `identity()` described is still running."""
    return process_start(pid) == start


def pdeathsig() -> list[str]:
    """`setpriv --pdeathsig KILL --` when this system's setpriv supports it, else nothing."""
    global _setpriv
    if _setpriv is None:
        path = shutil.which("setpriv")
        _setpriv = []
        if path:
            try:
                ok = subprocess.run([path, "--pdeathsig", "KILL", "--", "true"], stdin=subprocess.DEVNULL,
                                    capture_output=True, timeout=5).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                _setpriv = [path, "--pdeathsig", "KILL", "--"]
    return _setpriv


def signal_group(pgid: int, sig: int, spare_leader: bool = False) -> bool:
    """Send `sig` to the group (to all its members but the leader when `spare_leader`); False when none of it
    is left."""
    try:
        os.killpg(pgid, 0 if spare_leader else sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("cannot signal process group %d", pgid)
    if spare_leader:
        for pid in members(pgid) - {pgid}:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return True


def members(pgid: int) -> set[int]:
    """The pids of the group's processes that are not zombies."""
    members = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return members
    for pid in pids:
        fields = _stat(pid)
        if fields is not None and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.add(int(pid))
    return members


def group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs; zombies that init never reaps (a container
    without an init) do not count."""
    return signal_group(pgid, 0) and bool(members(pgid))


async def end_leftovers(pgid: int, sandboxed: bool, grace: float) -> None:
    """End what a run left in its group once its first process is gone. Sandboxed, that first process was
    bwrap: its pid namespace is already being torn down by the kernel (bwrap returns as soon as the
    script exits, its init follows a moment later), so no grace is owed: SIGKILL, and wait briefly."""
    if not sandboxed:
        await terminate(pgid, False, grace)
        return
    signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while group_alive(pgid) and time.monotonic() < deadline:
        await asyncio.sleep(LEFTOVER_POLL)

async def terminate(pgid: int, sandboxed: bool, grace: float) -> None:
    """SIGTERM the group, give it `grace` seconds, then SIGKILL whatever is left.

    A sandboxed group's leader is bwrap, which would die of SIGTERM at once and take the
    sandbox with it, grace or not: SIGTERM goes to the other members; SIGKILL to all."""
    if not signal_group(pgid, signal.SIGTERM, spare_leader=sandboxed):
        return
    deadline = time.monotonic() + grace
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(KILL_POLL, left))
        if not group_alive(pgid):
            return
    signal_group(pgid, signal.SIGKILL)


def recover(run_dir: Path) -> int:
    """At daemon start: end what dead processes' runs left running, and remove their run directories.

    A run directory whose owner (named in it) still runs is left alone: a one-off command may
    be using it right now. A process counts as a dead run's when its HOME is that run's
    directory; its whole group is killed. Returns the number of directories removed.
    """
    try:
        entries = [entry for entry in os.scandir(run_dir) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    leftovers = set()
    for entry in entries:
        match = _RUN_DIR.fullmatch(entry.name)
        if match is None or not alive(int(match[1]), int(match[2])):
            leftovers.add(os.path.abspath(entry.path))
    if not leftovers:
        return 0
    for pgid in _groups_with_home(leftovers):
        log.warning("killing process group %d left running by a run of a process that is gone", pgid)
        signal_group(pgid, signal.SIGKILL)
    for path in leftovers:
        shutil.rmtree(path, onerror=force_remove)
        if os.path.lexists(path):
            log.warning("could not remove leftover run directory %s", path)
    log.info("removed %d leftover run directories from %s", len(leftovers), run_dir)
    return len(leftovers)


def _groups_with_home(homes: set[str]) -> set[int]:
    """Process groups of the running processes whose environment has HOME set to one of `homes`."""
    wanted = {b"HOME=" + os.fsencode(home) for home in homes}
    groups = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            if wanted.intersection(environ):
                groups.add(os.getpgid(int(name)))
        except OSError:
            continue
    groups.discard(os.getpgrp())       # never our own
    return groups


async def remove_tree(path: str) -> None:
    """Remove a run's HOME; a thread only when the script left something in it."""
    try:
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        pass
    await asyncio.to_thread(shutil.rmtree, path, onerror=force_remove)
    if os.path.lexists(path):
        log.warning("could not remove run directory %s", path)


def force_remove(func, path: str, _exc_info) -> None:
    """rmtree error hook: scripts leave read-only directories behind (Go's module cache does)."""
    try:
        os.chmod(os.path.dirname(path), 0o700)
        if func in (os.rmdir, os.unlink):
            func(path)
        else:
            os.chmod(path, 0o700)
            shutil.rmtree(path, onerror=force_remove)
    except OSError:
        pass
