"""The start_pc (Wake-on-LAN) user skill: the 102-byte magic packet, read back from a loopback UDP
socket (tests never broadcast), and malformed MACs and ports rejected before anyone is asked."""
from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import unittest
from pathlib import Path

from ias import jsonschema as schema, results
from ias.runner import Runner
from ias.skills import load_skill
from tests.support import REPO, SkillsTestCase

SKILL = load_skill(REPO / "skills" / "start_pc", "user")
MAC = bytes.fromhex("a0b1c2d3e4f5")
PACKET = b"\xff" * 6 + MAC * 16


class Receiver:
    """A UDP socket on 127.0.0.1, port 0: where the skill is told to send."""

    def __enter__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        return self

    def __exit__(self, *exc_info):
        self.sock.close()

    def datagrams(self, wait: float) -> list[bytes]:
        """Everything received: the first datagram may take `wait` seconds, the rest must be queued."""
        got = []
        self.sock.settimeout(wait)
        try:
            while True:
                got.append(self.sock.recv(4096))
                self.sock.settimeout(0.05)
        except (TimeoutError, socket.timeout, BlockingIOError):
            return got


class WakeOnLanTest(unittest.IsolatedAsyncioTestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="ias-wol-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_defaults(self):
        self.assertEqual(schema.apply_defaults({"mac": "a0:b1:c2:d3:e4:f5"}, SKILL.parameters),
                         {"mac": "a0:b1:c2:d3:e4:f5", "broadcast": "255.255.255.255", "port": 9})
        self.assertTrue(SKILL.high)

    async def test_magic_packet_for_every_notation(self):
        runner = Runner(repo_root=REPO, run_dir=self.tmp / "runs", environ={"PATH": os.environ["PATH"]})
        for mac in ("a0:b1:c2:d3:e4:f5", "A0-B1-C2-D3-E4-F5", "a0b1.c2d3.e4f5"):
            with self.subTest(mac=mac), Receiver() as receiver:
                params = schema.apply_defaults({"mac": mac, "broadcast": "127.0.0.1", "port": receiver.port},
                                               SKILL.parameters)
                self.assertEqual(schema.validate(params, SKILL.parameters), [])
                result = results.of_run(await runner.execute(SKILL, params))
                self.assertEqual(result, {"success": True, "mac": "a0:b1:c2:d3:e4:f5", "broadcast": "127.0.0.1",
                                          "port": receiver.port, "bytes": 102})
                self.assertEqual(await asyncio.to_thread(receiver.datagrams, 5), [PACKET])


class WakeOnLanGateTest(SkillsTestCase):
    async def test_packet_sent_after_approval(self):
        with Receiver() as receiver:
            params = {"mac": "A0-B1-C2-D3-E4-F5", "broadcast": "127.0.0.1", "port": receiver.port}
            task = asyncio.create_task(self.gate.call("owner", "start_pc", params, self.owner.notify))
            code = await self.owner.code()
            self.assertEqual(await asyncio.to_thread(receiver.datagrams, 0.1), [])          # nothing before the code
            self.assertIn("\n· MAC 地址：A0-B1-C2-D3-E4-F5\n", self.owner.messages[0])
            await self.approvals.redeem("owner", code)
            result = await asyncio.wait_for(task, 30)
            self.assertEqual(await asyncio.to_thread(receiver.datagrams, 5), [PACKET])
        self.assertTrue(result["success"], result)
        self.assertEqual(result["bytes"], 102)

    async def test_malformed_calls_never_reach_the_owner(self):
        with Receiver() as receiver:
            bad = [
                {},
                {"mac": "a0:b1:c2:d3:e4"},                  # five pairs
                {"mac": "a0:b1-c2:d3:e4:f5"},               # mixed separators
                {"mac": "g0:b1:c2:d3:e4:f5"},
                {"mac": "a0b1c2d3e4f5"},
                {"mac": "a0b1.c2d3.e4f5.0000"},
                {"mac": "a0:b1:c2:d3:e4:f5", "port": 0},
                {"mac": "a0:b1:c2:d3:e4:f5", "port": 65536},
                {"mac": "a0:b1:c2:d3:e4:f5", "port": "9"},
                {"mac": "a0:b1:c2:d3:e4:f5", "broadcast": "256.1.1.1"},
                {"mac": "a0:b1:c2:d3:e4:f5", "broadcast": "example.com"},
                {"mac": "a0:b1:c2:d3:e4:f5", "interface": "eth0"},
            ]
            for params in bad:
                with self.subTest(params=params):
                    params = {**params, **({"broadcast": "127.0.0.1"} if "broadcast" not in params else {}),
                              **({"port": receiver.port} if "port" not in params else {})}
                    result = await self.gate.call("owner", "start_pc", params, self.owner.notify)
                    self.assertFalse(result["success"])
                    self.assertTrue(result["error"].startswith("参数错误："), result)
            self.assertEqual(await asyncio.to_thread(receiver.datagrams, 0.1), [])
        self.assertEqual(self.owner.messages, [])


if __name__ == "__main__":
    unittest.main()
