"""WeChat media (issue 26): inbound files through the local iLink server's CDN into the inbox and on to the
model, files sent with the upload flow, the CDN client's key, retry and size rules, the inbox's bound."""
import base64
import hashlib
import json
import os
import stat
import struct
import sys
import tempfile
import zlib
from datetime import datetime, timedelta
from pathlib import Path
from unittest import mock

from ias import limits
from ias.app import build, wechat
from ias.clock import TZ
from ias.channels.base import SENT, FAILED
from ias.channels.wechat.cdn import CDN, CDNError, TooLarge, decrypt, encrypt, outbound_key, padded_size, parse_key
from ias.channels.wechat.channel import WeChatChannel
from ias.channels.wechat.ilink import CHANNEL
from ias.channels.wechat.media import FAILED as FAILED_NOTE, NO_CRYPTO, TOO_LARGE, Media
from ias.config import Config
from ias.inbox import Attachment, Inbox, attachments, safe_name
from ias.supervisor import Supervisor
from tests.servers.ilink import ILinkServer
from tests.support import FIXTURES, REPO, GateTestCase, ScriptedLLM, answer, ask, capture_logs, until
from tests.test_wechat import WeChatTestCase

MB = 1024 * 1024


def png(width: int = 2, height: int = 2, extra: int = 0) -> bytes:
    """A real PNG (grey pixels), padded with an ancillary chunk of `extra` bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + (chunk(b"teXt", b"c\x00" + os.urandom(extra)) if extra else b"")
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"


def put(server: ILinkServer, param: str, data: bytes, key: bytes | None = None) -> bytes:
    """Put `data` on the server's CDN under `param`, encrypted with `key` (a new one by default); the key."""
    key = key or os.urandom(16)
    server.files[param] = encrypt(key, data)
    return key


def image_item(param: str, key: bytes, *, full_url: str | None = None) -> dict:
    media = {"encrypt_query_param": param, "aes_key": base64.b64encode(key).decode(), "encrypt_type": 1}
    if full_url:
        media["full_url"] = full_url
    return {"type": 2, "image_item": {"media": media, "aeskey": key.hex(), "mid_size": 100}}


def file_item(param: str, key: bytes, name: str, data: bytes, **fields) -> dict:
    media = {"encrypt_query_param": param, "aes_key": base64.b64encode(key.hex().encode()).decode(), "encrypt_type": 1}
    holder = {"media": media, "file_name": name, "md5": hashlib.md5(data).hexdigest(), "len": str(len(data))}
    return {"type": 4, "file_item": {**holder, **fields}}


def files_in(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


class ModelTestCase(GateTestCase):
    """The whole path: the local iLink server → the WeChat channel (built by app.wechat) → router → agent →
    the model (ScriptedLLM), with IAS_VISION set to `vision`, over the user skills in `skills`."""
    vision = 1
    skills = FIXTURES / "gate"

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.logs = capture_logs(self)
        self.server = ILinkServer(hold=0.5).start()
        self.addCleanup(self.server.close)
        self.model = ScriptedLLM()
        self.config = Config(data_dir=self.tmp, skills_dir=self.skills, system_skills_dir=None,
                             environ={"PATH": os.environ["PATH"]}, vision=self.vision,
                             wechat_token=self.server.token, wechat_owner=self.server.owner,
                             wechat_base_url=self.server.base_url, wechat_cdn_url=self.server.cdn_url)
        supervisor = Supervisor()
        self.channel = await wechat(self.config, self.store, supervisor)
        self.use(build(self.config, self.store, key=self.key, llm=self.model, channels=[self.channel],
                       primary=self.channel, supervisor=supervisor))
        await self.channel.start(self.router.deliver)

    async def asyncTearDown(self):
        await self.channel.stop()
        await super().asyncTearDown()
        self.model.assert_complete()
        self.assertEqual(self.server.problems, [])

    async def turn(self, **message) -> dict:
        """Send a message from the owner; the model request it caused, once its reply went out."""
        count, sent = len(self.model.bodies), len(self.server.sent)
        self.server.message(**message)
        await until(lambda: len(self.model.bodies) > count and len(self.server.sent) > sent)
        return self.model.requests[count]


class VisionTest(ModelTestCase):
    async def test_a_png_lands_byte_identical_and_reaches_the_model_as_an_image_part_once(self):
        picture = png(extra=2000)
        key = put(self.server, "img-1", picture)
        self.model.script(answer("这是一张灰色的小图。"), answer("好的。"))
        request = await self.turn(text=None, items=[{"type": 1, "text_item": {"text": "这是什么？"}},
                                                    image_item("img-1", key)])
        [stored] = files_in(self.config.inbox)
        self.assertEqual(stored.read_bytes(), picture)
        self.assertEqual(stat.S_IMODE(stored.stat().st_mode), 0o600)
        self.assertEqual(stat.S_IMODE(stored.parent.stat().st_mode), 0o700)
        self.assertEqual(stat.S_IMODE(self.config.inbox.stat().st_mode), 0o700)
        self.assertRegex(stored.parent.name, r"^\d{4}-\d\d-\d\d$")
        user = request["messages"][-1]
        self.assertEqual(user["role"], "user")
        text, image = user["content"]
        shown = f"inbox/{stored.parent.name}/{stored.name}"
        self.assertEqual(text, {"type": "text", "text": f"[图片：{shown}，2 KB]\n这是什么？"})
        self.assertEqual(image["type"], "image_url")
        prefix = "data:image/png;base64,"
        self.assertTrue(image["image_url"]["url"].startswith(prefix))
        self.assertEqual(base64.b64decode(image["image_url"]["url"][len(prefix):]), picture)
        # The next turn: the history keeps the reference, the bytes are not sent again.
        second = await self.turn(text="谢谢")
        self.assertNotIn("image_url", self.model.bodies[-1])
        self.assertIn({"role": "user", "content": f"[图片：{shown}，2 KB]\n这是什么？"}, second["messages"])
        self.assertNotIn("base64", json.dumps(self.sql("SELECT message FROM messages")))

    async def test_a_pdf_is_named_to_the_model_under_a_safe_name(self):
        key = put(self.server, "pdf-1", PDF)
        self.model.script(answer("收到报告。"))
        request = await self.turn(text=None, items=[file_item("pdf-1", key, "../../etc/季度\n报告.pdf", PDF)])
        [stored] = files_in(self.config.inbox)
        self.assertEqual(stored.read_bytes(), PDF)
        self.assertTrue(stored.name.endswith("-季度_报告.pdf"), stored.name)
        content = request["messages"][-1]["content"]
        self.assertEqual(content, f"[文件：季度_报告.pdf，application/pdf，{len(PDF)} B，"
                                  f"已存到 inbox/{stored.parent.name}/{stored.name}]")

    async def test_a_replayed_message_keeps_its_files(self):
        key = put(self.server, "pdf-2", PDF)
        await self.channel.stop()
        # Another channel receives it and hands it to nobody: it stays pending, as after a crash mid-turn.
        channel = WeChatChannel(self.store, self.channel.credentials, media=self.channel.media)
        self.addAsyncCleanup(channel.stop)
        delivered = []

        async def keep(message):
            delivered.append(message)
        await channel.start(keep)
        self.server.message(text=None, items=[file_item("pdf-2", key, "a.pdf", PDF)])
        await until(lambda: delivered)
        await channel.stop()
        [row] = await self.store.pending_inbound()
        self.assertEqual(attachments(row.attachments), delivered[0].attachments)
        self.model.script(answer("好。"))
        self.assertEqual(await self.router.replay(), 1)
        await until(lambda: self.model.bodies)
        self.assertIn("a.pdf，application/pdf", self.model.requests[0]["messages"][-1]["content"])
        await until(lambda: self.server.sent)


class NoVisionTest(ModelTestCase):
    vision = 0

    async def test_a_png_is_named_to_a_model_that_cannot_see(self):
        key = put(self.server, "img-2", png())
        self.model.script(answer("收到图片。"))
        request = await self.turn(text=None, items=[image_item("img-2", key)])
        [stored] = files_in(self.config.inbox)
        content = request["messages"][-1]["content"]
        self.assertEqual(content, f"[图片：image.png，image/png，{len(png())} B，"
                                  f"已存到 inbox/{stored.parent.name}/{stored.name}]")


class PictureOutTest(ModelTestCase):
    """The README's promise end to end: a shipped skill draws a picture, the owner gets it on WeChat."""
    skills = REPO / "skills"

    async def test_the_bar_chart_reaches_the_owner_as_an_image_after_the_reply(self):
        self.model.script(ask(("bar_chart", {"values": [3, 5, 2], "title": "本周用电"})), answer("图已画好。"))
        self.server.message(text="画一个柱状图：周一 3，周二 5，周三 2")
        await until(lambda: len(self.server.received_files()) == 1, 30)
        texts = [m["item_list"][0]["text_item"]["text"] for m in self.server.sent if m["item_list"][0]["type"] == 1]
        self.assertEqual(texts[-2:], ["图已画好。", "本周用电"])       # the reply, then the caption
        [(kind, name, data)] = self.server.received_files()
        self.assertEqual((kind, name), (2, None))                     # an image item
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertEqual([m["item_list"][0]["type"] for m in self.server.sent][-3:], [1, 1, 2])
        await until(lambda: self.sql("SELECT state FROM outbox WHERE file_path IS NOT NULL") == [("sent",)])


class MediaChannelTestCase(WeChatTestCase):
    hold = 0.5

    async def asyncSetUp(self):
        await super().asyncSetUp()
        self.logs = capture_logs(self)
        self.root = Path(tempfile.mkdtemp(prefix="ias-inbox-")) / "inbox"
        self.addCleanup(lambda: __import__("shutil").rmtree(self.root.parent, ignore_errors=True))

    async def media_channel(self, **options) -> WeChatChannel:
        return await self.channel(media=Media(CDN(self.server.cdn_url), Inbox(self.root, 100 * MB)), **options)

    def notes(self) -> list[str]:
        return [m["item_list"][0]["text_item"]["text"] for m in self.server.sent if m["item_list"][0]["type"] == 1]


class InboundTest(MediaChannelTestCase):
    async def test_a_30_mb_file_is_refused_with_a_message_and_nothing_written(self):
        await self.media_channel()
        big = os.urandom(30 * MB)
        key = put(self.server, "big", big)
        item = file_item("big", key, "big.bin", big)
        del item["file_item"]["len"]                   # not announced: the Content-Length refuses it
        announced = file_item("big", key, "big2.bin", big)       # announced: refused before the download
        await self.inbound(items=[{"type": 1, "text_item": {"text": "看看这个"}}, item])
        self.server.message(items=[announced])
        await self.until(lambda: len(self.notes()) == 2, what="the notes")
        self.assertEqual(self.delivered[0].text, "看看这个")
        self.assertEqual(self.delivered[0].attachments, ())
        self.assertEqual(self.notes(), [TOO_LARGE.format(what="文件", mb=25)] * 2)
        self.assertEqual(files_in(self.root), [])
        self.assertEqual(len(self.server.calls("/c2c/download")), 1)        # the announced one was not fetched

    async def test_a_wrong_md5_is_refused(self):
        await self.media_channel()
        key = put(self.server, "f", PDF)
        self.server.message(items=[file_item("f", key, "a.pdf", PDF, md5="0" * 32)])
        await self.until(lambda: self.notes(), what="the note")
        self.assertEqual(self.notes(), [FAILED_NOTE.format(what="文件")])
        self.assertEqual(files_in(self.root), [])
        self.assertEqual(self.delivered, [])
        self.assertIn("MD5", "\n".join(r.getMessage() for r in self.logs))

    async def test_voice_uses_the_transcript_and_keeps_audio_only_without_one(self):
        await self.media_channel()
        audio = b"\x02#!SILK_V3" + os.urandom(300)
        key = put(self.server, "v", audio)
        media = {"encrypt_query_param": "v", "aes_key": base64.b64encode(key).decode()}
        await self.inbound(items=[{"type": 3, "voice_item": {"media": media, "text": "八点开会"}}])
        self.assertEqual((self.delivered[-1].text, self.delivered[-1].attachments), ("八点开会", ()))
        self.assertEqual(self.server.calls("/c2c/download"), [])
        await self.inbound(items=[{"type": 3, "voice_item": {"media": media, "playtime": 2380}}])
        [voice] = self.delivered[-1].attachments
        self.assertEqual((voice.kind, voice.mime, voice.path.read_bytes()), ("voice", "audio/silk", audio))

    async def test_the_full_url_is_preferred_and_the_constructed_one_tried_after_a_5xx(self):
        await self.media_channel()
        key = put(self.server, "p", png())
        self.server.cdn_replies.append({"http": 502})
        await self.inbound(items=[image_item("p", key, full_url=self.server.full_url("p"))])
        first, second = [r.path for r in self.server.requests if r.path.startswith("/c2c/")]
        self.assertEqual((first, second), ("/c2c/full/p", "/c2c/download"))
        self.assertEqual(self.delivered[-1].attachments[0].path.read_bytes(), png())

    async def test_a_redelivered_message_is_not_stored_twice(self):
        await self.media_channel()
        key = put(self.server, "p", png())
        message = await self.inbound(items=[image_item("p", key)])
        self.server.redeliver(message)
        await self.inbound("下一条")
        self.assertEqual(len(files_in(self.root)), 1)
        self.assertEqual(len(self.delivered), 2)

    async def test_without_cryptography_the_owner_is_told_in_one_line(self):
        await self.media_channel()
        self.server.files["p"] = b"\x00" * 32
        blocked = dict.fromkeys(["cryptography", "cryptography.hazmat", "cryptography.hazmat.primitives",
                                 "cryptography.hazmat.primitives.ciphers", "cryptography.hazmat.primitives.padding"])
        with mock.patch.dict(sys.modules, blocked):
            await self.inbound(items=[{"type": 1, "text_item": {"text": "图"}}, image_item("p", os.urandom(16))])
            await self.until(lambda: self.notes(), what="the note")
        self.assertEqual(self.notes(), [NO_CRYPTO.format(what="图片")])
        self.assertEqual(self.delivered[-1].text, "图")
        self.assertIn("cryptography", "\n".join(r.getMessage() for r in self.logs))


class SendFileTest(MediaChannelTestCase):
    async def test_a_png_and_a_pdf_arrive_as_image_and_file_items_whose_keys_decrypt_them(self):
        channel = await self.media_channel()
        await self.inbound("发我报告", context_token="ctx-owner")
        folder = Path(tempfile.mkdtemp(prefix="ias-out-"))
        self.addCleanup(lambda: __import__("shutil").rmtree(folder, ignore_errors=True))
        chart = png(extra=5000)
        (folder / "chart.png").write_bytes(chart)
        (folder / "report.pdf").write_bytes(PDF)
        self.assertEqual(await channel.send_file(self.server.owner, folder / "chart.png", "本周用电"), SENT)
        self.server.upload_full = False         # the second upload by the URL built from upload_param
        self.assertEqual(await channel.send_file(self.server.owner, folder / "report.pdf", None), SENT)
        caption, image, document = self.server.sent
        self.assertEqual(caption["item_list"], [{"type": 1, "text_item": {"text": "本周用电"}}])
        requests = self.server.upload_requests
        self.assertEqual([r["media_type"] for r in requests], [1, 3])
        self.assertEqual([r["context_token"] for r in requests], ["ctx-owner"] * 2)
        for message, upload, original, request in zip((image, document), self.server.uploads,
                                                      (chart, PDF), requests):
            [item] = message["item_list"]
            holder = item["image_item"] if item["type"] == 2 else item["file_item"]
            hex_text = base64.b64decode(holder["media"]["aes_key"]).decode("ascii")
            self.assertRegex(hex_text, r"^[0-9a-f]{32}$")
            self.assertEqual(len(holder["media"]["aes_key"]), 44)
            self.assertEqual(decrypt(bytes.fromhex(hex_text), upload["body"]), original)
            self.assertEqual(holder["media"]["encrypt_query_param"], upload["reference"])
            self.assertEqual((request["rawsize"], request["rawfilemd5"], request["filesize"], request["aeskey"]),
                             (len(original), hashlib.md5(original).hexdigest(), padded_size(len(original)), hex_text))
            self.assertEqual(message["context_token"], "ctx-owner")
        self.assertEqual([m["item_list"][0]["type"] for m in (image, document)], [2, 4])
        self.assertEqual(image["item_list"][0]["image_item"]["mid_size"], len(self.server.uploads[0]["body"]))
        self.assertEqual(document["item_list"][0]["file_item"]["file_name"], "report.pdf")
        self.assertEqual(document["item_list"][0]["file_item"]["len"], str(len(PDF)))
        self.assertEqual((await channel.window(self.server.owner)).left, self.channels[0].budget - 3)
        self.assertEqual(self.server.received_files(), [(2, None, chart), (4, "report.pdf", PDF)])

    async def test_getuploadurl_minus_14_fails_the_file_without_a_logout(self):
        channel = await self.media_channel()
        await self.inbound("在吗")
        self.server.upload_replies.append({"ret": -14, "errcode": -14, "errmsg": "session timeout"})
        path = Path(tempfile.mkdtemp(prefix="ias-out-")) / "x.png"
        self.addCleanup(lambda: __import__("shutil").rmtree(path.parent, ignore_errors=True))
        path.write_bytes(png())
        self.assertEqual(await channel.send_file(self.server.owner, path, None), FAILED)
        self.assertFalse(channel.stale)
        self.assertTrue(channel.polling)
        self.assertIsNone(await self.store.get_state(CHANNEL, "stale"))
        self.assertEqual(self.server.sent, [])
        self.assertEqual(await channel.send_file(self.server.owner, path, None), SENT)

    async def test_the_cdn_upload_retries_a_5xx_and_stops_at_a_4xx(self):
        channel = await self.media_channel()
        await self.inbound("在吗")
        path = Path(tempfile.mkdtemp(prefix="ias-out-")) / "x.pdf"
        self.addCleanup(lambda: __import__("shutil").rmtree(path.parent, ignore_errors=True))
        path.write_bytes(PDF)
        self.server.cdn_replies.extend([{"http": 500}, {"http": 200}])       # the second: no x-encrypted-param
        self.assertEqual(await channel.send_file(self.server.owner, path, None), SENT)
        self.assertEqual(len(self.server.calls("/c2c/upload")), 3)
        self.server.cdn_replies.append({"http": 403, "headers": {"x-error-message": "forbidden"}})
        self.assertEqual(await channel.send_file(self.server.owner, path, None), FAILED)
        self.assertEqual(len(self.server.calls("/c2c/upload")), 4)
        self.assertEqual(len(self.server.sent), 1)


class PartsTest(WeChatTestCase):
    """The pieces on their own: keys, names, the inbox's bound and records."""

    def test_the_aes_key_forms(self):
        key = bytes(range(16))
        self.assertEqual(parse_key(base64.b64encode(key).decode()), key)
        self.assertEqual(parse_key(outbound_key(key)), key)
        self.assertEqual(outbound_key(bytes.fromhex("00112233445566778899aabbccddeeff")),
                         base64.b64encode(b"00112233445566778899aabbccddeeff").decode())
        for bad in ("", "not base64!", base64.b64encode(b"short").decode(), base64.b64encode(b"z" * 32).decode(), 16):
            with self.assertRaises(CDNError):
                parse_key(bad)
        for size in (0, 15, 16, 17, 1000):
            data = os.urandom(size)
            self.assertEqual(len(encrypt(key, data)), padded_size(size))
            self.assertEqual(decrypt(key, encrypt(key, data)), data)
        with self.assertRaises(CDNError):
            decrypt(os.urandom(16), encrypt(key, b"x" * 40))

    async def test_a_download_without_a_length_is_cut_off_at_the_limit(self):
        cdn, key = CDN(self.server.cdn_url), os.urandom(16)
        body = encrypt(key, os.urandom(2 * MB))
        self.server.raw.append(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)       # no Content-Length
        with self.assertRaises(TooLarge):
            await cdn.download({"encrypt_query_param": "x"}, key, limit=MB)
        self.server.files["y"] = body
        self.assertEqual(len(await cdn.download({"encrypt_query_param": "y"}, key, limit=2 * MB)), 2 * MB)
        with self.assertRaisesRegex(CDNError, "names no download"):
            await cdn.download({"full_url": "file:///etc/passwd"}, key)

    def test_an_image_part_counts_as_an_image_in_a_token_estimate(self):
        from ias.llm import _usage
        from ias.results import image_part
        picture = png(extra=300_000)
        text = [{"role": "user", "content": "看图"}]
        seen = [{"role": "user", "content": [{"type": "text", "text": "看图"}, image_part("image/png", picture)]}]
        plain, vision = _usage(None, text, [], "好", ()), _usage(None, seen, [], "好", ())
        self.assertTrue(vision.estimated)
        self.assertLess(vision.prompt - plain.prompt, limits.IMAGE_TOKENS_ESTIMATE + 20)
        self.assertGreaterEqual(vision.prompt - plain.prompt, limits.IMAGE_TOKENS_ESTIMATE)

    def test_doctor_names_a_missing_cryptography_as_a_warning(self):
        from ias.doctor import media_line
        config = Config(data_dir=Path("/srv/ias"), inbox_max_mb=20, vision=1)
        self.assertEqual(media_line(config), (True, "media", "inbox /srv/ias/inbox (at most 20 MB), vision on"))
        ok, _, detail = media_line(config, find_spec=lambda name: None)
        self.assertIsNone(ok)
        self.assertIn("cryptography is not installed", detail)

    def test_safe_names(self):
        self.assertEqual(safe_name("../../etc/passwd", "file"), "passwd")
        self.assertEqual(safe_name("..", "file"), "file")
        self.assertEqual(safe_name(".bashrc", "file"), "bashrc")
        self.assertEqual(safe_name("a\x00b\r\nc.pdf", "file"), "a_b_c.pdf")
        self.assertEqual(safe_name(None, "file"), "file")
        long = safe_name("长" * 500 + ".pdf", "file")
        self.assertEqual((len(long), long[-4:]), (limits.MEDIA_NAME_MAX, ".pdf"))

    def test_the_inbox_bound_removes_the_oldest_first(self):
        root = Path(tempfile.mkdtemp(prefix="ias-inbox-")) / "inbox"
        self.addCleanup(lambda: __import__("shutil").rmtree(root.parent, ignore_errors=True))
        day = [datetime(2026, 12, 1, 9, tzinfo=TZ)]
        inbox = Inbox(root, 100, now=lambda: day[0])
        saved = []
        for n in range(4):
            saved.append(inbox.save(bytes([n]) * 40, "file", f"{n}.bin", "application/octet-stream"))
            day[0] += timedelta(hours=13)
        left = files_in(root)
        self.assertEqual(left, [saved[2].path, saved[3].path])
        self.assertEqual(sorted(p.name for p in root.iterdir()), ["2026-12-02", "2026-12-03"])   # emptied day gone
        huge = inbox.save(b"x" * 150, "file", "huge.bin", "application/octet-stream")   # the new one stays
        self.assertEqual(files_in(root), [huge.path])

    def test_stored_records_are_checked_before_use(self):
        good = Attachment(Path("/var/ias/inbox/2026-12-01/x.png"), "image", "image/png", 3, "x.png")
        read = attachments([good.record(), {"path": "relative.png", "kind": "image", "mime": "image/png",
                                            "size": 1, "name": "r"}, {"path": "/x", "kind": "exe"}, "junk"])
        self.assertEqual(read, (good,))
        root = Path(tempfile.mkdtemp(prefix="ias-inbox-")) / "inbox"
        self.addCleanup(lambda: __import__("shutil").rmtree(root.parent, ignore_errors=True))
        inbox = Inbox(root, MB)
        stored = inbox.save(b"abc", "file", "a.txt", "text/plain")
        self.assertEqual(inbox.read(stored), b"abc")
        outside = root.parent / "secret"
        outside.write_bytes(b"secret")
        (stored.path.parent / "link").symlink_to(outside)
        for path in (outside, stored.path.parent / "link", root / ".." / "secret"):
            self.assertIsNone(inbox.read(Attachment(path, "file", "text/plain", 6, "s")))
