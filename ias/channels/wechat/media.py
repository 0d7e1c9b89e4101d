"""WeChat media items: what an inbound message carries (text, transcripts, media to download) and the
media item of an outbound file (reference/wechat-ilink-media.md).

Inbound, item types 2–5: images, files and videos are downloaded through the CDN, decrypted, checked
(MEDIA_DOWNLOAD_MAX, the file's MD5 where the item gives one) and stored in the owner's inbox. A voice
message with WeChat's transcript is that text; without one its audio is kept as an opaque `.silk` file.
Whatever fails (too large, a bad key or checksum, the CDN, no `cryptography`) becomes one line for the
owner and is logged; the message's text goes through regardless. Outbound, a file is an image item
(png, jpg, gif, webp) or a file item (everything else).

Not handled: media quoted in `ref_msg`, thumbnails, decoding SILK audio, video sent as video.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import stat
from pathlib import Path
from typing import Any

from ... import limits
from ...inbox import Attachment, Inbox, mime_of, safe_name, sniff, OCTETS
from .cdn import CDN, UPLOAD_FILE, UPLOAD_IMAGE, CDNError, NoCrypto, TooLarge, Uploaded, hex_key, parse_key
from .ilink import FILE, IMAGE, TEXT, VIDEO, VOICE, ILink

log = logging.getLogger(__name__)

WHAT = {IMAGE: "图片", VOICE: "语音", FILE: "文件", VIDEO: "视频"}
HOLDER = {IMAGE: "image_item", VOICE: "voice_item", FILE: "file_item", VIDEO: "video_item"}
KIND = {IMAGE: "image", VOICE: "voice", FILE: "file", VIDEO: "video"}
TOO_LARGE = "收到的{what}超过 {mb} MB，没有保存。"
FAILED = "收到的{what}没能下载或校验失败，没有保存。"
NO_CRYPTO = "收到的{what}无法处理：服务器没有安装 cryptography（请运行 make run，或 pip install 'ias[media]'）。"
SKIPPED = "一条消息最多处理 {n} 个附件，其余 {rest} 个已忽略。"
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})


def parse(items: Any) -> tuple[str, list[dict]]:
    """(the text of text items and voice transcripts, the media items to download), from a hostile item list."""
    texts, media = [], []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict) or item.get("type") not in (TEXT, *HOLDER):
            continue
        kind = item["type"]
        holder = item.get("text_item") if kind == TEXT else item.get(HOLDER[kind])
        holder = holder if isinstance(holder, dict) else {}
        text = holder.get("text") if kind in (TEXT, VOICE) else None
        if isinstance(text, str) and text.strip():
            texts.append(text)
        elif kind != TEXT:          # media, or voice without a transcript
            media.append(item)
    return "\n".join(texts), media


class Media:
    """Inbound media into the inbox, and files onto the CDN for sending."""

    def __init__(self, cdn: CDN, inbox: Inbox, *, limit: int = limits.MEDIA_DOWNLOAD_MAX):
        self.cdn = cdn
        self.inbox = inbox
        self.limit = limit

    async def receive(self, items: list[dict]) -> tuple[tuple[Attachment, ...], list[str]]:
        """Download and store the media items (at most MEDIA_ITEMS_MAX): the stored files, and the lines
        the owner gets about those that failed."""
        stored, notes = [], []
        for item in items[:limits.MEDIA_ITEMS_MAX]:
            what = WHAT[item["type"]]
            try:
                stored.append(await self.fetch(item))
                continue
            except NoCrypto as exc:
                log.error("WeChat: a received %s is not handled: %s", KIND[item["type"]], exc)
                note = NO_CRYPTO.format(what=what)
            except TooLarge as exc:
                log.warning("WeChat: a received %s is too large (%s): refused", KIND[item["type"]], exc)
                note = TOO_LARGE.format(what=what, mb=self.limit // (1024 * 1024))
            except (CDNError, OSError) as exc:
                log.warning("WeChat: a received %s was not stored: %s", KIND[item["type"]], exc)
                note = FAILED.format(what=what)
            if note not in notes:
                notes.append(note)
        if len(items) > limits.MEDIA_ITEMS_MAX:
            notes.append(SKIPPED.format(n=limits.MEDIA_ITEMS_MAX, rest=len(items) - limits.MEDIA_ITEMS_MAX))
        return tuple(stored), notes

    async def fetch(self, item: dict) -> Attachment:
        """One media item downloaded, decrypted, checked and stored."""
        kind = item["type"]
        holder = item.get(HOLDER[kind])
        holder = holder if isinstance(holder, dict) else {}
        media = holder.get("media")
        if not isinstance(media, dict):
            raise CDNError("the item has no media object")
        announced = holder.get("len") if kind == FILE else holder.get("video_size") if kind == VIDEO else None
        if isinstance(announced, str) and announced.strip().isdigit():
            announced = int(announced)
        if isinstance(announced, int) and not isinstance(announced, bool) and announced > self.limit + 16:
            raise TooLarge(f"{announced} bytes announced")
        if kind == IMAGE and holder.get("aeskey"):
            key = hex_key(holder.get("aeskey"))
        elif "aes_key" in media:
            key = parse_key(media.get("aes_key"))
        else:
            raise CDNError("the item has no key")
        data = await self.cdn.download(media, key, self.limit)
        expected = holder.get("md5") if kind == FILE else holder.get("video_md5") if kind == VIDEO else None
        if expected not in (None, "") and (not isinstance(expected, str)
                                           or expected.strip().lower() != hashlib.md5(data).hexdigest()):
            raise CDNError("the file's MD5 does not match")
        if kind == IMAGE:
            mime, suffix = sniff(data) or (OCTETS, ".bin")
            name = f"image{suffix}"
        elif kind == VOICE:
            mime, name = "audio/silk", "voice.silk"
        elif kind == VIDEO:
            mime, name = "video/mp4", "video.mp4"
        else:
            name = safe_name(holder.get("file_name"), "file")
            mime = mime_of(name)
        attachment = await asyncio.to_thread(self.inbox.save, data, KIND[kind], name, mime)
        log.info("WeChat: stored a received %s of %d bytes as %s", KIND[kind], len(data), attachment.path)
        return attachment

    async def upload(self, api: ILink, to_user: str, context_token: str | None, path: Path) -> dict:
        """Put the file at `path` on the CDN: the media item of a `sendmessage` (image or file)."""
        data = await asyncio.to_thread(_read, path)
        image = path.suffix.lower() in IMAGE_SUFFIXES
        uploaded = await self.cdn.upload(api, to_user, context_token, data, UPLOAD_IMAGE if image else UPLOAD_FILE)
        return item(path.name, uploaded, image)


def item(name: str, uploaded: Uploaded, image: bool) -> dict:
    """The `sendmessage` item of an uploaded file, in the exact shapes the protocol notes give."""
    if image:
        return {"type": IMAGE, "image_item": {"media": uploaded.media(), "mid_size": uploaded.cipher_size}}
    return {"type": FILE, "file_item": {"media": uploaded.media(), "file_name": name, "len": str(uploaded.raw_size)}}


def _read(path: Path) -> bytes:
    """A regular file's bytes, at most MEDIA_UPLOAD_MAX (TooLarge past it; CDNError for anything but a file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)     # a FIFO must not block the open
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CDNError(f"{path.name} is not a regular file")
        data = handle.read(limits.MEDIA_UPLOAD_MAX + 1)
    if len(data) > limits.MEDIA_UPLOAD_MAX:
        raise TooLarge(f"{path.name} is over {limits.MEDIA_UPLOAD_MAX} bytes")
    return data
