"""ias_skill.smtp: iAs's one SMTP client, and the mail server settings both mail protocols share.

Two users, one policy: the email skill (scripts/mail.py, with resources/lib on its PYTHONPATH)
and the daemon's fallback e-mail notifier (ias/notifiers.py, which loads this module from
resources/lib through `ias.config.skill_lib`; ias/config.py parses the settings with it, so a
bad one stops `doctor` and the daemon with one line). Stdlib only.

The policy:
- `IAS_SMTP_SSL` / `IAS_IMAP_SSL` is exactly `ssl` (the default; SMTP 465, IMAP 993),
  `starttls` (SMTP 587, IMAP 143) or `none` (SMTP 25, IMAP 143). Anything else (`tls`, `yes`)
  is an error naming the variable, never a guess that could mean a plain connection.
- A login over `none` to a host other than loopback would send the password in clear: refused
  before connecting, unless `IAS_SMTP_ALLOW_PLAIN_LOGIN=1` / `IAS_IMAP_ALLOW_PLAIN_LOGIN=1`
  says that network is trusted.
- SMTP login is one attempt with one mechanism the server advertises (PLAIN, else LOGIN), done
  here because smtplib's `login()` tries the next mechanism after a refusal (two failed logins
  per call; QQ and 163 lock accounts) and encodes credentials as ASCII. User and password go
  as UTF-8 in base64.
- Certificates are verified against the system store, or SSL_CERT_FILE / SSL_CERT_DIR.
- A send that fails after the message data started to go out may have arrived: its error says
  so (`delivery="unknown"`) rather than guessing.

Not handled: CRAM-MD5, XOAUTH2, client certificates, pipelining, DSN. smtplib is imported only
to send: ias/config.py loads this module on every command that has mail settings.
"""
from __future__ import annotations

import base64
import ipaddress
import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

from . import SkillError, env

MODES = ("ssl", "starttls", "none")
PORTS = {"IAS_SMTP": {"ssl": 465, "starttls": 587, "none": 25},
         "IAS_IMAP": {"ssl": 993, "starttls": 143, "none": 143}}
CODE_HINT = "QQ and 163 Mail need an authorization code, not the account password"


class SettingError(SkillError):
    """A mail setting is invalid or missing; the message names the variable."""


@dataclass(frozen=True, slots=True)
class Server:
    """A mail server's checked settings: `prefix` is IAS_SMTP or IAS_IMAP (error messages name it)."""
    prefix: str
    host: str
    port: int
    mode: str               # ssl, starttls or none
    user: str = ""          # "" = no login
    password: str = field(default="", repr=False)

    @property
    def where(self) -> str:
        return f"{self.prefix.removeprefix('IAS_')} server {self.host}:{self.port}"


# ---------------------------------------------------------------------------------------
# Settings


def ssl_mode(name: str, environ: Mapping[str, str] | None = None) -> str:
    """`name` (…_SSL): ssl (default), starttls or none; anything else is an error."""
    value = env(name, environ).lower() or "ssl"
    if value not in MODES:
        raise SettingError(f"{name} must be ssl, starttls or none, got '{value}'")
    return value


def port_of(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    """`name` (…_PORT) as a port number, else `default`."""
    value = env(name, environ)
    if not value:
        return default
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= 65535:
        raise SettingError(f"{name} must be a port number from 1 to 65535, got '{value}'")
    return int(value)


def credentials(prefix: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(user, password); no user = no login, a user without a password is an error."""
    user = env(f"{prefix}_USER", environ)
    password = (os.environ if environ is None else environ).get(f"{prefix}_PASSWORD", "")
    if user and not password:
        raise SettingError(f"{prefix}_PASSWORD is not set (needed to log in as {prefix}_USER); {CODE_HINT}")
    return user, password


def loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_plain_login(prefix: str, mode: str, host: str, user: str,
                       environ: Mapping[str, str] | None = None) -> None:
    """A password sent without TLS is readable on the network: only to loopback unless allowed."""
    if user and mode == "none" and not loopback(host) and env(f"{prefix}_ALLOW_PLAIN_LOGIN", environ) != "1":
        raise SettingError(f"refusing to send {prefix}_PASSWORD in clear text to {host} ({prefix}_SSL=none): set "
                           f"{prefix}_SSL=ssl or starttls, or {prefix}_ALLOW_PLAIN_LOGIN=1 if that network is trusted")


def server(prefix: str, environ: Mapping[str, str] | None = None) -> Server | None:
    """The checked settings `prefix`_HOST/PORT/SSL/USER/PASSWORD name (IAS_SMTP or IAS_IMAP); None
    without a host. Mode and port are checked even then: a typo is an error, not a surprise later."""
    mode = ssl_mode(f"{prefix}_SSL", environ)
    port = port_of(f"{prefix}_PORT", PORTS[prefix][mode], environ)
    host = env(f"{prefix}_HOST", environ)
    if not host:
        return None
    if any(c.isspace() or c in "/@" for c in host):
        raise SettingError(f"{prefix}_HOST must be a host name or address, got '{host}'")
    user, password = credentials(prefix, environ)
    refuse_plain_login(prefix, mode, host, user, environ)
    return Server(prefix, host, port, mode, user, password)


def tls_context():
    import ssl
    return ssl.create_default_context()     # honours SSL_CERT_FILE / SSL_CERT_DIR (OpenSSL reads them)


def local_name() -> str:
    # For EHLO: smtplib's default, socket.getfqdn(), may wait for a reverse DNS lookup.
    import socket
    return socket.gethostname() or "localhost"


# ---------------------------------------------------------------------------------------
# Sending


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def login(client, user: str, password: str, where: str) -> None:
    """One AUTH attempt with one advertised mechanism (PLAIN, else LOGIN); UTF-8 credentials."""
    import smtplib
    client.ehlo_or_helo_if_needed()
    if not client.has_extn("auth"):
        raise smtplib.SMTPNotSupportedError("SMTP AUTH extension not supported by server.")
    offered = client.esmtp_features["auth"].upper().split()
    if "PLAIN" in offered:
        code, answer = client.docmd("AUTH", "PLAIN " + _b64(b"\0" + user.encode() + b"\0" + password.encode()))
    elif "LOGIN" in offered:
        code, answer = client.docmd("AUTH", "LOGIN")
        if code == 334:
            code, answer = client.docmd(_b64(user.encode()))
        if code == 334:
            code, answer = client.docmd(_b64(password.encode()))
    else:
        raise SkillError(f"{where} offers no login iAs supports (PLAIN or LOGIN); it offers: {' '.join(offered) or 'none'}")
    if code == 334:                     # an unexpected challenge: give up rather than try again
        client.docmd("*")
    if code != 235:
        raise smtplib.SMTPAuthenticationError(code, answer)


def reply(exc) -> str:
    """An SMTP error's code and text on one line."""
    text = exc.smtp_error.decode("utf-8", "replace") if isinstance(exc.smtp_error, bytes) else str(exc.smtp_error)
    return f"{exc.smtp_code} {' '.join(text.split())}"


def describe(exc: BaseException, where: str, prefix: str, timeout: float | None = None) -> str:
    """A clear one-line message for a connection or protocol failure (no traceback, no password)."""
    import smtplib
    import socket
    import ssl
    waited = f" within {timeout:g} s" if timeout else ""
    if isinstance(exc, SkillError):
        return str(exc)
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        if "timed out" in str(exc):
            return f"no answer from {where}{waited}"
        return f"{where} closed the connection: {exc or 'unexpectedly'}"
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"{where} answered {reply(exc)}"
    if isinstance(exc, smtplib.SMTPException):
        return f"{where}: {exc}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"the TLS certificate of {where} could not be verified ({exc.verify_message}); "
                "for a private CA set SSL_CERT_FILE")
    if isinstance(exc, ssl.SSLError):
        return (f"TLS failed with {where} ({exc.reason or exc}); check {prefix}_SSL (ssl for 465/993, "
                f"starttls for 587/143, none for plain text) and {prefix}_PORT")
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {where} refused; check {prefix}_HOST and {prefix}_PORT"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"no answer from {where}{waited}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {where}: {exc.strerror or exc}; check {prefix}_HOST"
    if isinstance(exc, OSError):
        return f"network error with {where}: {exc.strerror or exc}"
    return f"unexpected error with {where}: {type(exc).__name__}: {exc}"


def send(to: Server, message, *, from_addr: str, to_addrs: list[str], timeout: float,
         local_hostname: str | None = None, explain: Callable[[BaseException, str, str], str] | None = None) -> None:
    """Send `message` (an EmailMessage) through `to`: connect, TLS as configured, one login, send, QUIT.

    Every failure is a SkillError with one clear line; one after the message data went out
    carries `delivery="unknown"`. `explain(exc, where, prefix)` words failures this module does
    not know (the skill's overall deadline); the default is `describe`.
    """
    client = None
    try:
        client = _connect(to, timeout, local_hostname or local_name())
        if to.mode == "starttls":
            client.ehlo()
            client.starttls(context=tls_context())
            client.ehlo()
        if to.user:
            login(client, to.user, to.password, to.where)
        client.send_message(message, from_addr=from_addr, to_addrs=to_addrs)
    except Exception as exc:        # the network, TLS, a refusal, the caller's deadline
        if client is not None:
            client.close()          # no QUIT: after a timeout it could wait as long again
        if isinstance(exc, SkillError):
            raise
        explain = explain or (lambda e, where, prefix: describe(e, where, prefix, timeout))
        raise _failure(exc, to, from_addr, to_addrs, explain, client is not None and client.data_started) from None
    try:
        client.quit()
    except Exception:               # sent already; a QUIT nobody answers changes nothing
        client.close()


def _failure(exc: Exception, to: Server, from_addr: str, to_addrs: list[str], explain, data_started: bool) -> SkillError:
    """The one-line error for a failed send."""
    import smtplib
    where, prefix = to.where, to.prefix
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return SkillError(f"SMTP login as {to.user} failed at {where}: {reply(exc)}. Check {prefix}_USER and "
                          f"{prefix}_PASSWORD ({CODE_HINT})")
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        reasons = "; ".join(f"{code} {text.decode('utf-8', 'replace') if isinstance(text, bytes) else text}"
                            for code, text in exc.recipients.values())
        return SkillError(f"{where} refused the recipient {', '.join(to_addrs)}: {reasons}")
    if isinstance(exc, smtplib.SMTPSenderRefused):
        return SkillError(f"{where} refused the sender {from_addr}: {reply(exc)} (many providers "
                          "require From to be the logged-in account)")
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        if "AUTH" in str(exc):
            hint = (f"; it offers no login here: if it wants TLS first set {prefix}_SSL=starttls or ssl, "
                    f"for a relay without login unset {prefix}_USER")
        else:
            hint = f" (set {prefix}_SSL=ssl or none)" if to.mode == "starttls" else ""
        return SkillError(f"{where}: {str(exc).rstrip('.')}{hint}")
    if data_started and not isinstance(exc, smtplib.SMTPResponseException):
        return SkillError(f"{where} did not confirm the message ({explain(exc, where, prefix)}): "
                          "delivery is unknown, it may or may not have been sent; check the Sent folder or ask "
                          "the recipient before sending it again", delivery="unknown")
    return SkillError(explain(exc, where, prefix) + "; the message was not sent")


def _connect(to: Server, timeout: float, local_hostname: str):
    """An SMTP or SMTP_SSL client that notes when the message data starts to go out (after that,
    a cut-off send may have arrived)."""
    import smtplib
    base = smtplib.SMTP_SSL if to.mode == "ssl" else smtplib.SMTP
    tls = {"context": tls_context()} if to.mode == "ssl" else {}

    class Client(base):
        data_started = False

        def data(self, msg):
            self.data_started = True
            return super().data(msg)

    return Client(to.host, to.port, local_hostname=local_hostname, timeout=timeout, **tls)
