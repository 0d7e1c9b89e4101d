"""Command line: `python ias.py [--config PATH] [COMMAND …]`; `main(argv) -> exit code`.

Parsing and dispatch only: the commands are `commands` (one function each), `doctor`, `backup`
(backup, restore) and `service` (service install), the daemon `daemon`, `--once` `oneoff`; which
data directory a command uses, and as whom, is `datadir`'s; nothing is built here. Commands that need no LLM never
import `openai` (cold start matters for scripted use), so the heavier modules are imported
inside the command functions.

No command-line input produces a traceback: a usage error is one line and exit 2, any other
problem one line and exit 1 (a closed stdout too); an unexpected exception is reported as an
internal error, its traceback logged only with -v. Text arguments that are not valid UTF-8
are decoded with replacement characters, as the console decodes its input.
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from . import config as config_module, datadir, version
from .commands import (cmd_approvals, cmd_audit, cmd_audit_prune, cmd_outbox, cmd_run, cmd_skills, cmd_tasks,
                       cmd_wechat)
from .errors import IasError
from .limits import CLI_NUMBER_MAX, SERVICE_DATA_DIR, SERVICE_USER

log = logging.getLogger("ias")

PR_SET_DUMPABLE = 4          # <linux/prctl.h>
DEPENDENCIES = ("psycopg", "openai")        # pyproject's; missing: the interpreter is not the venv's


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit 2) instead of the usage text."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _text(value: str) -> str:
    """An argument as text: bytes that are not UTF-8 (surrogateescape) become U+FFFD."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _day(value: str):
    """A past moment: YYYY-MM-DD (midnight, Beijing time) or an ISO time (Beijing time without an offset)."""
    from datetime import datetime
    from .clock import TZ
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD) or ISO time: {_text(value)[:40]!r}") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=TZ)
    if moment > datetime.now(TZ):
        raise argparse.ArgumentTypeError(f"{moment.isoformat()} is in the future")
    return moment


def _count(value: str) -> int:
    """A whole number from 0 to CLI_NUMBER_MAX (a --limit, a task id)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {_text(value)[:40]!r}") from None
    if not 0 <= number <= CLI_NUMBER_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and {CLI_NUMBER_MAX}")
    return number


class _Version(argparse.Action):
    """`--version`: `ias X.Y.Z`, read only when asked (no file read on every start)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"ias {version()}")
        parser.exit()


class _Presets:
    """`setup --provider`'s choices, the names of `setup.PRESETS`, read only when argparse checks a value or prints
    the help: every command builds the parser, and importing `setup` is ~3 ms of an `ias skills`."""

    def __iter__(self):
        from .setup import PRESETS
        return iter([p.name for p in PRESETS])

    def __contains__(self, name) -> bool:
        return name in list(self)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ias", description="iAs: a self-hosted personal assistant daemon")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--config", metavar="PATH", help="ias.toml to read (default $IAS_CONFIG, else ./ias.toml)")
    parser.add_argument("--once", metavar="TEXT", type=_text, help="one conversation turn for the owner; reply on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command")

    skills = sub.add_parser("skills", help="list skills; `skills check`, `skills show NAME`")
    skills.add_argument("action", nargs="?", choices=["check", "show"], help="check: lint every SKILL.md; show: one skill")
    skills.add_argument("name", nargs="?", type=_text, help="skill name for `show`")
    skills.add_argument("--json", action="store_true", help="machine-readable output")

    run = sub.add_parser("run", help="call one skill through the gate; prints the LLM-visible result")
    run.add_argument("name", type=_text)
    run.add_argument("params", nargs="?", default="{}", type=_text, help="parameters as a JSON object")

    approvals = sub.add_parser("approvals", help="pending approvals (never codes)")
    approvals.add_argument("--all", action="store_true", help="recent approvals in every state")

    tasks = sub.add_parser("tasks", help="scheduled tasks: list, add, update, remove, pause, resume")
    tsub = tasks.add_subparsers(dest="action", required=True)
    tlist = tsub.add_parser("list", help="enabled tasks (--all: paused and finished ones too)")
    tlist.add_argument("--all", action="store_true")
    tlist.add_argument("--json", action="store_true")
    for action in ("add", "update"):
        t = tsub.add_parser(action, help=f"{action} a task; prints the next 3 run times")
        if action == "update":
            t.add_argument("id", type=_count)
        required = action == "add"
        t.add_argument("--name", required=required, type=_text)
        t.add_argument("--schedule", required=required, type=_text,
                       help="cron ('0 7 * * *'), one-shot ('2026-12-24 08:00') or interval ('every 30m'), Beijing time")
        t.add_argument("--kind", choices=["reminder", "prompt"], default="reminder" if required else None,
                       help="reminder: send the text as is; prompt: run it through the assistant")
        t.add_argument("--text", required=required, type=_text)
        if action == "add":
            t.add_argument("--user", type=_text, help="whose task (default: the owner)")
        t.add_argument("--json", action="store_true")
    for action in ("remove", "pause", "resume"):
        t = tsub.add_parser(action)
        t.add_argument("id", type=_count)
        t.add_argument("--json", action="store_true")

    outbox = sub.add_parser("outbox", help="messages to the owner still queued, with why they wait")
    outbox.add_argument("--all", action="store_true", help="recent messages in every state")

    wx = sub.add_parser("wechat", help="WeChat (iLink) login and its state")
    wx.add_argument("action", choices=["login", "status", "logout"])

    sub.add_parser("doctor", help="check configuration, database, LLM endpoint, channels and skills")

    setup = sub.add_parser("setup", help="first run: LLM provider, key and model (tested), written to the env file "
                                         "$IAS_DATA_DIR/ias.env; then an optional WeChat login")
    provider = setup.add_argument("--provider", help="no questions: this preset, the key from OPENAI_API_KEY (for "
                                                     "scripts)")
    provider.choices = _Presets()       # set after add_argument, whose metavar check would read them at once
    setup.add_argument("--model", type=_text, help="the chat model (default: the preset's)")
    setup.add_argument("--base-url", type=_text, help="the endpoint (default: the preset's; needed for `other`)")

    audit = sub.add_parser("audit", help="recent audit rows; --verify checks the hash chain")
    audit.add_argument("--limit", type=_count, default=20, help="how many rows (default 20)")
    audit.add_argument("--verify", action="store_true")
    audit.add_argument("--prune-before", type=_day, metavar="DATE",
                       help="remove the rows older than DATE (YYYY-MM-DD, Beijing time, or an ISO time), "
                            "keeping a keyed checkpoint; only a log that verifies is pruned")

    backup = sub.add_parser("backup", help="dump the database to FILE (not the secret key), daemon running or not")
    backup.add_argument("file", nargs="?", type=_text, help="default: ias-backup-YYYYmmdd-HHMMSS.dump here")
    restore = sub.add_parser("restore", help="load a backup into an empty database, then verify the audit log")
    restore.add_argument("file", type=_text)

    service = sub.add_parser("service", help="`service install`: run iAs from this checkout as a systemd service")
    service.add_argument("action", choices=["install"])
    service.add_argument("--user", default=SERVICE_USER, type=_text, help=f"the service's system user "
                                                                          f"(default {SERVICE_USER})")
    service.add_argument("--data-dir", default=SERVICE_DATA_DIR, type=_text, metavar="DIR",
                         help=f"its data directory (default {SERVICE_DATA_DIR})")
    service.add_argument("--print", action="store_true", help="only print the unit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    cluster = None
    try:
        not_dumpable()
        if args.command == "service":
            from .service import cmd_service
            started()
            return cmd_service(args)
        datadir.before_config(args.config)     # as root: the service's user, before its env file is read
        config = datadir.locate(config_module.load(args.config), args.config)
        datadir.check(config.data_dir)
        if args.command in ("backup", "restore"):
            from .backup import cmd_backup, cmd_restore
            return _run(cmd_backup(config, args.file) if args.command == "backup"
                        else cmd_restore(config, args.file))
        if args.command == "skills":
            return cmd_skills(config, args)
        if args.command in ("run", None):
            # The embedded server starts (or is joined) while the rest is imported and loaded.
            from .pgcluster import embedded
            cluster = embedded(config)
            if cluster is not None:
                cluster.begin()
        if args.command == "run":
            return _run(cmd_run(config, args.name, args.params, cluster))
        if args.command == "approvals":
            return _run(cmd_approvals(config, args.all))
        if args.command == "outbox":
            return _run(cmd_outbox(config, args.all))
        if args.command == "audit":
            if args.prune_before is not None:
                return _run(cmd_audit_prune(config, args.prune_before))
            return _run(cmd_audit(config, args.limit, args.verify))
        if args.command == "tasks":
            return _run(cmd_tasks(config, args))
        if args.command == "wechat":
            return _run(cmd_wechat(config, args.action))
        if args.command == "doctor":
            from .doctor import cmd_doctor
            return _run(cmd_doctor(config))
        if args.command == "setup":
            from .setup import run_setup
            started()
            return run_setup(config, args.provider, args.model, args.base_url)
        if args.once is not None:
            from .oneoff import asks_model, run_once
            if asks_model(config, args.once):
                from . import sdk
                sdk.load()                  # while the cluster starts, and before the collector is back on
            return _run(run_once(config, args.once, cluster))
        from .daemon import run_daemon
        logging.getLogger("ias").setLevel(logging.DEBUG if args.verbose else _daemon_log_level())
        return _run(run_daemon(config, cluster=cluster))
    except IasError as exc:
        print(f"ias: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _broken_pipe()
    except Exception as exc:            # the last resort: every known case is handled where it happens
        if isinstance(exc, ModuleNotFoundError) and (exc.name or "").partition(".")[0] in DEPENDENCIES:
            print(f"ias: {exc.name} is not installed for {sys.executable}: run `make` first (it makes .venv with "
                  "what iAs needs), then python ias.py …", file=sys.stderr)
            return 1                    # run outside the venv, which ias.py could not run instead
        log.debug("internal error", exc_info=True)
        print(f"ias: internal error: {type(exc).__name__}: {_first_line(exc)}; run with -v for details",
              file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            _leave(cluster)


def _run(command) -> int:
    """Run a command's coroutine, its modules loaded: the garbage collector back on (see `run`)."""
    import asyncio                      # here: `skills` never needs it (~35 ms of a listing)
    started()
    return asyncio.run(command)


def started() -> None:
    """The end of the start: the cyclic garbage collector, which `run` turned off (an import-heavy start otherwise
    collects again and again: ~45 ms of a `--once`), on again, with what the start made (modules, classes, the
    parsed skills) frozen so that no collection walks it again (its few hundred cyclic leftovers stay). Nothing
    to do where the collector was on (`main` called in a process of its own, a test's)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _leave(cluster) -> None:
    """Stop using an early-begun cluster: a no-op once the store closed it; else its start ends here."""
    try:
        cluster.stop()
    except IasError as exc:
        print(f"ias: {exc}", file=sys.stderr)


def _daemon_log_level() -> int:
    """INFO for a log (the journal, a file, a pipe); WARNING when the owner chats on this terminal, so that
    the progress lines do not interleave with the replies (-v shows everything)."""
    try:
        chatting = sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        chatting = False
    return logging.WARNING if chatting else logging.INFO


def not_dumpable() -> None:
    """Close this process to every other process of its user (a skill included): no /proc/PID/environ, mem or
    fds, no ptrace, no core dump. The API keys, the approval key and the database password live in it.
    A program it starts is dumpable again after exec (unless it changed user); root still reads it."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise IasError(f"cannot make the process non-dumpable: {os.strerror(ctypes.get_errno())}")


def _broken_pipe() -> int:
    """The reader of stdout went away (`ias skills --json | head -1`): one line, exit 1.

    stdout is pointed at /dev/null, as the Python docs suggest, so that the buffered rest
    cannot fail again on the way out.
    """
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    print("ias: output closed early (broken pipe)", file=sys.stderr)
    return 1


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else "(no message)"


def run() -> None:
    """Entry point: `main`, then exit without tearing the interpreter down.

    Everything is closed by then; skipping the teardown of the `openai`/pydantic module graph
    saves ~0.3 s on every `--once`.
    """
    gc.disable()                        # until `started` (ias.py turned it off before its first import)
    # Text that cannot be encoded (a lone surrogate) is shown as an escape, never an exception.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    code = main()
    try:
        sys.stdout.flush()              # a closed pipe shows here when the output fit the buffer
    except BrokenPipeError:
        code = _broken_pipe()
    except (OSError, ValueError):
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    logging.shutdown()
    os._exit(code)
