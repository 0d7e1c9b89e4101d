"""Fallback notifiers: how a message reaches the owner when WeChat cannot carry it in time.

Three kinds, each optional, none by default: e-mail to IAS_NOTIFY_EMAIL (sent with the
IAS_SMTP_* settings and the SMTP client the email skill uses, resources/lib/ias_skill/smtp.py), a WeCom group robot (`POST …/cgi-bin/webhook/send?key=…`
with `{"msgtype": "text", "text": {"content": …}}`), and a generic JSON webhook (POST
`{"title", "text", "kind"}`, or the JSON of IAS_NOTIFY_WEBHOOK_BODY with `{title}`, `{text}` and
`{kind}` filled in, for ntfy, Bark, PushPlus …; optional `Authorization: Bearer
IAS_NOTIFY_WEBHOOK_TOKEN`).
Each is tried NOTIFY_ATTEMPTS times; a message counts as carried when at least one notifier
took it. The caller (outbox.py) never hands over a confirmation code.

Not handled: HTML mail, attachments, push services that take no JSON (use a small relay).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass
from typing import Mapping

from . import limits
from .config import skill_lib

log = logging.getLogger(__name__)

WECOM_BYTES_MAX = 2048          # a WeCom robot text message holds at most this many UTF-8 bytes


@dataclass(frozen=True, slots=True)
class Notice:
    """One fallback message: `kind` is the outbox kind (reminder, task, notice)."""
    title: str
    text: str
    kind: str


class Notifier:
    name = "notifier"

    def deliver(self, notice: Notice) -> None:
        """Send once (blocking; run in a thread); raise OSError or ValueError on failure."""
        raise NotImplementedError


def _post_json(url: str, body: dict, headers: Mapping[str, str] | None = None) -> bytes:
    import urllib.request       # here: commands that never notify anyone do not pay for it
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json; charset=utf-8", **(headers or {})})
    with urllib.request.urlopen(request, timeout=limits.NOTIFY_TIMEOUT) as response:
        return response.read(64 * 1024)


class WeComRobot(Notifier):
    """A WeCom (企业微信) group robot webhook; it answers 200 with `errcode` 0 on success."""
    name = "wecom"

    def __init__(self, url: str):
        self.url = url

    def deliver(self, notice: Notice) -> None:
        content = f"{notice.title}\n{notice.text}".encode("utf-8")[:WECOM_BYTES_MAX].decode("utf-8", "ignore")
        raw = _post_json(self.url, {"msgtype": "text", "text": {"content": content}})
        try:
            reply = json.loads(raw or b"{}")
        except ValueError:
            raise ValueError("WeCom robot answered something that is not JSON") from None
        if not isinstance(reply, dict) or reply.get("errcode", 0) != 0:
            detail = reply.get("errmsg") if isinstance(reply, dict) else None
            raise ValueError(f"WeCom robot refused: errcode {reply.get('errcode') if isinstance(reply, dict) else '?'}"
                             f"{f' {detail}' if detail else ''}")


class Webhook(Notifier):
    """A generic JSON webhook (ntfy, Bark, ServerChan, PushPlus … through their JSON endpoints or a relay)."""
    name = "webhook"

    def __init__(self, url: str, token: str | None = None, body: dict | None = None):
        self.url = url
        self.token = token
        self.body = body            # a template (parsed JSON), or None for {"title", "text", "kind"}

    def deliver(self, notice: Notice) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        values = {"title": notice.title, "text": notice.text, "kind": notice.kind}
        _post_json(self.url, values if self.body is None else _fill(self.body, values), headers)


_PLACEHOLDER = re.compile(r"\{(title|text|kind)\}")


def _fill(template, values: dict[str, str]):
    """The template with the placeholders in its strings replaced, in one pass: the values are data
    inside JSON strings, so a message can neither add a placeholder nor break the JSON."""
    if isinstance(template, str):
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    if isinstance(template, dict):
        return {key: _fill(value, values) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, values) for value in template]
    return template


class Email(Notifier):
    """Mail to the owner through the IAS_SMTP_* server, with the email skill's client (ias_skill.smtp):
    `server` is config.smtp, the settings checked at start (config.load refuses IAS_NOTIFY_EMAIL without them)."""
    name = "email"

    def __init__(self, to: str, server):
        self.to = to
        self.server = server

    def deliver(self, notice: Notice) -> None:
        from email.message import EmailMessage
        sender = self.server.user if "@" in self.server.user else self.to
        message = EmailMessage()
        message["From"] = sender
        message["To"] = self.to
        message["Subject"] = notice.title
        message.set_content(notice.text)
        skill_lib("smtp").send(self.server, message, from_addr=sender, to_addrs=[self.to],
                               timeout=limits.NOTIFY_TIMEOUT)


def configured(config) -> list[Notifier]:
    """The notifiers `config` asks for (none by default)."""
    found: list[Notifier] = []
    if config.notify_email:
        found.append(Email(config.notify_email, config.smtp))
    if config.notify_wecom_url:
        found.append(WeComRobot(config.notify_wecom_url))
    if config.notify_webhook_url:
        found.append(Webhook(config.notify_webhook_url, config.notify_webhook_token,
                             json.loads(config.notify_webhook_body) if config.notify_webhook_body else None))
    return found


class Fallback:
    """Every configured notifier; `send` is True when at least one of them took the notice."""

    def __init__(self, notifiers: list[Notifier], *, attempts: int = limits.NOTIFY_ATTEMPTS,
                 retry_delay: float = limits.NOTIFY_RETRY_DELAY):
        self.notifiers = notifiers
        self.attempts = attempts
        self.retry_delay = retry_delay
        self.last_error: str | None = None

    def __bool__(self) -> bool:
        return bool(self.notifiers)

    async def send(self, title: str, text: str, kind: str) -> bool:
        notice = Notice(title, text[:limits.NOTIFY_TEXT_MAX], kind)
        carried, errors = False, []
        for notifier in self.notifiers:
            for attempt in range(1, self.attempts + 1):
                try:
                    await asyncio.to_thread(notifier.deliver, notice)
                except Exception as exc:        # any failure of one notifier (OSError, HTTPException, a refusal …)
                    log.warning("fallback %s: attempt %d of %d failed: %s", notifier.name, attempt, self.attempts,
                                exc)
                    if attempt == self.attempts:
                        errors.append(f"{notifier.name}: {exc}")
                    else:
                        await asyncio.sleep(self.retry_delay)
                    continue
                log.info("fallback %s: sent a %s notice (%d characters)", notifier.name, kind, len(notice.text))
                carried = True
                break
        self.last_error = "; ".join(errors) or None
        return carried
