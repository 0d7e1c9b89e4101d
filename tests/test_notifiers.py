"""The fallback e-mail notifier against the local SMTP server (tests/servers/mail.py).

It sends with the email skill's client (resources/lib/ias_skill/smtp.py) and the settings
ias/config.py checked: one login attempt with one mechanism, UTF-8 credentials, the TLS mode
exactly as configured. Webhook and WeCom notifiers are tested through the outbox (test_outbox).
"""
from __future__ import annotations

import email
import email.policy
import os
import sys
import unittest
from unittest import mock

from ias.config import load
from ias.notifiers import Email, Notice, configured
from tests.servers.mail import SMTPServer, WithCertificate
from tests.support import SKILL_LIB

USER, PASSWORD = "bot@example.com", "授权码-ñ"
NOTICE = Notice("iAs 提醒", "该吃药了", "reminder")


def notifier(smtp: SMTPServer, **environ: str) -> Email:
    settings = {"IAS_NOTIFY_EMAIL": "me@example.com", "IAS_SMTP_HOST": "127.0.0.1",
                "IAS_SMTP_PORT": str(smtp.port), "IAS_SMTP_SSL": "none", **environ}
    [found] = configured(load(environ=settings))
    return found


class EmailTest(unittest.TestCase):
    def test_sends_with_the_skills_client(self):
        with SMTPServer(USER, PASSWORD) as smtp:
            notifier(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD=PASSWORD).deliver(NOTICE)
        self.assertEqual(smtp.auth_attempts, [("PLAIN", USER, True)])      # a non-ASCII code, as UTF-8
        [sent] = smtp.messages
        self.assertEqual((sent["mail_from"], sent["rcpt_to"], sent["user"]), (USER, ["me@example.com"], USER))
        msg = email.message_from_bytes(sent["data"], policy=email.policy.default)
        self.assertEqual((msg["Subject"], msg.get_content().strip()), ("iAs 提醒", "该吃药了"))
        self.assertEqual(sys.modules["ias_skill.smtp"].__file__, os.path.join(SKILL_LIB, "ias_skill", "smtp.py"))

    def test_a_wrong_password_is_one_auth_attempt_on_the_wire(self):
        for mechanisms, used in (("PLAIN LOGIN", "PLAIN"), ("LOGIN", "LOGIN")):
            with self.subTest(mechanisms=mechanisms), SMTPServer(USER, PASSWORD, mechanisms=mechanisms) as smtp:
                with self.assertRaises(Exception) as caught:
                    notifier(smtp, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD="wrong-code").deliver(NOTICE)
                self.assertEqual(smtp.auth_attempts, [(used, USER, False)])    # smtplib's login() tried two
                self.assertIn("535", str(caught.exception))
                self.assertIn("IAS_SMTP_PASSWORD", str(caught.exception))
                self.assertNotIn("wrong-code", str(caught.exception))
                self.assertEqual([c for c in smtp.commands if c.upper().startswith("AUTH")], [f"AUTH {used}"])
                self.assertEqual(smtp.messages, [])


class TLSTest(WithCertificate, unittest.TestCase):
    def test_ssl_and_starttls_then_login(self):
        for mode in ("ssl", "starttls"):
            with self.subTest(mode=mode), SMTPServer(USER, PASSWORD, tls=mode, context=self.context) as smtp, \
                    mock.patch.dict("os.environ", {"SSL_CERT_FILE": self.cert}):
                notifier(smtp, IAS_SMTP_SSL=mode, IAS_SMTP_USER=USER, IAS_SMTP_PASSWORD=PASSWORD).deliver(NOTICE)
                [sent] = smtp.messages
                self.assertTrue(sent["tls"])
                self.assertEqual(sent["user"], USER)


if __name__ == "__main__":
    unittest.main()
