"""ias.sdk: a package whose `__init__` is deferred behaves as if it had run (once, on first use, also under
threads and failures); the real SDK imported that way answers a chat completion with tools, its errors and its
type packages intact, in a fresh interpreter; a plain-HTTP endpoint's TLS context trusts nothing."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest
from pathlib import Path

from ias import sdk
from tests.servers.llm import LLMServer, calls, error, text

REPO = Path(__file__).resolve().parent.parent


class DeferredPackageTest(unittest.TestCase):
    """A synthetic package `deferme` (a subpackage `deferme.sub` with a module `leaf`), imported under
    `sdk.deferring`: each `__init__` records in `deferme_log` when it runs."""

    def setUp(self):
        root = Path(tempfile.mkdtemp(prefix="ias-sdk-"))
        self.addCleanup(shutil.rmtree, root, True)
        self.addCleanup(lambda: [sys.modules.pop(n) for n in list(sys.modules) if n.startswith("deferme")])
        self.addCleanup(sys.path.remove, str(root))
        sys.path.insert(0, str(root))
        (root / "deferme" / "sub").mkdir(parents=True)
        (root / "deferme" / "__init__.py").write_text(
            "import builtins\nbuiltins.deferme_log.append('deferme')\nfrom .sub.leaf import Leaf\nVALUE = 42\n")
        (root / "deferme" / "sub" / "__init__.py").write_text(
            "import builtins\nbuiltins.deferme_log.append('sub')\nfrom .leaf import Leaf\n")
        (root / "deferme" / "sub" / "leaf.py").write_text("class Leaf:\n    pass\n")
        import builtins
        builtins.deferme_log = self.log = []
        self.addCleanup(delattr, builtins, "deferme_log")
        self.root = root

    def test_an_init_runs_on_the_first_attribute_read_and_only_once(self):
        with sdk.deferring("deferme"):
            deferme = importlib.import_module("deferme")
            leaf = importlib.import_module("deferme.sub.leaf")      # a submodule: neither __init__ runs for it
        self.assertEqual(self.log, [])
        self.assertEqual(deferme.VALUE, 42)
        self.assertEqual(self.log, ["deferme"])                    # it imported deferme.sub.leaf only
        self.assertIs(deferme.Leaf, leaf.Leaf)
        from deferme.sub import Leaf
        self.assertIs(Leaf, leaf.Leaf)
        self.assertEqual(self.log, ["deferme", "sub"])
        with self.assertRaisesRegex(AttributeError, "has no attribute 'missing'"):
            deferme.missing
        self.assertIn("VALUE = 42", deferme.__loader__.get_source("deferme"))      # the real loader's, still

    def test_threads_reading_at_once_see_one_run(self):
        with sdk.deferring("deferme"):
            deferme = importlib.import_module("deferme")
        seen, start = [], threading.Barrier(8)

        def read():
            start.wait()
            seen.append(deferme.VALUE)
        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual((seen, self.log.count("deferme")), ([42] * 8, 1))

    def test_a_failing_init_raises_and_is_tried_again(self):
        init = self.root / "deferme" / "__init__.py"
        init.write_text("import builtins\nbuiltins.deferme_log.append('try')\nif len(builtins.deferme_log) < 2:\n"
                        "    raise RuntimeError('not yet')\nVALUE = 7\n")
        with sdk.deferring("deferme"):
            deferme = importlib.import_module("deferme")
        with self.assertRaisesRegex(RuntimeError, "not yet"):
            deferme.VALUE
        self.assertEqual((deferme.VALUE, self.log), (7, ["try", "try"]))

    def test_outside_the_block_packages_import_as_usual(self):
        with sdk.deferring("deferme"):
            pass
        importlib.import_module("deferme")
        self.assertEqual(self.log, ["deferme", "sub"])


# Run in a fresh interpreter: this test process imported the SDK the usual way already.
REAL_SDK = """
import asyncio, json, sys
from ias import sdk
openai = sdk.load()
deferred = "openai.types.responses.response" not in sys.modules
async def main():
    client = sdk.client({"api_key": "sk-test", "base_url": sys.argv[1], "max_retries": 0})
    first = await sdk.chat(client, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    second = await sdk.chat(client, {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": tools})
    try:
        await sdk.chat(client, {"model": "m", "messages": []})
        failed = None
    except openai.APIStatusError as exc:
        failed = [type(exc).__name__, exc.status_code]
    await client.close()
    call = second.choices[0].message.tool_calls[0]
    print(json.dumps({"deferred": deferred, "text": first.choices[0].message.content,
                      "call": [call.function.name, json.loads(call.function.arguments)], "failed": failed,
                      "types": [openai.types.Batch.__name__, openai.types.chat.ChatCompletion is type(first)]}))
asyncio.run(main())
"""


class RealSdkTest(unittest.TestCase):
    def test_the_sdk_imported_deferred_answers_chat_completions_and_errors(self):
        with LLMServer([text("你好"), calls(("f", {"x": 1})), error(401)]) as server:
            done = subprocess.run([sys.executable, "-c", REAL_SDK, server.base_url], cwd=REPO, capture_output=True,
                                  text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
            self.assertEqual(done.returncode, 0, done.stderr)
            sent = [json.loads(raw) for raw in server.raw]
        self.assertEqual(json.loads(done.stdout), {
            "deferred": True, "text": "你好", "call": ["f", {"x": 1}], "failed": ["AuthenticationError", 401],
            "types": ["Batch", True]})
        self.assertEqual(sent[1]["tools"][0]["function"]["name"], "f")         # the body as iAs built it
        self.assertEqual(sent[0]["messages"], [{"role": "user", "content": "hi"}])


class TlsContextTest(unittest.TestCase):
    def test_a_plain_http_endpoint_gets_a_context_that_trusts_nothing(self):
        context = sdk.tls_context("HTTP://127.0.0.1:11434/v1")
        self.assertEqual((context.verify_mode, context.check_hostname), (ssl.CERT_REQUIRED, True))
        self.assertEqual(context.cert_store_stats()["x509_ca"], 0)

    def test_any_other_endpoint_keeps_the_sdk_s_own(self):
        for base_url in (None, "", "https://api.deepseek.com/v1", "https://127.0.0.1:8443/v1"):
            self.assertIsNone(sdk.tls_context(base_url), base_url)


if __name__ == "__main__":
    unittest.main()
