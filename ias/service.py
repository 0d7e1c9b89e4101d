"""`ias service install [--user NAME] [--data-dir DIR] [--print]`: iAs as a systemd service for this checkout.

The unit is deploy/ias.service with its paths pointed at this checkout, the service's user and data
directory filled in, and the env file `DIR/ias.env` named; the unit at datadir.UNIT_PATH is also how
the admin commands find the service's data directory later (`datadir`). Installing (root): the system
user, the data directory (0700, the user's), what the service needs (bubblewrap through apt-get when
missing; the `qr` extra, and the `pgserver` wheel when the system has no PostgreSQL server), the unit,
`systemctl daemon-reload` and `enable --now`; then the next steps (WeChat login as that user, restart).
This module runs those programs (useradd, apt-get, pip, systemctl) through one injectable function,
so that tests never change the machine.

Not handled: other init systems; removing a service (`systemctl disable --now ias`, then delete the
unit); paths with spaces or characters systemd would expand (refused); a checkout or data directory
under /home or /root, which ProtectHome=yes hides from the service (refused).
"""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from .config import ENV_FILE, REPO_ROOT, absolute
from .datadir import UNIT_PATH
from .errors import IasError
from .limits import SERVICE_DATA_DIR, SERVICE_STEP_TIMEOUT, SERVICE_USER
from .pgcluster import ClusterError
from .pgcluster.binaries import find_bindir, unreachable

TEMPLATE = REPO_ROOT / "deploy" / "ias.service"
TEMPLATE_ROOT = "/opt/ias"                              # the checkout the template names
STATE_ROOT = Path("/var/lib")                           # a data directory here is the unit's StateDirectory=
HIDDEN = (Path("/home"), Path("/root"), Path("/run/user"))   # ProtectHome=yes
UNSAFE = set(" \t\n\"'\\%$;`")                          # quoting or specifiers in a unit file


class ServiceError(IasError):
    """The service cannot be installed as asked (one line naming why and what to do)."""


@dataclass(frozen=True, slots=True)
class Service:
    """What the unit names: the checkout, its venv's interpreter, the user and the data directory."""
    repo: Path
    user: str
    data_dir: Path
    group: str | None = None            # the user's primary group; None: a group named as the user (useradd's)

    @property
    def python(self) -> Path:
        return self.repo / ".venv" / "bin" / "python"

    @property
    def env_file(self) -> Path:
        return self.data_dir / ENV_FILE


def service(user: str = SERVICE_USER, data_dir: str | os.PathLike = SERVICE_DATA_DIR,
            repo: Path = REPO_ROOT, lookup: Callable[[str], pwd.struct_passwd] = pwd.getpwnam) -> Service:
    """The service for this checkout, its paths checked: absolute, plain, not hidden by ProtectHome; an existing
    user's primary group found."""
    found = Service(absolute(repo), user, absolute(data_dir), _group(user, lookup))
    if not user or not all(c.isalnum() or c in "_-." for c in user) or user[0] == "-":
        raise ServiceError(f"not a user name: {user!r}")
    for what, path in (("checkout", found.repo), ("data directory", found.data_dir)):
        if UNSAFE & set(str(path)):
            raise ServiceError(f"the {what} {path} holds a space, a quote or one of %$;\\`: use a plain path")
        if any(path == hidden or hidden in path.parents for hidden in HIDDEN):
            raise ServiceError(f"the {what} {path} is under /home or /root, which the service cannot see "
                               "(ProtectHome=yes): use e.g. /opt/ias for the checkout, /var/lib/ias for the data")
    return found


def _group(user: str, lookup: Callable[[str], pwd.struct_passwd]) -> str | None:
    try:
        return grp.getgrgid(lookup(user).pw_gid).gr_name
    except (KeyError, ValueError):      # no such user (yet), or a group without a name
        return None


def render(template: str, svc: Service) -> str:
    """The unit for `svc`: the template's settings that name paths or the user replaced, the rest kept."""
    values = {
        "Documentation": f"file://{svc.repo}/docs/operations.md",
        "User": svc.user, "Group": svc.group or svc.user,
        "WorkingDirectory": str(svc.repo),
        "ExecStart": f"{svc.python} {svc.repo / 'ias.py'}",
        "EnvironmentFile": f"-{svc.env_file}",
        "Environment": f"IAS_DATA_DIR={svc.data_dir}",
    }
    state = svc.data_dir.parent == STATE_ROOT
    lines = [f"# Written by `ias service install` for {svc.repo} (from deploy/ias.service)."]
    header = True
    for line in template.splitlines():
        header = header and line.startswith("#")
        if header:
            continue                                    # the template's own header: how it is used
        key, sep, _ = line.partition("=")
        if line.startswith("#") or not sep:
            lines.append(line.replace(TEMPLATE_ROOT, str(svc.repo)))
        elif key in values:
            lines.append(f"{key}={values[key]}")
        elif key == "StateDirectory":
            # systemd makes /var/lib/NAME, the user's; elsewhere the directory is made at install and opened.
            lines.append(f"StateDirectory={svc.data_dir.name}" if state else f"ReadWritePaths={svc.data_dir}")
        elif key == "StateDirectoryMode" and not state:
            continue
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def run_step(argv: list[str]) -> None:
    """Run one installation step (its output kept); ServiceError naming it when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=SERVICE_STEP_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ServiceError(f"`{' '.join(argv)}` could not run: {exc}") from None
    if done.returncode != 0:
        detail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-2:]) or f"exit {done.returncode}"
        raise ServiceError(f"`{' '.join(argv)}` failed: {detail}")


def _has_server() -> bool:
    try:
        find_bindir()
    except ClusterError:
        return False
    return True


def install(svc: Service, *, unit_path: Path = UNIT_PATH, run: Callable[[list[str]], None] = run_step,
            lookup: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
            has: Callable[[str], str | None] = shutil.which, has_server: Callable[[], bool] = _has_server,
            out: Callable[[str], None] = print) -> None:
    """Install and start the service (see the module's docstring); each step said on `out`."""
    if not svc.python.exists():
        raise ServiceError(f"no virtualenv at {svc.repo / '.venv'}: run `make` in {svc.repo} first")
    try:
        entry = lookup(svc.user)
    except KeyError:
        run(["useradd", "--system", "--user-group", "--home-dir", str(svc.data_dir), "--no-create-home",
             "--shell", "/usr/sbin/nologin", svc.user])
        entry = lookup(svc.user)
        out(f"created the system user {svc.user}")
        svc = replace(svc, group=_group(svc.user, lookup))
    closed = unreachable(svc.repo, entry.pw_uid, os.getgrouplist(svc.user, entry.pw_gid))
    if closed is not None:
        raise ServiceError(f"the user {svc.user} cannot reach the checkout {svc.repo} ({closed} is closed to it): "
                           "move the checkout (e.g. to /opt/ias) or open that directory (chmod o+x)")
    svc.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(svc.data_dir, entry.pw_uid, entry.pw_gid)
    os.chmod(svc.data_dir, 0o700)
    out(f"data directory {svc.data_dir} (0700, owned by {svc.user})")
    if has("bwrap") is None:
        if has("apt-get") is None:
            out("bubblewrap (bwrap) is missing and there is no apt-get: install it for the full skill sandbox")
        else:
            try:
                run(["apt-get", "install", "-y", "-qq", "bubblewrap"])
            except ServiceError:                    # a fresh machine's package lists may be missing or stale
                run(["apt-get", "update", "-qq"])
                run(["apt-get", "install", "-y", "-qq", "bubblewrap"])
            out("installed bubblewrap (the skill sandbox)")
    extras = "qr" if has_server() else "qr,embedded"
    run([str(svc.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-e",
         f"{svc.repo}[{extras}]"])
    out(f"installed the extras: {extras}" + (" (no PostgreSQL server on the system: the pgserver wheel's)"
                                             if "embedded" in extras else ""))
    unit = render(TEMPLATE.read_text(encoding="utf-8"), svc)
    partial = unit_path.with_name(f".{unit_path.name}.partial")
    partial.write_text(unit, encoding="utf-8")
    os.chmod(partial, 0o644)
    os.replace(partial, unit_path)
    out(f"wrote {unit_path}")
    run(["systemctl", "daemon-reload"])
    run(["systemctl", "enable", "--now", unit_path.name])
    out(f"enabled and started {unit_path.name}")
    for line in next_steps(svc, unit_path.stem):
        out(line)


def next_steps(svc: Service, name: str) -> list[str]:
    run_as = f"cd {svc.repo} && sudo -u {svc.user} env IAS_DATA_DIR={svc.data_dir} .venv/bin/ias"
    return [
        "next:",
        f"  1. the LLM, unless set already: {run_as} setup   (writes {svc.env_file})",
        f"  2. WeChat: {run_as} wechat login",
        f"  3. systemctl restart {name}   (then: systemctl status {name}; journalctl -u {name} -f)",
        f"user skills: {svc.repo / 'skills'}/NAME/SKILL.md (the service reads them, ProtectSystem=strict lets it "
        f"write only {svc.data_dir}); or set IAS_SKILLS_DIR in {svc.env_file} to another directory {svc.user} can "
        f"read, outside {svc.data_dir} (a skill may not reach the data directory)",
        f"admin commands run from {svc.repo} (as root too) use {svc.data_dir}, as the service's user",
    ]


def cmd_service(args) -> int:
    svc = service(args.user, args.data_dir)
    if args.print:
        sys.stdout.write(render(TEMPLATE.read_text(encoding="utf-8"), svc))
        return 0
    if os.geteuid() != 0:
        raise ServiceError(f"service install needs root: sudo {svc.python} {svc.repo / 'ias.py'} service install")
    install(svc)
    return 0
