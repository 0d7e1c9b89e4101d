"""MCP servers as skills: a stdlib client for the Model Context Protocol over stdio, and the servers' lifecycle.

The wire: JSON-RPC 2.0, one message per line on the server's stdin/stdout; its stderr goes
to the log, a bounded number of cut lines per start. A session is `initialize` (the newest
revision iAs speaks is offered; a server answering with one iAs does not speak is refused),
then `notifications/initialized`. Used: `tools/list` (following `nextCursor`), `tools/call`,
`ping`; a call that times out is followed by `notifications/cancelled`. A server's
`notifications/tools/list_changed` makes iAs list its tools again and replace its skills (a tool that
appears or changes after the first listing is High until the restart: changes.py).
Requests from the server are answered: `ping` with an empty result, anything else with
"method not found" (iAs offers no roots, sampling or elicitation).

Lifecycle (`Servers`): a server is started by the runner (its own process group, the
scrubbed environment) on first use, or at daemon start by `keep`, which also restarts one
that dies, with a delay doubling from MCP_RESTART_FIRST to MCP_RESTART_MAX. Each listing is
written to the data directory (registry.write_tools), so `ias skills` shows the tools without
starting anything; one that changed since the first listing only by the daemon, which tells the
owner (the cache is the next process's first listing). `close` stops every server this process
started: stdin closed, then SIGTERM and SIGKILL to its group. Every background task here (the
keepers, each connection's readers) runs under the supervisor given at construction (groups MCP and
"mcp keepers"): in the daemon one that dies of anything unexpected takes the daemon down loudly
(STYLE 14); in a one-off command its crash is logged with its traceback.

`Servers.run(skill, params, user) -> Outcome` is the executor of the skills made of MCP tools
(outcome.py): no exit code (no process runs per call); the size is that of the answer.

Modules: `connection` (one session: the wire, the handshake, tools/list and tools/call) and
`servers` (every server's lifecycle and the executor).

Not handled: resources, prompts, sampling, progress notifications, the HTTP transports, and
batches (no revision iAs speaks allows a server to send one unasked).
"""
