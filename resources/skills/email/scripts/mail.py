#!/usr/bin/env python3
"""The email skill: send over SMTP, list unread and read messages over IMAP. Stdlib plus ias_skill.

Parameters arrive as one JSON object on stdin; exactly one JSON object with `success` goes to
stdout. Expected failures (missing configuration, refused login, unreachable server, unknown
uid) are `{"success": false, "error": "..."}` with exit status 0, never a traceback; the
password never appears in an error.

Handled, and why:
- Sending builds an `EmailMessage` with `headerregistry.Address`, so Chinese subjects and
  display names become RFC 2047 encoded words and the From header is valid RFC 5322 (QQ Mail
  rejects anything else); a non-ASCII body is sent as UTF-8 in base64, which needs no
  8BITMIME from the server.
- Reading never changes the mailbox: INBOX is opened with EXAMINE (`readonly=True`) and every
  fetch uses `BODY.PEEK[...]`, which does not set \\Seen. Nothing is stored or expunged.
- Chinese mail labelled gb2312/gbk often holds GBK-only characters (喆 镕 堃) that the label's
  codec cannot decode; the stdlib's default policy turns them into U+FFFD. Messages are
  therefore parsed with the compat32 policy and every header and body is decoded here, with
  gb2312/gbk/cp936 mapped to gb18030 (a superset), falling back to UTF-8/GB18030 when a label
  is missing or wrong.
- 163/126 refuse SELECT ("Unsafe Login") until the client sends the IMAP ID command
  (RFC 2971), which imaplib does not know: it is registered in `imaplib.Commands` and sent
  after login when the server advertises ID.
- Attachment names in raw 8-bit headers (Foxmail, older Outlook: GBK or UTF-8 bytes, no
  RFC 2047/2231) are decoded from the raw header bytes (UTF-8, else GB18030); the compat32
  parser would otherwise hand them over as U+FFFD.
- What goes to stdout fits the 64 KiB *bytes* the model may see (`OUTPUT_MAX`): `read` cuts the
  body to fit and says `body_truncated`, keeping every other field valid JSON.
- Sending goes through `ias_skill.smtp`, the SMTP client the daemon's fallback e-mail notifier
  uses too: one login attempt with one mechanism (PLAIN, else LOGIN) as UTF-8, `…_SSL` exactly
  ssl/starttls/none, no plain login except to loopback. The same settings rules apply to IMAP.
  IMAP LOGIN is one command; a non-ASCII IMAP password is refused with a clear message.
- One overall deadline (`IAS_EMAIL_TIMEOUT`, default and at most 50 s, inside the skill's 60 s)
  on top of the per-step `NET_TIMEOUT`; a send cut off after the message data went out says
  its delivery is unknown rather than guessing.
"""
import codecs
import email
import email.header
import email.utils
import html.parser
import imaplib
import re
import signal
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage, Message

import ias_skill
from ias_skill import OUTPUT_MAX, SkillError, encoded, env, fit_text, smtp

VERSION = "1.0"
NET_TIMEOUT = 20            # seconds per network operation
DEADLINE_MAX = 50           # seconds for the whole call (IAS_EMAIL_TIMEOUT may lower it); ## Timeout is 60
HEADER_MAX = 2000           # characters of one header value in a result
ATTACHMENTS_MAX = 100       # attachment names listed by `read`
NAME_MAX = 255              # characters of one attachment name
LIMIT_DEFAULT = 10
LIMIT_MAX = 50
BODY_MAX = 20000            # characters of body returned by `read`
SUBJECT_MAX = 500

# Labels whose codec is too narrow for what senders put in them; None = no usable label.
CHARSET_ALIASES = {
    "gb2312": "gb18030", "gb_2312-80": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030",
    "cp936": "gb18030", "ms936": "gb18030", "euc-cn": "gb18030", "x-euc-cn": "gb18030",
    "csgb2312": "gb18030", "chinese": "gb18030", "iso-ir-58": "gb18030", "gb18030": "gb18030",
    "big5": "big5hkscs", "ks_c_5601-1987": "cp949", "euc-kr": "cp949",
    "us-ascii": "utf-8", "ascii": "utf-8", "iso-8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252",
    "unknown-8bit": None, "x-unknown": None, "unknown": None, "default": None,
}


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
# Output


# ---------------------------------------------------------------------------------------
# Decoding


def codec_for(charset):
    """The Python codec for a MIME charset label; None when there is no usable label."""
    name = (charset or "").strip().strip("\"'").lower()
    if name in CHARSET_ALIASES:
        return CHARSET_ALIASES[name]
    if not name:
        return None
    try:
        return codecs.lookup(name).name
    except LookupError:
        return None


def decode_bytes(data, charset=None):
    """Decode message bytes by their label, falling back when the label is missing or wrong."""
    name = codec_for(charset)
    candidates = [name, "utf-8"] if name else ["utf-8", "gb18030"]
    for candidate in candidates:
        try:
            return data.decode(candidate)
        except (UnicodeDecodeError, LookupError):
            continue
    return data.decode(name or "utf-8", "replace")


def clean(text):
    """A str from the parser may carry raw 8-bit bytes as surrogates: decode those properly."""
    if any("\udc80" <= ch <= "\udcff" for ch in text):
        return decode_bytes(text.encode("utf-8", "surrogateescape"))
    return text


def header_text(value):
    """A header value as readable text: RFC 2047 words decoded with mapped charsets, unfolded."""
    if value is None:
        return ""
    try:
        parts = email.header.decode_header(value)
    except (HeaderParseError, ValueError, LookupError):
        return " ".join(clean(str(value)).split())
    out = []
    for chunk, charset in parts:
        out.append(decode_bytes(chunk, charset) if isinstance(chunk, bytes) else clean(chunk))
    return " ".join("".join(out).split())


class _HTMLText(html.parser.HTMLParser):
    """Visible text of an HTML body: no tags, scripts or styles; block elements start new lines."""
    SKIP = {"script", "style", "title"}
    BLOCK = {"p", "div", "br", "li", "tr", "table", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote",
             "pre", "hr", "ul", "ol", "dl", "dt", "dd", "section", "article", "header", "footer"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def html_to_text(markup):
    parser = _HTMLText()
    try:
        parser.feed(markup)
        parser.close()
    except Exception:           # malformed markup: keep what was parsed
        pass
    lines = [" ".join(line.split()) for line in "".join(parser.out).splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def raw_header(part, name):
    """A header's value as text, raw 8-bit bytes decoded (UTF-8, else GB18030); None if absent."""
    for key, value in part.raw_items():
        if key.lower() == name:
            return clean(value) if isinstance(value, str) else str(value)
    return None


def header_param(part, header, param):
    """A parameter of a header, read from the raw value (compat32 turns 8-bit bytes into U+FFFD)."""
    value = raw_header(part, header)
    if value is None:
        return None
    holder = Message()
    holder[header] = value
    return holder.get_param(param, None, header)


def part_filename(part):
    """The attachment name of a MIME part (RFC 2231, RFC 2047 or raw 8-bit), or None."""
    raw = header_param(part, "content-disposition", "filename")
    if raw is None:
        raw = header_param(part, "content-type", "name")
    if raw is None:
        return None
    if isinstance(raw, tuple):      # RFC 2231: (charset, language, value as latin-1 text)
        charset, _language, value = raw
        text = decode_bytes(value.encode("latin-1", "replace"), charset)
    else:
        text = clean(email.utils.unquote(raw))
    if "=?" in text:
        text = header_text(text)
    return text[:NAME_MAX]


def part_text(part):
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    return decode_bytes(payload, part.get_content_charset())


def message_body(msg):
    """(body text, attachment names): text/plain preferred, else text/html without tags."""
    plain = markup = None
    attachments = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        name = part_filename(part)
        if part.get_content_disposition() == "attachment" or name is not None:
            if len(attachments) < ATTACHMENTS_MAX:
                attachments.append(name or "(unnamed)")
            continue
        kind = part.get_content_type()
        if kind == "text/plain" and plain is None:
            plain = part_text(part)
        elif kind == "text/html" and markup is None:
            markup = part_text(part)
    if plain is not None and plain.strip():
        body = plain
    elif markup is not None:
        body = html_to_text(markup)
    else:
        body = plain or ""
    return body.replace("\r\n", "\n").strip(), attachments


# ---------------------------------------------------------------------------------------
# Configuration


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


def imap_text(exc_or_data):
    """The server's text from an imaplib error or response data."""
    value = exc_or_data.args[0] if isinstance(exc_or_data, Exception) and exc_or_data.args else exc_or_data
    if isinstance(value, list):
        value = value[-1] if value else b""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join(str(value).split())


class Mailbox:
    """An IMAP session with INBOX opened read-only; use as a context manager."""

    def __init__(self):
        server = smtp.server("IAS_IMAP")
        if server is None:
            raise SkillError("reading email is not configured: set IAS_IMAP_HOST (and IAS_IMAP_USER, IAS_IMAP_PASSWORD)")
        self.host, self.port, self.mode = server.host, server.port, server.mode
        self.user, self.password, self.where = server.user, server.password, server.where
        self.imap = None

    def __enter__(self):
        stage = "connect"
        try:
            if self.mode == "ssl":
                self.imap = imaplib.IMAP4_SSL(self.host, self.port, ssl_context=smtp.tls_context(), timeout=NET_TIMEOUT)
            else:
                self.imap = imaplib.IMAP4(self.host, self.port, timeout=NET_TIMEOUT)
                if self.mode == "starttls":
                    stage = "starttls"
                    self.imap.starttls(ssl_context=smtp.tls_context())
            if self.user:
                stage = "login"
                self.imap.login(self.user, self.password)
            elif self.imap.state == "NONAUTH":
                raise SkillError(f"{self.where} needs a login: set IAS_IMAP_USER and IAS_IMAP_PASSWORD")
            stage = "id"
            self.send_id()
            stage = "select"
            typ, data = self.imap.select("INBOX", readonly=True)
            if typ != "OK":
                raise SkillError(f"{self.where} would not open INBOX: {imap_text(data)}")
        except SkillError:
            self.close()
            raise
        except UnicodeEncodeError:
            self.close()
            raise SkillError("IMAP login needs an ASCII user name and password (IAS_IMAP_USER, IAS_IMAP_PASSWORD)") from None
        except imaplib.IMAP4.error as exc:
            self.close()
            if stage == "login":
                raise SkillError(f"IMAP login as {self.user} failed at {self.where}: {imap_text(exc)}. Check IAS_IMAP_USER "
                           "and IAS_IMAP_PASSWORD (QQ and 163 Mail need an authorization code)") from None
            if stage == "starttls":
                raise SkillError(f"{self.where}: STARTTLS failed: {imap_text(exc)} (set IAS_IMAP_SSL=ssl or none)") from None
            raise SkillError(f"{self.where}: {stage} failed: {imap_text(exc)}") from None
        except Exception as exc:
            self.close()
            raise SkillError(network_error(exc, self.where, "IAS_IMAP")) from None
        return self

    def send_id(self):
        """RFC 2971 ID, only when advertised (capabilities may grow after login)."""
        capabilities = {c.upper() for c in self.imap.capabilities}
        if "ID" not in capabilities and self.user:
            typ, data = self.imap.capability()
            if typ == "OK" and data and isinstance(data[-1], bytes):
                capabilities |= set(data[-1].decode("ascii", "replace").upper().split())
        if "ID" not in capabilities:
            return
        imaplib.Commands.setdefault("ID", ("NONAUTH", "AUTH", "SELECTED"))
        self.imap.xatom("ID", f'("name" "iAs" "version" "{VERSION}" "vendor" "iAs")')

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.imap is not None:
            try:
                if DEADLINE["passed"]:
                    raise Deadline()
                self.imap.logout()
            except Exception:
                try:
                    self.imap.shutdown()
                except Exception:
                    pass
            self.imap = None

    def uid(self, command, *args):
        try:
            typ, data = self.imap.uid(command, *args)
        except imaplib.IMAP4.error as exc:
            raise SkillError(f"{self.where}: UID {command} failed: {imap_text(exc)}") from None
        except Exception as exc:
            raise SkillError(network_error(exc, self.where, "IAS_IMAP")) from None
        if typ != "OK":
            raise SkillError(f"{self.where}: UID {command} failed: {imap_text(data)}")
        return data


def fetched(data):
    """{uid: literal bytes} from UID FETCH response data (the UID may come before or after the literal)."""
    found = {}
    pending = None
    for item in data:
        if isinstance(item, tuple) and len(item) >= 2:
            match = re.search(rb"\bUID (\d+)", item[0])
            if match:
                found[int(match.group(1))] = item[1]
                pending = None
            else:
                pending = item[1]
        elif isinstance(item, bytes) and pending is not None:
            match = re.search(rb"\bUID (\d+)", item)
            if match:
                found[int(match.group(1))] = pending
            pending = None
    return found


def list_unread(params):
    limit = params.get("limit", LIMIT_DEFAULT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIMIT_MAX:
        raise SkillError(f"limit must be an integer from 1 to {LIMIT_MAX}")
    with Mailbox() as box:
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
    with Mailbox() as box:
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
