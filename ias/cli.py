"""Command line: `python ias.py [--config PATH] [COMMAND …]`; `main(argv) -> exit code`.

Commands that need no LLM never import `openai` (cold start matters for scripted use), so
the heavier modules are imported inside the command functions.

No command-line input produces a traceback: a usage error is one line and exit 2, any other
problem one line and exit 1 (a closed stdout too); an unexpected exception is reported as an
internal error, its traceback logged only with -v. Text arguments that are not valid UTF-8
are decoded with replacement characters, as the console decodes its input.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from dataclasses import asdict

from . import config as config_module
from .errors import IasError
from .limits import CLI_NUMBER_MAX

log = logging.getLogger("ias")

PR_SET_DUMPABLE = 4          # <linux/prctl.h>


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
    from .cron import TZ
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


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ias", description="iAs: a self-hosted personal assistant daemon")
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

    audit = sub.add_parser("audit", help="recent audit rows; --verify checks the hash chain")
    audit.add_argument("--limit", type=_count, default=20, help="how many rows (default 20)")
    audit.add_argument("--verify", action="store_true")
    audit.add_argument("--prune-before", type=_day, metavar="DATE",
                       help="remove the rows older than DATE (YYYY-MM-DD, Beijing time, or an ISO time), "
                            "keeping a keyed checkpoint; only a log that verifies is pruned")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        not_dumpable()
        config = config_module.load(args.config)
        if args.command == "skills":
            return cmd_skills(config, args)
        if args.command == "run":
            return asyncio.run(cmd_run(config, args.name, args.params))
        if args.command == "approvals":
            return asyncio.run(cmd_approvals(config, args.all))
        if args.command == "outbox":
            return asyncio.run(cmd_outbox(config, args.all))
        if args.command == "audit":
            if args.prune_before is not None:
                return asyncio.run(cmd_audit_prune(config, args.prune_before))
            return asyncio.run(cmd_audit(config, args.limit, args.verify))
        if args.command == "tasks":
            return asyncio.run(cmd_tasks(config, args))
        if args.command == "wechat":
            return asyncio.run(cmd_wechat(config, args.action))
        if args.command == "doctor":
            return asyncio.run(cmd_doctor(config))
        from . import app
        if args.once is not None:
            return asyncio.run(app.run_once(config, args.once))
        logging.getLogger("ias").setLevel(logging.DEBUG if args.verbose else logging.INFO)
        return asyncio.run(app.run_daemon(config))
    except IasError as exc:
        print(f"ias: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _broken_pipe()
    except Exception as exc:            # the last resort: every known case is handled where it happens
        log.debug("internal error", exc_info=True)
        print(f"ias: internal error: {type(exc).__name__}: {_first_line(exc)}; run with -v for details",
              file=sys.stderr)
        return 1


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


def cmd_skills(config, args) -> int:
    from .registry import registry
    reg = registry(config, cached=args.action is None)
    if args.action == "check":
        mcp_problems = asyncio.run(_check_servers(config, reg)) if reg.servers else []
        for line in (*reg.problems, *(f"{w} (warning)" for w in reg.warnings), *mcp_problems):
            print(line)
        too_many = _over_one_request(config, reg)
        if too_many:
            print(f"warning: {too_many}")
        failed = reg.problems or any(not line.endswith("(warning)") for line in mcp_problems)
        if not failed:
            print(f"{len(reg)} skills OK", file=sys.stderr)
        return 1 if failed else 0
    if args.action == "show":
        skill = reg.get(args.name or "")
        if skill is None:
            print(f"ias: no skill named {args.name!r}", file=sys.stderr)
            return 1
        spec = {"name": skill.name, "title": skill.title, "description": skill.description,
                "source": skill.source, "overrides": skill.overrides, "risk": skill.risk,
                "timeout": skill.timeout, "env": list(skill.env), "directory": str(skill.directory),
                "parameters": skill.parameters, "execute": skill.execute, "builtin": skill.builtin,
                "sandbox": _sandbox_of(skill)}
        if skill.mcp is not None:
            spec.update(server=skill.mcp.server, tool=skill.mcp.tool, server_schema=skill.mcp.schema)
            del spec["execute"]
        print(json.dumps(spec, ensure_ascii=False, indent=2))
        return 0
    rows = [{"name": s.name, "source": s.source, "risk": s.risk, "timeout": s.timeout,
             "overrides": s.overrides, "description": s.description, "sandbox": _sandbox_of(s),
             **({"server": s.mcp.server} if s.mcp is not None else {})} for s in reg]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False, indent=2))
    else:
        print(f"{'NAME':<24} {'SOURCE':<7} {'RISK':<5} {'TIMEOUT':>7}  OVERRIDES  {'MCP SERVER':<12}  SANDBOX")
        for r in rows:
            print(f"{r['name']:<24} {r['source']:<7} {r['risk']:<5} {r['timeout']:>6g}s  "
                  f"{'yes' if r['overrides'] else '':<9}  {r.get('server', ''):<12}  {r['sandbox']}")
    listed = {s.mcp.server for s in reg if s.mcp is not None}
    for name in sorted(set(reg.servers) - listed):
        print(f"mcp server {name}: tools not listed yet (run `ias skills check`)", file=sys.stderr)
    for line in reg.problems:
        print(f"not loaded: {line}", file=sys.stderr)
    return 0


def _sandbox_of(skill) -> str:
    """What `skills` says of a skill's sandbox: its `## Sandbox` (`default`, `network`, …, `unconfined`)."""
    return "in-process" if skill.builtin else skill.sandbox.describe()


def _over_one_request(config, reg) -> str | None:
    """A warning when the loaded skills exceed what one model request carries, else None."""
    from .ranker import Catalog
    count, size = Catalog(reg, config.max_tools, config.tools_bytes).totals()
    if count <= config.max_tools and size <= config.tools_bytes:
        return None
    return (f"{count} skills make {size} bytes of tool definitions, more than one model request carries "
            f"(IAS_MAX_TOOLS={config.max_tools}, IAS_TOOLS_BYTES={config.tools_bytes}): each request offers the "
            "system skills, the recently used ones and the most relevant others; find_skills reaches the rest")


async def _server_checks(config, reg) -> list[tuple]:
    """Start each MCP server once and list its tools: (server, tool skill names, problems) each; all stopped."""
    from .app import make_runner
    from .mcp import Servers
    from .registry import mcp_cache
    runner = make_runner(config)
    servers = Servers(reg, runner, mcp_cache(config), config.allow_risk_downgrade)
    found = []
    try:
        for name in sorted(reg.servers):
            found.append((reg.servers[name], *await servers.check(name)))
    finally:
        await servers.close()
    return found


async def _check_servers(config, reg) -> list[str]:
    """`skills check`: each server's tools on stderr; its problems returned."""
    lines = []
    for spec, tools, problems in await _server_checks(config, reg):
        if tools or not problems:
            print(f"{spec.path}:{spec.line}: mcp server {spec.name}: {len(tools)} tools: {', '.join(tools) or '-'}",
                  file=sys.stderr)
        lines.extend(problems)
    return lines


async def cmd_run(config, name: str, params_text: str) -> int:
    from . import schema
    from .app import build, open_store, owner_approvals
    try:
        params = schema.loads(params_text)
    except json.JSONDecodeError as exc:
        print(f"ias: parameters are not valid JSON: {exc.msg}", file=sys.stderr)
        return 2
    async with open_store(config) as store:
        c = build(config, store)
        try:
            async with owner_approvals(config, c) as (user, notify):
                result = await c.gate.call(user, name, params, notify)
        finally:
            await c.mcp.close()
        print(json.dumps(result, ensure_ascii=False))
        return 0 if result.get("success") else 1


async def cmd_approvals(config, include_closed: bool) -> int:
    return await _listing(config, lambda store: store.approvals(include_closed),
                          "no approvals" if include_closed else "no pending approvals",
                          lambda row: f"{row.created_at.astimezone():%Y-%m-%d %H:%M:%S}  {row.status:<8}  "
                                      f"{row.user_id}  {row.skill_name}  attempts_left={row.attempts_left}  id={row.id}")


async def cmd_outbox(config, include_done: bool) -> int:
    def line(row) -> str:
        preview = " ".join(row.text.split())
        preview = preview[:40] + ("…" if len(preview) > 40 else "")
        return (f"{row.created_at.astimezone():%Y-%m-%d %H:%M:%S}  {row.state:<8}  {row.kind:<8}  {row.channel:<7}  "
                f"attempts={row.attempts}  reason={row.reason or '-'}  {row.client_id}  {preview}")
    return await _listing(config, lambda store: store.outbox_rows(include_done),
                          "no messages" if include_done else "nothing queued", line)


async def _listing(config, fetch, empty: str, line) -> int:
    """Print one line per row that `fetch(store)` returns, or `empty`."""
    from .app import open_store
    async with open_store(config) as store:
        rows = await fetch(store)
    if not rows:
        print(empty)
    for row in rows:
        print(line(row))
    return 0


async def cmd_audit(config, limit: int, verify: bool) -> int:
    from .app import open_store
    from .audit import check, format_row
    async with open_store(config) as store:
        if verify:
            verdict = await check(store)
            for line in verdict.problems:
                print(line)
            print(verdict.summary(), file=sys.stdout if verdict.intact else sys.stderr)
            return 0 if verdict.intact else 1
        for row in await store.audit_rows(limit):
            print(format_row(row))
    return 0


async def cmd_audit_prune(config, before) -> int:
    from .app import open_store
    from .audit import prune
    async with open_store(config) as store:
        verdict, pruned = await prune(store, before)
    for line in verdict.problems:
        print(line)
    if not verdict.intact:
        print(f"{verdict.summary()}; nothing pruned", file=sys.stderr)
        return 1
    if pruned is None:
        print(f"audit log: no row older than {before.isoformat()}; nothing pruned")
    else:
        print(f"audit log: {pruned.count} rows older than {before.isoformat()} removed (up to row {pruned.last_id}); "
              f"a keyed checkpoint keeps the rest verifiable ({pruned.total} rows pruned in all)")
    return 0


async def cmd_doctor(config) -> int:
    """One line per check; exit 1 when any check fails."""
    from .app import open_llm, open_store
    from .approval import load_key
    from .registry import registry
    failed = False

    def line(ok: bool | None, what: str, detail: str) -> None:
        nonlocal failed
        failed |= ok is False
        print(f"{'ok  ' if ok else 'warn' if ok is None else 'FAIL'}  {what}: {detail}")

    line(True, "config", f"data dir {config.data_dir}, model {config.model}, approval timeout {config.approval_timeout:g}s")
    try:
        load_key(config.key_file)
        line(True, "secret key", f"{config.key_file} (0600)")
    except IasError as exc:
        line(False, "secret key", str(exc))
    from .sandbox import for_config
    level = for_config(config).level()
    line(level.full or (None if config.sandbox_allow_partial else False), "sandbox",
         str(level) + ("" if level.full else f" ({level.missing})" if level.name == "none" else "")
         + ("; user skills and MCP servers load anyway ([sandbox] allow_partial)" if not level.full and
            config.sandbox_allow_partial else ""))
    reg = registry(config)
    unconfined = sorted(s.name for s in reg if s.sandbox.unconfined)
    if unconfined:
        line(None, "unconfined", f"run outside the sandbox, each call approved by code: {', '.join(unconfined)}")
    line(not reg.problems, "skills", f"{len(reg)} loaded, {len(reg.problems)} not loaded"
         + "".join(f"\n      {p}" for p in reg.problems))
    too_many = _over_one_request(config, reg)
    if too_many:
        line(None, "tools", too_many)
    for spec, tools, problems in await _server_checks(config, reg) if reg.servers else ():
        bad = [p for p in problems if not p.endswith("(warning)")]
        line(False if bad else True if tools else None, f"mcp server {spec.name}",
             "; ".join(bad) if bad else f"{len(tools)} tools: {', '.join(tools) or '-'}")
    line(*_disk_line(config.data_dir))
    try:
        async with open_store(config) as store:
            where = "IAS_DATABASE_URL" if config.database_url else f"embedded cluster in {config.data_dir / 'pg'}"
            pending = await store.approvals()
            line(True, "database", f"{where}, schema applied, {len(pending)} pending approvals")
            from .wechat_login import status
            wx = await status(store)
            if config.wechat_token or wx.logged_in:
                line(not wx.stale, "channel", "WeChat session expired: run `ias wechat login`" if wx.stale
                     else f"WeChat, owner {config.wechat_owner or wx.owner}")
            else:
                line(None, "channel", "WeChat not logged in: console channel (`ias wechat login`)")
            from .notifiers import configured
            fallbacks = ", ".join(n.name for n in configured(config)) or "none (see README, Messages that arrive)"
            line(True if configured(config) else None, "outbox",
                 f"{len(await store.queued())} messages queued; fallback: {fallbacks}")
    except IasError as exc:
        line(False, "database", str(exc))
    async with open_llm(config) as llm:
        if llm is None:
            line(False, "llm", "OPENAI_API_KEY is not set")
        else:
            try:
                line(True, "llm", f"{config.openai_base_url or 'https://api.openai.com/v1'}: {await llm.check()}")
            except Exception as exc:              # any endpoint failure is a finding, not a crash
                line(False, "llm", f"{config.openai_base_url or 'default endpoint'} unreachable ({type(exc).__name__})")
    return 1 if failed else 0


def _disk_line(data_dir, statvfs=os.statvfs) -> tuple[bool | None, str, str]:
    """doctor's look at the free space under the data directory: a warning below 5 %."""
    from .limits import DISK_LOW_SHARE
    from .monitor import disk_space
    try:
        share, free, total = disk_space(data_dir, statvfs)
    except OSError as exc:
        return None, "disk", f"cannot check the free space under {data_dir}: {exc}"
    detail = f"{share:.1%} free under {data_dir} ({free / 2 ** 30:.1f} of {total / 2 ** 30:.1f} GiB)"
    if share < DISK_LOW_SHARE:
        return None, "disk", f"{detail}: below {DISK_LOW_SHARE:.0%}, the database stops when the disk is full"
    return True, "disk", detail


def run() -> None:
    """Entry point: `main`, then exit without tearing the interpreter down.

    Everything is closed by then; skipping the teardown of the `openai`/pydantic module graph
    saves ~0.3 s on every `--once`.
    """
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


async def cmd_tasks(config, args) -> int:
    from .app import open_store, resolve_owner
    from .handlers import task_json as _task_json, upcoming
    from .scheduler import TaskError, add_task, remove_task, set_enabled, update_task

    async with open_store(config) as store:
        try:
            if args.action == "list":
                tasks = await store.tasks(include_disabled=args.all)
                delivery = await store.last_deliveries()
                if args.json:
                    print(json.dumps([{**_task_json(t, upcoming(t)[:1]), "last_delivery": delivery.get(t.id)}
                                      for t in tasks], ensure_ascii=False, indent=1))
                elif not tasks:
                    print("no tasks" if args.all else "no enabled tasks (see --all)")
                for t in tasks if not args.json else ():
                    nxt = upcoming(t)[:1]
                    state = f"next {nxt[0]:%Y-%m-%d %H:%M}" if nxt else ("paused" if t.next_run_at is None else "done")
                    last = f"last {delivery[t.id]}" if t.id in delivery else "last -"
                    print(f"{t.id:>4}  {t.kind:<8}  {t.schedule:<18}  {state:<22}  {last:<15}  {t.name}: {t.text}")
                return 0
            if args.action == "add":
                user = args.user or await resolve_owner(config, store)
                task = await add_task(store, user, args.name, args.schedule, args.kind, args.text)
            elif args.action == "update":
                task = await update_task(store, args.id, name=args.name, schedule=args.schedule, kind=args.kind,
                                         text=args.text)
            elif args.action == "remove":
                await remove_task(store, args.id)
                print(json.dumps({"removed": args.id}) if args.json else f"task {args.id} removed")
                return 0
            else:
                task = await set_enabled(store, args.id, args.action == "resume")
        except TaskError as exc:
            print(json.dumps({"error": str(exc)}) if args.json else f"ias: {exc}",
                  file=sys.stdout if args.json else sys.stderr)
            return 1
    runs = upcoming(task)
    if args.json:
        print(json.dumps(_task_json(task, runs), ensure_ascii=False))
    else:
        print(f"task {task.id} ({task.kind}, {task.schedule}): {task.name}"
              + ("" if task.enabled else " — paused"))
        for when in runs:
            print(f"  next: {when:%Y-%m-%d %H:%M:%S} (Beijing time)")
    return 0


async def cmd_wechat(config, action: str) -> int:
    from .app import open_store
    from .ilink import DEFAULT_BASE_URL
    from .wechat_login import login, logout, status
    async with open_store(config) as store:
        if action == "login":
            done = await login(store, config.wechat_base_url or DEFAULT_BASE_URL, out=print,
                               ask=lambda prompt: asyncio.to_thread(input, prompt))
            print(f"已登录：owner {done['owner']}, bot {done['bot_id']}. Restart the daemon to use WeChat.")
        elif action == "logout":
            await logout(store)
            print("WeChat login forgotten.")
        else:
            state = await status(store)
            for key, value in asdict(state).items():
                print(f"{key}: {value}")
            if config.wechat_token:
                print("note: IAS_WECHAT_TOKEN is set and wins over the stored login")
    return 0
