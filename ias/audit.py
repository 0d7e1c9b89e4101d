"""The audit log's rules: what gets redacted, and how the hash chain is checked.

Rows are written by the store (in the same transaction as the state change they record);
the chain itself is computed by a database trigger so that every writer is covered.
Not handled: a deleted *last* row leaves no gap in the chain; compare row counts with a
copy kept elsewhere if that matters.
"""
from __future__ import annotations

import json
import re
from typing import Any

from .store import AuditRow, Store

SECRET_KEY_RE = re.compile(r"pass|secret|token|key|cookie|auth", re.IGNORECASE)
REDACTED = "***"


def redact(value: Any) -> Any:
    """A copy of `value` with the values of secret-looking keys replaced, at any depth."""
    if isinstance(value, dict):
        return {k: REDACTED if SECRET_KEY_RE.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


async def verify(store: Store) -> list[str]:
    """Problems with the chain: an edited row (digest mismatch) or a removed one (broken link)."""
    problems = []
    previous = ""
    for row_id, prev_hash, stored, digest in await store.audit_digests():
        if prev_hash != previous:
            problems.append(f"row {row_id}: chain broken (previous row removed or altered)")
        if stored != digest:
            problems.append(f"row {row_id}: contents do not match its hash (row altered)")
        previous = stored
    return problems


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
