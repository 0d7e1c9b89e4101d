"""Ends of skill runs that the database refused (an outage, a full disk): never lost, never "interrupted".

A run's end is its `skill_finished` audit row and, for an approved call, the approval's result.
When the store refuses them, they are kept in memory and retried with backoff until written
(SPEC §15 "Disk"). A daemon that stops before the database returns (it exits after a minute of
outage, and systemd restarts it) saves what is still unwritten to `Config.unwritten_file` in the data
directory (mode 0600); the next daemon start writes those first, before it gives `skill_interrupted` rows
to calls whose process died: a call whose end was kept is therefore never taken for interrupted.

Not handled: a process killed with SIGKILL while holding unwritten ends loses them (the next start
records those calls as interrupted), and so does a one-off command (`ias run`) that exits first.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import StoreError
from .limits import DB_RETRY_FIRST, DB_RETRY_MAX
from .store import AuditEntry, Store

log = logging.getLogger(__name__)


@dataclass(slots=True)
class End:
    """What is still to be written of one run's end (None: written)."""
    entry: AuditEntry | None
    approval_id: uuid.UUID | None = None
    result: dict | None = None

    @property
    def written(self) -> bool:
        return self.entry is None and self.result is None

    async def write(self, store: Store, *, quiet: bool = False) -> bool:
        """Write what is left, in order; whether all of it is written now (a refusal is logged unless `quiet`)."""
        if self.entry is not None:
            try:
                await store.audit(self.entry)
                self.entry = None
            except StoreError as exc:
                self._refused("skill_finished row", exc, quiet)
        if self.result is not None:
            try:
                await store.record_result(self.approval_id, self.result)
                self.result = None
            except StoreError as exc:
                self._refused("result", exc, quiet)
        return self.written

    def _refused(self, what: str, exc: StoreError, quiet: bool) -> None:
        if not quiet:
            log.error("a skill ran (%s) but its %s was not written yet: %s", self.tag, what, exc)

    @property
    def tag(self) -> str:
        return f"approval {self.approval_id}" if self.entry is None else (self.entry.detail or "?")

    def line(self) -> str:
        entry = None if self.entry is None else {k: v for k, v in asdict(self.entry).items() if v is not None}
        if entry and entry.get("approval_id") is not None:
            entry["approval_id"] = str(entry["approval_id"])
        return json.dumps({"entry": entry, "approval_id": self.approval_id and str(self.approval_id),
                           "result": self.result}) + "\n"

    @classmethod
    def parse(cls, line: str) -> End:
        data = json.loads(line)
        entry = data.get("entry")
        if entry is not None:
            if entry.get("approval_id") is not None:
                entry["approval_id"] = uuid.UUID(entry["approval_id"])
            entry = AuditEntry(**entry)
        approval = data.get("approval_id")
        return cls(entry, uuid.UUID(approval) if approval else None, data.get("result"))


class Unwritten:
    """The ends this process holds until the database takes them, and their file across a restart."""

    def __init__(self, store: Store, path: Path | None = None, *, first: float = DB_RETRY_FIRST,
                 most: float = DB_RETRY_MAX):
        self.store = store
        self.path = path                   # None: nothing survives this process
        self.first = first
        self.most = most
        self.ends: list[End] = []
        self.saved = False                  # the file has them now: no more writes from this process

    async def keep(self, end: End) -> None:
        """Retry `end` with backoff (at most `most` s apart) until it is written."""
        self.ends.append(end)
        delay = self.first
        try:
            while not end.written:
                await asyncio.sleep(delay)
                if self.saved:
                    return                  # the next start writes it (written here too, it would be twice)
                delay = min(delay * 2, self.most)
                await end.write(self.store, quiet=True)
            log.warning("a skill's end is written now that the database is back (%s)", end.tag)
        finally:
            if end in self.ends and end.written:
                self.ends.remove(end)

    def save(self) -> int:
        """Shutdown: append the ends still unwritten to the file; how many. This process writes no more."""
        self.saved = True
        return self._append([end for end in self.ends if not end.written])

    def _append(self, ends: list[End]) -> int:
        if not ends or self.path is None:
            return 0
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            with open(fd, "a", encoding="utf-8") as out:
                out.write("".join(end.line() for end in ends))
                out.flush()
                os.fsync(fd)
        except OSError as exc:
            log.error("%d unwritten skill ends lost (%s): the next start records them as interrupted", len(ends), exc)
            return 0
        log.warning("%d skill ends not written yet are kept in %s for the next start", len(ends), self.path)
        return len(ends)

    async def replay(self) -> int:
        """Start: write the ends a previous daemon kept (before `record_interrupted`); how many. Ends the
        database still refuses go back to the file; a line that cannot be read is logged and dropped."""
        if self.path is None:
            return 0
        taken = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        try:
            os.replace(self.path, taken)
        except FileNotFoundError:
            return 0
        left: list[End] = []
        try:
            for number, line in enumerate(taken.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    end = End.parse(line)
                except (ValueError, TypeError, AttributeError) as exc:
                    log.error("%s line %d: not a kept skill end (%s); dropped", self.path, number, exc)
                    continue
                left.append(end)
            for end in left:
                await end.write(self.store)
        finally:
            self._append([end for end in left if not end.written])
            taken.unlink(missing_ok=True)
        written = sum(end.written for end in left)
        if written:
            log.warning("%d skill ends kept by the previous daemon are written now", written)
        return written
