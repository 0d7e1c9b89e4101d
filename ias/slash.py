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

from .approval import Notify
from .gate import Gate
from .registry import Registry
from .stopping import STOPPED
from .store import Store

# name -> (method of Slash, what /help shows after the name)
COMMANDS: dict[str, tuple[str, str]] = {
    "/help": ("help", " — 显示本帮助"),
    "/skills": ("skills", " — 列出可用技能"),
    "/run": ("run", ' 技能名 {"参数": "值"} — 直接调用一个技能（高风险技能同样需要确认）'),
    "/reset": ("reset", " — 清空对话记录"),
    "/stop": ("stop", " — 停止正在进行的操作（也可发「停止」或 stop）"),
}
HELP = "\n".join(["iAs 命令：", *(name + shown for name, (_, shown) in COMMANDS.items()), "其他消息会交给大模型处理。"])
RUN_USAGE = "用法：/run 技能名 {\"参数\": \"值\"}"


class Slash:
    """Answers the owner's /commands over the objects they need."""

    def __init__(self, registry: Registry, gate: Gate, store: Store):
        self.registry = registry
        self.gate = gate
        self.store = store

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
