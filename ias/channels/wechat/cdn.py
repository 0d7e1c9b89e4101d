"""The WeChat CDN: media download and upload, AES-128-ECB with PKCS#7 padding (reference/wechat-ilink-media.md).

Download: a plain GET of the server's `full_url`, else `<IAS_WECHAT_CDN_URL>/download?encrypted_query_param=…`
(the JSON field is spelled `encrypt_query_param`); when the full URL fails with a 5xx or a transport error,
the constructed one is tried once. The size is checked against the Content-Length before the body is read
and again while it streams in, so nothing of an oversized file is kept. Keys: an image's `image_item.aeskey`
is plain hex; `media.aes_key` is base64 of either the 16 raw bytes or of their 32 hex characters (`parse_key`).

Upload: `getuploadurl` (with the recipient's `context_token`, which some accounts need; its -14 is about
that, never a logout) → POST of the ciphertext to `upload_full_url`, else one built from `upload_param` →
the `x-encrypted-param` response header is the media reference. A 4xx is final; a 5xx or a 200 without the
header is tried again, MEDIA_UPLOAD_ATTEMPTS in all. The media item for `sendmessage` carries the key as
base64 of its hex text (44 characters), never base64 of the raw bytes.

AES comes from the optional `cryptography` package, imported only when media is handled: without it
`NoCrypto` is raised and the channel tells the owner. HTTP is urllib in a worker thread, without proxies
(the CDN times out through them). Not handled: thumbnails, resumable or chunked transfers, voice upload.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import http.client
import logging
import os
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from ... import limits
from .ilink import ILink, WeChatError, error_code

log = logging.getLogger(__name__)

GET_UPLOAD_URL = "ilink/bot/getuploadurl"
UPLOAD_IMAGE, UPLOAD_VIDEO, UPLOAD_FILE = 1, 2, 3       # getuploadurl media_type
_QUOTE_SAFE = "-_.!~*'()"           # what JS encodeURIComponent leaves alone
_CHUNK = 256 * 1024


class CDNError(WeChatError):
    """A download or upload failed (transport, status, key, checksum)."""


class TooLarge(CDNError):
    """The file is over the size limit: refused before anything was kept."""


class NoCrypto(CDNError):
    """The optional `cryptography` package is not installed."""


@dataclass(frozen=True, slots=True)
class Uploaded:
    """A file on the CDN: the reference for `sendmessage`, its key, the ciphertext and plaintext sizes."""
    param: str
    key: bytes
    cipher_size: int
    raw_size: int

    def media(self) -> dict:
        """The CDNMedia object of the media item (`aes_key` as base64 of the hex key)."""
        return {"encrypt_query_param": self.param, "aes_key": outbound_key(self.key), "encrypt_type": 1}


def _primitives():
    try:
        from cryptography.hazmat.primitives import padding
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        raise NoCrypto("the cryptography package is not installed (pip install 'ias[media]')") from None
    return padding, Cipher, algorithms, modes


def encrypt(key: bytes, data: bytes) -> bytes:
    """AES-128-ECB with PKCS#7 padding."""
    padding, Cipher, algorithms, modes = _primitives()
    padder = padding.PKCS7(128).padder()
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return encryptor.update(padder.update(data) + padder.finalize()) + encryptor.finalize()


def decrypt(key: bytes, data: bytes) -> bytes:
    """The plaintext of AES-128-ECB + PKCS#7 ciphertext; CDNError when it is not (wrong key, truncated)."""
    padding, Cipher, algorithms, modes = _primitives()
    if not data or len(data) % 16:
        raise CDNError(f"ciphertext of {len(data)} bytes is not whole AES blocks")
    decryptor = Cipher(algorithms.AES(key), modes.ECB()).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(decryptor.update(data) + decryptor.finalize()) + unpadder.finalize()
    except ValueError:
        raise CDNError("the file does not decrypt (bad padding: wrong key?)") from None


def padded_size(size: int) -> int:
    """The ciphertext size of `size` plaintext bytes (PKCS#7 always adds 1 to 16)."""
    return (size // 16 + 1) * 16


def hex_key(value: object) -> bytes:
    """A key given as 32 hex characters (`image_item.aeskey`)."""
    if isinstance(value, str) and len(value) == 32:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    raise CDNError("the key is not 32 hex characters")


def parse_key(value: object) -> bytes:
    """`media.aes_key`: base64 of the 16-byte key, or of its 32 hex characters; anything else is an error."""
    try:
        raw = base64.b64decode(value, validate=True) if isinstance(value, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == 16:
        return raw
    if len(raw) == 32:
        return hex_key(raw.decode("ascii", "replace"))
    raise CDNError("aes_key is neither base64 of 16 bytes nor of 32 hex characters")


def outbound_key(key: bytes) -> str:
    """The key as an outbound `aes_key`: base64 of its 32 hex characters (44 characters)."""
    return base64.b64encode(key.hex().encode("ascii")).decode("ascii")


def _http_url(url: object) -> str | None:
    return url if isinstance(url, str) and urlsplit(url).scheme in ("http", "https") and urlsplit(url).hostname \
        else None


class CDN:
    """Downloads and uploads against one CDN base URL (IAS_WECHAT_CDN_URL)."""

    def __init__(self, base_url: str = limits.WECHAT_CDN_URL, *, timeout: float = limits.MEDIA_TIMEOUT,
                 attempts: int = limits.MEDIA_UPLOAD_ATTEMPTS):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.attempts = attempts
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def download_urls(self, media: dict) -> list[str]:
        """Where the file of a CDNMedia object is: its full URL first, then the one built from its parameter."""
        urls = [url] if (url := _http_url(media.get("full_url"))) else []
        param = media.get("encrypt_query_param")
        if isinstance(param, str) and param:
            urls.append(f"{self.base_url}/download?encrypted_query_param={quote(param, safe=_QUOTE_SAFE)}")
        return urls

    async def download(self, media: dict, key: bytes, limit: int = limits.MEDIA_DOWNLOAD_MAX) -> bytes:
        """The decrypted file of a CDNMedia object, at most `limit` bytes (TooLarge past it)."""
        urls = self.download_urls(media)
        if not urls:
            raise CDNError("the media item names no download")
        _primitives()           # NoCrypto before the download, not after
        for index, url in enumerate(urls):
            try:
                data = await asyncio.to_thread(self._get, url, padded_size(limit))
                break
            except TooLarge:
                raise
            except (OSError, ValueError, http.client.HTTPException, CDNError) as exc:
                if index + 1 == len(urls) or getattr(exc, "code", 500) < 500:
                    raise CDNError(f"download failed: {exc}") from None
                log.warning("WeChat CDN: the full URL failed (%s); trying the constructed one", exc)
        plain = decrypt(key, data)
        if len(plain) > limit:
            raise TooLarge(f"{len(plain)} bytes")
        return plain

    def _get(self, url: str, most: int) -> bytes:
        request = urllib.request.Request(url, method="GET", headers={"Accept-Encoding": "identity"})
        with self._opener.open(request, timeout=self.timeout) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.strip().isdigit() and int(length) > most:
                raise TooLarge(f"{int(length)} bytes announced")
            chunks, size = [], 0
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > most:
                    raise TooLarge(f"more than {most} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    async def upload(self, api: ILink, to_user: str, context_token: str | None, data: bytes,
                     media_type: int) -> Uploaded:
        """Put `data` on the CDN for `to_user` (getuploadurl, then the POST); what the media item needs."""
        _primitives()
        key, filekey = os.urandom(16), secrets.token_hex(16)
        cipher = encrypt(key, data)
        body = {"filekey": filekey, "media_type": media_type, "to_user_id": to_user, "rawsize": len(data),
                "rawfilemd5": hashlib.md5(data).hexdigest(), "filesize": len(cipher), "no_need_thumb": True,
                "aeskey": key.hex()}
        if context_token:
            body["context_token"] = context_token
        reply = await api.call(GET_UPLOAD_URL, body, limits.WECHAT_REQUEST_TIMEOUT)
        url = _http_url(reply.get("upload_full_url"))
        param = reply.get("upload_param")
        if url is None and isinstance(param, str) and param:
            url = (f"{self.base_url}/upload?encrypted_query_param={quote(param, safe=_QUOTE_SAFE)}"
                   f"&filekey={quote(filekey, safe=_QUOTE_SAFE)}")
        if url is None:     # -14 here is a missing context_token or an account limit, not a logout
            raise CDNError(f"getuploadurl gave no upload URL (ret {error_code(reply)} {reply.get('errmsg') or ''})")
        reference = await asyncio.to_thread(self._post, url, cipher)
        return Uploaded(reference, key, len(cipher), len(data))

    def _post(self, url: str, cipher: bytes) -> str:
        why = ""
        for _ in range(self.attempts):
            request = urllib.request.Request(url, data=cipher, method="POST",
                                             headers={"Content-Type": "application/octet-stream"})
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    response.read(limits.WECHAT_RESPONSE_MAX)
                    reference = response.headers.get("x-encrypted-param")
                    if response.status == 200 and reference:
                        return reference
                    why = f"HTTP {response.status} without x-encrypted-param"
            except urllib.error.HTTPError as exc:
                detail = exc.headers.get("x-error-message") or exc.read(500).decode("utf-8", "replace")
                if exc.code < 500:
                    raise CDNError(f"upload refused: HTTP {exc.code} {detail}".strip()) from None
                why = f"HTTP {exc.code} {detail}".strip()
            except (OSError, ValueError, http.client.HTTPException) as exc:
                why = str(exc) or type(exc).__name__
            log.warning("WeChat CDN: upload failed (%s)", why)
        raise CDNError(f"upload failed {self.attempts} times: {why}")
