"""The token accounting's SQL: one row per user, Beijing day and model, summed by UPSERT.

Each model response adds to its row in one statement (`INSERT … ON CONFLICT DO UPDATE`), so
concurrent turns never lose a count. Not handled: which day it is (the caller's clock, in Beijing
time), what a budget allows (`budget`), prices.
"""
from __future__ import annotations

from dataclasses import fields
from datetime import date

from .pool import Pool
from .records import UsageRow

_USAGE_FIELDS = ", ".join(f.name for f in fields(UsageRow))


class TokenUsage(Pool):
    """The token_usage table's queries."""

    async def record_usage(self, day: date, user_id: str, model: str, prompt: int, completion: int,
                           estimated: bool) -> None:
        """Add one response's tokens to the user's row for `day` and `model`."""
        async with self._conn() as conn:
            await conn.execute(
                "INSERT INTO token_usage AS u (day, user_id, model, prompt_tokens, completion_tokens, requests, "
                "estimated_requests) VALUES (%s, %s, %s, %s, %s, 1, %s) ON CONFLICT (day, user_id, model) DO UPDATE "
                "SET prompt_tokens = u.prompt_tokens + EXCLUDED.prompt_tokens, "
                "completion_tokens = u.completion_tokens + EXCLUDED.completion_tokens, requests = u.requests + 1, "
                "estimated_requests = u.estimated_requests + EXCLUDED.estimated_requests, updated_at = clock_timestamp()",
                (day, user_id, model, prompt, completion, int(estimated)))

    async def usage_on(self, user_id: str, day: date) -> list[UsageRow]:
        """The user's rows for `day`, one per model, by model name."""
        async with self._conn() as conn:
            cur = await conn.execute(f"SELECT {_USAGE_FIELDS} FROM token_usage WHERE user_id = %s AND day = %s "
                                     f"ORDER BY model", (user_id, day))
            return [UsageRow(**row) for row in await cur.fetchall()]
