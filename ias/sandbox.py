"""Containment (SPEC 10): what a skill process or an MCP server can reach. The only module that knows how.

A skill runs inside bubblewrap (`bwrap`) with fresh ipc, pid, net, uts and cgroup namespaces and a
filesystem made of read-only system parts only: `/usr` and the `/bin` `/lib*` `/sbin` links, `/etc`
with its secrets masked, the Python that runs iAs and its venv, the `ias_skill` helper, the skill's
own directory (read-only), a private HOME at the run directory's path and a private `/tmp` (both
tmpfs, gone with the call; a skill run whose result may send files gets the host's run directory
bound as HOME instead, removed by the runner after the call: disk, not memory, bounds it then),
`/dev` (null, urandom, …) and a `/proc` of its own pid namespace.
Nothing of `$IAS_DATA_DIR`, the repository, ias.toml, the secret key or the database socket exists
in there. `## Sandbox` adds the network (`- network`: the host's network namespace) and paths
(`- read: PATH`, `- write: PATH`); `- unconfined` (High skills only) runs without any of this.

Never root: when iAs runs as root, bwrap runs privileged (no user namespace: it builds the mounts
as root, so a 0700 parent such as /root or a temporary directory is no obstacle) and keeps only
CAP_SETUID/SETGID/SETPCAP for `setpriv`, which then becomes the unprivileged user (`nobody`, or
`[sandbox] user`) with no capabilities, an empty bounding set and no_new_privs before it execs the
skill: its real uid outside is the unprivileged one. As any other user, bwrap makes a user
namespace (`--unshare-all`) and nested user namespaces are disabled.

Nothing outlives the call: the pid namespace's init (bwrap) exits when the skill's first process
does, and the kernel then kills everything left inside it, `setsid -f` and double forks included.

The level (`probe()`, once per process): `full` when a sandbox of exactly that kind starts here;
else `none` with what is missing (no bwrap, user namespaces refused, no unprivileged user).
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace

from .limits import PROBE_TIMEOUT, SANDBOX_TMPFS_MAX

DEFAULT_USER = "nobody"
# System trees every sandbox sees read-only (those that exist; a symlink stays a symlink).
SYSTEM_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Secrets under /etc: a file is covered with /dev/null, a directory with an empty tmpfs.
ETC_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
               "/etc/security/opasswd", "/etc/ssl/private", "/etc/ias", "/etc/ssh/ssh_host_*_key",
               "/etc/credstore", "/etc/credstore.encrypted")


@dataclass(frozen=True, slots=True)
class Policy:
    """A skill's `## Sandbox`: what it may reach beyond the default."""
    network: bool = False
    read: tuple[str, ...] = ()          # absolute or `~/…`, as written
    write: tuple[str, ...] = ()
    unconfined: bool = False

    def lines(self) -> list[str]:
        """The permissions as `## Sandbox` lines (also the cache's form)."""
        if not (self.network or self.read or self.write or self.unconfined):
            return []                   # the default, most skills' (thousands are listed at once)
        return ((["unconfined"] if self.unconfined else []) + (["network"] if self.network else [])
                + [f"read: {p}" for p in self.read] + [f"write: {p}" for p in self.write])

    def describe(self) -> str:
        """One phrase for `skills` and `doctor`: `default` or the permissions, comma-separated."""
        return ", ".join(self.lines()) or "default"

    @classmethod
    def from_lines(cls, lines: list[str]) -> Policy:
        """The inverse of `lines()`; raises ValueError on a line that is no permission."""
        network, unconfined, read, write = False, False, [], []
        for line in lines:
            kind, path = parse_permission(line)
            if kind == "network":
                network = True
            elif kind == "unconfined":
                unconfined = True
            elif path not in (read if kind == "read" else write):
                (read if kind == "read" else write).append(path)
        return cls(network, tuple(read), tuple(write), unconfined)


def parse_permission(line: str) -> tuple[str, str | None]:
    """One `## Sandbox` line (list marker and backticks already gone): (kind, PATH or None); ValueError why not."""
    text = line.strip()
    word, colon, rest = text.replace("：", ":").partition(":")
    word = word.strip().lower()
    if not colon and word in ("network", "unconfined"):
        return word, None
    if colon and word in ("read", "write"):
        path = rest.strip().strip("`").strip()
        if not path or not (path.startswith("/") or path.startswith("~/")):
            raise ValueError(f"'{word}:' needs a PATH that is absolute or starts with ~/")
        if "\0" in path or any(part == ".." for part in path.split("/")):
            raise ValueError(f"'{word}:' PATH may not contain '..'")
        return word, os.path.normpath(path) if path.startswith("/") else "~/" + os.path.normpath(path[2:])
    raise ValueError("a '## Sandbox' line is one of: '- network', '- read: PATH', '- write: PATH', '- unconfined'")


TRUST_STORE_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR")


def with_trust_store(policy: Policy, env: dict[str, str]) -> Policy:
    """`policy` plus read access to the CA bundle a skill was handed in SSL_CERT_FILE / SSL_CERT_DIR (names
    it lists in `## Env`, values the owner set): a private CA is public data, and TLS needs it."""
    extra = tuple(env[name] for name in TRUST_STORE_ENV
                  if env.get(name, "").startswith("/") and env[name] not in policy.read)
    return replace(policy, read=policy.read + extra) if extra else policy


def expand(path: str) -> str:
    """A policy PATH on this host: `~/…` is the home directory of the user iAs runs as."""
    if path.startswith("~/"):
        return os.path.join(pwd.getpwuid(os.getuid()).pw_dir, path[2:])
    return path


def inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path` is `root` or below it (both made absolute; symlinks resolved)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class Level:
    """What this host gives: `full`, `partial: …` or `none` (with why, for the logs and `skills check`)."""
    name: str                 # "full" | "partial" | "none"
    missing: str = ""         # what is missing, for partial and none

    def __str__(self) -> str:
        return "partial: " + self.missing if self.name == "partial" else self.name

    @property
    def full(self) -> bool:
        return self.name == "full"


_levels: dict[str, Level] = {}          # by sandbox user, probed once per process
_probing: dict[str, subprocess.Popen | Level] = {}      # probes begun and not yet waited for (begin_probe)


class Sandbox:
    """Builds the command line that runs a program under a Policy (see the module docstring)."""

    def __init__(self, *, repo_root: str | os.PathLike, data_dir: str | os.PathLike, python: str = sys.executable,
                 user: str | None = None, hidden: tuple[str | os.PathLike, ...] = ()):
        self.repo_root = os.path.abspath(repo_root)
        self.data_dir = os.path.abspath(data_dir)
        self.python = python
        self.user = user or DEFAULT_USER
        self.hidden = tuple(os.path.abspath(p) for p in hidden)     # config and key files wherever they are
        self._bwrap = shutil.which("bwrap", path=os.environ.get("PATH", "") + ":/usr/bin:/bin")
        self._setpriv = shutil.which("setpriv", path=os.environ.get("PATH", "") + ":/usr/bin:/bin")
        self._base: list[str] | None = None

    @property
    def root(self) -> bool:
        return os.getuid() == 0

    def account(self) -> tuple[int, int]:
        """(uid, gid) the sandbox runs as when iAs is root; KeyError when the user does not exist."""
        entry = pwd.getpwnam(self.user)
        return entry.pw_uid, entry.pw_gid

    def level(self) -> Level:
        """The level reached here, probed by starting one sandbox (once per process and user)."""
        key = f"{self.user}:{os.getuid()}"
        if key not in _levels:
            _levels[key] = self._probed(_probing.pop(key, None) or self._probe())
        return _levels[key]

    @property
    def probed(self) -> bool:
        """Whether level() is known without starting anything."""
        return f"{self.user}:{os.getuid()}" in _levels

    def begin_probe(self) -> None:
        """Start the probe level() waits for, so that it runs meanwhile (a listing parses its skills)."""
        key = f"{self.user}:{os.getuid()}"
        if key not in _levels and key not in _probing:
            _probing[key] = self._probe()

    def _probe(self) -> subprocess.Popen | Level:
        """The probing sandbox started, or the level when none can start."""
        if self._bwrap is None:
            return Level("none", "bubblewrap (bwrap) is not installed")
        if self.root:
            if self._setpriv is None:
                return Level("none", "setpriv (util-linux) is not installed: cannot leave root")
            try:
                uid, _ = self.account()
            except KeyError:
                return Level("none", f"no user '{self.user}' to run skills as (set [sandbox] user)")
            if uid == 0:
                return Level("none", f"[sandbox] user '{self.user}' is root")
        try:
            return subprocess.Popen(self.command(["true"], Policy(), directory="/usr", home=None),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env={"PATH": "/usr/bin:/bin"})
        except (OSError, subprocess.SubprocessError) as exc:
            return Level("none", f"bwrap does not start: {exc}")

    @staticmethod
    def _probed(probe: subprocess.Popen | Level) -> Level:
        """The level a started probe shows (waited for; killed after PROBE_TIMEOUT)."""
        if isinstance(probe, Level):
            return probe
        try:
            _, err = probe.communicate(timeout=PROBE_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            probe.kill()
            probe.communicate()
            return Level("none", f"bwrap does not start: {exc}")
        if probe.returncode != 0:
            why = err.decode("utf-8", "replace").strip().splitlines()
            return Level("none", f"bwrap fails here: {why[-1] if why else f'exit {probe.returncode}'}")
        return Level("full")

    def refused(self, policy: Policy) -> str | None:
        """Why `policy` may not run here (a declared path inside the data directory or the repository), or None."""
        if not (policy.read or policy.write):
            return None
        for path in (*policy.read, *policy.write):
            real = expand(path)
            for root, what in ((self.data_dir, "the data directory"), (self.repo_root, "the repository")):
                if inside(real, root) or inside(root, real):
                    return f"sandbox path {path} overlaps {what}"
        return None

    def command(self, argv: list[str], policy: Policy, *, directory: str, home: str | None,
                keep_home: bool = False) -> list[str]:
        """`argv` wrapped in the sandbox `policy` describes, run in `directory` with a private HOME at `home`
        (a tmpfs; `keep_home`: the host's directory there, bound writable, so files left in it outlive the
        sandbox until the runner removes it)."""
        args = list(self._namespaces(policy))
        args += self._filesystem(policy, directory, home, keep_home)
        args += ["--chdir", directory, "--"]          # bwrap also sets PWD (to `directory`), as bash would
        if self.root:
            uid, gid = self.account()
            args += [self._setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                     "--bounding-set=-all", "--nnp", "--"]
        # No setpriv --pdeathsig in front: --die-with-parent already kills the sandbox when iAs dies.
        return [self._bwrap, *args, *argv]

    def _namespaces(self, policy: Policy) -> list[str]:
        if self.root:      # privileged bwrap: no user namespace (the skill's uid is a real one), caps for setpriv
            spaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
            spaces += [] if policy.network else ["--unshare-net"]
            return [*spaces, "--die-with-parent", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                    "--cap-add", "CAP_SETPCAP"]
        return ["--unshare-all", "--unshare-user", *(["--share-net"] if policy.network else []), "--disable-userns",
                "--die-with-parent"]

    def _filesystem(self, policy: Policy, directory: str, home: str | None, keep_home: bool = False) -> list[str]:
        """Mount arguments: the system parts, then every other mount in path order, parents made 0755."""
        if self._base is None:
            self._base = self._system()
        mounts: list[tuple[str, list[str]]] = []       # (destination, arguments); read-only ones first
        lib = os.path.join(self.repo_root, "resources", "lib")
        for path in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(self.python)), lib, directory,
                     *map(expand, policy.read)):
            mounts.append((path, ["--ro-bind-try", path, path]))
        for path in map(expand, policy.write):
            mounts.append((path, ["--bind-try", path, path]))
        if home is not None and keep_home:
            mounts.append((home, ["--bind", home, home]))
        elif home is not None:
            mounts.append((home, ["--size", str(SANDBOX_TMPFS_MAX), "--perms", "1777" if self.root else "0700",
                                  "--tmpfs", home]))
        if policy.network:
            resolv = os.path.realpath("/etc/resolv.conf")      # often a link into /run, which is not mounted
            if not resolv.startswith("/etc/"):
                mounts.append((resolv, ["--ro-bind-try", resolv, resolv]))
        shown = [*SYSTEM_TREES, "/etc", "/dev", "/proc"]        # there already, read-only
        args: list[str] = list(self._base)
        done: set[str] = {"/tmp"}
        skeletons = ["/"]       # where the directories leading to the mounts are made, read-only at the end
        for dest, mount in sorted(mounts, key=lambda m: (m[0].count("/"), m[0])):
            if dest in done or (mount[0] == "--ro-bind-try" and any(_under(dest, t) for t in shown)):
                continue
            for parent in _parents(dest):
                if parent not in done and not any(_under(parent, t) for t in shown):
                    if os.path.dirname(parent) == "/tmp":       # a skeleton in the writable /tmp: a tmpfs of
                        args += ["--perms", "0755", "--tmpfs", parent]      # its own, made read-only below
                        skeletons.append(parent)
                    else:
                        args += ["--perms", "0755", "--dir", parent]     # bwrap would make it 0700
                    done.add(parent)
            args += mount
            done.add(dest)
            if mount[-2] != "--tmpfs":
                shown.append(dest)
        return [*args, *self._masks(shown), *(a for path in skeletons for a in ("--remount-ro", path))]

    def _system(self) -> list[str]:
        args = []
        for tree in SYSTEM_TREES:
            if os.path.islink(tree):
                args += ["--symlink", os.readlink(tree), tree]
            elif os.path.isdir(tree):
                args += ["--ro-bind", tree, tree]
        return [*args, "--ro-bind", "/etc", "/etc", "--dev", "/dev", "--proc", "/proc",
                "--size", str(SANDBOX_TMPFS_MAX), "--perms", "1777", "--tmpfs", "/tmp"]

    def _masks(self, shown: list[str]) -> list[str]:
        """/etc's secrets, and the config, key and env files where a mount in `shown` would show them."""
        args = []
        for pattern in (*ETC_SECRETS, *self.hidden):
            for path in glob.glob(pattern) if "*" in pattern else [pattern]:
                if not os.path.lexists(path) or os.path.islink(path) or not any(_under(path, t) for t in shown):
                    continue
                if os.path.isdir(path):
                    args += ["--tmpfs", path]
                else:
                    args += ["--ro-bind", "/dev/null", path]
        return args


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _parents(path: str) -> list[str]:
    """/a/b/c -> ["/a", "/a/b"]."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def for_config(config) -> Sandbox:
    """The sandbox a Config describes: its repository, data directory and `[sandbox] user`; the config, key
    and env files masked wherever a mount would show them."""
    hidden = [config.key_file, config.repo_root / "ias.toml"]
    if config.environ.get("IAS_CONFIG"):
        hidden.append(os.path.abspath(config.environ["IAS_CONFIG"]))
    return Sandbox(repo_root=config.repo_root, data_dir=config.data_dir, python=sys.executable,
                   user=config.sandbox_user, hidden=tuple(hidden))


def refusal(config, box: Sandbox | None = None) -> str | None:
    """Why user skills and MCP servers are not loaded here (the level is not full and `[sandbox]
    allow_partial` is not set), else None."""
    if config.sandbox_allow_partial:
        return None
    level = (box or for_config(config)).level()
    if level.full:
        return None
    return (f"the sandbox level here is {level}"
            + (f" ({level.missing})" if level.name == "none" and level.missing else "")
            + "; user skills and MCP servers need the full level (or [sandbox] allow_partial = true in ias.toml)")
