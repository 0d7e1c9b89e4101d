"""The email skill against local SMTP/IMAP servers (tests/servers/mail.py): real subprocesses, no internet.

Sending: RFC 2047 subject and display name, valid From, UTF-8 body, AUTH, TLS with a private CA.
Reading: INBOX opened read-only, BODY.PEEK only (nothing marked as read), ID sent when
advertised, GB2312-labelled mail holding GBK-only characters decoded intact. Errors: a missing
host names its variable, refused logins and connections are one clear line. Through the gate:
a send after the owner's code, and malformed calls rejected before anyone is asked.
"""
from __future__ import annotations

import asyncio
import base64
import email
import email.policy
import json
import os
import shutil
import tempfile
import unittest
from email.message import EmailMessage
from pathlib import Path

from ias import jsonschema as schema, results
from ias.gate import Gate
from ias.runner import Runner
from ias.skills import load_skill
from tests.servers import closed_port
from tests.servers.mail import IMAPServer, SMTPServer, WithCertificate
from tests.support import REPO, SkillsTestCase, load_script

SKILL = load_skill(REPO / "resources" / "skills" / "email", "system")
USER, PASSWORD = "bot@example.com", "auth-code-123"

GBK_FROM_NAME = "张喆"
GBK_SUBJECT = "关于朱镕基和王堃的来信"
GBK_BODY = "喆、镕、堃都在这封信里。\n第二行：计算机。"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def gb2312_labelled_message() -> bytes:
    """Labelled gb2312, but the bytes are GBK (喆 镕 堃 are not in GB2312) — as real mailers send."""
    return (
        f"From: =?gb2312?B?{b64(GBK_FROM_NAME.encode('gbk'))}?= <zhe@example.cn>\r\n"
        "To: me@example.com\r\n"
        f"Subject: =?gb2312?B?{b64(GBK_SUBJECT.encode('gbk'))}?=\r\n"
        "Date: Mon, 01 Dec 2025 09:30:00 +0800\r\n"
        "Message-ID: <gbk-1@example.cn>\r\n"
        "MIME-Version: 1.0\r\n"
        "Content-Type: text/plain; charset=gb2312\r\n"
        "Content-Transfer-Encoding: base64\r\n"
        "\r\n"
        f"{b64(GBK_BODY.replace(chr(10), chr(13) + chr(10)).encode('gbk'))}\r\n"
    ).encode("ascii")


def plain_message(subject: str, body: str, sender: str = "alice@example.com") -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "me@example.com"
    msg["Subject"] = subject
    msg["Date"] = "Tue, 02 Dec 2025 10:00:00 +0800"
    msg.set_content(body)
    return msg.as_bytes(policy=email.policy.SMTP)


def html_message() -> bytes:
    msg = EmailMessage()
    msg["From"] = "Bob <bob@example.com>"
    msg["To"] = "me@example.com"
    msg["Subject"] = "报告 attached"
    msg["Date"] = "Wed, 03 Dec 2025 11:00:00 +0800"
    msg.set_content("<html><head><title>T</title><style>p {color: red}</style></head>"
                    "<body><p>Hello <b>世界</b></p><script>alert(1)</script><div>a &amp; b</div></body></html>",
                    subtype="html")
    msg.add_attachment(b"%PDF-1.4 fake", maintype="application", subtype="pdf", filename="报告.pdf")
    msg.add_attachment("x,y\n", subtype="csv", filename="data.csv")
    return msg.as_bytes(policy=email.policy.SMTP)


def raw_8bit_attachment_message(name: str, encoding: str, body: str = "见附件。") -> bytes:
    """As Foxmail and older Outlook send it: the attachment name as raw GBK/UTF-8 bytes, no RFC 2047/2231."""
    raw_name = name.encode(encoding)
    return (b"From: Zhang <zhang@example.cn>\r\nTo: me@example.com\r\nSubject: files\r\n"
            b"Date: Thu, 04 Dec 2025 08:00:00 +0800\r\nMIME-Version: 1.0\r\n"
            b"Content-Type: multipart/mixed; boundary=\"XX\"\r\n\r\n"
            b"--XX\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n"
            + base64.encodebytes(body.encode("utf-8")).replace(b"\n", b"\r\n") +
            b"--XX\r\nContent-Type: application/pdf; name=\"" + raw_name + b"\"\r\n"
            b"Content-Disposition: attachment; filename=\"" + raw_name + b"\"\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\nJVBERi0xLjQ=\r\n--XX--\r\n")


def fill_mailbox(imap: IMAPServer) -> dict[str, str]:
    """Four messages, one already read; returns their UIDs by name."""
    return {
        "gbk": imap.add(gb2312_labelled_message()),
        "old": imap.add(plain_message("Old news", "already read"), seen=True),
        "html": imap.add(html_message()),
        "utf8": imap.add(plain_message("Re: 你好", "你好，世界")),
    }


def smtp_env(server: SMTPServer, **extra) -> dict[str, str]:
    env = {"IAS_SMTP_HOST": "127.0.0.1", "IAS_SMTP_PORT": str(server.port), "IAS_SMTP_SSL": "none"}
    if "IAS_SMTP_USER" not in extra:
        env["IAS_SMTP_FROM"] = "relay@example.com"
    env.update(extra)
    return env


def imap_env(server: IMAPServer, **extra) -> dict[str, str]:
    env = {"IAS_IMAP_HOST": "127.0.0.1", "IAS_IMAP_PORT": str(server.port), "IAS_IMAP_SSL": "none",
           "IAS_IMAP_USER": server.user, "IAS_IMAP_PASSWORD": server.password}
    env.update(extra)
    return env


class _SkillRun:
    """Runs the email skill directly through the runner (schema defaults and validation first)."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-email-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def runner(self, environ: dict[str, str]) -> Runner:
        return Runner(repo_root=REPO, run_dir=self.tmp / "runs", environ={"PATH": os.environ["PATH"], **environ})

    async def run_email(self, params: dict, environ: dict[str, str]) -> dict:
        params = schema.apply_defaults(params, SKILL.parameters)
        self.assertEqual(schema.validate(params, SKILL.parameters), [])
        result = await self.runner(environ).execute(SKILL, params)
        self.assertEqual(result.exit_code, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        llm = results.of_run(result)
        self.assertNotIn("output", llm)          # one JSON object with `success`, passed through
        return llm

    def assertFailure(self, result: dict, *fragments: str) -> None:
        self.assertFalse(result["success"], result)
        for fragment in fragments:
            self.assertIn(fragment, result["error"])
        self.assertNotIn("Traceback", result["error"])


def mail_script(name: str):
    """One of the skill's script modules (`imap`, `mime`), for its pure helpers."""
    return load_script(Path(SKILL.directory, "scripts", f"{name}.py"), f"ias_email_skill_{name}")


class HelpersTest(unittest.TestCase):
    def test_fetch_response_with_uid_before_or_after_the_literal(self):
        mail = mail_script("imap")
        data = [(b"1 (UID 101 BODY[] {3}", b"abc"), b")",
                (b"2 (BODY[] {3}", b"def"), b" UID 103)",
                (b"3 (FLAGS (\\Seen) UID 105 BODY[] {0}", b""), b")"]
        self.assertEqual(mail.fetched(data), {101: b"abc", 103: b"def", 105: b""})

    def test_charset_fallbacks(self):
        mail = mail_script("mime")
        self.assertEqual(mail.decode_bytes("王堃".encode("gbk"), "GB2312"), "王堃")
        self.assertEqual(mail.decode_bytes("王堃".encode("gbk"), '"gbk"'), "王堃")
        self.assertEqual(mail.decode_bytes("王堃".encode("gb18030"), None), "王堃")     # unlabelled
        self.assertEqual(mail.decode_bytes("café".encode("cp1252"), "iso-8859-1"), "café")
        self.assertEqual(mail.decode_bytes(b"x", "no-such-charset"), "x")
        self.assertEqual(mail.header_text("=?GBK?B?" + b64("镕".encode("gbk")) + "?= =?utf-8?q?=E5=96=86?="), "镕喆")


    def test_raw_8bit_attachment_names(self):
        mail = mail_script("mime")
        for encoding in ("gbk", "utf-8", "gb18030"):
            with self.subTest(encoding=encoding):
                msg = email.message_from_bytes(raw_8bit_attachment_message("报告（终稿）喆.pdf", encoding))
                self.assertEqual(mail.message_body(msg), ("见附件。", ["报告（终稿）喆.pdf"]))

    def test_plain_login_only_to_loopback_unless_allowed(self):
        mail = mail_script("imap")       # its smtp and SkillError are ias_skill's
        for host in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.53"):
            mail.smtp.refuse_plain_login("IAS_SMTP", "none", host, USER)
        with self.assertRaisesRegex(mail.SkillError, "IAS_SMTP_ALLOW_PLAIN_LOGIN=1"):
            mail.smtp.refuse_plain_login("IAS_SMTP", "none", "smtp.example.com", USER)
        mail.smtp.refuse_plain_login("IAS_SMTP", "none", "smtp.example.com", "")        # no login, no password
        mail.smtp.refuse_plain_login("IAS_SMTP", "starttls", "smtp.example.com", USER)
        os.environ["IAS_IMAP_ALLOW_PLAIN_LOGIN"] = "1"
        self.addCleanup(os.environ.pop, "IAS_IMAP_ALLOW_PLAIN_LOGIN")
        mail.smtp.refuse_plain_login("IAS_IMAP", "none", "192.168.1.2", USER)
        with self.assertRaisesRegex(mail.SkillError, "IAS_SMTP_ALLOW_PLAIN_LOGIN"):
            mail.smtp.refuse_plain_login("IAS_SMTP", "none", "192.168.1.2", USER)


class SendTest(_SkillRun, unittest.IsolatedAsyncioTestCase):
    async def test_chinese_subject_display_name_and_body(self):
        body = "你好，\n这是周报：朱镕基与王堃。\n.以点开头的一行\n"
        with SMTPServer() as smtp:
            result = await self.run_email(
                {"action": "send", "to": "boss@example.org", "subject": "周报：朱镕基与王堃", "body": body},
                smtp_env(smtp, IAS_SMTP_FROM="小助手 <bot@example.com>"))
        self.assertTrue(result["success"], result)
        self.assertEqual(len(smtp.messages), 1)
        sent = smtp.messages[0]
        self.assertEqual(sent["mail_from"], "bot@example.com")
        self.assertEqual(sent["rcpt_to"], ["boss@example.org"])
        raw = sent["data"]
        raw.decode("ascii")                              # 7-bit clean: encoded words and base64
        headers = raw.split(b"\r\n\r\n", 1)[0]
        self.assertIn(b"Subject: =?utf-8?", headers)     # RFC 2047
        self.assertIn(b"From: =?utf-8?", headers)
        self.assertIn(b"<bot@example.com>", headers)
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        self.assertEqual(msg["Subject"], "周报：朱镕基与王堃")
        (sender,) = msg["From"].addresses
        self.assertEqual((sender.display_name, sender.addr_spec), ("小助手", "bot@example.com"))
        self.assertEqual(msg["From"].defects, ())
        self.assertEqual(msg["To"].addresses[0].addr_spec, "boss@example.org")
        self.assertIsNotNone(msg["Date"])
        self.assertTrue(msg["Message-ID"].endswith("@example.com>"))
        self.assertEqual(msg.get_content_charset(), "utf-8")
        self.assertEqual(msg.get_content(), body)

    async def test_login_and_refused_login(self):
        body = "line one\n.starts with a dot\n..two dots\n"
        with SMTPServer(USER, PASSWORD) as smtp:
            ok = await self.run_email({"action": "send", "to": "x@example.org", "subject": "hi", "body": body},
                                      smtp_env(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD=PASSWORD))
            bad = await self.run_email({"action": "send", "to": "x@example.org", "subject": "hi", "body": body},
                                       smtp_env(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD="wrong-code"))
        self.assertTrue(ok["success"], ok)
        self.assertEqual(ok["from"], USER)
        self.assertEqual(len(smtp.messages), 1)
        self.assertEqual(smtp.messages[0]["user"], USER)
        msg = email.message_from_bytes(smtp.messages[0]["data"], policy=email.policy.default)
        self.assertEqual(msg["From"].addresses[0].addr_spec, USER)      # From = the logged-in account
        self.assertEqual(msg.get_content().replace("\r\n", "\n"), body)    # dot-stuffing round trip
        self.assertFailure(bad, "SMTP login", "535", "IAS_SMTP_PASSWORD")
        self.assertNotIn("wrong-code", bad["error"])
        self.assertTrue(any(ok for _mech, _user, ok in smtp.auth_attempts))

    async def test_a_wrong_password_is_one_auth_attempt_on_the_wire(self):
        send = {"action": "send", "to": "x@example.org", "subject": "hi", "body": "b"}
        for mechanisms, used in (("PLAIN LOGIN", "PLAIN"), ("LOGIN PLAIN", "PLAIN"), ("LOGIN", "LOGIN")):
            with self.subTest(mechanisms=mechanisms), SMTPServer(USER, PASSWORD, mechanisms=mechanisms) as smtp:
                bad = await self.run_email(send, smtp_env(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD="wrong-code"))
                self.assertFailure(bad, "SMTP login", "535", "IAS_SMTP_PASSWORD")
                self.assertEqual(smtp.auth_attempts, [(used, USER, False)])
                self.assertEqual([c for c in smtp.commands if c.upper().startswith("AUTH")], [f"AUTH {used}"])
                self.assertEqual(smtp.messages, [])

    async def test_no_supported_mechanism_is_not_tried(self):
        with SMTPServer(USER, PASSWORD, mechanisms="CRAM-MD5 XOAUTH2") as smtp:
            result = await self.run_email({"action": "send", "to": "x@example.org", "subject": "s", "body": "b"},
                                          smtp_env(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD=PASSWORD))
        self.assertFailure(result, "PLAIN or LOGIN", "CRAM-MD5")
        self.assertEqual(smtp.auth_attempts, [])
        self.assertFalse([c for c in smtp.commands if c.upper().startswith("AUTH")])

    async def test_non_ascii_password_as_utf8(self):
        password = "授权码-ñ-密码"
        for mechanisms in ("PLAIN", "LOGIN"):
            with self.subTest(mechanisms=mechanisms), SMTPServer(USER, password, mechanisms=mechanisms) as smtp:
                result = await self.run_email({"action": "send", "to": "x@example.org", "subject": "s", "body": "b"},
                                              smtp_env(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD=password))
                self.assertTrue(result["success"], result)
                self.assertEqual(smtp.auth_attempts, [(mechanisms, USER, True)])
                self.assertEqual(len(smtp.messages), 1)
        with IMAPServer(password=password) as imap:
            result = await self.run_email({"action": "list_unread"}, imap_env(imap))
        self.assertFailure(result, "ASCII", "IAS_IMAP_PASSWORD")
        self.assertNotIn(password, result["error"])

    async def test_plain_login_to_another_host_is_refused_before_connecting(self):
        # 192.0.2.1 is TEST-NET-1: nothing is contacted, the refusal comes first.
        send = {"action": "send", "to": "x@example.org", "subject": "s", "body": "b"}
        result = await self.run_email(send, {"IAS_SMTP_HOST": "192.0.2.1", "IAS_SMTP_SSL": "none",
                                             "IAS_SMTP_USER": USER, "IAS_SMTP_PASSWORD": PASSWORD})
        self.assertFailure(result, "clear text", "192.0.2.1", "IAS_SMTP_ALLOW_PLAIN_LOGIN=1", "IAS_SMTP_SSL")
        self.assertNotIn(PASSWORD, result["error"])
        result = await self.run_email({"action": "list_unread"},
                                      {"IAS_IMAP_HOST": "192.0.2.1", "IAS_IMAP_SSL": "none",
                                       "IAS_IMAP_USER": USER, "IAS_IMAP_PASSWORD": PASSWORD})
        self.assertFailure(result, "clear text", "IAS_IMAP_ALLOW_PLAIN_LOGIN=1")

    async def test_overall_deadline_and_unknown_delivery(self):
        send = {"action": "send", "to": "x@example.org", "subject": "s", "body": "b"}
        with SMTPServer(stall="data") as smtp:
            result = await asyncio.wait_for(self.run_email(send, smtp_env(smtp, IAS_EMAIL_TIMEOUT="1")), 15)
            self.assertEqual(len(smtp.messages), 1)            # the server has it, but never said so
        self.assertFailure(result, "delivery is unknown", "within 1 s")
        self.assertEqual(result["delivery"], "unknown")
        with SMTPServer(stall="greeting") as smtp:
            result = await asyncio.wait_for(self.run_email(send, smtp_env(smtp, IAS_EMAIL_TIMEOUT="1")), 15)
        self.assertFailure(result, "within 1 s", "not sent")
        self.assertNotIn("delivery", result)

    async def test_configuration_errors_name_the_variable(self):
        send = {"action": "send", "to": "x@example.org", "subject": "s", "body": "b"}
        result = await self.run_email(send, {})
        self.assertFailure(result, "IAS_SMTP_HOST")
        result = await self.run_email(send, {"IAS_SMTP_HOST": "127.0.0.1", "IAS_SMTP_USER": USER})
        self.assertFailure(result, "IAS_SMTP_PASSWORD")
        for mode in ("maybe", "tls", "plain"):          # never a guess: `tls` once meant ssl, `plain` none
            result = await self.run_email(send, {"IAS_SMTP_HOST": "127.0.0.1", "IAS_SMTP_SSL": mode})
            self.assertFailure(result, "IAS_SMTP_SSL must be ssl, starttls or none")
        result = await self.run_email(send, {"IAS_SMTP_HOST": "127.0.0.1", "IAS_SMTP_SSL": "none"})
        self.assertFailure(result, "IAS_SMTP_FROM")
        result = await self.run_email({"action": "list_unread"}, {})
        self.assertFailure(result, "IAS_IMAP_HOST")
        result = await self.run_email({"action": "read", "uid": "1"}, {"IAS_IMAP_HOST": "127.0.0.1",
                                                                       "IAS_IMAP_PORT": "99999"})
        self.assertFailure(result, "IAS_IMAP_PORT")

    async def test_fields_missing_for_the_action(self):
        result = await self.run_email({"action": "send", "to": "x@example.org"}, {})
        self.assertFailure(result, "'send' needs", "subject", "body")
        result = await self.run_email({"action": "read"}, {})
        self.assertFailure(result, "'read' needs 'uid'")

    async def test_connection_refused(self):
        port = closed_port()
        result = await self.run_email({"action": "send", "to": "x@example.org", "subject": "s", "body": "b"},
                                      {"IAS_SMTP_HOST": "127.0.0.1", "IAS_SMTP_PORT": str(port), "IAS_SMTP_SSL": "none",
                                       "IAS_SMTP_FROM": "relay@example.com"})
        self.assertFailure(result, "refused", f"127.0.0.1:{port}", "IAS_SMTP_HOST")
        result = await self.run_email({"action": "list_unread"},
                                      {"IAS_IMAP_HOST": "127.0.0.1", "IAS_IMAP_PORT": str(port)})
        self.assertFailure(result, "refused", "IAS_IMAP_PORT")


class ReadTest(_SkillRun, unittest.IsolatedAsyncioTestCase):
    def assertUntouched(self, imap: IMAPServer) -> None:
        self.assertEqual(imap.violations, [])
        self.assertEqual(imap.selects, [("EXAMINE", "INBOX")])
        self.assertEqual([m["uid"] for m in imap.mailbox if "\\Seen" in m["flags"]], [103])

    async def test_list_unread_newest_first_without_marking_read(self):
        with IMAPServer(require_id=True) as imap:        # like 163.com: no SELECT before ID
            uids = fill_mailbox(imap)
            result = await self.run_email({"action": "list_unread"}, imap_env(imap))
            limited = await self.run_email({"action": "list_unread", "limit": 2}, imap_env(imap))
        self.assertTrue(result["success"], result)
        self.assertEqual(result["unread"], 3)
        self.assertEqual([m["uid"] for m in result["messages"]], [uids["utf8"], uids["html"], uids["gbk"]])
        first, _, gbk = result["messages"]
        self.assertEqual(first, {"uid": uids["utf8"], "from": "alice@example.com", "subject": "Re: 你好",
                                 "date": "Tue, 02 Dec 2025 10:00:00 +0800"})
        self.assertEqual(gbk["subject"], GBK_SUBJECT)
        self.assertEqual(gbk["from"], f"{GBK_FROM_NAME} <zhe@example.cn>")
        self.assertEqual([m["uid"] for m in limited["messages"]], [uids["utf8"], uids["html"]])
        self.assertEqual(limited["unread"], 3)
        self.assertEqual(imap.violations, [])
        self.assertEqual(imap.selects, [("EXAMINE", "INBOX")] * 2)
        self.assertEqual(len(imap.ids), 2)
        self.assertIn('"name" "iAs"', imap.ids[0])
        fetches = [c for c in imap.commands if c.startswith("UID FETCH")]
        self.assertTrue(fetches and all("BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)]" in c for c in fetches), fetches)
        self.assertEqual(imap.logins, [("me@example.com", True)] * 2)
        self.assertEqual(sum(m["uid"] != 103 and "\\Seen" in m["flags"] for m in imap.mailbox), 0)

    async def test_no_id_unless_advertised(self):
        with IMAPServer(advertise_id=False) as imap:
            fill_mailbox(imap)
            result = await self.run_email({"action": "list_unread", "limit": 1}, imap_env(imap))
        self.assertTrue(result["success"], result)
        self.assertEqual(imap.ids, [])
        self.assertFalse(any(c.startswith("ID") for c in imap.commands))

    async def test_read_gb2312_labelled_gbk_mail_intact(self):
        # The trap this guards against: the stdlib's default policy decodes by the label.
        trap = email.message_from_bytes(gb2312_labelled_message(), policy=email.policy.default)
        self.assertIn("\ufffd", str(trap["Subject"]))
        with IMAPServer() as imap:
            uids = fill_mailbox(imap)
            result = await self.run_email({"action": "read", "uid": uids["gbk"]}, imap_env(imap))
            self.assertUntouched(imap)
        self.assertTrue(result["success"], result)
        self.assertNotIn("\ufffd", json.dumps(result, ensure_ascii=False))
        self.assertEqual(result["uid"], uids["gbk"])
        self.assertEqual(result["subject"], GBK_SUBJECT)
        self.assertEqual(result["from"], f"{GBK_FROM_NAME} <zhe@example.cn>")
        self.assertEqual(result["to"], "me@example.com")
        self.assertEqual(result["date"], "Mon, 01 Dec 2025 09:30:00 +0800")
        self.assertEqual(result["body"], GBK_BODY)
        self.assertEqual(result["attachments"], [])
        fetches = [c for c in imap.commands if c.startswith("UID FETCH")]
        self.assertEqual(fetches, [f"UID FETCH {uids['gbk']} (UID BODY.PEEK[])"])

    async def test_read_html_only_mail_with_attachments(self):
        with IMAPServer() as imap:
            uids = fill_mailbox(imap)
            result = await self.run_email({"action": "read", "uid": uids["html"]}, imap_env(imap))
            self.assertUntouched(imap)
        self.assertTrue(result["success"], result)
        self.assertEqual(result["body"], "Hello 世界\n\na & b")
        self.assertEqual(result["attachments"], ["报告.pdf", "data.csv"])
        self.assertEqual(result["from"], "Bob <bob@example.com>")

    async def test_raw_gbk_attachment_name(self):
        with IMAPServer() as imap:
            gbk = imap.add(raw_8bit_attachment_message("季度报告.pdf", "gbk"))
            utf8 = imap.add(raw_8bit_attachment_message("季度报告.pdf", "utf-8"))
            results = [await self.run_email({"action": "read", "uid": uid}, imap_env(imap)) for uid in (gbk, utf8)]
        for result in results:
            self.assertTrue(result["success"], result)
            self.assertEqual(result["attachments"], ["季度报告.pdf"])
            self.assertEqual(result["body"], "见附件。")

    async def test_a_20000_emoji_body_fits_the_models_64_kib_in_bytes(self):
        body = "😀" * 20000                                     # 80,000 bytes of UTF-8
        with IMAPServer() as imap:
            uid = imap.add(raw_8bit_attachment_message("清单.pdf", "utf-8", body=body))
            params = schema.apply_defaults({"action": "read", "uid": uid}, SKILL.parameters)
            run = await self.runner(imap_env(imap)).execute(SKILL, params)
        self.assertEqual(run.exit_code, 0, run.stderr)
        self.assertFalse(results.truncated(run))
        self.assertLessEqual(run.output_size, 64 * 1024)
        result = results.of_run(run)                           # the skill's own JSON, not a cut "output"
        self.assertTrue(result["success"], result)
        self.assertEqual(result["attachments"], ["清单.pdf"])
        self.assertIs(result["body_truncated"], True)
        self.assertTrue(body.startswith(result["body"]))
        self.assertGreater(len(result["body"]), 14000)          # cut to fit, not to nothing

    async def test_unknown_uid_and_refused_login(self):
        with IMAPServer() as imap:
            fill_mailbox(imap)
            missing = await self.run_email({"action": "read", "uid": "999"}, imap_env(imap))
            refused = await self.run_email({"action": "list_unread"}, imap_env(imap, IAS_IMAP_PASSWORD="nope-nope"))
        self.assertFailure(missing, "no message with uid 999")
        self.assertFailure(refused, "IMAP login", "AUTHENTICATIONFAILED", "IAS_IMAP_PASSWORD")
        self.assertNotIn("nope-nope", refused["error"])
        self.assertEqual([ok for _user, ok in imap.logins], [True, False])      # one LOGIN per call
        self.assertEqual(imap.violations, [])


class TLSTest(WithCertificate, _SkillRun, unittest.IsolatedAsyncioTestCase):
    """Implicit TLS and STARTTLS against a self-signed certificate trusted through SSL_CERT_FILE."""

    async def test_smtp_ssl_and_starttls(self):
        send = {"action": "send", "to": "x@example.org", "subject": "加密", "body": "TLS 你好"}
        for mode in ("ssl", "starttls"):
            with self.subTest(mode=mode), SMTPServer(USER, PASSWORD, tls=mode, context=self.context) as smtp:
                result = await self.run_email(send, smtp_env(smtp, IAS_SMTP_SSL=mode, IAS_SMTP_USER=USER,
                                                             IAS_SMTP_PASSWORD=PASSWORD, SSL_CERT_FILE=self.cert))
                self.assertTrue(result["success"], result)
                self.assertEqual(len(smtp.messages), 1)
                self.assertTrue(smtp.messages[0]["tls"])
                self.assertEqual(smtp.messages[0]["user"], USER)

    async def test_untrusted_certificate_is_a_clear_error(self):
        with SMTPServer(tls="ssl", context=self.context) as smtp:
            result = await self.run_email({"action": "send", "to": "x@example.org", "subject": "s", "body": "b"},
                                          smtp_env(smtp, IAS_SMTP_SSL="ssl"))
        self.assertFailure(result, "certificate", "SSL_CERT_FILE")
        self.assertEqual(smtp.messages, [])

    async def test_imap_ssl_and_starttls(self):
        for mode in ("ssl", "starttls"):
            with self.subTest(mode=mode), IMAPServer(tls=mode, context=self.context) as imap:
                uids = fill_mailbox(imap)
                result = await self.run_email({"action": "read", "uid": uids["utf8"]},
                                              imap_env(imap, IAS_IMAP_SSL=mode, SSL_CERT_FILE=self.cert))
                self.assertTrue(result["success"], result)
                self.assertEqual(result["body"], "你好，世界")
                self.assertEqual(imap.violations, [])


class EmailGateTest(SkillsTestCase):
    """Through the real approval gate: validation, the owner's code, then the run."""
    def gate_with(self, environ: dict[str, str], **options) -> Gate:
        """A new app's gate (the test's from now on) whose runner also has `environ` (for the mail servers
        each test starts); `options` go to build."""
        return self.use(self.build(environ={**self.runner_environ(), **environ}, **options)).gate

    async def test_send_after_approval(self):
        params = {"action": "send", "to": "boss@example.org", "subject": "请假：王堃", "body": "明天请假一天。"}
        with SMTPServer(USER, PASSWORD) as smtp:
            gate = self.gate_with(smtp_env(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD=PASSWORD))
            task = asyncio.create_task(gate.call("owner", "email", params, self.owner.notify))
            code = await self.owner.code()
            self.assertEqual(smtp.connections, 0)            # nothing happens before the code
            await self.approvals.redeem("owner", code)
            result = await asyncio.wait_for(task, 30)
        self.assertTrue(result["success"], result)
        (message,) = self.owner.messages
        self.assertIn("\n技能：email\n参数：\n· 操作：send\n· 收件人：boss@example.org\n· 主题：请假：王堃\n"
                      "· 正文：明天请假一天。\n\n确认码：", message)        # labels for people, in schema order
        self.assertEqual(len(smtp.messages), 1)
        msg = email.message_from_bytes(smtp.messages[0]["data"], policy=email.policy.default)
        self.assertEqual(msg["Subject"], "请假：王堃")
        self.assertEqual(msg.get_content(), "明天请假一天。\n")

    async def test_list_unread_after_approval(self):
        with IMAPServer() as imap:
            uids = fill_mailbox(imap)
            gate = self.gate_with(imap_env(imap))
            task = asyncio.create_task(gate.call("owner", "email", {"action": "list_unread", "limit": 5},
                                                 self.owner.notify))
            await self.approvals.redeem("owner", await self.owner.code())
            result = await asyncio.wait_for(task, 30)
        self.assertTrue(result["success"], result)
        self.assertEqual(len(result["messages"]), 3)
        self.assertEqual(result["messages"][-1]["uid"], uids["gbk"])
        self.assertEqual(imap.violations, [])

    async def test_a_long_body_reaches_the_model_as_json_with_attachments(self):
        from ias.llm import LLM
        from tests.servers.llm import LLMServer, calls, text
        with IMAPServer() as imap, LLMServer() as model:
            uid = imap.add(raw_8bit_attachment_message("发票.pdf", "gbk", body="😀" * 20000))
            llm = LLM("sk-test", model.base_url, "test-model", retry_delays=(0.01,))
            self.addAsyncCleanup(llm.close)
            self.gate_with(imap_env(imap), llm=llm)
            agent = self.agent
            model.script(calls(("email", {"action": "read", "uid": uid})), text("读完了。"))
            turn = asyncio.create_task(agent.turn("owner", "读一下那封信", self.owner.notify))
            await self.approvals.redeem("owner", await self.owner.code())
            self.assertEqual(await asyncio.wait_for(turn, 30), "读完了。")
        [tool] = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
        result = json.loads(tool["content"])                  # still JSON, cut inside the body only
        self.assertEqual(result["attachments"], ["发票.pdf"])
        self.assertIs(result["body_truncated"], True)
        self.assertTrue(result["body"].startswith("😀" * 1000))

    async def test_malformed_calls_never_reach_the_owner(self):
        bad_calls = [
            {"action": "delete"},
            {},
            {"action": "send", "to": "not an address", "subject": "s", "body": "b"},
            {"action": "send", "to": "a@example.org\r\nBcc: x@evil.example", "subject": "s", "body": "b"},
            {"action": "send", "to": "a@example.org", "subject": "s", "body": "b", "cc": "c@example.org"},
            {"action": "list_unread", "limit": 0},
            {"action": "list_unread", "limit": 51},
            {"action": "read", "uid": "12 (BODY[])"},
            {"action": "read", "uid": 7},
        ]
        with SMTPServer() as smtp, IMAPServer() as imap:
            fill_mailbox(imap)
            gate = self.gate_with({**smtp_env(smtp), **imap_env(imap)})
            for params in bad_calls:
                with self.subTest(params=params):
                    result = await gate.call("owner", "email", params, self.owner.notify)
                    self.assertFalse(result["success"])
                    self.assertTrue(result["error"].startswith("参数错误："), result)
        self.assertEqual(self.owner.messages, [])
        self.assertEqual((smtp.connections, imap.connections), (0, 0))


if __name__ == "__main__":
    unittest.main()
