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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from .errors import IasError

if TYPE_CHECKING:
    from .store import ChainRow

KEYED = "k1:"                           # prefix of every keyed value; older rows hold a bare SHA-256
_CONTEXT = b"ias audit chain v1"        # what the chain key is derived for (never the secret itself)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)
HEAD_ID_DIGITS = 20                     # the head record's id width: every record has one length
HEAD_READ_MAX = 4096                    # bytes of the head file read at most
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))     # built once: verification seals every row


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


def seal(key: bytes, row: ChainRow) -> str:
    """The keyed value of `row` (its params as jsonb's text; its own `hash` is not covered)."""
    fields = ["v1", row.id, (row.at - _EPOCH) // _MICROSECOND, row.event, row.user_id, row.skill_name,
              row.params, row.risk, None if row.approval_id is None else str(row.approval_id), row.decision,
              row.exit_code, row.duration_ms, row.output_size, row.truncated, row.detail, row.prev_hash]
    return KEYED + hmac.digest(key, _ENCODER.encode(fields).encode("ascii"), "sha256").hex()


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
