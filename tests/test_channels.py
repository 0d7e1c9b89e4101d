"""The Channel contract, run on every channel (huey's StorageTests pattern): the console, WeChat (against
the local iLink server, tests/servers/ilink.py) and the test channel `FakeChannel`; and the rules in
ias/channels/base.py (text splitting, the send budget) that the outbox and direct sends share."""
import ast
import asyncio
import io
import shutil
import tempfile
import unittest
from pathlib import Path

from ias import limits
from ias.channels.base import FAILED, SENT, SHUT, UNKNOWN, Channel, Window, budget, capped, split_text
from ias.channels.console import ConsoleChannel
from ias.channels.wechat.cdn import CDN
from ias.channels.wechat.channel import BUDGET_NOTE
from ias.channels.wechat.media import Media
from ias.inbox import Inbox
from ias.outbox import Outbox
from tests.support import REPO, FakeChannel
from tests.test_wechat import WeChatTestCase

CONFIRMATION = "iAs 需要你的确认\n\n技能：mark_high\n参数：\n（无）\n\n确认码：123456"


class ChannelContract:
    """What the outbox and the router rely on, for a channel built by `make()`. A case provides `make()`
    (the channel, ready to send to `self.user`), `refuse()` (its next post fails), `arrived()` (the parts
    the other end got, in order) and, for a channel with a window, `owner_writes()`. `windowed` and
    `resumable` say what the channel is."""

    windowed = False
    resumable = False

    async def make(self) -> Channel:
        raise NotImplementedError

    def refuse(self) -> None:
        raise NotImplementedError

    def arrived(self) -> list[str]:
        raise NotImplementedError

    async def owner_writes(self) -> None:
        """The owner writes: a window opens and the budget starts again (only for a windowed channel)."""
        raise NotImplementedError

    async def test_post_outcomes(self):
        channel = await self.make()
        self.assertEqual(await channel.post(self.user, "第一条", "ias-contract-1"), SENT)
        self.assertEqual(self.arrived()[-1], "第一条")
        self.refuse()
        self.assertIn(await channel.post(self.user, "被拒绝", "ias-contract-2"), (SHUT, FAILED, UNKNOWN))

    async def test_send_is_true_once_delivered_and_false_when_refused_or_blank(self):
        channel = await self.make()
        self.assertTrue(await channel.send(self.user, "收到"))
        self.assertEqual(self.arrived()[-1], "收到")
        self.assertFalse(await channel.send(self.user, "  \n "))
        self.refuse()
        self.assertFalse(await channel.send(self.user, "这条被拒绝"))

    async def test_room_and_budget(self):
        channel = await self.make()
        room, why = await channel.room(self.user)
        if channel.budget_note is None:
            self.assertEqual((room, why), (None, None))
            for i in range(limits.WECHAT_SEND_BUDGET + 2):      # no budget: everything goes
                self.assertTrue(await channel.send(self.user, f"第{i}条"))
            return
        self.assertIsInstance(room, int)
        self.assertGreater(room, 1)
        for i in range(room - 1):                               # the last place is kept for the note
            self.assertTrue(await channel.send(self.user, f"第{i}条"))
        self.assertEqual(await channel.room(self.user), (1, None))
        self.assertFalse(await channel.send(self.user, "放不下了"))
        self.assertEqual(self.arrived()[-1], channel.budget_note)
        self.assertEqual(await channel.room(self.user), (0, "budget"))
        self.assertFalse(await channel.send(self.user, "还是放不下"))
        self.assertEqual(self.arrived()[-1], channel.budget_note)

    async def test_window_state(self):
        channel = await self.make()
        window = await channel.window(self.user)
        if not self.windowed:
            self.assertIsNone(window)
            await channel.mark_asked(self.user)                 # nothing to mark, and no error
            self.assertIsNone(await channel.window(self.user))
            return
        self.assertIsInstance(window, Window)
        room, _ = await channel.room(self.user)
        self.assertEqual(window.left, room)
        self.assertLessEqual(window.closes - window.opened, window.length)
        self.assertFalse(window.asked)
        await channel.mark_asked(self.user)
        self.assertTrue((await channel.window(self.user)).asked)
        await self.owner_writes()                               # a new window: the keeper may ask again
        self.assertFalse((await channel.window(self.user)).asked)

    async def test_confirmation_delivery(self):
        channel = await self.make()
        self.assertTrue(channel.can_confirm())
        outbox = Outbox(None, {channel.name: channel}, channel.name)     # urgent() never touches the store
        self.assertIs(await outbox.urgent(self.user, channel.name, CONFIRMATION, "mark_high", 60), True)
        self.assertEqual(self.arrived()[-1], CONFIRMATION)
        self.refuse()
        held = await outbox.urgent(self.user, channel.name, CONFIRMATION, "mark_high", 60)
        if self.windowed:       # held until the owner writes
            self.assertIsInstance(held, asyncio.Event)
            self.assertFalse(held.is_set())
        else:                   # writing would not change anything
            self.assertIs(held, False)

    async def test_resumable(self):
        channel = await self.make()
        self.assertIs(channel.resumable, self.resumable)

    async def test_long_text_is_split_at_text_max(self):
        channel = await self.make()
        before = len(self.arrived())
        lines = [f"第{i}行：" + "字" * 90 for i in range(100)]         # 9 500 characters
        text = "\n".join(lines)
        self.assertTrue(await channel.send(self.user, text))
        parts = self.arrived()[before:]
        self.assertEqual("\n".join(parts), text)
        if channel.text_max is None:
            self.assertEqual(parts, [text])
        else:
            self.assertGreater(len(parts), 1)
            self.assertTrue(all(len(part) <= channel.text_max for part in parts))


class FileContract:
    """`send_file`, for a case of ChannelContract that also provides `files_arrived()`: the (name, bytes) of
    each file the other end got, in order. A channel whose images carry no name (`names_images` False: a
    WeChat image item has none) shows None for an image's name."""
    names_images = True

    def files_arrived(self) -> list[tuple[str, bytes]]:
        raise NotImplementedError

    def a_file(self, name: str, data: bytes) -> Path:
        directory = Path(tempfile.mkdtemp(prefix="ias-channel-file-"))
        self.addCleanup(shutil.rmtree, directory, True)
        path = directory / name
        path.write_bytes(data)
        return path

    async def test_send_file_outcomes(self):
        channel = await self.make()
        png = self.a_file("图表.png", b"\x89PNG\r\n\x1a\n" + bytes(200))
        self.assertEqual(await channel.send_file(self.user, png, None, "ias-contract-file-1"), SENT)
        self.assertEqual(self.files_arrived()[-1], ("图表.png" if self.names_images else None, png.read_bytes()))
        self.refuse()
        self.assertIn(await channel.send_file(self.user, png, None, "ias-contract-file-2"), (SHUT, FAILED, UNKNOWN))

    async def test_a_caption_goes_first_as_a_text_of_its_own(self):
        channel = await self.make()
        pdf = self.a_file("report.pdf", b"%PDF-1.4\n%%EOF\n")
        texts = len(self.arrived())
        self.assertEqual(await channel.send_file(self.user, pdf, "本月报告", "ias-contract-file-3"), SENT)
        self.assertEqual(self.arrived()[texts], "本月报告")
        self.assertEqual(self.files_arrived()[-1], ("report.pdf", pdf.read_bytes()))


class _Writes(io.StringIO):
    """A stdout that remembers each write (one per part) and can be closed under the console."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


class ConsoleContractTest(ChannelContract, FileContract, unittest.IsolatedAsyncioTestCase):
    user = "owner"

    def files_arrived(self) -> list[tuple[str, bytes]]:
        paths = [Path(line.removeprefix("[文件] ")) for line in self.arrived() if line.startswith("[文件] ")]
        self.assertTrue(all(path.is_absolute() for path in paths))
        return [(path.name, path.read_bytes()) for path in paths]

    async def make(self) -> Channel:
        self.stdout = _Writes()
        return ConsoleChannel(self.user, stdin=io.StringIO(""), stdout=self.stdout, interactive=True)

    def refuse(self) -> None:
        self.stdout.close()

    def arrived(self) -> list[str]:
        return [text.removesuffix("\n") for text in self.stdout.writes]


class FakeChannelContractTest(ChannelContract, FileContract, unittest.IsolatedAsyncioTestCase):
    user = "owner"

    def files_arrived(self) -> list[tuple[str, bytes]]:
        return [(name, data) for _, name, data, _, _ in self.channel.files]

    async def make(self) -> Channel:
        self.channel = FakeChannel("fake")
        return self.channel

    def refuse(self) -> None:
        self.channel.deliver = False

    def arrived(self) -> list[str]:
        return [text for _, text in self.channel.sent]


class WeChatContractTest(ChannelContract, FileContract, WeChatTestCase):
    windowed = True
    resumable = True
    names_images = False

    async def make(self) -> Channel:
        self.user = self.server.owner
        self.inbox = Path(tempfile.mkdtemp(prefix="ias-channel-inbox-"))
        self.addCleanup(shutil.rmtree, self.inbox, True)
        channel = await self.channel(media=Media(CDN(self.server.cdn_url), Inbox(self.inbox, 10 * 1024 * 1024)))
        await self.inbound()
        return channel

    def files_arrived(self) -> list[tuple[str | None, bytes]]:
        return [(name, data) for _, name, data in self.server.received_files()]

    def refuse(self) -> None:
        self.server.send_replies.extend([{"ret": -2, "errmsg": "refused"}] * 2)

    def arrived(self) -> list[str]:
        return [m["item_list"][0]["text_item"]["text"] for m in self.server.sent if m["item_list"][0]["type"] == 1]

    async def owner_writes(self) -> None:
        self.clock.advance(60)
        await self.inbound("又来了")

    async def test_the_budget_note_is_the_wechat_one(self):
        channel = await self.make()
        self.assertEqual(channel.budget_note, BUDGET_NOTE)


class RulesTest(unittest.TestCase):
    def test_split_text(self):
        self.assertEqual(split_text("x" * 9000), ["x" * 4000, "x" * 4000, "x" * 1000])
        self.assertEqual(split_text("  \n "), [])
        self.assertEqual(split_text("a" * 6 + "\n" + "b" * 3, 8), ["a" * 6, "b" * 3])     # at the line break
        self.assertEqual(split_text("a\n" + "b" * 9, 8), ["a\nbbbbbb", "bbb"])            # not in the first half
        self.assertEqual(split_text("x" * 9000, None), ["x" * 9000])

    def test_capped(self):
        self.assertEqual(capped(["a", "b"], 2), ["a", "b"])
        self.assertEqual(capped(["a", "bb", "ccc"], 2), ["a", "（内容过长，其余 5 字未发送）"])

    def test_budget(self):
        self.assertEqual(budget(5, None, "note"), (5, False))       # no limit
        self.assertEqual(budget(3, 3, "note"), (3, False))          # all fit: no note
        self.assertEqual(budget(5, 3, "note"), (2, True))           # the last place is the note
        self.assertEqual(budget(5, 1, "note"), (0, True))
        self.assertEqual(budget(5, 0, "note"), (0, False))          # spent: nothing, not even the note
        self.assertEqual(budget(5, 3, None), (3, False))            # without a note, what fits


def _ias_sources():
    for path in sorted((REPO / "ias").rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


class HonestInterfaceTest(unittest.TestCase):
    """Issue 23: the outbox asked getattr/hasattr of its channels, and wechat.py imported the outbox."""

    def test_nothing_in_ias_probes_a_channel_with_getattr_or_hasattr(self):
        probes = []
        for path, tree in _ias_sources():
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and node.func.id in ("getattr", "hasattr") and node.args \
                        and "channel" in ast.unparse(node.args[0]).lower():
                    probes.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
        self.assertEqual(probes, [])

    def test_channels_import_nothing_from_the_floors_above(self):
        above = {"outbox", "router", "approval", "agent", "gate", "app", "daemon", "scheduler", "cli"}
        found = []
        for path, tree in _ias_sources():
            if "channels" not in path.relative_to(REPO / "ias").parts:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    names = (node.module or "").split(".") + [alias.name for alias in node.names]
                elif isinstance(node, ast.Import):
                    names = [part for alias in node.names for part in alias.name.split(".")]
                else:
                    continue
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {name}" for name in names if name in above]
        self.assertEqual(found, [])


if __name__ == "__main__":
    unittest.main()
