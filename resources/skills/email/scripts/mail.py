#!/usr/bin/env python3
"""The email skill: send over SMTP, list unread and read messages over IMAP. Stdlib plus ias_skill.

This is the entry script: the actions, the call's deadline and its errors. The IMAP session is
`imap.py`, the decoding of received headers and bodies `mime.py` (both beside it: a script's
own directory is first on its import path); sending goes through `ias_skill.smtp`, the SMTP
client the daemon's fallback e-mail notifier uses too.

Parameters arrive as one JSON object on stdin; exactly one JSON object with `success` goes to
stdout. Expected failures (missing configuration, refused login, unreachable server, unknown
uid) are `{"success": false, "error": "..."}` with exit status 0, never a traceback; the
password never appears in an error.

Handled, and why:
- Sending builds an `EmailMessage` with `headerregistry.Address`, so Chinese subjects and
  display names become RFC 2047 encoded words and the From header is valid RFC 5322 (QQ Mail
  rejects anything else); a non-ASCII body is sent as UTF-8 in base64, which needs no
  8BITMIME from the server. `ias_skill.smtp` makes one login attempt with one mechanism
  (PLAIN, else LOGIN) as UTF-8, takes `…_SSL` exactly ssl/starttls/none, and allows no plain
  login except to loopback; the same settings rules apply to IMAP.
- Reading never changes the mailbox (`imap.py`: EXAMINE, `BODY.PEEK[...]`); GBK-only characters
  in gb2312-labelled mail and raw 8-bit attachment names are decoded intact (`mime.py`).
- What goes to stdout fits the 64 KiB *bytes* the model may see (`OUTPUT_MAX`): `read` cuts the
  body to fit and says `body_truncated`, keeping every other field valid JSON.
- One overall deadline (`IAS_EMAIL_TIMEOUT`, default and at most 50 s, inside the skill's 60 s)
  on top of the per-step `NET_TIMEOUT`; a send cut off after the message data went out says
  its delivery is unknown rather than guessing.

Not handled: attachments (sending them, or reading their contents), HTML mail to send,
several recipients, Cc/Bcc when sending.
"""
import email
import email.utils
import imaplib
import re
import signal
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage

import ias_skill
from ias_skill import OUTPUT_MAX, SkillError, encoded, env, fit_text, smtp
from imap import Mailbox, fetched, imap_text
from mime import header_text, message_body

NET_TIMEOUT = 20            # seconds per network operation
DEADLINE_MAX = 50           # seconds for the whole call (IAS_EMAIL_TIMEOUT may lower it); ## Timeout is 60
HEADER_MAX = 2000           # characters of one header value in a result
LIMIT_DEFAULT = 10
LIMIT_MAX = 50
BODY_MAX = 20000            # characters of body returned by `read`
SUBJECT_MAX = 500


class Deadline(Exception):
    """The call's overall time limit passed (raised from SIGALRM, wherever the call was)."""


DEADLINE = {"seconds": DEADLINE_MAX, "passed": False}


def start_deadline():
    raw = env("IAS_EMAIL_TIMEOUT")
    try:
        seconds = min(max(float(raw), 0.1), DEADLINE_MAX) if raw else DEADLINE_MAX
    except ValueError:
        seconds = DEADLINE_MAX
    DEADLINE["seconds"] = seconds

    def expired(_signum, _frame):
        DEADLINE["passed"] = True
        raise Deadline()
    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def deadline_text():
    return f"{DEADLINE['seconds']:g} s"


# ---------------------------------------------------------------------------------------
# Sending


def sender_address(user):
    configured = env("IAS_SMTP_FROM")
    if configured:
        name, addr = email.utils.parseaddr(configured)
        if "@" not in addr:
            raise SkillError(f"IAS_SMTP_FROM is not an email address: '{configured}'")
        where = "IAS_SMTP_FROM"
    elif user:
        name, addr = "", user
        if "@" not in addr:
            raise SkillError("IAS_SMTP_USER is not an email address; set IAS_SMTP_FROM to the address to send from")
        where = "IAS_SMTP_USER"
    else:
        raise SkillError("set IAS_SMTP_FROM (or IAS_SMTP_USER) to the address to send from")
    try:
        return Address(display_name=name, addr_spec=addr)
    except (HeaderParseError, ValueError, IndexError):
        raise SkillError(f"{where} is not a valid email address: '{addr}'") from None


def build_message(sender, to, subject, body):
    try:
        recipient = Address(addr_spec=to)
    except (HeaderParseError, ValueError, IndexError):
        raise SkillError(f"'to' is not a valid email address: '{to}'") from None
    if not recipient.domain:
        raise SkillError(f"'to' is not a valid email address: '{to}'")
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = recipient
    msg["Subject"] = " ".join(subject.split())
    msg["Date"] = email.utils.formatdate(localtime=True)
    msg["Message-ID"] = email.utils.make_msgid(domain=sender.domain or "localhost")
    if body.isascii():
        msg.set_content(body)
    else:
        msg.set_content(body, cte="base64")     # UTF-8; base64 needs no 8BITMIME
    return msg, recipient


def send(params):
    missing = [key for key in ("to", "subject", "body") if not isinstance(params.get(key), str)]
    if missing:
        raise SkillError("action 'send' needs 'to', 'subject' and 'body'; missing: " + ", ".join(missing))
    to, subject, body = params["to"].strip(), params["subject"], params["body"]
    if len(subject) > SUBJECT_MAX:
        raise SkillError(f"subject is longer than {SUBJECT_MAX} characters")

    server = smtp.server("IAS_SMTP")
    if server is None:
        raise SkillError("sending email is not configured: set IAS_SMTP_HOST (and IAS_SMTP_USER, IAS_SMTP_PASSWORD)")
    sender = sender_address(server.user)
    msg, recipient = build_message(sender, to, subject, body)
    smtp.send(server, msg, from_addr=sender.addr_spec, to_addrs=[recipient.addr_spec], timeout=NET_TIMEOUT,
              explain=network_error)
    return {"success": True, "sent": True, "from": str(sender), "to": recipient.addr_spec,
            "subject": str(msg["Subject"]), "message_id": str(msg["Message-ID"])}


# ---------------------------------------------------------------------------------------
# Reading


def mailbox():
    """INBOX, read-only, within this call's deadline."""
    return Mailbox(NET_TIMEOUT, network_error, lambda: DEADLINE["passed"])


def list_unread(params):
    limit = params.get("limit", LIMIT_DEFAULT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        raise SkillError(f"limit must be an integer from 1 to {LIMIT_MAX}")
    with mailbox() as box:
        data = box.uid("SEARCH", None, "UNSEEN")
        uids = sorted({int(x) for chunk in data if isinstance(chunk, bytes) for x in chunk.split() if x.isdigit()},
                      reverse=True)
        newest = uids[:limit]
        messages = []
        if newest:
            data = box.uid("FETCH", ",".join(map(str, newest)), "(UID BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)])")
            headers = fetched(data)
            for uid in newest:
                if uid not in headers:
                    continue
                msg = email.message_from_bytes(headers[uid])
                messages.append({"uid": str(uid), "from": header_text(msg["From"])[:HEADER_MAX],
                                 "subject": header_text(msg["Subject"])[:HEADER_MAX],
                                 "date": header_text(msg["Date"])[:HEADER_MAX]})
    result = {"success": True, "unread": len(uids), "messages": messages}
    while messages and len(encoded(result)) > OUTPUT_MAX:     # fewer messages rather than cut JSON
        messages.pop()
        result["messages_truncated"] = True
    return result


def read(params):
    uid = params.get("uid")
    if isinstance(uid, int) and not isinstance(uid, bool):
        uid = str(uid)
    if not isinstance(uid, str) or not re.fullmatch(r"[1-9][0-9]{0,9}", uid.strip()):
        raise SkillError("action 'read' needs 'uid': the digits list_unread returned, e.g. \"1234\"")
    uid = uid.strip()
    with mailbox() as box:
        raw = fetched(box.uid("FETCH", uid, "(UID BODY.PEEK[])")).get(int(uid))
    if raw is None:
        raise SkillError(f"no message with uid {uid} in INBOX")
    msg = email.message_from_bytes(raw)
    body, attachments = message_body(msg)
    result = {"success": True, "uid": uid, "from": header_text(msg["From"])[:HEADER_MAX],
              "to": header_text(msg["To"])[:HEADER_MAX]}
    if msg["Cc"] is not None:
        result["cc"] = header_text(msg["Cc"])[:HEADER_MAX]
    result.update(subject=header_text(msg["Subject"])[:HEADER_MAX], date=header_text(msg["Date"])[:HEADER_MAX],
                  attachments=attachments, body=body[:BODY_MAX])
    if len(body) > BODY_MAX:
        result["body_truncated"] = True
    return fit_text(result, "body", "body_truncated")      # the 64 KiB are bytes: 20,000 emoji are 80 KB


# ---------------------------------------------------------------------------------------
# Errors


def network_error(exc, where, prefix):
    """A clear one-line message for a connection or protocol failure (no traceback, no password)."""
    if isinstance(exc, Deadline):
        return f"{where} did not finish within {deadline_text()} (IAS_EMAIL_TIMEOUT)"
    if isinstance(exc, imaplib.IMAP4.error):
        return f"{where}: {imap_text(exc)}"
    return smtp.describe(exc, where, prefix, NET_TIMEOUT)


# ---------------------------------------------------------------------------------------


ACTIONS = {"send": send, "list_unread": list_unread, "read": read}


def main(stdin_text):
    params = ias_skill.params(stdin_text)
    action = params.get("action")
    if action not in ACTIONS:
        raise SkillError("action must be send, list_unread or read")
    try:
        start_deadline()
        return ACTIONS[action](params)
    except SkillError:
        raise
    except Deadline:
        raise SkillError(f"email {action} did not finish within {deadline_text()}") from None
    except Exception as exc:        # a bug or a server answer nobody expected: still no traceback
        raise SkillError(f"email {action} failed: {type(exc).__name__}: {exc}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


if __name__ == "__main__":
    ias_skill.run(main, "email failed")
