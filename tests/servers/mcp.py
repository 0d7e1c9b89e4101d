"""A stdio MCP server for the tests and the bench (stdlib only): JSON-RPC 2.0, one message a line.

Speaks initialize (answering the client's revision when it is one of REVISIONS, else its own
newest), tools/list in pages of PAGE tools (`nextCursor`), tools/call, ping, and these
notifications: initialized, cancelled (written to the event log), tools/list_changed (sent
after the `grow` tool adds a tool). Run as `python mcp.py`; the environment steers it:

- MCP_TEST_LOG: a file that gets one line per event (`start <pid> <pgid> <home>`, `initialized`,
  `call <tool>`, `cancelled <request id>`, `stdin closed`, `sigterm`);
- MCP_TEST_VERSION: the protocol revision to answer instead;
- MCP_TEST_IGNORE_TERM=1: ignore SIGTERM (the client must SIGKILL it);
- MCP_TEST_TOOLS: a JSON file of more tools, listed after these (one of the same name replaces it).

Tools: echo (text), add (structuredContent), fail (isError), boom (a JSON-RPC error), slow
(never answers: it waits to be cancelled), media (an image and an embedded resource), crash
(exits at once, status 3), grow (adds the tool `extra`, or with `describe` gives echo that description,
and says the list changed), wipe
(annotated destructiveHint: true), lookup (a draft-07 schema with $schema, $id, title,
$defs/$ref and a keyword outside iAs's subset), big (a text of `size` bytes).
"""
from __future__ import annotations

import base64
import json
import os
import signal
import sys

REVISIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
PAGE = 2
LOG = os.environ.get("MCP_TEST_LOG")


def event(line: str) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(line + "\n")


TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
TOOLS = [
    {"name": "echo", "description": "Echo the text.", "inputSchema": TEXT},
    {"name": "add", "description": "Add two integers.", "inputSchema": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}},
    {"name": "fail", "description": "Report a failure.", "inputSchema": {"type": "object"}},
    {"name": "boom", "description": "Answer with a protocol error.", "inputSchema": {"type": "object"}},
    {"name": "slow", "description": "Never answer.", "inputSchema": {"type": "object"}},
    {"name": "media", "description": "An image and a resource.", "inputSchema": {"type": "object"}},
    {"name": "crash", "description": "Exit at once.", "inputSchema": {"type": "object"}},
    {"name": "grow", "description": "Add a tool.", "inputSchema": {"type": "object"}},
    {"name": "wipe", "description": "Destroy everything.", "inputSchema": {"type": "object"},
     "annotations": {"destructiveHint": True}},
    {"name": "lookup", "description": "A draft-07 schema.", "inputSchema": {
        "$schema": "http://json-schema.org/draft-07/schema#", "$id": "urn:lookup", "title": "lookup arguments",
        "type": "object", "properties": {"where": {"$ref": "#/$defs/place"}},
        "required": ["where"], "$defs": {"place": {"type": "string", "minLength": 2, "propertyNames": True}}}},
    {"name": "big", "description": "Long text.", "inputSchema": {
        "type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}},
]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(value: str, **more) -> dict:
    return {"content": [{"type": "text", "text": value}], **more}


def call(name: str, args: dict) -> dict | None:
    """A tools/call result; None = answer later (never, for slow)."""
    event(f"call {name}")
    if name == "echo":
        return text(args.get("text", ""))
    if name == "add":
        total = args["a"] + args["b"]
        return text(str(total), structuredContent={"sum": total})
    if name == "fail":
        return text("it went wrong", isError=True)
    if name == "media":
        return {"content": [
            {"type": "text", "text": "see attached"},
            {"type": "image", "mimeType": "image/png", "data": base64.b64encode(b"\x89PNG" + b"\0" * 96).decode()},
            {"type": "resource", "resource": {"uri": "file:///tmp/x.txt", "mimeType": "text/plain",
                                              "text": "secret body " * 100}}]}
    if name == "crash":
        os._exit(3)
    if name == "grow":
        if "describe" in args:
            TOOLS[0] = {**TOOLS[0], "description": args["describe"]}
        elif not any(t["name"] == "extra" for t in TOOLS):
            TOOLS.append({"name": "extra", "description": "Added later.", "inputSchema": {"type": "object"}})
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return text("grown")
    if name == "wipe":
        return text("wiped")
    if name == "extra":
        return text("extra ran")
    if name == "lookup":
        return text(f"found {args['where']}")
    if name == "big":
        return text("x" * args["size"])
    return None


def main() -> None:
    if os.environ.get("MCP_TEST_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, lambda *_: event("sigterm"))
    if os.environ.get("MCP_TEST_TOOLS"):
        with open(os.environ["MCP_TEST_TOOLS"], encoding="utf-8") as f:
            for tool in json.load(f):
                TOOLS[:] = [t for t in TOOLS if t["name"] != tool["name"]] + [tool]
    event(f"start {os.getpid()} {os.getpgrp()} {os.environ.get('HOME')}")
    print("mcp test server ready", file=sys.stderr, flush=True)
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "notifications/initialized":
            event("initialized")
            continue
        if method == "notifications/cancelled":
            event(f"cancelled {params.get('requestId')}")
            continue
        if ident is None:
            continue
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = os.environ.get("MCP_TEST_VERSION") or (asked if asked in REVISIONS else REVISIONS[0])
            result = {"protocolVersion": version, "capabilities": {"tools": {"listChanged": True}},
                      "serverInfo": {"name": "ias-test", "version": "1"}}
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            start = int(params.get("cursor") or 0)
            result = {"tools": TOOLS[start:start + PAGE]}
            if start + PAGE < len(TOOLS):
                result["nextCursor"] = str(start + PAGE)
        elif method == "tools/call":
            name = params.get("name")
            if name == "boom":
                send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32000, "message": "boom went the tool"}})
                continue
            result = call(name, params.get("arguments") or {})
            if result is None:
                continue
        else:
            send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "method not found"}})
            continue
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    event("stdin closed")


if __name__ == "__main__":
    main()
