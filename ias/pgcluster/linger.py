"""The embedded cluster's linger: the idle mark its last user leaves in `<datadir>.idle` and the detached reaper
(sh and sleep, then `python -m ias.pgcluster`) that stops the server once the linger is over.

When to linger, and the stop itself (under the start lock, only while nobody uses the server and the mark is
still the reaper's), are the cluster's. Not handled: a reaper killed by someone else (the server then runs
until the next user leaves), and a clock set back during a linger (`doctor` shows the idle time as 0).
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

PACKAGE_PARENT = Path(__file__).resolve().parent.parent.parent    # where `python -m ias.pgcluster` finds it


def leave(idle_file: Path, datadir: Path, bindir: Path | None, seconds: float) -> None:
    """Mark the server idle and leave a reaper that stops it after `seconds` unless a later user left a newer
    mark (or uses it then). The previous reaper, still asleep, is ended: one waits at a time, however many
    commands ran. OSError when none could be left."""
    token = f"{time.time():.6f}:{os.getpid()}:{secrets.token_hex(4)}"
    # sh and sleep while it waits (a megabyte or two), Python only for the stop itself.
    argv = ["/bin/sh", "-c", 'sleep "$0" && exec "$@"', f"{seconds:.3f}", sys.executable, "-m", "ias.pgcluster",
            str(datadir), token, str(bindir or "")]
    end_reaper(idle_file)
    # Its own session, no descriptors, no secrets in its environment: it outlives this process alone.
    reaper = subprocess.Popen(argv, cwd=PACKAGE_PARENT, env={"PATH": os.environ.get("PATH", os.defpath)},
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    idle_file.write_text(f"{token}\n{reaper.pid}\n", encoding="ascii")


def mark(idle_file: Path) -> tuple[str, int] | None:
    """The idle mark: the token its reaper carries and that reaper's pid (0 when unknown), or None."""
    try:
        token, _, pid = idle_file.read_text(encoding="ascii").partition("\n")
        return token.strip(), int(pid.strip() or 0)
    except (OSError, ValueError):
        return None


def end_reaper(idle_file: Path) -> None:
    """End the reaper of the current mark while it still sleeps (its session: sh and sleep), if it is that
    reaper (its command line carries the token: a reused pid is left alone)."""
    found = mark(idle_file)
    if found is None or not found[1]:
        return
    token, pid = found
    try:
        if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
            os.killpg(pid, signal.SIGTERM)
    except OSError:
        pass                                        # gone already, or not ours


def idle_for(idle_file: Path) -> float | None:
    """Seconds since the mark was left, or None without one."""
    found = mark(idle_file)
    try:
        return max(0.0, time.time() - float(found[0].split(":")[0])) if found else None
    except ValueError:
        return None
