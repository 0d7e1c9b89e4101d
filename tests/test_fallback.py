"""Model fallback (SPEC §12): IAS_FALLBACK_MODELS parsed into endpoints, the chain asking the next model only
when one is unavailable after its retries (on the wire, with the real `openai` client and local endpoints),
and `doctor` checking every configured model."""
import importlib
import logging
import socket
import tempfile
import unittest
from pathlib import Path

from ias.agent import APOLOGY, KEY_REFUSED
from ias.app import llm_chain
from ias.config import load
from ias.errors import ConfigError
from ias.limits import FALLBACK_MODELS_MAX
from tests.servers.llm import LLMServer, error, stall, text
from tests.support import GateTestCase, capture_logs, slow
from tests.test_daemon import DaemonTestCase

DELAYS = (0.01, 0.01)       # two retries, at once: every model is asked 1 + 2 times before the next


def closed_port_url() -> str:
    """The base URL of a local port nobody listens on (a refused connection)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


class EntriesTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-fallback-")
        self.addCleanup(tmp.cleanup)
        self.tmp = Path(tmp.name)

    def load(self, models: str | None, **env: str):
        environ = {"IAS_DATA_DIR": str(self.tmp), "OPENAI_API_KEY": "sk-primary",
                   "OPENAI_BASE_URL": "https://primary.example/v1", **env}
        if models is not None:
            environ["IAS_FALLBACK_MODELS"] = models
        return load(environ=environ)

    def test_good_forms(self):
        config = self.load(" deepseek-chat ,http://127.0.0.1:11434/v1| qwen2.5:7b , https://api.example.cn/v1 |Qwen/Qwen2.5-72B",
                           IAS_FALLBACK_KEY_2="sk-second")
        self.assertEqual([(e.base_url, e.model, e.key, e.key_from) for e in config.fallback_models], [
            ("https://primary.example/v1", "deepseek-chat", "sk-primary", "OPENAI_API_KEY"),
            ("http://127.0.0.1:11434/v1", "qwen2.5:7b", "sk-second", "IAS_FALLBACK_KEY_2"),
            ("https://api.example.cn/v1", "Qwen/Qwen2.5-72B", "sk-primary", "OPENAI_API_KEY")])
        self.assertNotIn("sk-", repr(config.fallback_models))
        self.assertEqual(self.load(None).fallback_models, ())
        self.assertEqual(self.load("m").fallback_models[0].base_url, "https://primary.example/v1")
        self.assertIsNone(load(environ={"IAS_DATA_DIR": str(self.tmp), "IAS_FALLBACK_MODELS": "m"})
                          .fallback_models[0].base_url)        # no OPENAI_BASE_URL: the SDK's default, as the primary's

    def test_errors_name_the_entry(self):
        cases = {"a,,b": "entry 2 is empty", "a,": "entry 2 is empty", " , a": "entry 1 is empty",
                 "a|b|c": r"entry 1 \('a\|b\|c'\): write `model` or `base_url\|model`",
                 "m,ftp://h/v1|n": r"entry 2 \('ftp://h/v1\|n'\): the base URL must be an http:// or https:// URL",
                 "host.example|m": "entry 1 .*the base URL must be", "http://|m": "entry 1 .*the base URL must be",
                 "http://h:99999/v1|m": "entry 1 .*the base URL must be",
                 "http://user:secret@h/v1|m": r"entry 1 .*\(and no user:password@\)",
                 "https://h/v1": r"entry 1 \('https://h/v1'\): no model name", "https://h/v1|": "entry 1 .*no model name",
                 "gpt 4o": "entry 1 .*no spaces or control characters",
                 ",".join("m" * (FALLBACK_MODELS_MAX + 1)): f"has {FALLBACK_MODELS_MAX + 1} entries; at most "
                                                            f"{FALLBACK_MODELS_MAX}"}
        for models, message in cases.items():
            with self.subTest(models), self.assertRaisesRegex(ConfigError, "IAS_FALLBACK_MODELS " + message):
                self.load(models)

    def test_a_key_for_no_entry_is_an_error(self):
        with self.assertRaisesRegex(ConfigError, "IAS_FALLBACK_KEY_2 is set but IAS_FALLBACK_MODELS has 1 entries"):
            self.load("m", IAS_FALLBACK_KEY_2="sk-x")
        with self.assertRaisesRegex(ConfigError, "IAS_FALLBACK_KEY_1 is set but IAS_FALLBACK_MODELS has 0 entries"):
            self.load(None, IAS_FALLBACK_KEY_1="sk-x")
        with self.assertRaisesRegex(ConfigError, "IAS_FALLBACK_KEY_01 is set"):
            self.load("m", IAS_FALLBACK_KEY_01="sk-x")
        self.assertEqual(self.load("m", IAS_FALLBACK_KEY_2="").fallback_models[0].key, "sk-primary")   # blank: unset

    def test_ias_toml_names_them_and_the_environment_overrides_it(self):
        toml = self.tmp / "ias.toml"
        toml.write_text('fallback_models = "a, http://127.0.0.1:8000/v1|b"\n', encoding="utf-8")
        config = load(toml, environ={"IAS_DATA_DIR": str(self.tmp), "OPENAI_API_KEY": "sk-primary"})
        self.assertEqual([(e.base_url, e.model) for e in config.fallback_models],
                         [(None, "a"), ("http://127.0.0.1:8000/v1", "b")])
        config = load(toml, environ={"IAS_DATA_DIR": str(self.tmp), "IAS_FALLBACK_MODELS": "c"})
        self.assertEqual([e.model for e in config.fallback_models], ["c"])
        toml.write_text('fallback_key_1 = "sk-x"\n', encoding="utf-8")
        with self.assertRaisesRegex(ConfigError, "unknown setting 'fallback_key_1'"):    # a key is never in the file
            load(toml, environ={"IAS_DATA_DIR": str(self.tmp)})


class ChainTest(GateTestCase):
    """The agent over `app.llm_chain`: a primary and a fallback endpoint, the real client, retries at once."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        importlib.import_module("openai")       # the first request's import is not part of a turn

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.primary = LLMServer().start()
        self.backup = LLMServer().start()
        for server in (self.primary, self.backup):
            self.addCleanup(server.close)
        self.records = capture_logs(self)

    async def asyncTearDown(self):
        await super().asyncTearDown()
        self.primary.check()
        self.backup.check()

    async def turn(self, primary_url: str | None = None, key: str = "sk-test", **env: str) -> str:
        """One turn through the chain configured as the environment would: the primary model, then the backup."""
        environ = {"IAS_DATA_DIR": str(self.tmp), "OPENAI_API_KEY": key, "IAS_MODEL": "primary-model",
                   "OPENAI_BASE_URL": primary_url or self.primary.base_url,
                   "IAS_FALLBACK_MODELS": f"{self.backup.base_url}|backup-model", **env}
        models = llm_chain(load(environ=environ), retry_delays=DELAYS)
        self.addAsyncCleanup(models.close)
        return await self.build(llm=models).agent.turn("owner", "你好", None)

    def switches(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING and "fallback" in r.getMessage()]

    async def test_a_primary_answering_500_hands_the_turn_to_the_fallback(self):
        self.primary.script(error(500), error(502), error(503))
        self.backup.script(text("备用模型的回答"))
        self.assertEqual(await self.turn(), "备用模型的回答")      # nothing in the reply says which model
        self.assertEqual(len(self.primary.requests), 3)             # 1 + its 2 retries first
        self.assertEqual([r["model"] for r in self.backup.requests], ["backup-model"])
        self.assertEqual(self.backup.requests[0]["messages"][-1], {"role": "user", "content": "你好"})
        self.assertEqual(self.switches(), ["LLM model primary-model failed (LLM endpoint failed 3 times: "
                                           "InternalServerError); trying fallback backup-model"])
        self.assertFalse([r for r in self.records if "sk-test" in r.getMessage()])

    async def test_429_and_a_refused_connection_fall_back(self):
        self.primary.script(error(429), error(429), error(429))
        self.backup.script(text("一"), text("二"))
        self.assertEqual(await self.turn(), "一")
        self.assertEqual(await self.turn(closed_port_url()), "二")
        self.assertEqual(len(self.primary.requests), 3)
        self.assertRegex(self.switches()[1], r"^LLM model primary-model failed \(LLM endpoint failed 3 times: "
                                             r"APIConnectionError\); trying fallback backup-model$")

    async def test_a_primary_past_its_deadline_falls_back(self):
        """Each attempt ends at IAS_LLM_TIMEOUT (here 1 s), whatever the endpoint does: then the fallback."""
        self.primary.script(stall(), stall(), stall())
        self.backup.script(text("及时的回答"))
        self.assertEqual(await self.turn(IAS_LLM_TIMEOUT="1"), "及时的回答")
        self.assertIn("(LLM endpoint failed 3 times: no complete reply within the deadline)", self.switches()[0])

    async def test_the_chain_offers_what_an_llm_does(self):
        """The primary's name and model list (doctor asks each member itself); warm and close reach them."""
        models = llm_chain(load(environ={"IAS_DATA_DIR": str(self.tmp), "OPENAI_API_KEY": "sk-test",
                                         "OPENAI_BASE_URL": self.primary.base_url, "IAS_MODEL": "primary-model",
                                         "IAS_FALLBACK_MODELS": f"a, {self.backup.base_url}|b"}))
        self.assertEqual((models.model, [m.model for m in models.fallbacks]), ("primary-model", ["a", "b"]))
        self.assertEqual([m.base_url for m in models.members], [self.primary.base_url] * 2 + [self.backup.base_url])
        models.warm()
        self.assertEqual(await models.models(), ["test-model"])
        await models.fallbacks[1].models()
        await models.close()
        self.assertTrue(all(m._client is None or m._client.is_closed() for m in models.members))

    async def test_the_fallback_s_own_key_is_the_one_it_is_sent(self):
        """Entry 1's key from IAS_FALLBACK_KEY_1 (the primary's would be refused by this endpoint)."""
        self.backup.script(text("用自己的密钥"))
        self.assertEqual(await self.turn(closed_port_url(), key="sk-wrong", IAS_FALLBACK_KEY_1="sk-test"),
                         "用自己的密钥")

    async def test_a_fallback_s_refused_key_is_told_by_its_own_name(self):
        """The primary is down and the fallback refuses its key: the owner is told which variable to fix."""
        self.assertEqual(await self.turn(closed_port_url(), IAS_FALLBACK_KEY_1="sk-wrong"),
                         "大模型服务拒绝了密钥：请检查 IAS_FALLBACK_KEY_1")

    async def test_a_refused_key_is_told_and_never_falls_back(self):
        self.assertEqual(await self.turn(key="sk-wrong", IAS_FALLBACK_KEY_1="sk-test"), KEY_REFUSED)
        self.primary.script(error(403))
        self.assertEqual(await self.turn(), KEY_REFUSED)
        self.assertEqual((len(self.primary.requests), self.backup.requests), (1, []))
        self.assertEqual(self.switches(), [])

    async def test_other_4xx_never_fall_back(self):
        for status in (400, 404, 409, 422):
            self.primary.script(*[error(status)] * (3 if status == 409 else 1))    # a 409 is retried, not passed on
            self.assertEqual(await self.turn(), APOLOGY, status)
        self.assertEqual((len(self.primary.requests), self.backup.requests), (6, []))
        self.assertEqual(self.switches(), [])

    async def test_every_model_failing_is_the_usual_apology(self):
        self.primary.script(error(500), error(500), error(500))
        self.backup.script(error(502), error(502), error(502))
        self.assertEqual(await self.turn(), APOLOGY)
        self.assertEqual((len(self.primary.requests), len(self.backup.requests)), (3, 3))
        self.assertEqual(len(self.switches()), 1)


@slow
class CommandsTest(DaemonTestCase):
    def test_once_answers_from_the_fallback_when_the_primary_is_down(self):
        """`--once` with the default retry delays (1 s and 4 s) against a primary nobody listens on."""
        with LLMServer([text("备用模型的回答")]) as backup:
            result = self.ias("--once", "你好", env={"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": closed_port_url(),
                                                    "IAS_FALLBACK_MODELS": f"{backup.base_url}|backup-model"})
        self.assertEqual((result.returncode, result.stdout), (0, "备用模型的回答\n"), result.stderr)
        self.assertIn("trying fallback backup-model", result.stderr)
        self.assertNotIn("sk-test", result.stderr)

    def test_doctor_checks_every_model(self):
        with LLMServer([], models=("main-model",)) as primary, LLMServer([], models=("backup-model",)) as backup:
            result = self.ias("doctor", env={
                "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": primary.base_url, "IAS_MODEL": "main-model",
                "IAS_FALLBACK_MODELS": f"{backup.base_url}|backup-model, {backup.base_url}|other-model, "
                                       f"{backup.base_url}|backup-model, {closed_port_url()}|m",
                "IAS_FALLBACK_KEY_3": "sk-wrong"})
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        lines = [line for line in result.stdout.splitlines() if line[6:].startswith("llm")]
        self.assertEqual(lines[:4], [
            f"ok    llm: {primary.base_url}: 1 models, main-model found",
            f"ok    llm fallback 1: {backup.base_url}: 1 models, backup-model found",
            f"warn  llm fallback 2: {backup.base_url}: model other-model is not among the 1 models it lists; "
            "fix entry 2 of IAS_FALLBACK_MODELS",
            f"FAIL  llm fallback 3: {backup.base_url}: 大模型服务拒绝了密钥：请检查 IAS_FALLBACK_KEY_3"])
        self.assertRegex(lines[4], r"^FAIL  llm fallback 4: http://127.0.0.1:\d+/v1 unreachable \(\w+\)$")
        self.assertEqual(len(lines), 5)
        self.assertNotIn("sk-", result.stdout + result.stderr)


if __name__ == "__main__":
    unittest.main()
