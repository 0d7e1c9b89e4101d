"""Local SMTP and IMAP servers for the email skill's tests: stdlib sockets, one thread per connection.

Both listen on 127.0.0.1, port 0 (`server.port` after start), speak just enough of the protocols
for smtplib and imaplib, and record what the client did so tests can check it:

- SMTPServer (RFC 5321, 4954, 3207): EHLO/HELO, AUTH PLAIN and LOGIN against one user and
  password, credentials decoded as UTF-8 (`auth_attempts`; `mechanisms` is what EHLO advertises,
  "PLAIN LOGIN" as Postfix with Dovecot SASL), MAIL/RCPT/DATA with dot-unstuffing (`messages`:
  envelope and raw bytes), RSET, NOOP, QUIT, and STARTTLS or implicit TLS when given an
  `ssl.SSLContext`. `stall="greeting"|"data"` goes silent before the greeting or after the
  message data (a server that took the mail but never said so) until the server is closed.
- IMAPServer (RFC 3501, 2971): CAPABILITY (ID advertised unless told not to), STARTTLS, LOGIN
  (`logins`), ID (`ids`), SELECT/EXAMINE of INBOX (`selects`, with the read-only flag),
  UID SEARCH UNSEEN|ALL, UID FETCH of BODY.PEEK[], BODY.PEEK[HEADER] and
  BODY.PEEK[HEADER.FIELDS (...)], LOGOUT. Anything that would change the mailbox or mark mail
  as read (BODY[] without PEEK, RFC822, STORE, EXPUNGE, COPY, MOVE, APPEND, CLOSE on a
  read-write mailbox) is recorded in `violations` (a test asserts it stays empty) and marks
  the message \\Seen as a real server would. `require_id=True` refuses SELECT until ID was
  sent, like 163.com ("Unsafe Login").

`connections` counts accepted connections, so a test can check a server saw nothing at all.
Use `with SMTPServer(...) as smtp:`; `make_certificate()` creates a self-signed certificate for
127.0.0.1 with the openssl CLI.
"""
from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import socketserver
import ssl
import subprocess
import tempfile
import threading

SOCKET_TIMEOUT = 10.0


def make_certificate(directory: str) -> tuple[str, str]:
    """A self-signed certificate (CN=localhost, SAN IP:127.0.0.1) and its key: (certfile, keyfile)."""
    cert = os.path.join(directory, "cert.pem")
    key = os.path.join(directory, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    return cert, key


def server_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


class WithCertificate:
    """A test case mixin: `cls.cert` (a self-signed certificate file, to trust through SSL_CERT_FILE)
    and `cls.context` (a server context with it), made once per class. The openssl command-line
    tool makes it; without it the class fails, never skips."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cert_dir = tempfile.mkdtemp(prefix="ias-mail-cert-")
        cls.cert, key = make_certificate(cls.cert_dir)
        cls.context = server_context(cls.cert, key)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.cert_dir, ignore_errors=True)
        super().tearDownClass()


class _Conn:
    """One client connection: line reads, raw writes, and an in-place switch to TLS."""

    def __init__(self, sock: socket.socket):
        sock.settimeout(SOCKET_TIMEOUT)
        # Replies go out line by line: without NODELAY, Nagle and the client's delayed ACK cost ~40 ms each.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.rfile = sock.makefile("rb")
        self.tls = False

    def readline(self) -> bytes:
        return self.rfile.readline(1 << 20)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self, text: str) -> None:
        self.send(text.encode("utf-8") + b"\r\n")

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def start_tls(self, context: ssl.SSLContext) -> None:
        self.rfile.close()
        self.sock = context.wrap_socket(self.sock, server_side=True)
        self.rfile = self.sock.makefile("rb")
        self.tls = True


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False


class _Base:
    """Listening socket, accept thread and the `with` protocol shared by both servers."""

    def __init__(self, tls: str | None, context: ssl.SSLContext | None):
        if tls not in (None, "ssl", "starttls"):
            raise ValueError(tls)
        if tls and context is None:
            raise ValueError("TLS needs an SSLContext")
        self.tls = tls
        self.context = context
        self.connections = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                with outer._lock:
                    outer.connections += 1
                conn = _Conn(self.request)
                try:
                    if outer.tls == "ssl":
                        conn.start_tls(outer.context)
                    outer.session(conn)
                except (OSError, ssl.SSLError) as exc:
                    outer.errors.append(f"{type(exc).__name__}: {exc}")
                finally:
                    conn.close()

        self._server = _TCPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def session(self, conn: _Conn) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------
# SMTP


class SMTPServer(_Base):
    def __init__(self, user: str | None = None, password: str | None = None, *, tls: str | None = None,
                 context: ssl.SSLContext | None = None, mechanisms: str = "PLAIN LOGIN", stall: str | None = None):
        super().__init__(tls, context)
        self.user = user
        self.password = password
        self.mechanisms = mechanisms
        self.stall = stall
        self.closing = threading.Event()
        self.messages: list[dict] = []        # {"mail_from", "rcpt_to", "data", "tls", "user"}
        self.commands: list[str] = []         # command lines (AUTH payloads left out)
        self.auth_attempts: list[tuple[str, str, bool]] = []    # (mechanism, user, accepted)

    def _b64(self, data: bytes | str) -> bytes:
        try:
            return base64.b64decode(data, validate=True)
        except ValueError:
            return b""

    def __exit__(self, *exc_info):
        self.closing.set()
        super().__exit__(*exc_info)

    def _auth(self, conn: _Conn, arg: str) -> str | None:
        mechanism, _, initial = arg.partition(" ")
        mechanism = mechanism.upper()
        if mechanism not in self.mechanisms.upper().split():
            conn.line("504 5.5.4 Unrecognized authentication type")
            return None
        if mechanism == "PLAIN":
            if not initial:
                conn.line("334 ")
                initial = conn.readline().strip().decode("ascii", "replace")
            parts = self._b64(initial).split(b"\0")
            user, password = (parts[1], parts[2]) if len(parts) == 3 else (b"", b"")
        elif mechanism == "LOGIN":
            if initial:
                user = self._b64(initial)
            else:
                conn.line("334 VXNlcm5hbWU6")
                user = self._b64(conn.readline().strip())
            conn.line("334 UGFzc3dvcmQ6")
            password = self._b64(conn.readline().strip())
        else:
            conn.line("504 5.5.4 Unrecognized authentication type")
            return None
        user_text = user.decode("utf-8", "replace")
        ok = self.user is not None and user_text == self.user and password.decode("utf-8", "replace") == self.password
        self.auth_attempts.append((mechanism, user_text, ok))
        if ok:
            conn.line("235 2.7.0 Authentication successful")
            return user_text
        conn.line("535 5.7.8 Authentication credentials invalid")
        return None

    def session(self, conn: _Conn) -> None:
        if self.stall == "greeting":
            self.closing.wait(SOCKET_TIMEOUT)
            return
        conn.line("220 localhost ESMTP iAs test server")
        authed = None
        envelope = None
        while True:
            raw = conn.readline()
            if not raw:
                return
            line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            verb, _, arg = line.partition(" ")
            verb = verb.upper()
            self.commands.append(line if verb != "AUTH" else "AUTH " + arg.partition(" ")[0])
            if verb == "EHLO":
                extensions = ["localhost", "8BITMIME", "SIZE 10485760"]
                if self.tls == "starttls" and not conn.tls:
                    extensions.append("STARTTLS")
                if self.user is not None:
                    extensions.append(f"AUTH {self.mechanisms}")
                for i, extension in enumerate(extensions):
                    conn.line(("250 " if i == len(extensions) - 1 else "250-") + extension)
            elif verb == "HELO":
                conn.line("250 localhost")
            elif verb == "STARTTLS":
                if self.tls != "starttls" or conn.tls:
                    conn.line("502 5.5.1 STARTTLS not available")
                    continue
                conn.line("220 2.0.0 Ready to start TLS")
                conn.start_tls(self.context)
                authed, envelope = None, None
            elif verb == "AUTH":
                if self.user is None or authed:
                    conn.line("503 5.5.1 AUTH not available")
                    continue
                authed = self._auth(conn, arg)
            elif verb == "MAIL":
                if self.user is not None and not authed:
                    conn.line("530 5.7.0 Authentication required")
                    continue
                match = re.match(r"(?i)FROM:\s*<([^>]*)>", arg)
                if not match:
                    conn.line("501 5.5.4 Syntax: MAIL FROM:<address>")
                    continue
                envelope = {"mail_from": match.group(1), "rcpt_to": [], "tls": conn.tls, "user": authed}
                conn.line("250 2.1.0 OK")
            elif verb == "RCPT":
                match = re.match(r"(?i)TO:\s*<([^>]*)>", arg)
                if envelope is None or not match:
                    conn.line("503 5.5.1 Need MAIL before RCPT" if envelope is None else "501 5.5.4 Syntax")
                    continue
                envelope["rcpt_to"].append(match.group(1))
                conn.line("250 2.1.5 OK")
            elif verb == "DATA":
                if envelope is None or not envelope["rcpt_to"]:
                    conn.line("503 5.5.1 Need RCPT before DATA")
                    continue
                conn.line("354 End data with <CR><LF>.<CR><LF>")
                lines = []
                while True:
                    raw = conn.readline()
                    if not raw:
                        return
                    if raw in (b".\r\n", b".\n"):
                        break
                    lines.append(raw[1:] if raw.startswith(b".") else raw)
                envelope["data"] = b"".join(lines)
                self.messages.append(envelope)
                envelope = None
                if self.stall == "data":
                    self.closing.wait(SOCKET_TIMEOUT)
                    return
                conn.line("250 2.0.0 OK queued")
            elif verb == "RSET":
                envelope = None
                conn.line("250 2.0.0 OK")
            elif verb == "NOOP":
                conn.line("250 2.0.0 OK")
            elif verb == "QUIT":
                conn.line("221 2.0.0 Bye")
                return
            else:
                conn.line("502 5.5.2 Command not recognized")


# ---------------------------------------------------------------------------------------
# IMAP

_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')
_FIELDS = re.compile(r"HEADER\.FIELDS \(([^)]*)\)")


def _tokens(text: str) -> list[str]:
    """Atoms and quoted strings (unescaped) of a command's arguments."""
    return [re.sub(r"\\(.)", r"\1", m.group(1)) if m.group(1) is not None else m.group(2)
            for m in _TOKEN.finditer(text)]


def _header_block(raw: bytes) -> bytes:
    end = raw.find(b"\r\n\r\n")
    return raw[:end + 4] if end >= 0 else raw


def _header_fields(raw: bytes, names: set[str]) -> bytes:
    """The named header fields (with their folded lines) and the blank line that ends them."""
    out = []
    keep = False
    for line in _header_block(raw).split(b"\r\n"):
        if not line:
            break
        if line[:1] in (b" ", b"\t"):
            if keep:
                out.append(line + b"\r\n")
            continue
        keep = line.split(b":", 1)[0].strip().decode("ascii", "replace").upper() in names
        if keep:
            out.append(line + b"\r\n")
    return b"".join(out) + b"\r\n"


class IMAPServer(_Base):
    def __init__(self, user: str = "me@example.com", password: str = "secret", *, advertise_id: bool = True,
                 require_id: bool = False, tls: str | None = None, context: ssl.SSLContext | None = None):
        super().__init__(tls, context)
        self.user = user
        self.password = password
        self.advertise_id = advertise_id
        self.require_id = require_id
        self.mailbox: list[dict] = []        # {"uid", "raw", "flags"} in sequence order
        self.commands: list[str] = []        # "CMD args" of every command (LOGIN password left out)
        self.logins: list[tuple[str, bool]] = []
        self.ids: list[str] = []             # the argument text of each ID command
        self.selects: list[tuple[str, str]] = []   # ("SELECT"|"EXAMINE", mailbox)
        self.violations: list[str] = []    # commands that change the mailbox or mark mail as read
        self._next_uid = 101

    def add(self, raw: bytes, *, seen: bool = False) -> str:
        """Append a message; returns its UID (as text). UIDs start at 101 and skip one each time."""
        uid = self._next_uid
        self._next_uid += 2
        self.mailbox.append({"uid": uid, "raw": raw, "flags": {"\\Seen"} if seen else set()})
        return str(uid)

    def seen(self, uid: str | int) -> bool:
        return any(m["uid"] == int(uid) and "\\Seen" in m["flags"] for m in self.mailbox)

    def _capabilities(self, conn: _Conn) -> str:
        caps = ["IMAP4rev1", "LITERAL+"]
        if self.tls == "starttls" and not conn.tls:
            caps.append("STARTTLS")
        if self.advertise_id:
            caps.append("ID")
        return " ".join(caps)

    def _uids(self, spec: str) -> list[int]:
        top = max((m["uid"] for m in self.mailbox), default=0)
        wanted: set[int] = set()
        for part in spec.split(","):
            low, _, high = part.partition(":")
            low_n = top if low == "*" else int(low)
            high_n = low_n if not high else top if high == "*" else int(high)
            wanted.update(range(min(low_n, high_n), max(low_n, high_n) + 1))
        return sorted(wanted)

    def _fetch(self, conn: _Conn, tag: str, args: str, readonly: bool) -> None:
        spec, _, items = args.partition(" ")
        items = items.upper()
        marks_read = bool(re.search(r"BODY\[|RFC822(?![.](HEADER|SIZE))", items))
        if marks_read:
            self.violations.append(f"UID FETCH {items} (marks the message as read)")
        if "BODY.PEEK[]" in items or "BODY[]" in items:
            section, select = "", (lambda raw: raw)
        elif (match := _FIELDS.search(items)):
            names = set(match.group(1).split())
            section, select = f"HEADER.FIELDS ({match.group(1)})", (lambda raw: _header_fields(raw, names))
        elif "HEADER]" in items:
            section, select = "HEADER", _header_block
        else:
            section, select = None, None
        wanted = set(self._uids(spec))
        for seq, message in enumerate(self.mailbox, 1):
            if message["uid"] not in wanted:
                continue
            if marks_read and not readonly:
                message["flags"].add("\\Seen")
            head = f"* {seq} FETCH (UID {message['uid']}"
            if section is None:
                conn.line(head + f" FLAGS ({' '.join(sorted(message['flags']))}))")
                continue
            data = select(message["raw"])
            conn.send(f"{head} BODY[{section}] {{{len(data)}}}\r\n".encode() + data + b")\r\n")
        conn.line(f"{tag} OK UID FETCH completed")

    def session(self, conn: _Conn) -> None:
        conn.line(f"* OK [CAPABILITY {self._capabilities(conn)}] iAs test IMAP server ready")
        authed = False
        selected = None
        readonly = True
        id_sent = False
        while True:
            raw = conn.readline()
            if not raw:
                return
            line = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            tag, _, rest = line.partition(" ")
            command, _, args = rest.partition(" ")
            command = command.upper()
            if command == "UID":
                sub, _, args = args.partition(" ")
                command = "UID " + sub.upper()
            self.commands.append(command if command == "LOGIN" else f"{command} {args}".strip())
            if command == "CAPABILITY":
                conn.line(f"* CAPABILITY {self._capabilities(conn)}")
                conn.line(f"{tag} OK CAPABILITY completed")
            elif command == "NOOP":
                conn.line(f"{tag} OK NOOP completed")
            elif command == "LOGOUT":
                conn.line("* BYE logging out")
                conn.line(f"{tag} OK LOGOUT completed")
                return
            elif command == "STARTTLS":
                if self.tls != "starttls" or conn.tls:
                    conn.line(f"{tag} BAD STARTTLS not available")
                    continue
                conn.line(f"{tag} OK Begin TLS negotiation now")
                conn.start_tls(self.context)
            elif command == "LOGIN":
                words = _tokens(args)
                ok = len(words) == 2 and words[0] == self.user and words[1] == self.password
                self.logins.append((words[0] if words else "", ok))
                if authed:
                    conn.line(f"{tag} BAD already authenticated")
                elif ok:
                    authed = True
                    conn.line(f"{tag} OK [CAPABILITY {self._capabilities(conn)}] LOGIN completed")
                else:
                    conn.line(f"{tag} NO [AUTHENTICATIONFAILED] Invalid credentials")
            elif command == "ID":
                self.ids.append(args)
                id_sent = True
                conn.line('* ID ("name" "iAs test IMAP")')
                conn.line(f"{tag} OK ID completed")
            elif not authed:
                conn.line(f"{tag} BAD {command} needs authentication")
            elif command in ("SELECT", "EXAMINE"):
                words = _tokens(args)
                name = words[0] if words else ""
                self.selects.append((command, name))
                if self.require_id and not id_sent:
                    conn.line(f"{tag} NO SELECT Unsafe Login. Please contact kefu@188.com for help")
                    continue
                if name.upper() != "INBOX":
                    conn.line(f"{tag} NO no such mailbox")
                    continue
                selected, readonly = "INBOX", command == "EXAMINE"
                top = max((m["uid"] for m in self.mailbox), default=0)
                conn.line("* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft)")
                conn.line(f"* {len(self.mailbox)} EXISTS")
                conn.line("* 0 RECENT")
                conn.line("* OK [UIDVALIDITY 1] UIDs valid")
                conn.line(f"* OK [UIDNEXT {top + 1}] Predicted next UID")
                conn.line(f"{tag} OK [{'READ-ONLY' if readonly else 'READ-WRITE'}] {command} completed")
            elif selected is None:
                conn.line(f"{tag} BAD {command} needs a selected mailbox")
            elif command == "UID SEARCH":
                criteria = args.upper().split()
                if criteria == ["UNSEEN"]:
                    found = [m["uid"] for m in self.mailbox if "\\Seen" not in m["flags"]]
                elif criteria == ["ALL"]:
                    found = [m["uid"] for m in self.mailbox]
                else:
                    conn.line(f"{tag} BAD unsupported search criteria")
                    continue
                conn.line("* SEARCH" + "".join(f" {uid}" for uid in found))
                conn.line(f"{tag} OK UID SEARCH completed")
            elif command == "UID FETCH":
                self._fetch(conn, tag, args, readonly)
            elif command == "CLOSE":
                if not readonly:
                    self.violations.append("CLOSE on a read-write mailbox (expunges)")
                selected = None
                conn.line(f"{tag} OK CLOSE completed")
            elif command in ("STORE", "UID STORE", "EXPUNGE", "UID EXPUNGE", "COPY", "UID COPY", "MOVE",
                             "UID MOVE", "APPEND", "FETCH"):
                self.violations.append(f"{command} {args}".strip())
                conn.line(f"{tag} NO {command} not allowed in this test")
            else:
                conn.line(f"{tag} BAD unknown command {command}")
