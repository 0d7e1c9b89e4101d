"""Files to the owner (issue 26, out): a skill's result naming files, copied out of its run before HOME goes,
refused when hostile, queued in the outbox after the reply (caption first), held while the window is shut,
never sent twice across a restart; the approval message's file parameter; the shipped bar_chart skill."""
import hashlib
import json
import os
import stat
import time
import uuid
from pathlib import Path

from ias import limits, outgoing
from ias.approval import render
from ias.channels.base import SHUT, Inbound
from ias.outbox import FILE_TEXT
from ias.skills import load_skill
from ias.store import Approval
from tests.support import FIXTURES, REPO, FakeChannel, GateTestCase, ScriptedLLM, answer, ask, until

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PDF = b"%PDF-1.4\n" + "月报 ".encode() * 500 + b"\n%%EOF\n"


class WindowedChannel(FakeChannel):
    """A FakeChannel with a send window: shut (SHUT, no room) until `open` is set, as WeChat's after 24 h."""
    resumable = True

    def __init__(self, name: str = "wechat"):
        super().__init__(name)
        self.open = False

    async def room(self, user_id: str):
        return (None, None) if self.open else (0, "window")

    async def post(self, user_id: str, text: str, client_id: str) -> str:
        return await super().post(user_id, text, client_id) if self.open else SHUT

    async def send_file(self, user_id: str, path: Path, caption, client_id: str) -> str:
        return await super().send_file(user_id, path, caption, client_id) if self.open else SHUT


class MediaOutTestCase(GateTestCase):
    user_skills = FIXTURES / "media"

    def copies(self) -> list[Path]:
        """The private copies waiting in $IAS_DATA_DIR/outgoing."""
        root = self.app.config.outgoing
        return sorted(root.glob("*/*")) if root.exists() else []

    def texts(self, channel: FakeChannel) -> list[str]:
        return [text for _, text in channel.sent]


class FilesThroughTheTurnTest(MediaOutTestCase):
    async def test_a_png_and_a_pdf_reach_the_channel_after_the_reply_in_order_each_after_its_caption(self):
        llm = ScriptedLLM(ask(("send_files", {"case": "png_pdf"})), answer("图表和月报发给你了"))
        channel = FakeChannel("wechat")
        self.use(self.build(llm=llm, channels=[channel], primary=channel))
        await self.router.deliver(Inbound("wechat", "owner", "把本周用电画出来"))
        await until(lambda: len(channel.files) == 2 and self.router.dispatching == 0)
        self.assertEqual(self.texts(channel), ["图表和月报发给你了", "本周用电", "月报"])
        self.assertEqual([(name, data, after) for _, name, data, _, after in channel.files],
                         [("chart.png", PNG, 2), ("report.pdf", PDF, 3)])         # each right after its caption
        llm.assert_complete()
        seen = json.loads(llm.requests[1]["messages"][-1]["content"])
        self.assertEqual(seen["files"], [{"name": "chart.png", "size": len(PNG), "caption": "本周用电"},
                                         {"name": "report.pdf", "size": len(PDF), "caption": "月报"}])
        self.assertNotIn(str(self.tmp), json.dumps(seen, ensure_ascii=False))     # never the private copy's path
        rows = self.sql("SELECT text, state, file_path IS NOT NULL FROM outbox ORDER BY id")
        self.assertEqual(rows, [("图表和月报发给你了", "sent", False), ("本周用电", "sent", False),
                                (FILE_TEXT.format(name="chart.png"), "sent", True), ("月报", "sent", False),
                                (FILE_TEXT.format(name="report.pdf"), "sent", True)])

    async def test_the_copies_are_private_and_the_run_directory_is_gone(self):
        result = await self.gate.call("owner", "send_files", {"case": "png_pdf"}, for_owner=(files := []))
        self.assertTrue(result["success"])
        self.assertEqual([Path(f.path).read_bytes() for f in files], [PNG, PDF])
        for copy in self.copies():
            self.assertEqual(stat.S_IMODE(copy.stat().st_mode), 0o600)
            self.assertEqual(stat.S_IMODE(copy.parent.stat().st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(self.app.config.outgoing.stat().st_mode), 0o700)
        self.assertEqual(os.listdir(self.app.config.run_dir), [])

    async def test_a_caller_that_cannot_send_files_leaves_no_copy(self):
        result = await self.gate.call("owner", "send_files", {"case": "png_pdf"})        # /run, ias run
        self.assertEqual(len(result["files"]), 2)
        self.assertEqual(result["files_note"], "这些文件没有发送：这里不能发送文件")
        self.assertEqual(self.copies(), [])

    async def test_a_file_from_the_inbox_may_be_sent(self):
        photo = self.app.config.inbox / "2026-12-03" / "photo.jpg"
        photo.parent.mkdir(parents=True)
        photo.write_bytes(b"\xff\xd8jpeg")
        result = await self.gate.call("owner", "send_files", {"case": "inbox", "path": str(photo)}, for_owner=(files := []))
        self.assertEqual(result["files"], [{"name": "photo.jpg", "size": 6}])
        self.assertEqual(Path(files[0].path).read_bytes(), b"\xff\xd8jpeg")


class RefusedFilesTest(MediaOutTestCase):
    async def test_outside_a_link_out_of_home_a_fifo_and_an_oversized_file_are_refused_and_the_model_told(self):
        result = await self.gate.call("owner", "send_files", {"case": "hostile"}, for_owner=(files := []))
        self.assertTrue(result["success"])                  # the call stands
        self.assertEqual(result["output"], "done")
        self.assertEqual([f.name for f in files], ["ok.png"])
        self.assertEqual(result["files"], [{"name": "ok.png", "size": len(PNG)}])
        self.assertEqual([r["error"] for r in result["files_refused"]], [
            "未发送：路径不在技能的 HOME 或主人的收件箱中", "未发送：路径含符号链接或文件有硬链接", "未发送：不是普通文件",
            f"未发送：文件超过 {limits.MEDIA_SEND_MAX >> 20} MB"])
        self.assertEqual(result["files_refused"][0]["path"], "/etc/hostname")
        self.assertEqual(len(self.copies()), 1)             # only ok.png was copied out

    async def test_dot_dot_a_linked_directory_a_relative_path_a_bad_entry_a_hard_link_and_too_many_files(self):
        result = await self.gate.call("owner", "send_files", {"case": "more"}, for_owner=(files := []))
        self.assertEqual(files, [])
        self.assertNotIn("files", result)
        link = "未发送：路径含符号链接或文件有硬链接"
        self.assertEqual([r["error"] for r in result["files_refused"]], [
            "未发送：路径不在技能的 HOME 或主人的收件箱中", link, "未发送：路径不在技能的 HOME 或主人的收件箱中",
            '未发送：每项应为 {"path": "…", "caption": "…"}', link,
            f"未发送：一次最多发送 {limits.MEDIA_SEND_FILES_MAX} 个文件（其余 2 个）"])
        self.assertEqual(self.copies(), [])
        self.assertEqual(os.listdir(self.app.config.run_dir), [])

    async def test_a_stored_row_naming_a_file_that_is_no_copy_of_ours_is_never_sent(self):
        channel = FakeChannel("wechat")
        self.use(self.build(channels=[channel], primary=channel))
        now = self.app.outbox.now()
        await self.store.enqueue("owner", "wechat", "reply", [("[文件] passwd", "ias-x.1", "/etc/passwd")], now, now)
        await self.app.outbox.flush("owner")
        self.assertEqual(channel.files, [])
        self.assertEqual(self.sql("SELECT state, reason FROM outbox"), [("expired", "file refused")])


class FilesInTheOutboxTest(MediaOutTestCase):
    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.llm = ScriptedLLM(ask(("send_files", {"case": "png_pdf"})), answer("本周图表"), answer("你好"))
        self.channel = WindowedChannel()
        self.use(self.build(llm=self.llm, channels=[self.channel], primary=self.channel))

    async def queue_a_task_with_files(self):
        """A scheduled prompt task whose skill returns two files, run while the window is shut."""
        task = type("Task", (), {"id": 1, "kind": "prompt", "user_id": "owner", "name": "周报", "text": "画本周用电",
                                 "next_run_at": None})()
        await self.router.run_task(task)
        self.assertEqual(self.channel.sent + self.channel.files, [])
        self.assertEqual(self.sql("SELECT count(*) FROM outbox WHERE state = 'queued'"), [(5,)])

    async def test_a_shut_window_queues_the_files_and_they_go_when_the_owner_writes(self):
        await self.queue_a_task_with_files()
        self.channel.open = True                            # the owner writes: the window opens
        await self.router.deliver(Inbound("wechat", "owner", "在吗"))
        await until(lambda: len(self.channel.files) == 2 and self.router.dispatching == 0)
        self.assertEqual(self.texts(self.channel), ["你好", "本周图表", "本周用电", "月报"])   # the answer first
        self.assertEqual([(name, data, after) for _, name, data, _, after in self.channel.files],
                         [("chart.png", PNG, 3), ("report.pdf", PDF, 4)])

    async def test_nothing_is_sent_twice_across_a_restart_and_sent_copies_are_swept(self):
        await self.queue_a_task_with_files()
        restarted = WindowedChannel()
        restarted.open = True
        self.use(self.build(channels=[restarted], primary=restarted))     # a new process over the same store
        await self.app.outbox.tick()
        self.assertEqual([name for _, name, *_ in restarted.files], ["chart.png", "report.pdf"])
        for _ in range(2):
            await self.app.outbox.tick()
            self.use(self.build(channels=[restarted], primary=restarted))
        self.assertEqual(len(restarted.files), 2)
        self.assertEqual(self.texts(restarted), ["本周图表", "本周用电", "月报"])
        self.assertEqual(len(self.copies()), 2)             # kept a while (the console prints their paths)
        self.app.outbox.wall = lambda: time.time() + limits.OUTGOING_KEEP + 1
        await self.app.outbox.tick()
        self.assertEqual(self.copies(), [])

    async def test_an_expired_file_is_never_sent_and_its_copy_is_swept(self):
        await self.queue_a_task_with_files()
        self.sql("UPDATE outbox SET created_at = created_at - interval '4 days'")
        self.app.outbox.wall = lambda: time.time() + limits.OUTGOING_KEEP + 1
        await self.app.outbox.tick()
        self.assertEqual(self.sql("SELECT DISTINCT state FROM outbox"), [("expired",)])
        self.assertEqual(self.copies(), [])
        self.channel.open = True
        await self.app.outbox.tick()
        self.assertEqual(self.channel.files, [])


class OutgoingRulesTest(GateTestCase):
    def test_a_copy_in_use_or_young_is_kept_by_the_sweep(self):
        root = self.tmp / "outgoing"
        entries = []
        for _ in range(3):
            box = root / uuid.uuid4().hex
            box.mkdir(parents=True)
            (box / "a.png").write_bytes(b"x")
            entries.append(box)
        os.utime(entries[0], (0, 0))
        os.utime(entries[1], (0, 0))
        removed = outgoing.sweep(root, {str(entries[1] / "a.png")}, time.time(), limits.OUTGOING_KEEP)
        self.assertEqual(removed, 1)
        self.assertEqual(sorted(root.iterdir()), sorted(entries[1:]))

    def test_own_accepts_only_a_copy_made_here(self):
        root = self.tmp / "outgoing"
        box = root / "abc"
        box.mkdir(parents=True)
        (box / "a.png").write_bytes(b"x")
        (box / "link.png").symlink_to("/etc/passwd")
        self.assertTrue(outgoing.own(str(box / "a.png"), root))
        for path in ("/etc/passwd", str(box / "link.png"), str(root / "abc" / ".." / "abc" / "a.png"), str(box),
                     str(root / "x.png")):
            self.assertFalse(outgoing.own(path, root), path)

    def test_safe_names(self):
        self.assertEqual(outgoing.safe_name("图表\n\u202e.png"), "图表__.png")
        self.assertEqual(outgoing.safe_name(".."), "file")
        long = outgoing.safe_name("x" * 300 + ".pdf")
        self.assertEqual((len(long), long[-4:]), (limits.MEDIA_SEND_NAME_MAX, ".pdf"))


class ApprovalFileParameterTest(GateTestCase):
    def test_a_file_parameter_is_shown_by_name_size_and_sha256_prefix(self):
        photo = self.tmp / "photo.jpg"
        photo.write_bytes(b"j" * 12345)
        schema = {"type": "object", "properties": {"photo": {"type": "string", "format": "file", "title": "照片"},
                                                   "note": {"type": "string"}}}
        row = Approval(uuid.uuid4(), None, None, "owner", "print_photo", {"photo": str(photo), "note": str(photo)},
                       "", 3, "pending", None, None)
        message = render(row, "123456", 300, schema)
        digest = hashlib.sha256(b"j" * 12345).hexdigest()[:12]
        self.assertIn(f"· 照片：{photo}（文件 12 KB，SHA-256 {digest}）\n", message)
        self.assertIn(f"· note：{photo}\n", message)              # not declared a file: the value alone
        for value in (str(self.tmp / "missing.jpg"), str(self.tmp), "relative.jpg"):
            row = Approval(uuid.uuid4(), None, None, "owner", "print_photo", {"photo": value}, "", 3, "pending",
                           None, None)
            self.assertIn(f"· 照片：{value}\n", render(row, "123456", 300, schema))


class BarChartSkillTest(GateTestCase):
    user_skills = REPO / "skills"

    async def test_the_shipped_example_draws_a_png_that_goes_to_the_owner(self):
        skill = load_skill(REPO / "skills" / "bar_chart", "user")
        self.assertFalse(skill.high)
        result = await self.gate.call("owner", "bar_chart", {"values": [3, 5, -2, 8], "title": "本周用电"},
                                      for_owner=(files := []))
        self.assertTrue(result["success"], result)
        self.assertEqual(result["files"], [{"name": "chart.png", "size": files[0].size, "caption": "本周用电"}])
        data = Path(files[0].path).read_bytes()
        self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        self.assertEqual((width, height), (2 * 16 + 4 * 32 - 8, 2 * 16 + 240))


if __name__ == "__main__":
    import unittest
    unittest.main()
