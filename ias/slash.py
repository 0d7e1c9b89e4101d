"""The owner's slash commands: messages starting with `/`, answered without the model (SPEC §8).

One table, `COMMANDS`, names each command, the method of `Slash` that answers it and its line in
/help (which is made from the table, so the help never lists a command that does not exist). A
command gets the rest of the message after its name, already stripped; an unknown one is answered
with the help. Every answer is Chinese text for the owner.

Not handled: commands for anyone but the user who sends them (each acts on its sender's own
history, grants or memories), and arguments with quoting (the rest of the line is one argument).
"""
from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from .approval import Notify
from .gate import Gate
from .grants import Grants
from .limits import MEMORY_LIST_MAX, MEMORY_LIST_TEXT
from .memory import Memory
from .registry import Registry
from .stopping import STOPPED
from .store import Store

if TYPE_CHECKING:
    from .status import Status

# name -> (method of Slash, what /help shows after the name)
COMMANDS: dict[str, tuple[str, str]] = {
    "/help": ("help", " — 显示本帮助"),
    "/skills": ("skills", " — 列出可用技能"),
    "/run": ("run", ' 技能名 {"参数": "值"} — 直接调用一个技能（高风险技能同样需要确认）'),
    "/reset": ("reset", " — 清空对话记录（记忆保留）"),
    "/stop": ("stop", " — 停止正在进行的操作（也可发「停止」或 stop）"),
    "/status": ("status", " — 查看模型、今日用量、沙箱级别、微信窗口、待发送与待确认"),
    "/grants": ("list_grants", " — 列出有效的授权（确认时回复 确认码+1h、+1d 或 +N次 可授权）"),
    "/revoke": ("revoke", " 编号|all — 撤销一个或全部授权"),
    "/memory": ("memory", " [ok 编号] — 列出记忆（最新在前）；加 ok 编号 确认一条未确认的记忆"),
    "/forget": ("forget", " 编号 — 删除一条记忆"),
}
HELP = "\n".join(["iAs 命令：", *(name + shown for name, (_, shown) in COMMANDS.items()), "其他消息会交给大模型处理。"])
NO_STATUS = "当前没有可显示的状态。"
RUN_USAGE = "用法：/run 技能名 {\"参数\": \"值\"}"
MEMORY_USAGE = "用法：/memory 列出记忆；/memory ok 编号 确认一条未确认的记忆"
FORGET_USAGE = "用法：/forget 编号"
NO_MEMORY = "记忆功能未启用。"
_NUMBER = re.compile(r"#?([1-9][0-9]{0,17})")
NO_GRANTS = "此处不支持授权。"


def is_command(text: str) -> bool:
    """Whether a message is one of the owner's /commands (answered here, never by the model)."""
    return text.strip().startswith("/")


class Slash:
    """Answers the owner's /commands over the objects they need."""

    def __init__(self, registry: Registry, gate: Gate, store: Store, *, status: Status | None = None,
                 memory: Memory | None = None, grants: Grants | None = None):
        self.registry = registry
        self.gate = gate
        self.store = store
        self.grants = grants
        self._status = status           # /status's facts (None: built without them, e.g. a bare test agent)
        self.memories = memory          # /memory, /forget (the method /memory is `memory`)

    async def answer(self, user_id: str, text: str, notify: Notify | None) -> str:
        """The reply to `text`, a message starting with `/`."""
        name, _, rest = text.partition(" ")
        entry = COMMANDS.get(name)
        if entry is None:
            return f"未知命令：{name}\n\n{HELP}"
        return await getattr(self, entry[0])(user_id, rest.strip(), notify)

    async def help(self, user_id: str, rest: str, notify: Notify | None) -> str:
        return HELP

    async def skills(self, user_id: str, rest: str, notify: Notify | None) -> str:
        return "\n".join(f"{s.name}（{'高风险' if s.high else '低风险'}）："
                         f"{(s.description.splitlines() or [''])[0]}" for s in self.registry) or "没有可用的技能。"

    async def reset(self, user_id: str, rest: str, notify: Notify | None) -> str:
        await self.store.clear_messages(user_id)
        return "对话记录已清空。"

    async def stop(self, user_id: str, rest: str, notify: Notify | None) -> str:
        # The router handles the stop word before any turn; one that reaches a turn has nothing to stop.
        return STOPPED

    async def run(self, user_id: str, rest: str, notify: Notify | None) -> str:
        skill, _, arguments = rest.partition(" ")
        if not skill:
            return RUN_USAGE
        result = await self.gate.call(user_id, skill, arguments.strip() or "{}", notify)
        return json.dumps(result, ensure_ascii=False, indent=1)

    async def status(self, user_id: str, rest: str, notify: Notify | None) -> str:
        return NO_STATUS if self._status is None else await self._status.report(user_id)

    async def memory(self, user_id: str, rest: str, notify: Notify | None) -> str:
        if self.memories is None:
            return NO_MEMORY
        if rest:
            word, _, number = rest.partition(" ")
            match = _NUMBER.fullmatch(number.strip())
            if word.lower() != "ok" or match is None:
                return MEMORY_USAGE
            row = await self.memories.confirm(user_id, int(match[1]))
            return f"没有待确认的记忆 #{match[1]}。" if row is None else f"已确认记忆 #{row.id}：{row.text}"
        rows, total = await self.memories.listing(user_id, MEMORY_LIST_MAX)
        if not rows:
            return "还没有记忆。"
        lines = [f"记忆（共 {total} 条，最新在前）："]
        for row in rows:
            text = row.text if len(row.text) <= MEMORY_LIST_TEXT else row.text[:MEMORY_LIST_TEXT - 1] + "…"
            lines.append(f"#{row.id} {text}" + ("（未确认）" if row.status != "active" else ""))
        if total > len(rows):
            lines.append(f"……另有 {total - len(rows)} 条未显示")
        if any(row.status != "active" for row in rows):
            lines.append("未确认的记忆不会被使用：确认请发 /memory ok 编号，删除请发 /forget 编号。")
        return "\n".join(lines)

    async def forget(self, user_id: str, rest: str, notify: Notify | None) -> str:
        if self.memories is None:
            return NO_MEMORY
        match = _NUMBER.fullmatch(rest)
        if match is None:
            return FORGET_USAGE
        row = await self.memories.forget(user_id, int(match[1]), by="/forget")
        return f"没有记忆 #{match[1]}。" if row is None else f"已删除记忆 #{row.id}：{row.text}"

    async def list_grants(self, user_id: str, rest: str, notify: Notify | None) -> str:
        return NO_GRANTS if self.grants is None else await self.grants.listing(user_id)

    async def revoke(self, user_id: str, rest: str, notify: Notify | None) -> str:
        return NO_GRANTS if self.grants is None else await self.grants.revoke(user_id, rest)
