"""The audit log's rules: what gets redacted, and how the hash chain is checked.

Rows are written by the store (in the same transaction as the state change they record);
the chain itself is computed by a database trigger so that every writer is covered.
Not handled: a deleted *last* row leaves no gap in the chain; compare row counts with a
copy kept elsewhere if that matters.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .limits import AUDIT_KEY_MAX, AUDIT_VALUE_MAX
from .store import AuditRow, Store

SECRET_KEY_RE = re.compile(r"pass|secret|token|key|cookie|auth", re.IGNORECASE)
REDACTED = "***"


def redact(value: Any) -> Any:
    """Call parameters as the audit log keeps them: secret-looking keys' values replaced at any depth,
    then each parameter value and name bounded (`bounded`), so no call grows the log by much."""
    hidden = _hide(value)
    if not isinstance(hidden, dict):
        return bounded(hidden)
    return {bounded(k, AUDIT_KEY_MAX) if isinstance(k, str) else k: bounded(v) for k, v in hidden.items()}


def bounded(value: Any, limit: int = AUDIT_VALUE_MAX) -> Any:
    """`value` when it takes at most `limit` bytes, else one string of at most `limit` bytes:
    `<first bytes>…[truncated, sha256=<hex>, <N> bytes]`.

    A string is measured and hashed as its UTF-8; any other value (an object, an array, nested at
    any depth) as its compact JSON text (`json.dumps(value, ensure_ascii=False, separators=(",", ":"))`),
    taken after redaction, so the hash never covers a secret. N is the full size in bytes.
    """
    if isinstance(value, str):
        if len(value) * 4 <= limit:             # at most 4 bytes a character: surely short enough
            return value
        data = value.encode("utf-8", "surrogatepass")
    elif value is None or isinstance(value, (bool, int, float)):
        return value                            # numbers are at most JSON_NUMBER_MAX digits when parsed
    else:
        data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return value
    tail = f"…[truncated, sha256={hashlib.sha256(data).hexdigest()}, {len(data)} bytes]"
    return data[:max(0, limit - len(tail.encode()))].decode("utf-8", "ignore") + tail


def _hide(value: Any) -> Any:
    """A copy of `value` with the values of secret-looking keys replaced, at any depth."""
    if isinstance(value, dict):
        return {k: REDACTED if SECRET_KEY_RE.search(str(k)) else _hide(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hide(v) for v in value]
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
