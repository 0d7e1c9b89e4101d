"""The keyed audit chain: each row's HMAC over the row and the previous row's value, and its head.

The database stores the chain but never computes or checks it: the key is derived from the
secret key (`derive`), which the database never sees, so whoever owns the tables can edit,
delete or re-chain rows but cannot forge the values. The newest row's id and value are also
kept in a file in the data directory (`advance` after each commit), which is what reveals the
removal of the newest rows.

A row's value is `k1:` + HMAC-SHA256 over a JSON array (ASCII, no spaces) of: the format tag,
id, time (integer microseconds since the epoch), every audit column as the database returns
it (params as jsonb's own text), and the previous row's value. JSON keeps the encoding
unambiguous: strings are quoted, null is not "", true is not 1.

`ias audit --prune-before` removes the oldest rows and leaves a checkpoint (`Checkpoint`): the
last removed row's id and value, and how many rows were removed in all, sealed with the same
key (`mark`, over a JSON array whose tag no row's array has). Verification starts from it: the
first remaining row must link to that value, so a row deleted past the cut breaks the chain,
and a checkpoint moved or written without the key does not match its seal.

Not handled: an attacker who can also reach the data directory can read the secret key there
and forge everything; and, with the head file removed as well, a log rewritten wholly in the
old unkeyed form passes as a log from before the keyed chain. The head is not fsynced: after a
power loss it may lag behind the log, which verification accepts (it only checks the rows it
names are there).
"""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

from .errors import IasError

KEYED = "k1:"                           # prefix of every keyed value; older rows hold a bare SHA-256
_CONTEXT = b"ias audit chain v1"        # what the chain key is derived for (never the secret itself)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
HEAD_ID_DIGITS = 20                     # the head record's id width: every record has one length
HEAD_READ_MAX = 4096                    # bytes of the head file read at most
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
_esc = json.encoder.encode_basestring_ascii        # a JSON string, ASCII (json's own C function)


class HeadError(IasError):
    """The chain head file exists but cannot be read or parsed."""


@dataclass(frozen=True, slots=True)
class AuditChain:
    """What a store needs to write keyed rows: the derived key and the head file's path."""
    key: bytes = field(repr=False)
    head: Path

    @classmethod
    def derive(cls, secret: bytes, head: Path) -> "AuditChain":
        """The chain key for `secret` (HMAC of a fixed context: the secret itself is never used)."""
        return cls(hmac.new(secret, _CONTEXT, hashlib.sha256).digest(), Path(head))


@dataclass(frozen=True, slots=True)
class Head:
    """The newest row a writer committed, as recorded outside the database."""
    id: int
    value: str


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One row of the audit log as stored (the store reads and writes it; re-exported by `ias.store`)."""
    id: int
    at: datetime
    event: str
    user_id: str | None
    skill_name: str | None
    params: Any
    risk: str | None
    approval_id: uuid.UUID | None
    decision: str | None
    exit_code: int | None
    duration_ms: int | None
    output_size: int | None
    truncated: bool | None
    detail: str | None
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ChainRow(AuditRow):
    """An audit row as the chain covers it: `params` is jsonb's text. Defined here, beside `seal`,
    so that the chain needs nothing of the store."""


def seal(key: bytes, row: ChainRow) -> str:
    """The keyed value of `row` (its params as jsonb's text; its own `hash` is not covered)."""
    return Sealer(key).link((row.id, (row.at - _EPOCH) // _MICROSECOND, row.event, row.user_id, row.skill_name,
                             row.params, row.risk, None if row.approval_id is None else str(row.approval_id),
                             row.decision, row.exit_code, row.duration_ms, row.output_size, row.truncated,
                             row.detail, row.prev_hash))


class Sealer:
    """Seals under one key, fast enough to verify millions of rows: the HMAC's inner and outer
    SHA-256 states are keyed once and copied per row, and the JSON array is written directly
    (the same text as `json.dumps(…, ensure_ascii=True, separators=(",", ":"))`, which the
    tests check), not through the generic encoder."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes):
        block = (hashlib.sha256(key).digest() if len(key) > 64 else key).ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def mac(self, text: str) -> str:
        """`k1:` + HMAC-SHA256 (hex) of ASCII `text` under the key."""
        inner = self._inner.copy()
        inner.update(text.encode("ascii"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return KEYED + outer.hexdigest()

    def link(self, link: tuple) -> str:
        """The keyed value of a row given as LINK_FIELDS (the first 15: `hash` is not covered).
        Written out, not through helpers: verification runs it a million times."""
        (row_id, at, event, user_id, skill_name, params, risk, approval_id, decision, exit_code, duration_ms,
         output_size, truncated, detail, prev_hash) = link[:15]
        inner = self._inner.copy()
        inner.update(
            f'["v1",{row_id},{at},{_esc(event)},{"null" if user_id is None else _esc(user_id)},'
            f'{"null" if skill_name is None else _esc(skill_name)},{"null" if params is None else _esc(params)},'
            f'{"null" if risk is None else _esc(risk)},{"null" if approval_id is None else _esc(approval_id)},'
            f'{"null" if decision is None else _esc(decision)},{"null" if exit_code is None else exit_code},'
            f'{"null" if duration_ms is None else duration_ms},{"null" if output_size is None else output_size},'
            f'{"null" if truncated is None else "true" if truncated else "false"},'
            f'{"null" if detail is None else _esc(detail)},{_esc(prev_hash)}]'.encode("ascii"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return KEYED + outer.hexdigest()


# A row as verification reads it (the store's `audit_chain`), one plain tuple per row: the sealed
# fields in the order the value covers them, `at` in integer microseconds since the epoch and the
# approval id as text, then the stored value and, for a row from before the keyed chain, the old
# rule's digest.
LINK_FIELDS = ("id", "at_us", "event", "user_id", "skill_name", "params", "risk", "approval_id", "decision",
               "exit_code", "duration_ms", "output_size", "truncated", "detail", "prev_hash", "hash", "digest")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where the log was cut: the last removed row's id and value, the rows removed so far, and
    the keyed seal over the three (`mark`)."""
    last_id: int
    last_value: str
    pruned: int
    seal: str


def mark(key: bytes, last_id: int, last_value: str, pruned: int) -> str:
    """The keyed seal of a checkpoint (tagged apart from every row's value)."""
    return Sealer(key).mac(_ENCODER.encode(["checkpoint-v1", last_id, last_value, pruned]))


def is_keyed(value: str) -> bool:
    return value.startswith(KEYED)


def read_head(path: Path) -> Head | None:
    """The recorded head, None when there is no file; HeadError when it is unreadable."""
    try:
        with _opened(path, os.O_RDONLY, fcntl.LOCK_SH) as fd:
            text = os.pread(fd, HEAD_READ_MAX, 0).decode("ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeError) as exc:
        raise HeadError(f"cannot read the audit chain head {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return _parse(path, text)


def advance(path: Path, head: Head) -> None:
    """Record `head` unless a newer one is already recorded (another writer, another process).

    Under a flock on the file, so concurrent writers only ever move it forward and readers never
    see half a record. The record has a fixed length and is overwritten in place: no rename,
    which ext4 makes flush the file (milliseconds on every audit row), and no moment at which
    the file is empty. An unreadable head is replaced (verification has nothing better).
    """
    with _opened(path, os.O_RDWR | os.O_CREAT, fcntl.LOCK_EX) as fd:
        try:
            current = _parse(path, os.pread(fd, HEAD_READ_MAX, 0).decode("ascii"))
        except (HeadError, UnicodeError):
            current = None
        if current is None or current.id < head.id:
            _write(fd, head)


def reset(path: Path, head: Head | None) -> None:
    """Record `head` whatever is recorded (a restored log's newest row), or none at all."""
    if head is None:
        Path(path).unlink(missing_ok=True)
        return
    with _opened(path, os.O_RDWR | os.O_CREAT, fcntl.LOCK_EX) as fd:
        _write(fd, head)


def _parse(path: Path, text: str) -> Head | None:
    parts = text.split()
    if not parts:
        return None                         # created, never written (its writer died in between)
    if len(parts) != 2 or not parts[0].isdigit() or not is_keyed(parts[1]):
        raise HeadError(f"the audit chain head {path} is not '<id> {KEYED}<hmac>'")
    return Head(int(parts[0]), parts[1])


@contextmanager
def _opened(path: Path, flags: int, lock: int) -> Iterator[int]:
    """The head file open (never through a symbolic link) and flocked, then closed (unlocked)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, lock)
        yield fd
    finally:
        os.close(fd)


def _write(fd: int, head: Head) -> None:
    record = f"{head.id:0{HEAD_ID_DIGITS}d} {head.value}\n".encode("ascii")
    os.pwrite(fd, record, 0)
    os.ftruncate(fd, len(record))
