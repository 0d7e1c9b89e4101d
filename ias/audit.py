"""The audit log's rules: what gets redacted, and how the keyed chain is checked.

Rows are written by the store, in the same transaction as the state change they record, each
sealed with an HMAC chained over the previous row's value (auditchain.py); the database only
stores the values. `verify` recomputes every one in Python with the key, and compares the
newest rows with the head kept outside the database, so an edited, deleted, re-chained or
truncated log is found whoever wrote it. Rows from before the keyed chain are checked by
their old rule (a SHA-256 the verifying query computes with built-ins) and counted as unkeyed:
they prove less, since anyone could have computed them.
"""
from __future__ import annotations

import json
import re
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from .auditchain import HeadError, is_keyed, read_head, seal
from .errors import StoreError
from .store import AuditRow, Store

SECRET_KEY_RE = re.compile(r"pass|secret|token|key|cookie|auth", re.IGNORECASE)
REDACTED = "***"
PROBLEMS_KEPT = 50           # problem lines `verify` keeps (the count goes on): memory stays flat


def redact(value: Any) -> Any:
    """A copy of `value` with the values of secret-looking keys replaced, at any depth."""
    if isinstance(value, dict):
        return {k: REDACTED if SECRET_KEY_RE.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `verify` found: rows read, those before the keyed chain, and the problems (the first
    PROBLEMS_KEPT of `broken`)."""
    rows: int
    unkeyed: int
    problems: tuple[str, ...]
    broken: int

    @property
    def intact(self) -> bool:
        return self.broken == 0

    def summary(self) -> str:
        if not self.intact:
            more = self.broken - len(self.problems)
            return f"audit log: chain broken ({self.broken} problems{f', {more} not shown' if more else ''})"
        unkeyed = f"; {self.unkeyed} rows before the keyed chain (unkeyed)" if self.unkeyed else ""
        return f"audit log: chain intact ({self.rows} rows{unkeyed})"


async def verify(store: Store) -> list[str]:
    """The chain's problems (the first PROBLEMS_KEPT); empty when it is intact."""
    return list((await check(store)).problems)


async def check(store: Store) -> Verdict:
    """Check every row's value and link, and the head kept outside the database, in one pass.

    The head is read before the rows' snapshot is taken: it is written after its row commits,
    so a row a running daemon appends meanwhile can never look like a removed one.
    """
    chain = store.chain
    if chain is None:
        raise StoreError("no audit chain key: the audit log cannot be verified")
    problems: list[str] = []
    broken = 0

    def found(line: str) -> None:
        nonlocal broken
        broken += 1
        if len(problems) < PROBLEMS_KEPT:
            problems.append(line)
    try:
        head, head_read = read_head(chain.head), True
    except HeadError as exc:
        head, head_read = None, False
        found(str(exc))
    rows = unkeyed = keyed = forged = 0
    previous, last_id, head_seen = "", None, False
    async with aclosing(store.audit_chain()) as stream:
        async for row in stream:
            rows += 1
            last_id = row.id
            if row.prev_hash != previous:
                found(f"row {row.id}: chain broken (previous row removed or altered)")
            if is_keyed(row.hash):
                keyed += 1
                if seal(chain.key, row) != row.hash:
                    forged += 1
                    found(f"row {row.id}: contents do not match its keyed hash (row altered or re-chained)")
            elif keyed:
                found(f"row {row.id}: not keyed, after the keyed chain began (row altered or re-chained)")
            else:
                unkeyed += 1
                if row.digest != row.hash:
                    found(f"row {row.id}: contents do not match its hash (row altered)")
            if head is not None and row.id == head.id:
                head_seen = True
                if row.hash != head.value:
                    found(f"row {row.id}: differs from the chain head kept in {chain.head} (row altered or re-chained)")
            previous = row.hash
    if head is not None and not head_seen:
        end = f"the log ends at row {last_id}" if last_id is not None else "the log is empty"
        found(f"row {head.id} is missing: the chain head kept in {chain.head} names it, {end} (rows removed)")
    elif head is None and keyed and head_read:
        found(f"no chain head {chain.head}: the removal of the newest rows cannot be ruled out "
              "(restored or moved? see README, Audit log)")
    if keyed and forged == keyed:
        found("every keyed row fails: the secret key is not the one that wrote this log")
    return Verdict(rows, unkeyed, tuple(problems), broken)


def format_row(row: AuditRow) -> str:
    """One audit row as a single line for `ias audit`."""
    parts = [f"{row.id:>6}", row.at.astimezone().strftime("%Y-%m-%d %H:%M:%S"), row.event]
    for label, value in (("user", row.user_id), ("skill", row.skill_name), ("risk", row.risk),
                         ("decision", row.decision), ("exit", row.exit_code), ("ms", row.duration_ms),
                         ("bytes", row.output_size), ("approval", row.approval_id), ("detail", row.detail)):
        if value is not None:
            parts.append(f"{label}={value}")
    if row.truncated:
        parts.append("truncated")
    if row.params is not None:
        parts.append("params=" + json.dumps(row.params, ensure_ascii=False, sort_keys=True))
    return "  ".join(parts)
