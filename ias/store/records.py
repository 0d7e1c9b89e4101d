"""The store's records: frozen rows handed to and from the rest of iAs.

AuditRow and ChainRow live in `auditchain` (the chain seals them; defined there so that it needs
nothing of the store) and are re-exported here.

Not handled: how a row is read or written (the modules by table family).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from ..auditchain import AuditRow, ChainRow

__all__ = ["AuditEntry", "AuditRow", "ChainRow", "Pruned", "Approval", "Task", "OutboxRow", "InboundRow", "UsageRow",
           "Grant"]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One audit row to write; `params` must already be redacted."""
    event: str
    user_id: str | None = None
    skill_name: str | None = None
    params: Any = None
    risk: str | None = None
    approval_id: uuid.UUID | None = None
    decision: str | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    output_size: int | None = None
    truncated: bool | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Pruned:
    """What `prune_audit` removed: rows this time, the last one's id, and rows removed in all."""
    count: int
    last_id: int
    total: int


@dataclass(frozen=True, slots=True)
class Approval:
    id: uuid.UUID
    created_at: datetime
    expires_at: datetime
    user_id: str
    skill_name: str
    params: dict
    code_hash: str
    attempts_left: int
    status: str
    result: dict | None
    consumed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    user_id: str
    name: str
    schedule: str
    kind: str                      # "reminder" | "prompt"
    text: str
    enabled: bool
    next_run_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One message part to the owner (see schema.sql `outbox`)."""
    id: int
    user_id: str
    channel: str
    kind: str                      # reply | reminder | task | notice
    text: str
    client_id: str
    created_at: datetime
    due_at: datetime
    state: str                     # queued | sent | fallback | expired
    attempts: int
    reason: str | None
    next_try_at: datetime | None
    done_at: datetime | None
    noticed: bool
    task_run_id: int | None
    file_path: str | None = None   # a file to send (its private copy, ias/outgoing.py); `text` then names it


@dataclass(frozen=True, slots=True)
class InboundRow:
    """One message from a user, recorded on arrival (see schema.sql `inbound`)."""
    id: int
    channel: str
    user_id: str
    message_id: str | None
    text: str
    received_at: datetime
    replays: int                   # how many starts handled it again already
    attachments: Any               # the records of its files (JSON, read back by inbox.attachments)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One user's model tokens on one Beijing day with one model: summed over its responses."""
    day: date
    model: str
    prompt_tokens: int
    completion_tokens: int
    requests: int
    estimated_requests: int         # responses without a believable `usage`, counted by estimate

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Grant:
    """One grants row as stored (see schema.sql `grants`); whether it counts is ias/grants.py's MAC check."""
    id: int
    created_at: datetime
    user_id: str
    skill_name: str
    params: dict
    task_id: int | None            # None: any call of the user; else only that scheduled task's calls
    uses_max: int | None           # None: a time grant
    uses: int
    expires_at: datetime
    approval_id: uuid.UUID
    mac: str
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One memory as stored."""
    id: int
    user_id: str
    text: str
    source: str                   # "owner" | "model"
    status: str                   # "active" | "unverified"
    tainted: bool                 # the turn had read untrusted content before it was written
    said: str | None              # the owner's message of that turn (cut), None outside a turn
    created_at: datetime
    confirmed_at: datetime | None
