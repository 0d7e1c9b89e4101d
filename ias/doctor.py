"""`ias doctor`: one line per check of configuration, secret key, sandbox, skills, MCP servers, disk,
media, database, channel, outbox and LLM endpoints (the primary and each fallback model); exit 1 when
any check fails.

A check reports what it finds, it repairs nothing; warnings (`warn`) do not fail. Not handled
here: checks of a running daemon (doctor reads the same configuration and database, it does
not talk to the daemon).
"""
from __future__ import annotations

import os

from .commands import over_one_request, server_checks
from .errors import IasError


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
    too_many = over_one_request(config, reg)
    if too_many:
        line(None, "tools", too_many)
    for spec, tools, problems in await server_checks(config, reg) if reg.servers else ():
        bad = [p for p in problems if not p.endswith("(warning)")]
        line(False if bad else True if tools else None, f"mcp server {spec.name}",
             "; ".join(bad) if bad else f"{len(tools)} tools: {', '.join(tools) or '-'}")
    line(*disk_line(config.data_dir))
    line(*media_line(config))
    if not config.database_url:
        from .pgcluster import embedded
        try:
            line(True, "cluster", f"embedded PostgreSQL in {config.cluster_dir}: {embedded(config).state()}")
        except IasError as exc:
            line(False, "cluster", str(exc))
    try:
        async with open_store(config) as store:
            where = "IAS_DATABASE_URL" if config.database_url else f"embedded cluster in {config.cluster_dir}"
            pending = await store.approvals()
            line(True, "database", f"{where}, schema applied, {len(pending)} pending approvals")
            from .channels.wechat.login import status
            wx = await status(store)
            if config.wechat_token or wx.logged_in:
                line(not wx.stale, "channel", "WeChat session expired: run `ias wechat login`" if wx.stale
                     else f"WeChat, owner {config.wechat_owner or wx.owner}")
            else:
                line(None, "channel", "WeChat not logged in: console channel (`ias wechat login`)")
            from .notifiers import configured
            fallbacks = ", ".join(n.name for n in configured(config)) or "none (see docs/wechat.md, fallback notifiers)"
            line(True if configured(config) else None, "outbox",
                 f"{len(await store.queued())} messages queued; fallback: {fallbacks}")
    except IasError as exc:
        line(False, "database", str(exc))
    async with open_llm(config) as llm:
        if llm is None:
            line(False, "llm", "OPENAI_API_KEY is not set (run `ias setup`)")
        else:
            line(*await llm_line(llm.primary, "llm", "OPENAI_API_KEY", "set IAS_MODEL to one of them (or run `ias setup`)"))
            for n, (endpoint, fallback) in enumerate(zip(config.fallback_models, llm.fallbacks), 1):
                line(*await llm_line(fallback, f"llm fallback {n}", endpoint.key_from,
                                     f"fix entry {n} of IAS_FALLBACK_MODELS"))
    return 1 if failed else 0


async def llm_line(llm, what: str, key_from: str, fix: str) -> tuple[bool | None, str, str]:
    """doctor's look at one model's endpoint (`what`: the check's name): its model list; a warning for a model
    it does not list (`fix` says what to change; none for an endpoint without a list), a failure for a
    refused key (`key_from`: the variable it came from) or an endpoint that cannot be reached."""
    from .agent import key_refused
    from .llm import KeyRefused
    url = llm.base_url or "https://api.openai.com/v1"
    try:
        names = await llm.models()
    except KeyRefused:
        return False, what, f"{url}: {key_refused(key_from)}"
    except Exception as exc:              # any endpoint failure is a finding, not a crash
        return False, what, f"{llm.base_url or 'default endpoint'} unreachable ({type(exc).__name__})"
    if names is None:
        return True, what, f"{url}: no model list offered, model {llm.model} not checked"
    if llm.model not in names:
        return None, what, f"{url}: model {llm.model} is not among the {len(names)} models it lists; {fix}"
    return True, what, f"{url}: {len(names)} models, {llm.model} found"


def media_line(config, find_spec=None) -> tuple[bool | None, str, str]:
    """WeChat media (SPEC 13): whether AES is there (the optional cryptography package), the inbox and its
    bound, whether the model is taken to see images."""
    import importlib.util
    detail = f"inbox {config.inbox} (at most {config.inbox_max_mb} MB), vision {'on' if config.vision else 'off'}"
    if (find_spec or importlib.util.find_spec)("cryptography") is None:
        return None, "media", ("cryptography is not installed: WeChat images and files are answered with a note "
                               f"(make run, or pip install 'ias[media]'); {detail}")
    return True, "media", detail


def disk_line(data_dir, statvfs=os.statvfs) -> tuple[bool | None, str, str]:
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
