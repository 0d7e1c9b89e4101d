#!/usr/bin/env python3
"""Run the owner-approved command line with bash and report exit code, stdout and stderr as JSON.

The command is passed to bash as one argv element (`bash -c -- COMMAND`), never spliced into
another shell string. It runs in its own process group (a new session) so that the time limit
can end everything it started; the same happens when this helper is itself told to stop
(SIGTERM/SIGINT/SIGHUP from the runner's timeout), so nothing outlives the run.

Output is read concurrently from both pipes; only the start and the end of each stream are kept
(HEAD + TAIL bytes), so a flood costs no memory, and the JSON result always fits the 64 KiB the
model may see. Stdlib and the ias_skill helper (on PYTHONPATH from the runner).
"""
import json
import os
import signal
import subprocess
import threading
import time

import ias_skill
from ias_skill import SkillError, group_alive, signal_group

DEFAULT_TIMEOUT = 110.0          # below the skill's ## Timeout (120 s), so the result is still printed
KILL_GRACE = 2.0                 # seconds between SIGTERM and SIGKILL of the command's group
DRAIN_TIMEOUT = 2.0              # seconds to wait for the pipes after bash has exited
LIMITS = {"stdout": 24 * 1024, "stderr": 8 * 1024}   # bytes kept per stream (start and end)
RESULT_MAX = 60 * 1024           # bytes of the JSON result, under the runner's 64 KiB


class Capture:
    """Reads one pipe to its end, keeping the first and the last bytes only."""

    def __init__(self, pipe, limit):
        self.pipe = pipe
        self.head_max = limit * 3 // 4
        self.tail_max = limit - self.head_max
        self.head = bytearray()
        self.tail = bytearray()
        self.size = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            while True:
                chunk = os.read(self.pipe.fileno(), 65536)
                if not chunk:
                    break
                self.size += len(chunk)
                room = self.head_max - len(self.head)
                if room > 0:
                    self.head += chunk[:room]
                    chunk = chunk[room:]
                if chunk:
                    self.tail += chunk
                    if len(self.tail) > self.tail_max:
                        del self.tail[:-self.tail_max]
        except OSError:
            pass

    @property
    def truncated(self):
        return self.size > len(self.head) + len(self.tail)

    def text(self, limit):
        """The kept output as text, at most about `limit` bytes, with a marker where bytes were left out."""
        data = bytes(self.head) + bytes(self.tail)
        if not self.truncated and len(data) <= limit:
            return data.decode("utf-8", "replace")
        head_n = min(len(self.head), limit * 3 // 4)
        tail_n = min(len(self.tail), limit - head_n) if self.truncated else min(len(data) - head_n, limit - head_n)
        head = data[:head_n]
        tail = data[len(data) - tail_n:] if tail_n else b""
        omitted = self.size - len(head) - len(tail)
        return (head.decode("utf-8", "replace") + f"\n…[{omitted} bytes omitted]…\n"
                + tail.decode("utf-8", "replace"))


def terminate(pgid):
    """SIGTERM the group, then SIGKILL what is left after KILL_GRACE seconds."""
    if not signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + KILL_GRACE
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if not group_alive(pgid):
            return
    signal_group(pgid, signal.SIGKILL)


def drain(*captures):
    """Wait at most DRAIN_TIMEOUT seconds in all for the readers to reach the end of their pipes."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    for capture in captures:
        capture.thread.join(max(0.0, deadline - time.monotonic()))


def inner_timeout():
    raw = os.environ.get("IAS_SHELL_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_TIMEOUT
    return min(max(value, 0.1), DEFAULT_TIMEOUT)


def main(stdin_text):
    command = ias_skill.params(stdin_text).get("command")
    if not isinstance(command, str) or not command.strip():
        raise SkillError("command must be a non-empty string")
    if "\0" in command:
        raise SkillError("command contains a NUL character, which a command line cannot carry")

    home = os.environ.get("HOME") or os.getcwd()
    env = {k: v for k, v in os.environ.items()
           if k not in ("IAS_PARAMS", "IAS_SHELL_TIMEOUT", "PYTHONPATH") and not k.startswith("IAS_PARAM_")}
    limit = inner_timeout()
    started_pids = []

    def stop(signum, _frame):
        # The runner's own timeout or shutdown: the command's group left ours, so end it too.
        for pid in started_pids:
            signal_group(pid, signal.SIGKILL)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stop)
    try:
        proc = subprocess.Popen(["bash", "-c", "--", command], cwd=home, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise SkillError(f"could not start bash: {exc.strerror or exc}") from None
    started_pids.append(proc.pid)

    out = Capture(proc.stdout, LIMITS["stdout"])
    err = Capture(proc.stderr, LIMITS["stderr"])
    started = time.monotonic()
    timed_out = False
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        terminate(proc.pid)
        proc.wait()
    duration = time.monotonic() - started
    # bash is gone; give the pipes a moment, then end whatever it left running in its group.
    drain(out, err)
    if group_alive(proc.pid):
        terminate(proc.pid)
        drain(out, err)

    code = proc.returncode
    result = {"success": code == 0 and not timed_out, "exit_code": code}
    if timed_out:
        result["error"] = f"command timed out after {limit:g} s and was terminated"
        result["timed_out"] = True
    elif code < 0:
        result["error"] = f"command was killed by signal {-code}"
    elif code != 0:
        result["error"] = f"command exited with status {code}"
    result["truncated"] = out.truncated or err.truncated
    result["duration_s"] = round(duration, 3)
    out_limit, err_limit = LIMITS["stdout"], LIMITS["stderr"]
    while True:
        result["stdout"] = out.text(out_limit)
        result["stderr"] = err.text(err_limit)
        size = len(json.dumps(result, ensure_ascii=False).encode("utf-8"))
        if size <= RESULT_MAX:
            break
        # Escaped control characters take up to six bytes each: shrink until the JSON fits.
        out_limit, err_limit = out_limit // 2, err_limit // 2
        result["truncated"] = True
    return result


if __name__ == "__main__":
    ias_skill.run(main, "execute_shell failed")
