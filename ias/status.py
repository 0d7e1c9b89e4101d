"""`/status` (SPEC §12): the facts an owner asks for from the phone, gathered from the objects that hold
them, and their Chinese lines.

The model configured (and its fallbacks), the day's tokens (and IAS_DAILY_TOKENS), the sandbox level (as doctor reports
it), the primary channel's send window (`console` for a channel without one), the user's queued
outbox parts, the approval they are being asked for now and their active grants. Times are Beijing time with the zone.
Without the database the answer is one line. Not handled: the status of other users or processes
(an approval asked by a one-off command elsewhere is not seen), the endpoint's health (doctor's).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from .approval import Approvals
from .budget import Budget
from .channels.base import Channel, Window
from .clock import SYSTEM, stamp
from .config import Config
from .errors import StoreError
from .grants import Grants
from .sandbox import Level, Sandbox
from .store import Store

UNAVAILABLE = "状态暂时无法读取：数据库不可用，请稍后再试。"


@dataclass(frozen=True, slots=True)
class Facts:
    """What /status shows for one user, at `now`."""
    now: datetime
    model: str | None                   # None: no model configured (no API key)
    fallbacks: tuple[str, ...]          # IAS_FALLBACK_MODELS' models, in order
    tokens: dict[str, int]              # today's tokens by model
    estimated: bool                     # some of them are estimates (the endpoint gave no usage)
    daily: int | None                   # IAS_DAILY_TOKENS
    sandbox: Level
    channel: str                        # the primary channel's name
    window: Window | None               # its send window for the user; None: it has none
    queued: int                         # outbox parts still queued for the user
    asking: str | None                  # the skill whose code the user is being asked for now
    grants: int | None = None           # the user's active grants (None: built without grants)


class Status:
    """Gathers /status's facts; built by app.build over the objects that hold them."""

    def __init__(self, config: Config, store: Store, budget: Budget, approvals: Approvals, sandbox: Sandbox,
                 channel: Channel | None, *, has_model: bool, now: Callable[[], datetime] = SYSTEM.now,
                 grants: Grants | None = None):
        self.config = config
        self.store = store
        self.budget = budget
        self.approvals = approvals
        self.sandbox = sandbox
        self.channel = channel          # the primary channel; None: built without channels (a one-off command)
        self.has_model = has_model      # a model client was built (there is an API key)
        self.now = now
        self.grants = grants

    async def facts(self, user_id: str) -> Facts:
        """The facts for `user_id` now; StoreError when the database cannot be read."""
        rows = await self.budget.refresh(user_id)
        queued = len(await self.store.queued(user_id))
        window = None if self.channel is None else await self.channel.window(user_id)
        level = self.sandbox.level() if self.sandbox.probed else await asyncio.to_thread(self.sandbox.level)
        return Facts(now=self.now(), model=self.config.model if self.has_model else None,
                     fallbacks=tuple(endpoint.model for endpoint in self.config.fallback_models),
                     tokens={row.model: max(0, row.total) for row in rows},
                     estimated=any(row.estimated_requests for row in rows), daily=self.budget.daily, sandbox=level,
                     channel="console" if self.channel is None else self.channel.name, window=window, queued=queued,
                     asking=self.approvals.asking(user_id),
                     grants=None if self.grants is None else len(await self.grants.active(user_id)))

    async def report(self, user_id: str) -> str:
        """The /status answer: the lines of `facts`, or one line when the database is unreachable."""
        try:
            return lines(await self.facts(user_id))
        except StoreError:
            return UNAVAILABLE


def lines(facts: Facts) -> str:
    """The owner's /status text."""
    model = facts.model if facts.model is not None else "未配置（运行 python ias.py setup 或设置 OPENAI_API_KEY）"
    if facts.model is not None and facts.fallbacks:
        model += f"（备用：{'、'.join(facts.fallbacks)}）"
    total = sum(facts.tokens.values())
    used = f"{total:,}" + (f" / {facts.daily:,}" if facts.daily is not None else "") + " tokens"
    detail = [f"{name} {count:,}" for name, count in facts.tokens.items()] if len(facts.tokens) > 1 else []
    if facts.estimated:
        detail.append("含估算")
    sandbox = str(facts.sandbox) + (f"（{facts.sandbox.missing}）" if facts.sandbox.name == "none" else "")
    return "\n".join([
        "iAs 状态：",
        f"模型：{model}",
        f"今日用量：{used}" + (f"（{'；'.join(detail)}）" if detail else ""),
        f"沙箱级别：{sandbox}",
        f"微信窗口：{window_text(facts.window, facts.channel, facts.now)}",
        f"待发送消息：{facts.queued} 条",
        f"待确认：{facts.asking or '无'}",
        *([] if facts.grants is None else [f"有效授权：{facts.grants} 个"]),
    ])


def window_text(window: Window | None, channel: str, now: datetime) -> str:
    """The send window's state: time left and when it closes, closed, never opened; the channel's name
    (`console`) for one without a window."""
    if window is None:
        return channel
    if window.opened is None or window.closes is None:
        return "未打开（在微信上发一条消息即打开）"
    closes = datetime.fromtimestamp(window.closes, timezone.utc)
    left = int(window.closes - now.timestamp())
    if left <= 0:
        return f"已关闭（{stamp(closes, seconds=False)}），在微信上发一条消息即重新打开"
    hours, minutes = divmod(left // 60, 60)
    return f"还剩 {hours} 小时 {minutes} 分（至 {stamp(closes, seconds=False)}），本窗口还可发 {window.left} 条"
