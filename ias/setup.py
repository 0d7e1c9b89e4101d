"""`ias setup`: the first run — an LLM provider from the presets, its base URL, model and key, one test
request (a plain answer and a tool call), the result written to the env file, then an optional WeChat login.

Interactive on a terminal (the owner is the operator: prompts in Chinese); for scripts
`ias setup --provider NAME [--model M] [--base-url URL]` with the key from OPENAI_API_KEY. Nothing is
written unless the test request succeeds. Not handled: settings other than the LLM's (the env file
keeps any line it does not set, so they can be added by hand), several endpoints, checking a model's
quality beyond answering and calling one tool.
"""
from __future__ import annotations

import asyncio
import getpass
import os
import sys
from dataclasses import dataclass
from typing import Callable

from . import envfile
from .errors import ConfigError


@dataclass(frozen=True, slots=True)
class Provider:
    """A preset: its name for --provider, what the owner sees, and the endpoint and model it fills in."""
    name: str
    label: str
    base_url: str | None            # None: the owner must give it (vLLM and other servers)
    model: str | None               # None: likewise
    key: str = "required"           # "required", "optional" (a local server may take any), "none" (never asked)
    vision: bool = False            # its preset model is known to see images (IAS_VISION=1 is written with it)


PRESETS = (
    Provider("openai", "OpenAI", "https://api.openai.com/v1", "gpt-4o-mini", vision=True),
    Provider("deepseek", "DeepSeek 深度求索", "https://api.deepseek.com/v1", "deepseek-chat"),
    Provider("qwen", "通义千问 Qwen（阿里云百炼 DashScope）", "https://dashscope.aliyuncs.com/compatible-mode/v1",
             "qwen-plus"),
    Provider("moonshot", "月之暗面 Kimi（Moonshot）", "https://api.moonshot.cn/v1", "kimi-k2.5", vision=True),
    Provider("zhipu", "智谱 GLM", "https://open.bigmodel.cn/api/paas/v4", "glm-4-flash"),
    Provider("siliconflow", "硅基流动 SiliconFlow", "https://api.siliconflow.cn/v1", "deepseek-ai/DeepSeek-V3"),
    Provider("ollama", "Ollama（本机）", "http://127.0.0.1:11434/v1", "qwen2.5:7b", key="none"),
    Provider("other", "vLLM 或其他 OpenAI 兼容服务", None, None, key="optional"),
)
NO_KEY = "none"         # the API key written for a server that takes none (the SDK insists on one)

PROBE_TEXT = "请只回复一个字：好"
PROBE_TOOL_NAME = "get_time"
PROBE_TOOL = {"type": "function", "function": {
    "name": PROBE_TOOL_NAME, "description": "查询某个时区的当前时间",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "description": "时区，如 Asia/Shanghai"}},
                   "required": ["zone"]}}}
PROBE_TOOL_TEXT = f"请调用 {PROBE_TOOL_NAME} 工具查询 Asia/Shanghai 的当前时间。"


def preset(name: str) -> Provider:
    for provider in PRESETS:
        if provider.name == name:
            return provider
    raise ConfigError(f"unknown provider {name!r}: one of {', '.join(p.name for p in PRESETS)}")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What setup tests and then writes."""
    base_url: str
    model: str
    api_key: str
    vision: bool = False            # the preset's own model, known to see images

    def settings(self) -> dict[str, str]:
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "IAS_MODEL": self.model,
                "IAS_VISION": "1" if self.vision else "0"}


async def probe(endpoint: Endpoint, timeout: float) -> str | None:
    """One plain request and one with a tool the model must call: None when both work, else why not (one
    line, Chinese: the owner reads it)."""
    from .agent import KEY_REFUSED
    from .llm import LLM, KeyRefused, LLMError
    llm = LLM(endpoint.api_key, endpoint.base_url, endpoint.model, retry_delays=(), timeout=timeout)
    try:
        plain = await llm.complete([{"role": "user", "content": PROBE_TEXT}], [])
        if not (plain.content or "").strip() and not plain.tool_calls:
            return f"模型 {endpoint.model} 没有给出回答"
        called = await llm.complete([{"role": "user", "content": PROBE_TOOL_TEXT}], [PROBE_TOOL])
        if not any(call.name == PROBE_TOOL_NAME for call in called.tool_calls):
            return (f"模型 {endpoint.model} 没有调用工具：iAs 需要支持工具调用（function calling）的模型和接口"
                    "（vLLM 需 --enable-auto-tool-choice）")
    except KeyRefused:
        return KEY_REFUSED
    except LLMError as exc:
        return _failure(exc, endpoint)
    finally:
        await llm.close()
    return None


def _failure(exc: Exception, endpoint: Endpoint) -> str:
    """A failed test request in the owner's words: what to check."""
    import openai
    cause = exc.__cause__
    if isinstance(cause, openai.NotFoundError):
        return f"接口 {endpoint.base_url} 找不到模型 {endpoint.model}（404）：请检查接口地址和模型名"
    if isinstance(cause, (openai.APIConnectionError, openai.APITimeoutError, TimeoutError)):
        return f"连不上 {endpoint.base_url}：请检查接口地址和网络"
    if isinstance(cause, openai.BadRequestError):
        return f"接口 {endpoint.base_url} 拒绝了请求（400）：请检查模型名 {endpoint.model} 以及是否支持工具调用"
    return f"测试请求失败：{exc}"


def needed() -> bool:
    """For `make run`: whether no LLM is configured (no OPENAI_API_KEY and no OPENAI_BASE_URL in the
    environment or the env file). A configuration that does not load is not for setup to mend: False,
    and the daemon says what is wrong."""
    from .config import load
    try:
        config = load()
    except ConfigError:
        return False
    return not (config.openai_api_key or config.openai_base_url)


def from_arguments(config, provider: str, model: str | None, base_url: str | None) -> Endpoint:
    """The endpoint `ias setup --provider …` names, the key from OPENAI_API_KEY (environment or env file)."""
    chosen = preset(provider)
    base_url = base_url or chosen.base_url
    model = model or chosen.model
    if base_url is None:
        raise UsageError(f"--provider {provider} needs --base-url URL")
    if model is None:
        raise UsageError(f"--provider {provider} needs --model NAME")
    key = config.openai_api_key
    if chosen.key == "none" or (not key and chosen.key == "optional"):
        key = key or NO_KEY
    if not key:
        raise ConfigError("OPENAI_API_KEY is not set: `ias setup --provider …` reads the key from it")
    return Endpoint(base_url, model, key, chosen.vision and model == chosen.model)


class UsageError(ConfigError):
    """A missing argument: exit 2, as argparse's own usage errors."""


def ask_endpoint(ask: Callable[[str], str], secret: Callable[[str], str], out: Callable[[str], None]) -> Endpoint:
    """The owner's choice, asked on the terminal: provider, base URL, model, key."""
    out("选择大模型服务：")
    for number, provider in enumerate(PRESETS, 1):
        out(f"  {number}) {provider.label}")
    while True:
        answer = ask(f"编号 [1-{len(PRESETS)}，默认 1]：").strip() or "1"
        if answer.isdigit() and 1 <= int(answer) <= len(PRESETS):
            chosen = PRESETS[int(answer) - 1]
            break
        out(f"请输入 1 到 {len(PRESETS)} 之间的编号。")
    base_url = _ask_value(ask, out, "接口地址（base URL）", chosen.base_url)
    model = _ask_value(ask, out, "模型", chosen.model)
    key = NO_KEY
    if chosen.key != "none":
        while True:
            typed = secret("API 密钥（输入时不显示" + ("；没有就直接回车" if chosen.key == "optional" else "") + "）：").strip()
            if typed or chosen.key == "optional":
                key = typed or NO_KEY
                break
            out("需要密钥：请在服务商的控制台创建 API Key 后粘贴到这里。")
    return Endpoint(base_url, model, key, chosen.vision and model == chosen.model)


def _ask_value(ask, out, what: str, default: str | None) -> str:
    while True:
        answer = ask(f"{what}" + (f" [{default}]" if default else "") + "：").strip()
        if answer or default:
            return answer or default
        out(f"需要填写{what}。")


def run_setup(config, provider: str | None = None, model: str | None = None, base_url: str | None = None, *,
              interactive: bool | None = None, ask: Callable[[str], str] = input,
              secret: Callable[[str], str] = getpass.getpass, out: Callable[[str], None] = print,
              login: Callable[[], int] | None = None) -> int:
    """`ias setup`: the exit status (0 written, 1 the test failed or the input ended, 2 a usage error).

    `login` runs `wechat login` (by default `commands.cmd_wechat`); `ask`, `secret` and `out` are the
    terminal, injectable for tests."""
    if provider is None:
        if not (sys.stdin.isatty() if interactive is None else interactive):
            print("ias: setup asks its questions on a terminal; in a script use "
                  "`ias setup --provider NAME [--model M] [--base-url URL]` with OPENAI_API_KEY set", file=sys.stderr)
            return 2
        try:
            endpoint = ask_endpoint(ask, secret, out)
        except (EOFError, KeyboardInterrupt):
            print("\nias: setup cancelled; nothing written", file=sys.stderr)
            return 1
    else:
        try:
            endpoint = from_arguments(config, provider, model, base_url)
        except UsageError as exc:
            print(f"ias setup: {exc}", file=sys.stderr)
            return 2
    out(f"正在测试 {endpoint.base_url}（模型 {endpoint.model}）：一次普通回答、一次工具调用……")
    problem = asyncio.run(probe(endpoint, config.llm_timeout))
    if problem is not None:
        print(f"ias: {problem}；没有写入任何设置", file=sys.stderr)
        return 1
    envfile.write(config.env_file, endpoint.settings())
    out(f"测试通过，已写入 {config.env_file}（仅本用户可读写）。")
    for name, value in endpoint.settings().items():
        if os.environ.get(name, "").strip() not in ("", value):
            out(f"注意：环境变量 {name} 已设置，它优先于 ias.env 中的值；请删除它（unset {name}）以使用刚写入的设置。")
    if provider is None and _yes(ask, "现在登录微信吗？以后也可以运行 python ias.py wechat login [y/N]："):
        code = login() if login is not None else _wechat_login(config)
        if code != 0:
            return code
    out("设置完成：运行 make run（或 python ias.py）启动 iAs，在终端里直接输入消息即可对话；"
        "如 iAs 已在运行，请重启它以使用新的设置。")
    return 0


def _yes(ask, prompt: str) -> bool:
    try:
        return ask(prompt).strip().lower() in ("y", "yes", "是", "好")
    except (EOFError, KeyboardInterrupt):
        return False


def _wechat_login(config) -> int:
    """`ias wechat login`, the QR code drawn when segno is installed (`make run` installs it)."""
    from .commands import cmd_wechat
    return asyncio.run(cmd_wechat(config, "login"))
