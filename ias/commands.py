"""The command line's commands, one function each: `skills`, `run`, `approvals`, `outbox`, `audit`,
`tasks`, `wechat` (`doctor` is `doctor`; the daemon and `--once` are `daemon` and `oneoff`).

Each takes the loaded config (and its parsed arguments) and returns the exit status; what it
needs built comes from `app`. The heavier modules are imported inside the functions: a command
that needs no LLM never imports `openai`. Not handled here: argument parsing and the one-line
reporting of errors (`cli`).
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict


def cmd_skills(config, args) -> int:
    from .registry import registry
    if not config.sandbox_allow_partial and _has_entries(config.skills_dir):
        from .sandbox import for_config
        for_config(config).begin_probe()    # user skills load only at the full level: probed while they are parsed
    reg = registry(config, cached=args.action is None)
    if args.action == "check":
        mcp_problems = _servers_checked(config, reg) if reg.servers else []
        for line in (*reg.problems, *(f"{w} (warning)" for w in reg.warnings), *mcp_problems):
            print(line)
        too_many = over_one_request(config, reg)
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
                "timeout": skill.timeout, "env": list(skill.env), "directory": skill.directory,
                "parameters": skill.parameters, "execute": skill.execute, "builtin": skill.builtin,
                "sandbox": _sandbox_of(skill)}
        if skill.mcp is not None:
            spec.update(server=skill.mcp.server, tool=skill.mcp.tool, server_schema=skill.mcp.schema)
            del spec["execute"]
        print(json.dumps(spec, ensure_ascii=False, indent=2))
        return 0
    if args.json:
        print(json.dumps([{"name": s.name, "source": s.source, "risk": s.risk, "timeout": s.timeout,
                           "overrides": s.overrides, "description": s.description, "sandbox": _sandbox_of(s),
                           **({"server": s.mcp.server} if s.mcp is not None else {})} for s in reg],
                         ensure_ascii=False, indent=2))
    else:       # one write, no row built first, %-formatting (twice as fast as format specs): thousands of skills
        header = f"{'NAME':<24} {'SOURCE':<7} {'RISK':<5} {'TIMEOUT':>7}  OVERRIDES  {'MCP SERVER':<12}  SANDBOX"
        row = "%-24s %-7s %-5s %6gs  %-9s  %-12s  %s"
        print("\n".join([header, *(row % (s.name, s.source, s.risk, s.timeout, "yes" if s.overrides else "",
                                          s.mcp.server if s.mcp is not None else "", _sandbox_of(s)) for s in reg)]))
    listed = {s.mcp.server for s in reg if s.mcp is not None}
    for name in sorted(set(reg.servers) - listed):
        print(f"mcp server {name}: tools not listed yet (run `ias skills check`)", file=sys.stderr)
    for line in reg.problems:
        print(f"not loaded: {line}", file=sys.stderr)
    return 0


def _has_entries(directory) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def _sandbox_of(skill) -> str:
    """What `skills` says of a skill's sandbox: its `## Sandbox` (`default`, `network`, …, `unconfined`)."""
    return "in-process" if skill.builtin else skill.sandbox.describe()


def over_one_request(config, reg) -> str | None:
    """A warning when the loaded skills exceed what one model request carries, else None."""
    from .app import make_catalog
    count, size = make_catalog(config, reg).totals()
    if count <= config.max_tools and size <= config.tools_bytes:
        return None
    return (f"{count} skills make {size} bytes of tool definitions, more than one model request carries "
            f"(IAS_MAX_TOOLS={config.max_tools}, IAS_TOOLS_BYTES={config.tools_bytes}): each request offers the "
            "system skills, the recently used ones and the most relevant others; find_skills reaches the rest")


async def server_checks(config, reg) -> list[tuple]:
    """Start each MCP server once and list its tools: (server, tool skill names, problems) each; all stopped."""
    from .app import open_servers
    found = []
    async with open_servers(config, reg) as servers:
        for name in sorted(reg.servers):
            found.append((reg.servers[name], *await servers.check(name)))
    return found


def _servers_checked(config, reg) -> list[str]:
    """`skills check`: each server's tools on stderr; its problems returned."""
    import asyncio                      # only with MCP servers to start: a listing never needs it
    lines = []
    for spec, tools, problems in asyncio.run(server_checks(config, reg)):
        if tools or not problems:
            print(f"{spec.path}:{spec.line}: mcp server {spec.name}: {len(tools)} tools: {', '.join(tools) or '-'}",
                  file=sys.stderr)
        lines.extend(problems)
    return lines


async def cmd_run(config, name: str, params_text: str, cluster=None) -> int:
    """`ias run NAME [JSON]`; `cluster`: the embedded cluster, perhaps begun already (see cli)."""
    from . import jsonschema as schema
    from .app import build, open_store
    from .oneoff import finish, owner_approvals
    try:
        params = schema.loads(params_text)
    except json.JSONDecodeError as exc:
        print(f"ias: parameters are not valid JSON: {exc.msg}", file=sys.stderr)
        return 2
    async with open_store(config, cluster) as store:
        c = build(config, store)
        try:
            async with owner_approvals(config, c) as (user, notify):
                result = await c.gate.call(user, name, params, notify)
        finally:
            await finish(c)
        print(json.dumps(result, ensure_ascii=False))
        return 0 if result.get("success") else 1


async def cmd_approvals(config, include_closed: bool) -> int:
    from .clock import stamp            # here, as in the other listings: `skills` needs no time zone
    return await _listing(config, lambda store: store.approvals(include_closed),
                          "no approvals" if include_closed else "no pending approvals",
                          lambda row: f"{stamp(row.created_at)}  {row.status:<8}  "
                                      f"{row.user_id}  {row.skill_name}  attempts_left={row.attempts_left}  id={row.id}")


async def cmd_outbox(config, include_done: bool) -> int:
    from .clock import stamp

    def line(row) -> str:
        preview = " ".join(row.text.split())
        preview = preview[:40] + ("…" if len(preview) > 40 else "")
        return (f"{stamp(row.created_at)}  {row.state:<8}  {row.kind:<8}  {row.channel:<7}  "
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


async def cmd_tasks(config, args) -> int:
    from .app import open_store, resolve_owner
    from .clock import stamp
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
                    state = f"next {stamp(nxt[0], seconds=False)}" if nxt else ("paused" if t.next_run_at is None
                                                                                  else "done")
                    last = f"last {delivery[t.id]}" if t.id in delivery else "last -"
                    print(f"{t.id:>4}  {t.kind:<8}  {t.schedule:<18}  {state:<26}  {last:<15}  {t.name}: {t.text}")
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
            print(f"  next: {stamp(when)}")
    return 0


async def cmd_wechat(config, action: str) -> int:
    from asyncio import to_thread
    from .app import open_store
    from .channels.wechat.ilink import DEFAULT_BASE_URL
    from .channels.wechat.login import login, logout, status
    async with open_store(config) as store:
        if action == "login":
            await login(store, config.wechat_base_url or DEFAULT_BASE_URL, out=print,      # its last line says done
                        ask=lambda prompt: to_thread(input, prompt))
        elif action == "logout":
            await logout(store)
            print("已退出微信登录（本机保存的登录信息已删除）。")
        else:
            state = await status(store)
            for key, value in asdict(state).items():
                print(f"{key}: {value}")
            if config.wechat_token:
                print("注意：已设置环境变量 IAS_WECHAT_TOKEN，它优先于本机保存的微信登录。")
    return 0
