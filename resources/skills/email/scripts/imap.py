"""The email skill's IMAP session: INBOX opened read-only, UID commands, their responses. Stdlib plus ias_skill.

Reading never changes the mailbox: INBOX is opened with EXAMINE (`readonly=True`) and the
caller fetches with `BODY.PEEK[...]`, which does not set \\Seen. 163/126 refuse SELECT
("Unsafe Login") until the client sends the IMAP ID command (RFC 2971), which imaplib does not
know: it is registered in `imaplib.Commands` and sent after login when the server advertises ID.
Settings (`IAS_IMAP_*`) follow the SMTP rules of `ias_skill.smtp`; IMAP LOGIN is one command,
and a non-ASCII password is refused with a clear message.

Not handled: mailboxes other than INBOX, IDLE, flags, moving or deleting mail, SASL
mechanisms other than LOGIN, the call's overall deadline (the caller's: see `Mailbox`).
"""
import imaplib
import re

from ias_skill import SkillError, smtp

VERSION = "1.0"    # sent in the RFC 2971 ID


def imap_text(exc_or_data):
    """The server's text from an imaplib error or response data."""
    value = exc_or_data.args[0] if isinstance(exc_or_data, Exception) and exc_or_data.args else exc_or_data
    if isinstance(value, list):
        value = value[-1] if value else b""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return " ".join(str(value).split())


class Mailbox:
    """An IMAP session with INBOX opened read-only; use as a context manager.

    `timeout`: seconds per network operation. `explain(exc, where, prefix)`: the one-line message
    for a connection or protocol failure. `expired()`: whether the call's deadline has passed;
    then the session is cut without a LOGOUT, which could wait another `timeout`.
    """

    def __init__(self, timeout, explain, expired):
        server = smtp.server("IAS_IMAP")
        if server is None:
            raise SkillError("reading email is not configured: set IAS_IMAP_HOST (and IAS_IMAP_USER, IAS_IMAP_PASSWORD)")
        self.host, self.port, self.mode = server.host, server.port, server.mode
        self.user, self.password, self.where = server.user, server.password, server.where
        self.timeout, self.explain, self.expired = timeout, explain, expired
        self.imap = None

    def __enter__(self):
        stage = "connect"
        try:
            if self.mode == "ssl":
                self.imap = imaplib.IMAP4_SSL(self.host, self.port, ssl_context=smtp.tls_context(), timeout=self.timeout)
            else:
                self.imap = imaplib.IMAP4(self.host, self.port, timeout=self.timeout)
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
            raise SkillError(self.explain(exc, self.where, "IAS_IMAP")) from None
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
                if self.expired():
                    raise TimeoutError("no time left for LOGOUT")
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
            raise SkillError(self.explain(exc, self.where, "IAS_IMAP")) from None
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
