"""What the model sees of a skill call: every result string and truncation rule of SPEC §5–6.

Other modules return facts — the runner a `RunResult` (exit code, output, stderr tail, timed
out, overflowed, sizes), a handler its JSON object, an MCP server its CallToolResult, the
approval an outcome status, the validator a list of errors — and each executor and the gate
turn them into the JSON object the model reads through the functions here. The agent
keeps each result in the history cut to TOOL_RESULT_MAX characters by `for_history`, and the
model's own calls within the bounds of SPEC §6.11 by `calls_for_history`.

Nothing here mentions approvals or codes: a High call that did not run is "rejected" or "not
confirmed", never "the code was wrong" or "the owner was asked".

Not handled here: the errors inside `参数错误：…` (the validator's `path: message` lines) and
a skill's own JSON result, which the model gets as the skill printed it.
"""
from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from .limits import (ARGUMENTS_MAX, ERROR_TAIL, MEDIA_SEND_FILES_MAX, MEDIA_SEND_MAX, OUTPUT_HELD_MAX, STDOUT_TO_LLM,
                     TOOL_CALLS_MAX, TOOL_NAME_SHOWN, TOOL_RESULT_MAX)
from .outgoing import size_text

if TYPE_CHECKING:
    from .outcome import RunResult
    from .outgoing import OutFile, Refused


def of_run(run: RunResult) -> dict:
    """The result of a run that ended, as SPEC §5 describes it."""
    if run.timed_out:
        return timed_out(run.skill, run.timeout)
    if run.overflowed:
        return {"success": False, "error": f"技能输出超过上限（{_size(OUTPUT_HELD_MAX)}），已终止：{run.skill}",
                "truncated": True}
    if run.exit_code != 0:
        error = _tail(run.stderr) or _tail(run.stdout) or f"技能执行失败（退出码 {run.exit_code}）：{run.skill}"
        return {"success": False, "error": error, "exit_code": run.exit_code}
    if not truncated(run):
        try:
            parsed = json.loads(run.stdout)
        except (ValueError, RecursionError):      # not JSON, or nested too deeply to parse: plain output
            parsed = None
        if isinstance(parsed, dict) and "success" in parsed:
            return files_for_owner(parsed, run.files, run.refused) if run.files or run.refused else parsed
    output, cut = _cut_utf8(run.stdout, STDOUT_TO_LLM)
    result = {"success": True, "output": output}
    if cut or truncated(run):
        result["truncated"] = True
    return result


FILES_NOTE = "这些文件会在你的回复之后发送给主人"
FILES_DROPPED = "这些文件没有发送：这里不能发送文件"
FILE_REFUSALS = {
    "outside": "路径不在技能的 HOME 或主人的收件箱中",
    "missing": "文件不存在",
    "link": "路径含符号链接或文件有硬链接",
    "not_regular": "不是普通文件",
    "too_big": f"文件超过 {MEDIA_SEND_MAX // (1 << 20)} MB",
    "too_many": f"一次最多发送 {MEDIA_SEND_FILES_MAX} 个文件",
    "bad_entry": '每项应为 {"path": "…", "caption": "…"}',
    "failed": "文件无法读取",
}


def files_for_owner(result: dict, files: tuple[OutFile, ...], refused: tuple[Refused, ...]) -> dict:
    """A script's result naming `files` as the model sees it: the files taken for the owner (name, size,
    caption; never the private copy's path) and, for each refused one, why (the call otherwise stands)."""
    shown = {key: value for key, value in result.items() if key != "files"}
    if files:
        shown["files"] = [{"name": f.name, "size": f.size, **({"caption": f.caption} if f.caption else {})}
                          for f in files]
        shown["files_note"] = FILES_NOTE
    if refused:
        shown["files_refused"] = [
            {"path": r.path, "error": "未发送：" + FILE_REFUSALS.get(r.reason, r.reason)
             + (f"（其余 {r.count} 个）" if r.reason == "too_many" else "")} for r in refused]
    return shown


def files_dropped(result: dict) -> dict:
    """A result with files, from a call whose caller cannot send files (`/run`, `ias run`): none was sent."""
    return {**result, "files_note": FILES_DROPPED}


def of_handler(result: dict) -> dict:
    """A built-in handler's JSON object as is; past STDOUT_TO_LLM bytes its text cut, as a script's output."""
    text = json.dumps(result, ensure_ascii=False)
    output, cut = _cut_utf8(text, STDOUT_TO_LLM)
    return result if not cut else {"success": True, "output": output, "truncated": True}


def of_mcp(name: str, answer: dict) -> dict:
    """The result of an MCP tools/call: text content joined; `isError` is a failure; structuredContent as
    `data`; images, audio and resources summarised; text past STDOUT_TO_LLM bytes cut (truncated)."""
    content = answer.get("content")
    parts = [_content_text(item) for item in content if isinstance(item, dict)] if isinstance(content, list) else []
    text, cut = _cut_utf8("\n".join(p for p in parts if p), STDOUT_TO_LLM)
    if answer.get("isError") is True:
        result = {"success": False, "error": text or f"MCP 工具报告错误：{name}"}
    else:
        result = {"success": True, "output": text}
        data = answer.get("structuredContent")
        if data is not None:
            if len(json.dumps(data, ensure_ascii=False).encode("utf-8", "replace")) <= STDOUT_TO_LLM:
                result["data"] = data
            else:
                cut = True
    if cut:
        result["truncated"] = True
    return result


def mcp_failed(name: str, error: str) -> dict:
    """An MCP call that got no result: the server could not start, answered an error or went away."""
    return {"success": False, "error": f"MCP 服务调用失败：{name}：{_tail(error)}"}


def handler_failed(error: str) -> dict:
    """A built-in handler that failed (a store error): the model hears why."""
    return {"success": False, "error": _tail(error)}


def timed_out(name: str, timeout: float) -> dict:
    """A call ended by the skill's timeout, whichever executor ran it."""
    return {"success": False, "error": f"技能执行超时（{_seconds(timeout)}s）：{name}"}


def _content_text(item: dict) -> str:
    """One content block as text: text as is; anything else a one-line summary, never its bytes."""
    kind = item.get("type")
    if kind == "text":
        return item.get("text") if isinstance(item.get("text"), str) else ""
    if kind in ("image", "audio"):
        data = item.get("data") if isinstance(item.get("data"), str) else ""
        return f"[{kind} {_short(item.get('mimeType'))}, {_decoded_size(data)} bytes]"
    if kind == "resource" and isinstance(item.get("resource"), dict):
        res = item["resource"]
        size = (f"{len(res['text'])} characters" if isinstance(res.get("text"), str)
                else f"{_decoded_size(res.get('blob'))} bytes")
        return f"[resource {_short(res.get('uri'))} {_short(res.get('mimeType'))}, {size}]"
    if kind == "resource_link":
        return f"[resource link {_short(item.get('uri'))} {_short(item.get('name'))}]"
    return f"[{_short(kind)} content]"


def _decoded_size(data) -> int:
    """Bytes a base64 text stands for (not decoded: only its size is told)."""
    data = data.strip() if isinstance(data, str) else ""
    return len(data) * 3 // 4 - data[-2:].count("=")


def _short(value) -> str:
    return str(value)[:200] if value is not None else ""


def truncated(run: RunResult) -> bool:
    """Whether the run wrote more stdout than the model may see (the audit row's truncated flag)."""
    return run.output_size > STDOUT_TO_LLM or run.overflowed


def unknown_skill(name: str) -> dict:
    return {"success": False, "error": f"未知技能：{shown_name(name)}"}


def too_long(name: str) -> dict:
    """Arguments past ARGUMENTS_MAX: refused before validation, nothing ran, no approval was asked."""
    return {"success": False, "error": f"参数过长：{shown_name(name)}"}


def too_many_calls(name: str) -> dict:
    """A call past the first TOOL_CALLS_MAX of one model response: nothing of it ran."""
    return {"success": False, "error": f"单次调用过多，未执行：{shown_name(name)}"}


def shown_name(name) -> str:
    """A called name as echoed to the model: real skill names whole, a flood cut to TOOL_NAME_SHOWN."""
    name = str(name)
    return name if len(name) <= TOOL_NAME_SHOWN else name[:TOOL_NAME_SHOWN] + "…"


def arguments_size(arguments: dict | str | None) -> int:
    """Bytes of a call's arguments as JSON text: the text the model sent, else the compact JSON of the
    object given (`/run` passes text, `ias run` an object)."""
    if arguments is None:
        return 0
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return len(arguments.encode("utf-8", "surrogatepass"))


def calls_for_history(message: dict, run: int = TOOL_CALLS_MAX) -> dict:
    """The assistant message as the history keeps it and later requests re-send it: a call past the
    first `run`, or one whose arguments are past ARGUMENTS_MAX, keeps its id and name but not its
    arguments (valid JSON in their place; its tool message says why), and names are cut."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    kept = []
    for i, call in enumerate(calls):
        function = call["function"]
        arguments = function["arguments"]
        if i >= run:
            arguments = "{}"
        elif (size := arguments_size(arguments)) > ARGUMENTS_MAX:
            arguments = json.dumps({"_omitted": f"参数过长，未保存（{size} 字节）"}, ensure_ascii=False)
        kept.append({**call, "function": {**function, "name": shown_name(function["name"]), "arguments": arguments}})
    return {**message, "tool_calls": kept}


def invalid(errors: list[str]) -> dict:
    """Arguments that failed validation: nothing ran, no approval was asked."""
    return {"success": False, "error": "参数错误：" + "；".join(errors)}


def not_json(reason: str) -> str:
    """The validation error for arguments that are no JSON text at all."""
    return f"$: arguments are not valid JSON ({reason})"


def refused(status: str, name: str) -> dict:
    """A High call that did not run, by how its approval ended (any status but approved)."""
    if status == "too_long":
        return {"success": False, "error": f"参数过长，无法请求确认：{name}"}
    if status == "too_many":
        return {"success": False, "error": f"本轮待确认操作过多，未请求确认：{name}"}
    if status == "rejected":
        return {"success": False, "error": f"用户拒绝了你的调用：{name}"}
    return {"success": False, "error": f"用户没有确认操作：{name}"}


def interrupted(name: str) -> dict:
    """A call whose run was cut short by shutdown or by the death of its process; never re-run."""
    return {"success": False, "error": f"技能执行被中断：{name}"}


def for_history(result: dict, limit: int = TOOL_RESULT_MAX) -> str:
    """A tool result as the model reads it: JSON of at most `limit` characters that stays JSON.

    The longest strings are cut (and `truncated` set) rather than the text, so fields such as an
    e-mail's `attachments` or `body_truncated` survive a long body.
    """
    content = json.dumps(result, ensure_ascii=False)
    if len(content) <= limit:
        return content
    shrunk = {**result, "truncated": True}
    strings = sorted((k for k, v in shrunk.items() if isinstance(v, str)), key=lambda k: -len(shrunk[k]))
    excess = len(json.dumps(shrunk, ensure_ascii=False)) - limit
    for key in strings:         # the text shrinks by what each cut value's JSON lost: no re-serialising
        if excess <= 0:
            break
        before = shrunk[key]
        shrunk[key] = before[:max(0, len(before) - excess - 1)] + "…"
        excess -= len(json.dumps(before, ensure_ascii=False)) - len(json.dumps(shrunk[key], ensure_ascii=False))
    content = json.dumps(shrunk, ensure_ascii=False)
    if len(content) > limit:            # the bulk is in nested values: cut the text after all
        content = content[:limit] + "…(truncated)"
    return content


def _seconds(value: float) -> str:
    """30.0 -> '30', 2.5 -> '2.5'."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _size(n: int) -> str:
    """1048576 -> '1 MiB'."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _tail(text: str) -> str:
    return text.strip()[-ERROR_TAIL:].strip()


def _cut_utf8(text: str, limit: int) -> tuple[str, bool]:
    """At most `limit` UTF-8 bytes of `text`, cut on a character boundary; and whether it was cut."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


# -- files the owner sent (issue 26) -----------------------------------------------------------------
FILE_KINDS = {"image": "图片", "voice": "语音", "file": "文件", "video": "视频"}


def file_line(kind: str, name: str, mime: str, size: int, shown: str, seen: bool) -> str:
    """The line naming a file the owner sent: `[图片：inbox/…/x.png，123 KB]` for an image the model sees
    (the history keeps only this reference, never the bytes), else its name, type, size and inbox path."""
    what = FILE_KINDS.get(kind, "文件")
    if seen:
        return f"[{what}：{shown}，{size_text(size)}]"
    return f"[{what}：{name}，{mime}，{size_text(size)}，已存到 {shown}]"


def with_files(text: str, lines: list[str]) -> str:
    """The owner's message as the model reads it: the lines naming their files, then their text."""
    return "\n".join([*lines, text] if text else lines)


def image_part(mime: str, data: bytes) -> dict:
    """An image for a vision model, in the current turn only (a data URL)."""
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"}}
