"""Configuration: every path setting is made absolute once, against the working directory at start."""
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from ias import limits
from ias.config import REPO_ROOT, Config, load
from ias.errors import ConfigError


class PathsTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-config-")
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name).resolve()
        cwd = os.getcwd()
        self.addCleanup(os.chdir, cwd)
        os.chdir(self.tmp)

    def test_relative_settings_from_the_environment_become_absolute(self):
        config = load(environ={"IAS_DATA_DIR": "data/../state", "IAS_SECRET_KEY_FILE": "keys/ias.key",
                               "IAS_SKILLS_DIR": "./my-skills"})
        self.assertEqual(config.data_dir, self.tmp / "state")
        self.assertEqual(config.key_file, self.tmp / "keys" / "ias.key")
        self.assertEqual(config.skills_dir, self.tmp / "my-skills")

    def test_relative_settings_from_ias_toml_become_absolute(self):
        (self.tmp / "ias.toml").write_text('data_dir = "var2"\nskills_dir = "s"\n', encoding="utf-8")
        config = load(environ={})
        self.assertEqual((config.data_dir, config.skills_dir), (self.tmp / "var2", self.tmp / "s"))
        self.assertEqual(config.key_file, self.tmp / "var2" / "secret.key")

    def test_defaults_are_absolute_and_stay_put_when_the_cwd_changes(self):
        config = load(environ={})
        self.assertEqual(config.data_dir, self.tmp / "var")
        self.assertEqual(config.key_file, self.tmp / "var" / "secret.key")
        self.assertEqual(config.skills_dir, REPO_ROOT / "skills")
        os.chdir("/")
        self.assertEqual(config.data_dir, self.tmp / "var")

    def test_home_is_expanded(self):
        config = load(environ={"IAS_DATA_DIR": "~/ias-state", "HOME": "/home/someone"})
        self.assertTrue(config.data_dir.is_absolute())
        self.assertEqual(config.data_dir.name, "ias-state")
        self.assertNotIn("~", str(config.data_dir))

    def test_a_data_dir_that_is_a_file_is_refused(self):
        (self.tmp / "afile").write_text("")
        with self.assertRaisesRegex(ConfigError, "^IAS_DATA_DIR .*afile is not a directory$"):
            load(environ={"IAS_DATA_DIR": "afile"})

    def test_a_config_built_directly_is_absolute_too(self):
        self.assertEqual(Config(data_dir=Path("d")).data_dir, self.tmp / "d")
        self.assertEqual(Config(secret_key_file=Path("k")).key_file, self.tmp / "k")

    def test_the_data_directory_layout_is_the_configs(self):
        """Every file iAs keeps in the data directory, by the name it has had (existing installs keep theirs)."""
        config = load(environ={"IAS_DATA_DIR": "state"})
        data = self.tmp / "state"
        self.assertEqual({name: getattr(config, name) for name in (
            "key_file", "audit_head", "cluster_dir", "run_dir", "daemon_lock", "unwritten_file", "skills_cache",
            "mcp_cache")}, {
            "key_file": data / "secret.key", "audit_head": data / "audit.head", "cluster_dir": data / "pg",
            "run_dir": data / "runs", "daemon_lock": data / "daemon.lock",
            "unwritten_file": data / "unwritten-ends.jsonl", "skills_cache": data / "skills.cache.json",
            "mcp_cache": data / "mcp"})
        os.chdir("/")
        self.assertEqual(config.cluster_dir, data / "pg")     # resolved at load, not when asked


class DefaultsTest(unittest.TestCase):
    def test_every_default_comes_from_limits(self):
        config = load(environ={})
        self.assertEqual((config.model, config.approval_timeout, config.llm_timeout, config.turn_timeout,
                          config.wechat_window, config.wechat_budget, config.outbox_expire, config.fallback_after,
                          config.retention_days, config.max_tools, config.tools_bytes),
                         (limits.MODEL_DEFAULT, limits.APPROVAL_TIMEOUT, limits.LLM_TIMEOUT, limits.TURN_TIMEOUT,
                          limits.WECHAT_REPLY_WINDOW, limits.WECHAT_SEND_BUDGET, limits.OUTBOX_EXPIRE,
                          limits.FALLBACK_AFTER, limits.RETENTION_DAYS, limits.MAX_TOOLS_DEFAULT,
                          limits.TOOLS_BYTES_DEFAULT))
        # The values SPEC names; a change to one is a change to the product, not a refactoring.
        self.assertEqual((config.model, config.approval_timeout, config.wechat_window, config.wechat_budget,
                          config.outbox_expire, config.fallback_after, config.retention_days),
                         ("gpt-4o-mini", 300.0, 82800.0, 8, 259200.0, 600.0, 180))


class LoadTest(unittest.TestCase):
    """What load() reads, what wins, and what it refuses (one ConfigError line, never a silent default)."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-config-")
        self.addCleanup(tmp.cleanup)
        self.file = Path(tmp.name) / "ias.toml"

    def load(self, toml: str, **environ: str):
        self.file.write_text(toml, encoding="utf-8")
        return load(self.file, environ)

    def test_the_environment_wins_and_secrets_come_only_from_it(self):
        config = self.load('model = "from-file"\napproval_timeout = 60\n[skills]\nallow_risk_downgrade = ["wol"]\n',
                           IAS_MODEL=" from-env ", OPENAI_API_KEY="sk-x", IAS_WECHAT_TOKEN="t")
        self.assertEqual((config.model, config.approval_timeout), ("from-env", 60.0))
        self.assertEqual((config.openai_api_key, config.wechat_token), ("sk-x", "t"))
        self.assertEqual(config.allow_risk_downgrade, frozenset({"wol"}))
        self.assertEqual(config.environ["IAS_MODEL"], " from-env ")       # the skills' environment, as given
        self.assertEqual(self.load("", IAS_MODEL="   ").model, "gpt-4o-mini")   # blank: not set

    def test_refusals(self):
        for toml, environ, needle in [
                ('openai_api_key = "sk-x"\n', {}, "is a secret; set OPENAI_API_KEY"),
                ('modle = "x"\n', {}, "unknown setting 'modle'"),
                ("approval_timeout = 0.5\n", {}, "between 1 and 86400 seconds"),
                ("", {"IAS_APPROVAL_TIMEOUT": "soon"}, "IAS_APPROVAL_TIMEOUT must be a number of seconds"),
                ('model = ""\n', {}, "must be a non-empty string"),
                ("[skills]\nallow_risk_downgrade = \"wol\"\n", {}, "must be a list of skill names"),
                ("[skills]\nother = 1\n", {}, "accepts only allow_risk_downgrade"),
                ("model = \n", {}, "ias.toml"),
                ("", {"IAS_MODEL": "bad\udcff"}, "IAS_MODEL is not valid UTF-8")]:
            with self.subTest(toml=toml, environ=environ), self.assertRaisesRegex(ConfigError, needle):
                self.load(toml, **environ)

    def test_the_deadlines(self):
        self.assertEqual((self.load("").llm_timeout, self.load("").turn_timeout), (60.0, 300.0))
        config = self.load("llm_timeout = 20\nturn_timeout = 90\n", IAS_TURN_TIMEOUT="120")
        self.assertEqual((config.llm_timeout, config.turn_timeout), (20.0, 120.0))
        for toml, environ, needle in [("llm_timeout = 0\n", {}, "llm_timeout must be between 1 and 3600"),
                                      ("", {"IAS_TURN_TIMEOUT": "86400"}, "IAS_TURN_TIMEOUT must be between 1 and 3600"),
                                      ("", {"IAS_LLM_TIMEOUT": "soon"}, "IAS_LLM_TIMEOUT must be a number")]:
            with self.subTest(toml=toml, environ=environ), self.assertRaisesRegex(ConfigError, needle):
                self.load(toml, **environ)

    def test_the_cluster_linger(self):
        self.assertEqual(self.load("").pg_linger, 30.0)
        self.assertEqual(self.load("pg_linger = 5\n", IAS_PG_LINGER="0").pg_linger, 0.0)     # 0: stop at once
        for bad, needle in [("-1", "must be between 0 and 3600,"), ("7200", "must be between 0 and 3600,"), ("soon", "must be a number")]:
            with self.subTest(bad=bad), self.assertRaisesRegex(ConfigError, f"^IAS_PG_LINGER {needle}"):
                self.load("", IAS_PG_LINGER=bad)

    def test_an_explicit_file_that_is_missing_is_an_error(self):
        with self.assertRaisesRegex(ConfigError, "cannot read config"):
            load(self.file, {})
        with self.assertRaisesRegex(ConfigError, "cannot read config"):
            load(None, {"IAS_CONFIG": str(self.file)})


if __name__ == "__main__":
    unittest.main()


class DeliverySettingsTest(unittest.TestCase):
    """The WeChat window and budget, the outbox's expiry and fallback delay, and the fallback notifiers."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-config-")
        self.addCleanup(tmp.cleanup)
        self.toml = Path(tmp.name) / "ias.toml"

    def test_defaults_are_todays_values(self):
        self.toml.write_text("", encoding="utf-8")
        config = load(self.toml, environ={})
        self.assertEqual((config.wechat_window, config.wechat_budget, config.outbox_expire, config.fallback_after),
                         (82800.0, 8, 259200.0, 600.0))
        self.assertEqual((config.notify_email, config.notify_wecom_url, config.notify_webhook_url), (None,) * 3)

    def test_ias_toml_and_the_environment_which_wins(self):
        self.toml.write_text('wechat_window = 72000\nwechat_budget = 6\noutbox_expire = 86400\n'
                             'notify_email = "me@example.com"\n', encoding="utf-8")
        config = load(self.toml, environ={"IAS_WECHAT_BUDGET": "5", "IAS_FALLBACK_AFTER": "0",
                                          "IAS_NOTIFY_WEBHOOK_TOKEN": "t0k", "IAS_SMTP_HOST": "smtp.qq.com"})
        self.assertEqual((config.wechat_window, config.wechat_budget, config.outbox_expire, config.fallback_after),
                         (72000.0, 5, 86400.0, 0.0))
        self.assertEqual((config.notify_email, config.notify_webhook_token), ("me@example.com", "t0k"))

    def test_retention_days_default_toml_environment_and_bounds(self):
        self.toml.write_text("retention_days = 30\n", encoding="utf-8")
        self.assertEqual(load(environ={}).retention_days, 180)
        self.assertEqual(load(self.toml, environ={}).retention_days, 30)
        self.assertEqual(load(self.toml, environ={"IAS_RETENTION_DAYS": "365"}).retention_days, 365)
        for bad in ("0", "1.5", "forever"):
            with self.assertRaisesRegex(ConfigError, "IAS_RETENTION_DAYS"):
                load(environ={"IAS_RETENTION_DAYS": bad})

    def test_a_webhook_body_template_must_be_a_json_object(self):
        template = '{"topic": "ias", "message": "{text}"}'
        self.assertEqual(load(environ={"IAS_NOTIFY_WEBHOOK_BODY": template}).notify_webhook_body, template)
        for value in ('["{text}"]', "{text}", "[" * 100_000):
            with self.subTest(value=value[:12]), self.assertRaisesRegex(ConfigError, "must be a JSON object"):
                load(environ={"IAS_NOTIFY_WEBHOOK_BODY": value})

    def test_bad_values_are_one_clear_error(self):
        for var, value, words in (("IAS_WECHAT_BUDGET", "1.5", "must be an integer"),
                                  ("IAS_WECHAT_BUDGET", "1", "between 2 and 100"),
                                  ("IAS_WECHAT_WINDOW", "90000", "between 60 and 86400"),
                                  ("IAS_OUTBOX_EXPIRE", "nan", "between"),
                                  ("IAS_FALLBACK_AFTER", "soon", "must be a number")):
            with self.subTest(var=var, value=value), self.assertRaises(ConfigError) as caught:
                load(environ={var: value})
            self.assertIn(words, str(caught.exception))
            self.assertIn(var, str(caught.exception))

    def test_the_webhook_token_is_a_secret(self):
        self.toml.write_text('notify_webhook_token = "x"\n', encoding="utf-8")
        with self.assertRaises(ConfigError) as caught:
            load(self.toml, environ={})
        self.assertIn("IAS_NOTIFY_WEBHOOK_TOKEN", str(caught.exception))


class MailSettingsTest(unittest.TestCase):
    """IAS_SMTP_* and IAS_IMAP_* are checked at load by the email skill's rules: one line naming the variable."""

    def test_bad_values_are_one_clear_error(self):
        for environ, words in (({"IAS_SMTP_HOST": "smtp.qq.com", "IAS_SMTP_PORT": "abc"}, "IAS_SMTP_PORT must be a port"),
                               ({"IAS_SMTP_PORT": "70000"}, "IAS_SMTP_PORT must be a port"),
                               ({"IAS_SMTP_HOST": "smtp.qq.com", "IAS_SMTP_SSL": "tls"}, "IAS_SMTP_SSL must be ssl, "
                                                                                        "starttls or none, got 'tls'"),
                               ({"IAS_IMAP_HOST": "imap.qq.com", "IAS_IMAP_SSL": "plain"}, "IAS_IMAP_SSL must be"),
                               ({"IAS_IMAP_HOST": "imap.qq.com", "IAS_IMAP_PORT": "１４３"}, "IAS_IMAP_PORT"),
                               ({"IAS_SMTP_HOST": "smtp.qq.com", "IAS_SMTP_USER": "me@qq.com"}, "IAS_SMTP_PASSWORD"),
                               ({"IAS_SMTP_HOST": "mail.example.com", "IAS_SMTP_SSL": "none",
                                 "IAS_SMTP_USER": "me", "IAS_SMTP_PASSWORD": "pw"}, "IAS_SMTP_ALLOW_PLAIN_LOGIN=1")):
            with self.subTest(environ=environ), self.assertRaises(ConfigError) as caught:
                load(environ=environ)
            self.assertIn(words, str(caught.exception))
            self.assertEqual(len(str(caught.exception).splitlines()), 1)
            self.assertNotIn("pw", str(caught.exception).replace("PASSWORD", ""))

    def test_parsed_values(self):
        config = load(environ={"IAS_SMTP_HOST": " smtp.qq.com ", "IAS_SMTP_USER": "me@qq.com",
                               "IAS_SMTP_PASSWORD": "code", "IAS_IMAP_HOST": "127.0.0.1", "IAS_IMAP_SSL": "NONE",
                               "IAS_IMAP_USER": "me", "IAS_IMAP_PASSWORD": "pw"})
        smtp, imap = config.smtp, config.imap
        self.assertEqual((smtp.host, smtp.port, smtp.mode, smtp.user, smtp.password),
                         ("smtp.qq.com", 465, "ssl", "me@qq.com", "code"))
        self.assertEqual((imap.host, imap.port, imap.mode), ("127.0.0.1", 143, "none"))     # plain, but loopback
        self.assertNotIn("code", repr(config))
        self.assertEqual(load(environ={"IAS_SMTP_HOST": "h", "IAS_SMTP_SSL": "starttls"}).smtp.port, 587)
        self.assertEqual(load(environ={"IAS_SMTP_HOST": "h", "IAS_SMTP_PORT": "2525"}).smtp.port, 2525)
        relay = load(environ={"IAS_SMTP_HOST": "10.0.0.5", "IAS_SMTP_SSL": "none", "IAS_SMTP_USER": "me",
                              "IAS_SMTP_PASSWORD": "pw", "IAS_SMTP_ALLOW_PLAIN_LOGIN": "1"}).smtp
        self.assertEqual((relay.port, relay.mode), (25, "none"))
        self.assertEqual((load(environ={}).smtp, load(environ={"IAS_SMTP_SSL": "starttls"}).smtp), (None, None))

    def test_a_fallback_email_without_a_server_is_refused_at_load(self):
        """Not when the fallback is needed (a reminder the owner then never gets): at start, one line."""
        with self.assertRaisesRegex(ConfigError, "^IAS_NOTIFY_EMAIL is set but IAS_SMTP_HOST is not"):
            load(environ={"IAS_NOTIFY_EMAIL": "me@example.com", "IAS_SMTP_USER": "me@qq.com"})
        self.assertEqual(load(environ={"IAS_NOTIFY_EMAIL": "me@example.com", "IAS_SMTP_HOST": "h"}).smtp.host, "h")

    def test_doctor_says_it_in_one_line(self):
        """The same through the real entry point: exit 1, one line on stderr, no traceback."""
        with tempfile.TemporaryDirectory(prefix="ias-config-") as tmp:
            for extra, words in (({"IAS_SMTP_HOST": "smtp.qq.com", "IAS_SMTP_SSL": "tls"},
                                  "ias: IAS_SMTP_SSL must be ssl, starttls or none, got 'tls'"),
                                 ({"IAS_SMTP_PORT": "abc"}, "ias: IAS_SMTP_PORT must be a port number from 1 to "
                                                            "65535, got 'abc'"),
                                 ({"IAS_NOTIFY_EMAIL": "me@example.com"}, "ias: IAS_NOTIFY_EMAIL is set but "
                                                                          "IAS_SMTP_HOST is not")):
                env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "IAS_DATA_DIR": tmp, **extra}
                with self.subTest(extra=extra):
                    done = subprocess.run([sys.executable, str(REPO_ROOT / "ias.py"), "doctor"], capture_output=True,
                                          text=True, env=env, cwd=tmp, timeout=60)
                    self.assertEqual((done.returncode, done.stdout), (1, ""), done.stderr)
                    self.assertEqual(done.stderr.splitlines(), [done.stderr.splitlines()[0]])
                    self.assertTrue(done.stderr.startswith(words), done.stderr)


class MediaSettingsTest(unittest.TestCase):
    """WeChat media (issue 26): the CDN base, the inbox's bound and whether the model sees images."""

    def test_defaults_the_environment_and_bounds(self):
        config = load(environ={"IAS_DATA_DIR": "/srv/ias"})
        self.assertEqual((config.wechat_cdn_url, config.inbox_max_mb, config.vision, config.inbox),
                         ("https://novac2c.cdn.weixin.qq.com/c2c", 500, 0, Path("/srv/ias/inbox")))
        self.assertEqual((limits.WECHAT_CDN_URL, limits.INBOX_MAX_MB, limits.MEDIA_DOWNLOAD_MAX),
                         (config.wechat_cdn_url, config.inbox_max_mb, 25 * 1024 * 1024))
        config = load(environ={"IAS_WECHAT_CDN_URL": "http://127.0.0.1:9/c2c", "IAS_INBOX_MAX_MB": "20",
                               "IAS_VISION": "1"})
        self.assertEqual((config.wechat_cdn_url, config.inbox_max_mb, config.vision), ("http://127.0.0.1:9/c2c", 20, 1))
        for var, value in (("IAS_VISION", "2"), ("IAS_VISION", "yes"), ("IAS_INBOX_MAX_MB", "0"),
                           ("IAS_INBOX_MAX_MB", "1.5")):
            with self.subTest(var=var, value=value), self.assertRaisesRegex(ConfigError, var):
                load(environ={var: value})
