"""The daily token budget (SPEC §12 "Budgets"): every model response's tokens recorded, and each model
request of a turn checked against IAS_DAILY_TOKENS first.

A user's total for the Beijing day is read from the store once per turn (`refresh`) and kept in
memory, grown by every response recorded here, so the check before each round costs no query.
A response whose count cannot be stored is still counted in memory (and logged): the turn goes on,
and the budget still sees it. The day turns at Beijing midnight, by the injected clock.

Not handled: budgets per model or per task, prices, a warning before the budget is reached, and
turns of one user running in parallel in several processes (each counts what it sees at its refresh).
"""
from __future__ import annotations

import logging
from datetime import date, datetime
from typing import TYPE_CHECKING, Callable

from .clock import SYSTEM, TZ
from .errors import StoreError
from .store import Store, UsageRow

if TYPE_CHECKING:
    from .llm import Reply

log = logging.getLogger(__name__)

SPENT = "今日大模型额度已用完（{budget} tokens），明天恢复或调高 IAS_DAILY_TOKENS。"


def beijing_day(moment: datetime) -> date:
    """The Beijing calendar day of `moment` (aware): the day token counts belong to."""
    return moment.astimezone(TZ).date()


class Budget:
    """Each user's model tokens today: recorded after every response, checked before every request."""

    def __init__(self, store: Store, daily: int | None, now: Callable[[], datetime] = SYSTEM.now):
        self.store = store
        self.daily = daily              # tokens per user per Beijing day; None: no limit
        self.now = now
        self._today: dict[str, tuple[date, int]] = {}      # user -> (day, tokens counted that day)

    async def refresh(self, user_id: str) -> list[UsageRow]:
        """Read the user's counts for today from the store (a turn's first check): one row per model."""
        day = beijing_day(self.now())
        rows = await self.store.usage_on(user_id, day)
        self._today[user_id] = (day, sum(max(0, row.total) for row in rows))
        return rows

    def used(self, user_id: str) -> int:
        """The user's tokens today as last refreshed and recorded since (0 once the day has turned)."""
        day, total = self._today.get(user_id, (None, 0))
        return total if day == beijing_day(self.now()) else 0

    def spent(self, user_id: str) -> str | None:
        """The message that ends the turn when the user's tokens today reached the budget, else None."""
        if self.daily is not None and self.used(user_id) >= self.daily:
            log.info("daily token budget reached for %s: %d of %d", user_id, self.used(user_id), self.daily)
            return SPENT.format(budget=self.daily)
        return None

    async def record(self, user_id: str, reply: Reply) -> None:
        """Count one model response's tokens for the user today; a store failure is logged, never raised."""
        usage = reply.usage
        if usage is None:           # a test's scripted reply: nothing to count
            return
        day = beijing_day(self.now())
        self._today[user_id] = (day, self.used(user_id) + usage.total)
        try:
            await self.store.record_usage(day, user_id, reply.model, usage.prompt, usage.completion, usage.estimated)
        except StoreError as exc:
            log.error("the tokens of a model response for %s were not stored (%s): counted in memory only",
                      user_id, exc)
