"""The audit log's rules: what gets redacted, and how the keyed chain is checked.

Rows are written by the store, in the same transaction as the state change they record, each
sealed with an HMAC chained over the previous row's value (auditchain.py); the database only
stores the values. `verify` recomputes every one in Python with the key, and compares the
newest rows with the head kept outside the database, so an edited, deleted, re-chained or
truncated log is found whoever wrote it. Rows from before the keyed chain are checked by
their old rule (a SHA-256 the verifying query computes with built-ins) and counted as unkeyed:
they prove less, since anyone could have computed them.

The oldest rows can be removed only by `prune` (`ias audit --prune-before DATE`), which leaves a
keyed checkpoint at the cut; verification starts from it, so the rest is still proved.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from asyncio.subprocess import PIPE
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, AsyncIterator

from .auditchain import KEYED, AuditChain, Checkpoint, Head, HeadError, Sealer, is_keyed, mark, read_head, reset
from .errors import StoreError
from .limits import AUDIT_KEY_MAX, AUDIT_VALUE_MAX
from .store import AuditRow, Pruned, Store

SECRET_KEY_RE = re.compile(r"pass|secret|token|key|cookie|auth", re.IGNORECASE)
REDACTED = "***"
PROBLEMS_KEPT = 50           # problem lines `verify` keeps (the count goes on): memory stays flat
VERIFY_SPAN_MIN = 200_000    # rows a helper process is worth (starting one takes ~0.3 s)
VERIFY_PARTS = min(os.cpu_count() or 1, 4)      # a long log is verified in this many processes at once


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


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `verify` found: rows read, those before the keyed chain, and the problems (the first
    PROBLEMS_KEPT of `broken`); `pruned` rows were removed before `checkpoint` (the last one's id)."""
    rows: int
    unkeyed: int
    problems: tuple[str, ...]
    broken: int
    pruned: int = 0
    checkpoint: int | None = None

    @property
    def intact(self) -> bool:
        return self.broken == 0

    def summary(self) -> str:
        if not self.intact:
            more = self.broken - len(self.problems)
            return f"audit log: chain broken ({self.broken} problems{f', {more} not shown' if more else ''})"
        unkeyed = f"; {self.unkeyed} rows before the keyed chain (unkeyed)" if self.unkeyed else ""
        pruned = (f"; {self.pruned} older rows pruned, checkpoint at row {self.checkpoint}"
                  if self.checkpoint is not None else "")
        return f"audit log: chain intact ({self.rows} rows{unkeyed}{pruned})"


async def verify(store: Store) -> list[str]:
    """The chain's problems (the first PROBLEMS_KEPT); empty when it is intact."""
    return list((await check(store)).problems)


async def check(store: Store) -> Verdict:
    """Check every row's value and link, the checkpoint a prune left, and the head kept outside
    the database, in one pass over one snapshot (streamed: memory stays flat).

    The head is read before the rows' snapshot is taken: it is written after its row commits,
    so a row a running daemon appends meanwhile can never look like a removed one.
    """
    chain = _chain(store)
    try:
        walk = _Walk(chain, read_head(chain.head), expect_head=True)
    except HeadError as exc:
        walk = _Walk(chain, None, expect_head=False)
        walk.found(str(exc))
    return await walk.along(store)


async def anchor(store: Store) -> Verdict:
    """After a restore: check the log without the head on file, and if it is intact make its
    newest row the head (no head at all when no row is keyed); the log as it is becomes the
    reference for truncation."""
    chain = _chain(store)
    walk = _Walk(chain, None, expect_head=False)
    verdict = await walk.along(store)
    if verdict.intact:
        reset(chain.head, Head(walk.last_id, walk.previous) if walk.keyed else None)
    return verdict


async def prune(store: Store, before: datetime) -> tuple[Verdict, Pruned | None]:
    """Remove the audit rows older than `before`, leaving a keyed checkpoint (`Store.prune_audit`),
    but only from a log that verifies: pruning a broken log would destroy the evidence. The
    verdict, and what was removed (None: nothing, or the log is broken)."""
    verdict = await check(store)
    if not verdict.intact:
        return verdict, None
    return verdict, await store.prune_audit(before, f"ias audit --prune-before {before.isoformat()}")


def _chain(store: Store) -> AuditChain:
    if store.chain is None:
        raise StoreError("no audit chain key: the audit log cannot be verified")
    return store.chain


def spans(first: int | None, last: int | None, parts: int) -> list[tuple[int, int]]:
    """The id range first..last cut into `parts` ranges of about the same width (fewer when it is
    narrower than VERIFY_SPAN_MIN a part); none for an empty log."""
    if first is None or last is None:
        return []
    parts = max(1, min(parts, (last - first + 1) // VERIFY_SPAN_MIN))
    width = -(-(last - first + 1) // parts)
    return [(lo, min(lo + width - 1, last)) for lo in range(first, last + 1, width)]


class _Walk:
    """One pass along the chain (or along one span of it, in a helper process): what has been seen so
    far, measured against `head` (the newest row recorded outside the database; `expect_head`: its
    absence is a problem once rows are keyed) and starting from the checkpoint a prune left, once its
    keyed seal is checked.

    A span's walk starts not knowing the value before it (`previous` None: its first row's link is
    kept, `first_link`, for the walk before it to check) nor whether the keyed chain began before it
    (`keyed_began` None: its leading unkeyed rows are kept, `leading`, for the same check)."""

    def __init__(self, chain: AuditChain, head: Head | None, expect_head: bool, *, span: bool = False):
        self.chain, self.head, self.expect_head = chain, head, expect_head
        self.sealer = Sealer(chain.key)
        self.problems: list[str] = []
        self.broken = self.rows = self.unkeyed = self.keyed = self.forged = 0
        self.previous: str | None = None if span else ""
        self.keyed_began: bool | None = None if span else False
        self.last_id: int | None = None
        self.head_seen = False
        self.checkpoint: Checkpoint | None = None
        self.first_link: tuple[int, str] | None = None      # a span's first row: its id and the value it links to
        self.leading = 0                                    # a span's unkeyed rows before its first keyed one,
        self.leading_ids: list[int] = []                    # the first PROBLEMS_KEPT of them

    async def along(self, store: Store) -> Verdict:
        """The whole log: the first span walked here, the others in helper processes meanwhile (a long log on
        a machine with more than one CPU), joined in order."""
        async with store.audit_chain() as view:
            self.start(view.checkpoint)
            first, *rest = spans(view.first, view.last, VERIFY_PARTS) or [(0, -1)]
            helpers = [asyncio.ensure_future(_helper(store.dsn, view.snapshot, self.chain, self.head,
                                                     self.checkpoint, span)) for span in rest]
            try:
                await self.walk(view.rows(*first))
                for span, helper in zip(rest, helpers):
                    self.join(span, await helper)
            finally:
                for helper in helpers:
                    helper.cancel()
                await asyncio.gather(*helpers, return_exceptions=True)
        return self.verdict()

    async def walk(self, batches: AsyncIterator[list[tuple]]) -> None:
        async for batch in batches:
            self.steps(batch)

    def steps(self, links: list[tuple]) -> None:
        """`step` for each row, the usual one (keyed, linked to the one before, sealed right, past the cut,
        not the head) only counted: verification takes a million of them."""
        seal = self.sealer.link
        cut = -1 if self.checkpoint is None else self.checkpoint.last_id
        head = -1 if self.head is None else self.head.id
        previous, usual, last = self.previous, 0, None
        for link in links:
            value = link[15]
            if link[14] == previous and cut < link[0] != head and value[:3] == KEYED and seal(link) == value:
                usual, previous, last = usual + 1, value, link[0]
                continue
            if usual:
                self._usual(usual, previous, last)
                usual = 0
            self.step(link)
            previous = self.previous
        if usual:
            self._usual(usual, previous, last)

    def _usual(self, count: int, previous: str, last: int) -> None:
        self.rows += count
        self.keyed += count
        self.keyed_began, self.previous, self.last_id = True, previous, last

    def found(self, line: str) -> None:
        self.broken += 1
        if len(self.problems) < PROBLEMS_KEPT:
            self.problems.append(line)

    def start(self, checkpoint: Checkpoint | None) -> None:
        """Begin where the log was cut: the first remaining row must link to the last removed one."""
        if checkpoint is None:
            return
        if mark(self.chain.key, checkpoint.last_id, checkpoint.last_value, checkpoint.pruned) != checkpoint.seal:
            self.found(f"the audit checkpoint at row {checkpoint.last_id} does not match its keyed seal "
                       "(forged or altered)")
            return
        self.checkpoint, self.previous = checkpoint, checkpoint.last_value
        self.keyed_began = is_keyed(checkpoint.last_value)

    def step(self, link: tuple) -> None:
        """One row, as auditchain.LINK_FIELDS."""
        row_id, prev_hash, value = link[0], link[14], link[15]
        self.rows += 1
        self.last_id = row_id
        if self.checkpoint is not None and row_id <= self.checkpoint.last_id:
            self.found(f"row {row_id}: at or before the checkpoint at row {self.checkpoint.last_id} "
                       "(row added after the log was pruned)")
        if self.previous is None:
            self.first_link = (row_id, prev_hash)
        elif prev_hash != self.previous:
            self.found(f"row {row_id}: chain broken (previous row removed or altered)")
        if value.startswith(KEYED):
            self.keyed += 1
            self.keyed_began = True
            if self.sealer.link(link) != value:
                self.forged += 1
                self.found(f"row {row_id}: contents do not match its keyed hash (row altered or re-chained)")
        elif self.keyed_began:
            self._unkeyed_after(row_id)
        else:
            if self.keyed_began is None:
                self.leading += 1
                if len(self.leading_ids) < PROBLEMS_KEPT:
                    self.leading_ids.append(row_id)
            self.unkeyed += 1
            if link[16] != value:
                self.found(f"row {row_id}: contents do not match its hash (row altered)")
        if self.head is not None and row_id == self.head.id:
            self.head_seen = True
            if value != self.head.value:
                self.found(f"row {row_id}: differs from the chain head kept in {self.chain.head} "
                           "(row altered or re-chained)")
        self.previous = value

    def _unkeyed_after(self, row_id: int) -> None:
        self.found(f"row {row_id}: not keyed, after the keyed chain began (row altered or re-chained)")

    def join(self, span: tuple[int, int], part: dict | str) -> None:
        """The walk of the next span (its `summary()`, or why its helper failed) after this one's."""
        if isinstance(part, str):
            self.found(f"rows {span[0]}–{span[1]} could not be checked: {part}")
            return
        if not part["rows"]:
            return
        first_id, link = part["first_link"]
        if link != self.previous:
            self.found(f"row {first_id}: chain broken (previous row removed or altered)")
        if self.keyed_began:
            for row_id in part["leading_ids"]:
                self._unkeyed_after(row_id)
            self.broken += part["leading"] - len(part["leading_ids"])
            self.unkeyed -= part["leading"]
        for line in part["problems"]:
            self.found(line)
        self.broken += part["broken"] - len(part["problems"])
        for name in ("rows", "unkeyed", "keyed", "forged"):
            setattr(self, name, getattr(self, name) + part[name])
        self.head_seen = self.head_seen or part["head_seen"]
        self.keyed_began = self.keyed_began or part["keyed"] > 0
        self.previous, self.last_id = part["previous"], part["last_id"]

    def summary(self) -> dict:
        """What `join` needs of a span's walk (JSON: it comes from a helper process)."""
        return {"rows": self.rows, "unkeyed": self.unkeyed, "keyed": self.keyed, "forged": self.forged,
                "broken": self.broken, "problems": self.problems, "head_seen": self.head_seen,
                "first_link": self.first_link, "leading": self.leading, "leading_ids": self.leading_ids,
                "previous": self.previous, "last_id": self.last_id}

    def verdict(self) -> Verdict:
        where, cut = self.chain.head, self.checkpoint
        if self.head is not None and not self.head_seen and not self._pruned(self.head):
            end = f"the log ends at row {self.last_id}" if self.last_id is not None else "the log is empty"
            self.found(f"row {self.head.id} is missing: the chain head kept in {where} names it, {end} (rows removed)")
        elif self.head is None and self.keyed and self.expect_head:
            self.found(f"no chain head {where}: the removal of the newest rows cannot be ruled out "
                       "(restored or moved? see docs/approvals-and-audit.md, the audit log)")
        if self.keyed and self.forged == self.keyed:
            self.found("every keyed row fails: the secret key is not the one that wrote this log")
        return Verdict(self.rows, self.unkeyed, tuple(self.problems), self.broken,
                       cut.pruned if cut else 0, cut.last_id if cut else None)

    def _pruned(self, head: Head) -> bool:
        """The head names a row a prune removed (it was read before the prune committed)."""
        cut = self.checkpoint
        return cut is not None and (head.id < cut.last_id or (head.id == cut.last_id and head.value == cut.last_value))


# -- helper processes: a long log is verified on every CPU (`python -m ias.audit`) --

async def _helper(dsn: str, snapshot: str, chain: AuditChain, head: Head | None, checkpoint: Checkpoint | None,
                  span: tuple[int, int]) -> dict | str:
    """Walk one span in a helper process, in the snapshot `snapshot` (exported by the caller, whose
    transaction stays open meanwhile); its `summary()`, or why it failed. The chain key goes through
    the helper's stdin, never its arguments or environment."""
    job = json.dumps({"dsn": dsn, "snapshot": snapshot, "key": chain.key.hex(), "head_file": str(chain.head),
                      "span": span,
                      "head": None if head is None else [head.id, head.value],
                      "checkpoint": None if checkpoint is None else asdict(checkpoint)}).encode()
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "ias.audit", stdin=PIPE, stdout=PIPE,
                                                stderr=PIPE, env=env)
    try:
        out, err = await proc.communicate(job)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        return f"the helper process failed (exit {proc.returncode}: {lines[-1] if lines else 'no message'})"
    try:
        return json.loads(out)
    except ValueError:
        return "the helper process gave no verdict"


async def _walk_span(job: dict) -> dict:
    head = None if job["head"] is None else Head(*job["head"])
    walk = _Walk(AuditChain(bytes.fromhex(job["key"]), Path(job["head_file"])), head, False, span=True)
    walk.checkpoint = None if job["checkpoint"] is None else Checkpoint(**job["checkpoint"])
    store = Store(job["dsn"])
    try:
        async with store.audit_chain(snapshot=job["snapshot"]) as view:
            await walk.walk(view.rows(*job["span"]))
    finally:
        await store.close()
    return walk.summary()


def format_row(row: AuditRow) -> str:
    """One audit row as a single line for `ias audit`."""
    from .clock import stamp
    parts = [f"{row.id:>6}", stamp(row.at), row.event]
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


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_walk_span(json.load(sys.stdin)))))
