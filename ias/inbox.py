"""The owner's inbox: files they sent (WeChat images, files, videos, voice), kept on disk and bounded.

Files land in `$IAS_DATA_DIR/inbox/YYYY-MM-DD/` (the Beijing date; directories 0700, files 0600) under
a name made safe here: the sender's name is hostile (path separators, control characters, leading dots, any length).
The whole inbox is bounded (IAS_INBOX_MAX_MB): after each new file the oldest files are removed first,
never the new one; day directories older than IAS_RETENTION_DAYS are removed by the daily retention
(`prune`). `Attachment` is the record of one stored file that crosses modules (the channel's
Inbound, the store's inbound row, the agent's turn); `attachments()` reads such records back from
stored JSON, checking every field (a database row is input too).

Not handled: quotas per sender, deduplication of identical files, files that other processes put there
(they count against the bound and may be removed like ours).
"""
from __future__ import annotations

import logging
import os
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from .clock import SYSTEM, TZ
from .limits import MEDIA_NAME_MAX

log = logging.getLogger(__name__)

KINDS = ("image", "voice", "file", "video")
_DAY = re.compile(r"\d{4}-\d\d-\d\d")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f/\\:*?\"<>|]+")
# Image types told by their first bytes (images come without a name)
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png", ".png"), (b"\xff\xd8\xff", "image/jpeg", ".jpg"),
          (b"GIF87a", "image/gif", ".gif"), (b"GIF89a", "image/gif", ".gif"), (b"BM", "image/bmp", ".bmp"))
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp",
         ".bmp": "image/bmp", ".pdf": "application/pdf", ".txt": "text/plain", ".mp4": "video/mp4",
         ".mov": "video/quicktime", ".silk": "audio/silk", ".mp3": "audio/mpeg", ".zip": "application/zip",
         ".doc": "application/msword", ".xls": "application/vnd.ms-excel", ".csv": "text/csv",
         ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
         ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"}
OCTETS = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Attachment:
    """One file the owner sent, stored in the inbox: its absolute path, kind (image|voice|file|video),
    MIME type, size in bytes and the name shown (the sender's, made safe)."""
    path: Path
    kind: str
    mime: str
    size: int
    name: str

    def record(self) -> dict:
        """As stored JSON (the inbound row keeps it, so a replayed message keeps its files)."""
        return {"path": str(self.path), "kind": self.kind, "mime": self.mime, "size": self.size, "name": self.name}


def attachments(value: Any) -> tuple[Attachment, ...]:
    """The records of stored JSON read back; anything malformed is left out (and logged)."""
    found = []
    for item in value if isinstance(value, list) else ():
        try:
            path, kind, mime, size, name = (item[key] for key in ("path", "kind", "mime", "size", "name"))
            if not (isinstance(path, str) and os.path.isabs(path) and kind in KINDS and isinstance(mime, str)
                    and isinstance(size, int) and not isinstance(size, bool) and size >= 0 and isinstance(name, str)):
                raise ValueError
        except (TypeError, KeyError, ValueError):
            log.warning("a stored attachment record is malformed: left out")
            continue
        found.append(Attachment(Path(path), kind, mime, size, name))
    return tuple(found)


def sniff(data: bytes) -> tuple[str, str] | None:
    """(MIME type, extension) of an image told by its first bytes, None if not one we know."""
    for magic, mime, suffix in _MAGIC:
        if data.startswith(magic):
            return mime, suffix
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", ".webp"
    return None


def mime_of(name: str) -> str:
    """The MIME type of a file name's extension, application/octet-stream when unknown."""
    return _MIME.get(os.path.splitext(name)[1].lower(), OCTETS)


def safe_name(name: Any, default: str) -> str:
    """A file name that is one plain path component: no separators or control characters, no leading dot,
    at most MEDIA_NAME_MAX characters (the extension kept); `default` when nothing is left."""
    text = unicodedata.normalize("NFC", name) if isinstance(name, str) else ""
    text = _UNSAFE.sub("_", os.path.basename(text.replace("\\", "/"))).strip().lstrip(".").strip()
    if not text:
        text = default
    stem, suffix = os.path.splitext(text)
    if len(suffix) > 16 or not suffix[1:].isalnum():
        stem, suffix = text, ""
    return stem[:MEDIA_NAME_MAX - len(suffix)] + suffix


class Inbox:
    """The inbox directory and its bound."""

    def __init__(self, root: Path, max_bytes: int, *, now: Callable[[], datetime] = SYSTEM.now):
        self.root = root
        self.max_bytes = max_bytes
        self._now = now

    def save(self, data: bytes, kind: str, name: str, mime: str) -> Attachment:
        """Write `data` as a new file of today's directory (never replacing one), then keep the bound; the
        file's record. Raises OSError."""
        now = self._now().astimezone(TZ)     # days and times are Beijing time, as the owner reads them
        day = self.root / now.strftime("%Y-%m-%d")
        for directory in (self.root, day):
            directory.mkdir(mode=0o700, exist_ok=True)
            if directory.is_symlink() or not directory.is_dir():
                raise OSError(f"{directory} is not a directory")
            os.chmod(directory, 0o700)
        stored = f"{now.strftime('%H%M%S')}-{secrets.token_hex(3)}-{name}"
        path = day / stored
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self.bound(keep=path)
        return Attachment(path, kind, mime, len(data), name)

    def bound(self, keep: Path | None = None) -> int:
        """Remove the oldest files until the inbox holds at most `max_bytes` (`keep` is never removed); how
        many were removed. Empty day directories go too."""
        files = []
        for day in sorted(self.root.iterdir()) if self.root.is_dir() else ():
            if not day.is_dir() or day.is_symlink():
                continue
            for path in day.iterdir():
                try:
                    info = path.lstat()
                except FileNotFoundError:
                    continue
                files.append((day.name, info.st_mtime, path.name, path, info.st_size))
        total = sum(size for *_, size in files)
        removed = 0
        for *_, path, size in sorted(files):         # by day, then time: oldest first
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("inbox: could not remove %s: %s", path, exc)
                continue
            total -= size
            removed += 1
            log.info("inbox: removed %s (the inbox is bounded to %d bytes)", path, self.max_bytes)
        for day in (self.root.iterdir() if removed else ()):
            if day.is_dir() and not day.is_symlink() and not any(day.iterdir()):
                day.rmdir()
        return removed

    def prune(self, before: datetime) -> int:
        """Remove the day directories older than `before`'s day, with their files (SPEC 15 retention:
        IAS_RETENTION_DAYS); how many files went. A name that is not a day is left alone."""
        cutoff = before.astimezone(TZ).strftime("%Y-%m-%d")
        removed = 0
        for day in sorted(self.root.iterdir()) if self.root.is_dir() else ():
            if day.name >= cutoff or not _DAY.fullmatch(day.name) or day.is_symlink() or not day.is_dir():
                continue
            for path in day.iterdir():
                try:
                    path.unlink()
                    removed += 1
                except OSError as exc:
                    log.warning("inbox: could not remove %s: %s", path, exc)
            try:
                day.rmdir()
            except OSError as exc:
                log.warning("inbox: could not remove %s: %s", day, exc)
        return removed

    def owns(self, path: Path) -> bool:
        """Whether `path` is a regular file (not a symlink) inside the inbox: what a stored record may name."""
        try:
            inside = path.parent.parent == self.root and path.parent.name not in ("", ".", "..")
            return inside and not path.parent.is_symlink() and not path.is_symlink() and path.is_file()
        except OSError:
            return False

    def read(self, attachment: Attachment) -> bytes | None:
        """The bytes of a stored file the record names, None unless it is the inbox's own (see `owns`)."""
        if not self.owns(attachment.path):
            return None
        try:
            fd = os.open(attachment.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as handle:
            return handle.read(attachment.size + 1)[:attachment.size] if attachment.size else b""

    def shown(self, path: Path) -> str:
        """The path as the model and the owner read it: `inbox/YYYY-MM-DD/name`."""
        try:
            return f"{self.root.name}/{path.relative_to(self.root)}"
        except ValueError:
            return path.name
