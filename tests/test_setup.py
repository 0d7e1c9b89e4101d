"""`ias setup`: the presets, the test request (a plain answer and a tool call) that must pass before anything
is written, the interactive questions, and issue 24's end-to-end path from a fresh copy: setup, then the
daemon `make run` starts answering with nothing exported, and a wrong key told as such."""
import contextlib
import io
import json
import os
import signal
import stat
import tempfile
import unittest
from pathlib import Path
from unittest import mock
from urllib.parse import urlparse

from ias import envfile
from ias.agent import KEY_REFUSED
from ias.config import load
from ias.errors import ConfigError
from ias.setup import NO_KEY, PRESETS, PROBE_TOOL_NAME, UsageError, from_arguments, needed, preset, run_setup
from tests.e2e_support import ECHO, Copy, EchoLLM, wait_until
from tests.servers.llm import LLMServer, calls, error, text
from tests.support import slow

PROBED = (text("好"), calls((PROBE_TOOL_NAME, {"zone": "Asia/Shanghai"})))      # a model that passes the test


class PresetsTest(unittest.TestCase):
    def test_every_preset_names_an_endpoint_and_model_except_other(self):
        self.assertEqual(len({p.name for p in PRESETS}), len(PRESETS))
        self.assertEqual({p.name for p in PRESETS}, {"openai", "deepseek", "qwen", "moonshot", "zhipu", "siliconflow",
                                                     "ollama", "other"})
        for provider in PRESETS:
            with self.subTest(provider=provider.name):
                if provider.name == "other":
                    self.assertEqual((provider.base_url, provider.model), (None, None))
                    continue
                url = urlparse(provider.base_url)
                self.assertEqual(url.scheme, "http" if provider.name == "ollama" else "https")
                self.assertTrue(url.netloc and provider.model)
        self.assertEqual(preset("ollama").key, "none")

    def test_arguments_fill_in_the_preset_and_take_the_key_from_the_environment(self):
        config = load(environ={"OPENAI_API_KEY": "sk-1", "IAS_DATA_DIR": "/nonexistent/ias"})
        self.assertEqual(from_arguments(config, "deepseek", None, None).settings(), {
            "OPENAI_BASE_URL": "https://api.deepseek.com/v1", "OPENAI_API_KEY": "sk-1", "IAS_MODEL": "deepseek-chat",
            "IAS_VISION": "0"})
        self.assertEqual(from_arguments(config, "qwen", "qwen-max", "https://proxy/v1").settings(), {
            "OPENAI_BASE_URL": "https://proxy/v1", "OPENAI_API_KEY": "sk-1", "IAS_MODEL": "qwen-max", "IAS_VISION": "0"})
        # A preset whose model sees images says so; another model of the same provider is not assumed to.
        self.assertEqual(from_arguments(config, "openai", None, None).settings()["IAS_VISION"], "1")
        self.assertEqual(from_arguments(config, "openai", "gpt-3.5-turbo", None).settings()["IAS_VISION"], "0")
        keyless = load(environ={"IAS_DATA_DIR": "/nonexistent/ias"})
        self.assertEqual(from_arguments(keyless, "ollama", None, None).api_key, NO_KEY)
        self.assertEqual(from_arguments(keyless, "other", "m", "http://127.0.0.1:8000/v1").api_key, NO_KEY)
        with self.assertRaisesRegex(ConfigError, "OPENAI_API_KEY is not set"):
            from_arguments(keyless, "openai", None, None)
        with self.assertRaisesRegex(UsageError, "--provider other needs --base-url URL"):
            from_arguments(config, "other", "m", None)
        with self.assertRaisesRegex(UsageError, "--provider other needs --model NAME"):
            from_arguments(config, "other", None, "http://127.0.0.1:8000/v1")


class NeededTest(unittest.TestCase):
    """`make run` offers setup when neither OPENAI_API_KEY nor OPENAI_BASE_URL is set, here or in the env file."""

    def test_needed(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-setup-")
        self.addCleanup(tmp.cleanup)
        cwd = os.getcwd()
        self.addCleanup(os.chdir, cwd)
        os.chdir(tmp.name)
        bare = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_"))}
        for extra, expected in (({}, True), ({"OPENAI_API_KEY": "sk-1"}, False),
                                ({"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"}, False)):
            with self.subTest(extra=extra), mock.patch.dict(os.environ, {**bare, **extra}, clear=True):
                self.assertIs(needed(), expected)
        envfile.write(Path(tmp.name) / "var" / "ias.env", {"OPENAI_API_KEY": "sk-1"})
        with mock.patch.dict(os.environ, bare, clear=True):
            self.assertIs(needed(), False)
            (Path(tmp.name) / "var" / "ias.env").chmod(0o666)      # a broken configuration: the daemon says why
            self.assertIs(needed(), False)


class SetupTest(unittest.TestCase):
    """run_setup against the local endpoint, in-process; the terminal is injected."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-setup-")
        self.addCleanup(tmp.cleanup)
        self.data = Path(tmp.name) / "var"
        self.out: list[str] = []

    def setup_run(self, server: LLMServer, key: str = "sk-test", **options) -> tuple[int, str]:
        config = load(environ={"OPENAI_API_KEY": key, "IAS_DATA_DIR": str(self.data)})
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            if "ask" in options:
                code = run_setup(config, interactive=True, out=self.out.append, **options)
            else:
                code = run_setup(config, "other", "test-model", server.base_url, out=self.out.append, **options)
        return code, stderr.getvalue()

    def test_a_passed_test_writes_the_env_file_0600(self):
        with LLMServer(list(PROBED)) as server:
            code, err = self.setup_run(server)
            server.assert_complete()
        self.assertEqual((code, err), (0, ""))
        env_file = self.data / "ias.env"
        self.assertEqual(stat.S_IMODE(env_file.stat().st_mode), 0o600)
        self.assertEqual(envfile.read(env_file), {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-test",
                                                  "IAS_MODEL": "test-model", "IAS_VISION": "0"})
        plain, tooled = server.requests
        self.assertNotIn("tools", plain)
        self.assertEqual([t["function"]["name"] for t in tooled["tools"]], [PROBE_TOOL_NAME])

    def test_a_variable_of_the_real_environment_that_would_win_is_pointed_out(self):
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_"))}
        with LLMServer(list(PROBED)) as server, mock.patch.dict(os.environ, {**environ, "IAS_MODEL": "gpt-4o"},
                                                                clear=True):
            self.assertEqual(self.setup_run(server), (0, ""))
        self.assertIn("注意：环境变量 IAS_MODEL 已设置，它优先于 ias.env 中的值；请删除它（unset IAS_MODEL）以使用刚写入的设置。",
                      self.out)
        self.assertFalse(any("OPENAI_API_KEY 已设置" in line for line in self.out))

    def test_a_failed_test_writes_nothing_and_says_why_in_one_line(self):
        cases = [("sk-wrong", [], KEY_REFUSED),
                 ("sk-test", [text("好"), text("现在是 14:00")], "没有调用工具"),
                 ("sk-test", [error(404)], "找不到模型 test-model（404）"),
                 ("sk-test", [error(400)], "拒绝了请求（400）"),
                 ("sk-test", [text("")], "没有给出回答")]
        for key, steps, reason in cases:
            with self.subTest(reason=reason), LLMServer(steps) as server:
                code, err = self.setup_run(server, key)
                server.assert_complete()
                self.assertEqual(code, 1)
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertIn(reason, err)
                self.assertTrue(err.endswith("；没有写入任何设置\n"), err)
                self.assertFalse((self.data / "ias.env").exists())

    def test_an_unreachable_endpoint(self):
        config = load(environ={"OPENAI_API_KEY": "sk-test", "IAS_DATA_DIR": str(self.data), "IAS_LLM_TIMEOUT": "5"})
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            code = run_setup(config, "other", "m", "http://127.0.0.1:9/v1", out=self.out.append)
        self.assertEqual(code, 1)
        self.assertIn("连不上 http://127.0.0.1:9/v1：请检查接口地址和网络", stderr.getvalue())

    def test_interactive_questions_the_key_unechoed_and_the_wechat_login_offered(self):
        logins = []
        for wechat in ("n", "y"):
            with self.subTest(wechat=wechat), LLMServer(list(PROBED)) as server:
                answers = iter(["9", "8", server.base_url, "test-model", wechat])      # 9 is no preset: asked again
                asked, secrets = [], []

                def ask(prompt: str) -> str:
                    asked.append(prompt)
                    return next(answers)

                def secret(prompt: str) -> str:
                    secrets.append(prompt)
                    return "sk-test"

                code, err = self.setup_run(server, ask=ask, secret=secret,
                                           login=lambda: logins.append(wechat) or 0)
                self.assertEqual((code, err), (0, ""), self.out)
        self.assertEqual(logins, ["y"])
        self.assertIn("  8) vLLM 或其他 OpenAI 兼容服务", self.out)
        self.assertIn("请输入 1 到 8 之间的编号。", self.out)
        self.assertEqual(len(secrets), 1)       # the key: asked once, without echo, never through `ask`
        self.assertFalse(any("密钥" in prompt for prompt in asked))
        self.assertEqual(envfile.read(self.data / "ias.env")["OPENAI_API_KEY"], "sk-test")

    def test_interactive_needs_a_model_when_the_preset_has_none(self):
        with LLMServer(list(PROBED)) as server:
            answers = iter(["8", server.base_url, "", "test-model", "n"])
            code, _ = self.setup_run(server, ask=lambda prompt: next(answers), secret=lambda prompt: "sk-test")
        self.assertEqual(code, 0)
        self.assertIn("需要填写模型。", self.out)
        self.assertEqual(envfile.read(self.data / "ias.env")["IAS_MODEL"], "test-model")

    def test_input_ending_cancels_and_no_terminal_is_a_usage_error(self):
        def ended(prompt):
            raise EOFError
        with LLMServer([]) as server:
            self.assertEqual(self.setup_run(server, ask=ended, secret=ended)[0], 1)
        config = load(environ={"IAS_DATA_DIR": str(self.data)})
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            self.assertEqual(run_setup(config, interactive=False), 2)
        self.assertIn("ias setup --provider NAME", stderr.getvalue())
        self.assertFalse((self.data / "ias.env").exists())


class SetupLLM(EchoLLM):
    """The echo model, which also calls the set-up's probe tool when offered."""

    def _next(self, raw: bytes) -> dict:
        step = super()._next(raw)
        if any(t["function"]["name"] == PROBE_TOOL_NAME for t in json.loads(raw).get("tools") or []):
            return calls((PROBE_TOOL_NAME, {"zone": "Asia/Shanghai"}))
        return step


@slow
class FirstRunTest(unittest.TestCase):
    """Issue 24's "Must show": from a fresh copy, `ias setup` then the daemon as `make run` starts it."""

    def setUp(self):
        self.copy = Copy()
        self.addCleanup(self.copy.remove)

    def test_setup_then_the_daemon_answers_with_nothing_exported(self):
        env_file = self.copy.root / "var" / "ias.env"
        with SetupLLM() as llm:
            wrong = self.copy.ias("setup", "--provider", "other", "--base-url", llm.base_url, "--model", "test-model",
                                  env={"OPENAI_API_KEY": "sk-wrong"})
            self.assertEqual(wrong.returncode, 1, wrong.describe())
            self.assertEqual(wrong.stderr, f"ias: {KEY_REFUSED}；没有写入任何设置\n")
            self.assertFalse(env_file.exists())

            done = self.copy.ias("setup", "--provider", "other", "--base-url", llm.base_url, "--model", "test-model",
                                 env={"OPENAI_API_KEY": "sk-test"})
            self.assertEqual(done.returncode, 0, done.describe())
            self.assertEqual(stat.S_IMODE(env_file.stat().st_mode), 0o600)
            self.assertIn(str(env_file), done.stdout)
            with env_file.open("a") as settings:      # the cluster stops with its last user: nothing left to wait out
                settings.write("IAS_PG_LINGER=0\n")

            daemon = self.copy.daemon()         # `make run`: python ias.py, the console, no OPENAI_* exported
            line = daemon.reply("你好")
            self.assertEqual(line, ECHO + "你好", daemon.stderr()[-3000:])
            daemon.send("/exit")
            self.assertEqual(daemon.proc.wait(timeout=60), 0, daemon.stderr()[-3000:])
            self.assertNotIn("Traceback", daemon.stderr())
            self.assertTrue(wait_until(lambda: not self.copy.cluster_processes(), 15),
                            f"left running after /exit: {self.copy.cluster_processes()}")

            daemon = self.copy.daemon()         # the terminal closed under it: SIGHUP
            self.assertEqual(daemon.reply("还在吗"), ECHO + "还在吗", daemon.stderr()[-3000:])
            daemon.proc.send_signal(signal.SIGHUP)
            self.assertEqual(daemon.proc.wait(timeout=60), 0, daemon.stderr()[-3000:])
            self.assertTrue(wait_until(lambda: not self.copy.cluster_processes(), 15),
                            f"left running after SIGHUP: {self.copy.cluster_processes()}")

            refused = self.copy.ias("--once", "你好", env={"OPENAI_API_KEY": "sk-wrong"})     # the environment wins
            self.assertEqual((refused.returncode, refused.stdout), (1, KEY_REFUSED + "\n"), refused.describe())


if __name__ == "__main__":
    unittest.main()
