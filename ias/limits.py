"""Every limit, timeout and buffer size, and every setting's default, in one place, so they can be
read and tuned together. config.py checks the settings and takes their defaults from here."""

# Settings' defaults (ias.toml / IAS_*; the ranges they may take are config.py's)
MODEL_DEFAULT = "gpt-4o-mini"       # IAS_MODEL
ENV_FILE_MAX = 64 * 1024            # bytes of $IAS_DATA_DIR/ias.env; a larger file is a configuration error
APPROVAL_TIMEOUT = 300.0            # seconds the owner has to answer a confirmation: IAS_APPROVAL_TIMEOUT
OUTBOX_EXPIRE = 3 * 86400.0         # seconds a queued message may wait before it expires: IAS_OUTBOX_EXPIRE
FALLBACK_AFTER = 600.0              # seconds past its due time before a reminder/task result goes to the fallback
RETENTION_DAYS = 180                # days of history, settled outbox rows and task runs kept: IAS_RETENTION_DAYS

# Skills
SKILL_TIMEOUT_DEFAULT = 30          # seconds, when SKILL.md has no ## Timeout
SKILL_TIMEOUT_MAX = 600             # seconds
KILL_GRACE = 2.0                    # seconds between SIGTERM and SIGKILL of a skill's group
DRAIN_TIMEOUT = 2.0                 # seconds to drain pipes after the group is killed
CANCEL_GRACE = 0.5                  # seconds a cancelled run (the stop word) gets after SIGTERM before SIGKILL
REAP_WAIT = 1.0                     # seconds a cancelled run waits for its SIGKILLed process to be reaped
STDOUT_TO_LLM = 64 * 1024           # bytes of stdout the model may see
OUTPUT_HELD_MAX = 1024 * 1024       # bytes of output ever held; past that the group is killed
STDERR_HELD_MAX = 64 * 1024         # bytes of stderr kept (the tail)
ERROR_TAIL = 2000                   # characters of stderr/stdout tail in an error result
KILL_POLL = 0.05                    # seconds between checks that a terminated group is gone
LEFTOVER_POLL = 0.002               # seconds between checks that a sandbox's pid namespace is gone after its script
ENV_VALUE_MAX = 64 * 1024           # bytes; a longer IAS_PARAM_*/IAS_PARAMS value is left out of the env
ENV_TOTAL_MAX = 1024 * 1024         # bytes of IAS_PARAM*/IAS_PARAMS values in one env (ARG_MAX is ~2 MiB)
SKILL_FILE_MAX = 256 * 1024         # bytes of one SKILL.md; a larger file is a load error, never read whole
SKILL_CACHE_BATCH = 200             # skills per JSON text when the listing's spec cache is written (bounds its memory)
SKILL_PARSE_SPLIT_MIN = 1000        # new SKILL.md files a listing parses in two halves at once (a fork costs ~2 ms)
SANDBOX_TMPFS_MAX = 1024 * 1024 * 1024   # bytes of a sandbox's private HOME and /tmp each (tmpfs: memory, used only as filled)
PROBE_TIMEOUT = 10                  # seconds the sandbox probe (one `true` in a sandbox) may take

# JSON (schemas in SKILL.md and tool arguments alike) and schema patterns
JSON_DEPTH_MAX = 64                 # nested arrays/objects; deeper is an error, checked before parsing
JSON_NUMBER_MAX = 100               # characters of one JSON number literal (digits of a Python int)
SCHEMA_NODES_MAX = 10_000          # JSON values of one MCP tool schema after $ref expansion; more: not loaded
PATTERN_MAX = 1000                  # characters of one schema `pattern`
PATTERN_STEPS_MAX = 300_000         # estimated regex steps for one match (a step takes 3-50 ns: <= ~15 ms)
PATTERN_INPUT_MAX = 10_000          # characters of a string matched against a pattern; longer is refused
PATTERN_INPUT_MIN = 256             # a pattern that cannot match this many characters within the steps is refused

# Agent and LLM
AGENT_MAX_ROUNDS = 8                # model calls per turn (tool rounds included)
HISTORY_WINDOW = 24                 # stored messages sent back to the model
LLM_TIMEOUT = 60.0                  # seconds per chat request attempt, in total (not per read): IAS_LLM_TIMEOUT
TURN_TIMEOUT = 300.0                # seconds per turn, not counting the wait for the owner's code: IAS_TURN_TIMEOUT
TIMEOUT_SETTING_MAX = 3600.0        # seconds; a longer IAS_LLM_TIMEOUT or IAS_TURN_TIMEOUT is a configuration error
TOOL_GIST_MAX = 500                 # characters of the last tool result the owner gets when the model says nothing
LLM_RETRY_DELAYS = (1.0, 4.0)       # seconds before each retry of a failed request
FALLBACK_MODELS_MAX = 4             # entries of IAS_FALLBACK_MODELS (each tried with its own retries)
USAGE_TOKENS_MAX = 10_000_000       # tokens one response may report per field; more (or not a whole number ≥ 0): estimated
ESTIMATE_BYTES_PER_TOKEN = 3        # an estimate's rule: UTF-8 bytes / 3 (a CJK character is 3 bytes, ~1-2 tokens)
DAILY_TOKENS_MAX = 10 ** 12         # the largest IAS_DAILY_TOKENS accepted
TOOL_RESULT_MAX = 16 * 1024         # characters of one tool result kept in the history
TOOL_CALLS_MAX = 16                 # tool calls of one model response that are run; the rest are refused unrun
ARGUMENTS_MAX = 64 * 1024           # bytes of one call's arguments as JSON text; longer is refused before validation
TOOL_NAME_SHOWN = 200               # characters of a called tool's name echoed to the model or kept in history
MAX_TOOLS_DEFAULT = 32              # tools offered per model request (IAS_MAX_TOOLS)
MAX_TOOLS_CEILING = 128             # never more: OpenAI's endpoint refuses a request with more tools
TOOLS_BYTES_DEFAULT = 12 * 1024     # bytes of tool definitions per model request (IAS_TOOLS_BYTES)
TOOLS_BYTES_MIN = 1024              # a smaller IAS_TOOLS_BYTES is a configuration error
FIND_SKILLS_DEFAULT = 8             # skills find_skills names when the model gives no limit
RECENT_SKILLS_MAX = 8               # skills used recently in the conversation that stay offered
SKILLS_SCAN_INTERVAL = 3.0          # seconds between the daemon's stat scans of the skill directories

# Audit log
AUDIT_VALUE_MAX = 4 * 1024          # bytes of one parameter value kept in an audit row; longer: a prefix and its SHA-256
AUDIT_KEY_MAX = 256                 # bytes of one top-level parameter name kept in an audit row, the same way

# Approvals
APPROVALS_PER_TURN = 3              # approvals asked per owner message; later High calls in that turn are refused
SPACES_RUN_MAX = 8                  # plain spaces in a row shown as is in the message; longer runs (padding) escaped

# Command line
CLI_NUMBER_MAX = 2 ** 31 - 1        # largest --limit or task id accepted (beyond it: a usage error)

# Store
STORED_JSON_DEPTH = 100             # nesting kept in a stored JSON value (the validator allows 64); deeper parts become a marker
POOL_SIZE = 8                       # database connections a store holds at most
POOL_IDLE_CLOSE = 10.0              # seconds an unused pooled connection stays open
CONNECT_TIMEOUT = 10                # seconds to connect to PostgreSQL
PRUNE_BATCH = 5000                  # rows per DELETE when history is pruned
AUDIT_BATCH = 2000                  # rows per fetch when the whole audit log is read (verification)

# Daemon
SHUTDOWN_GRACE = 5.0                # seconds on SIGTERM for calls in flight to record their results, after their skills end
TURNS_MAX = 4                       # agent turns for inbound messages running at once; more wait their turn, in order
DB_LOST_LIMIT = 60.0                # seconds the database may stay unreachable before the daemon exits non-zero
DB_RETRY_FIRST = 0.5                # seconds before the second reconnect attempt; doubled after each failure
DB_RETRY_MAX = 1.0                  # seconds between reconnect attempts at most (a restarted server is used within it)
DISK_LOW_SHARE = 0.05               # free share of the data directory's file system below which the owner is warned
DISK_CHECK_INTERVAL = 300.0         # seconds between the daemon's looks at that free space
DB_RESTART_MAX = 8.0                # seconds between starts of the embedded server at most (doubled from DB_RETRY_FIRST)

# Scheduler
SCHEDULER_MAX_SLEEP = 30.0          # seconds; re-check at least this often (forward clock jumps, lost NOTIFY)
CLOCK_JUMP_TOLERANCE = 2.0          # seconds the wall clock may fall behind the monotonic one between ticks before it counts as a jump back
SCHEDULER_RETRY = 5.0               # seconds before the loop retries after a database error
TASK_REPLY_MAX = 4000               # characters of a task's reply kept in task_runs
CRON_SEARCH_YEARS = 400             # years a cron search looks ahead (the Gregorian cycle) before "never fires"

# WeChat (iLink)
WECHAT_FIRST_POLL_WAIT = 3.0        # seconds a one-off command waits for messages already queued before it sends
WECHAT_POLL_TIMEOUT = 35.0          # seconds the server may hold getupdates, until it announces another value
WECHAT_POLL_TIMEOUT_MIN = 1.0       # seconds; an announced longpolling_timeout_ms is clamped to this range
WECHAT_POLL_TIMEOUT_MAX = 120.0
WECHAT_POLL_MARGIN = 5.0            # seconds added to the server's hold time for the client timeout
WECHAT_RETRY_DELAY = 2.0            # seconds before retrying a failed getupdates
WECHAT_FAILURES_BEFORE_BACKOFF = 3  # failed getupdates in a row before the long pause
WECHAT_BACKOFF_DELAY = 30.0         # seconds of that pause
WECHAT_SEND_TIMEOUT = 15.0          # seconds per sendmessage request
WECHAT_REQUEST_TIMEOUT = 15.0       # seconds for other short requests (get_bot_qrcode)
WECHAT_TEXT_MAX = 4000              # characters per sent message; longer texts are split
WECHAT_REPLY_WINDOW = 23 * 3600.0   # seconds after the user's last message in which sends are tried (iLink: 24 h):
                                    # IAS_WECHAT_WINDOW
WECHAT_SEND_BUDGET = 8              # bot messages per owner message, the last one being "reply to continue" (iLink: ~10):
                                    # IAS_WECHAT_BUDGET
WECHAT_LOGIN_DEADLINE = 480.0       # seconds for the whole QR login
WECHAT_QR_POLL_TIMEOUT = 35.0       # seconds of one get_qrcode_status long poll (a client timeout means "wait")
WECHAT_QR_POLL_PAUSE = 1.0          # seconds between QR status polls
WECHAT_QR_CODES_MAX = 3             # QR codes shown (the first and refreshes after expiry) before giving up
WECHAT_QR_POLL_ERRORS_MAX = 5       # failed QR status polls in a row (not timeouts) before giving up
WECHAT_RESPONSE_MAX = 4 * 1024 * 1024   # bytes of one HTTP response body
WECHAT_HEADERS_MAX = 100            # header lines of one HTTP response
WECHAT_STOP_GRACE = 1.0             # seconds stop() waits for cancelled tasks to finish
WECHAT_WINDOW_LEARN_MIN = 6 * 3600.0  # seconds; a ret=-2 sooner after the owner's message is taken as rate limiting, not the window
WECHAT_WINDOW_LEARN_MARGIN = 600.0  # seconds below the age of a refused send that the learned window is set to

# Inbound messages held in memory while the database is unreachable (per process); past it: DB_DOWN
INBOUND_HELD_MAX = 200
INBOUND_REPLAYS_MAX = 3             # starts that handle a pending message again before it is given up (told)

# Outbox, window keeper and fallback notifiers (the window, budget, expiry and fallback delay are settings, above)
OUTBOX_TICK = 60.0                  # seconds between the outbox's checks (retries, fallback, expiry, window keeper)
OUTBOX_RETRY_FIRST = 30.0           # seconds before retrying a part after a transient error; doubled per attempt
OUTBOX_RETRY_MAX = 1800.0           # seconds between retries at most
OUTBOX_UNKNOWN_WAIT = 600.0         # seconds before a part whose send got no answer (timeout, or a stop mid-send) is sent
                                    # again under its client_id: far past anything the service may still complete
OUTBOX_SEND_GRACE = 5.0             # seconds a stop waits for a send in flight to be answered and recorded
OUTBOX_PARTS_MAX = 20               # parts of one message; the rest is cut, with a note
OUTBOX_ANSWER_HOLD = 300.0          # seconds queued parts wait for the answer to the owner's latest message at most
KEEPER_LEAD = 3 * 3600.0            # seconds before the window closes that the keeper asks the owner to write
NOTIFY_TIMEOUT = 15.0               # seconds per fallback request (HTTP or SMTP)
NOTIFY_ATTEMPTS = 3                 # tries per fallback notifier before the failure is recorded
NOTIFY_RETRY_DELAY = 2.0            # seconds between those tries
NOTIFY_TEXT_MAX = 4000              # characters of one fallback message

# Embedded PostgreSQL
CLUSTER_START_TIMEOUT = 60          # seconds pg_ctl waits for the server to start or stop
CLUSTER_STALE_WAIT = 10.0           # seconds a start is retried while a killed server's backends still exit
CLUSTER_RETRY_PAUSE = 0.2           # seconds between those attempts
CLUSTER_HANDOVER = 1.0              # seconds after such a server exits for a restart to start the next one
CLUSTER_POLL = 0.05                 # seconds between looks at a server someone else is starting or stopping
CLUSTER_MAX_WAL = "256MB"           # max_wal_size: WAL kept between checkpoints (SPEC: at most 256 MB)
CLUSTER_MIN_WAL = "32MB"            # min_wal_size: WAL recycled in advance
BACKUP_TIMEOUT = 3600               # seconds pg_dump or pg_restore may take (`ias backup`, `ias restore`)
RESTORE_PROBLEMS_SHOWN = 5          # audit chain problems printed by a restore that cannot verify the log
SERVICE_STEP_TIMEOUT = 900          # seconds one `ias service install` step (useradd, apt-get, pip, systemctl) may take
SERVICE_USER = "ias"                # `ias service install`'s system user: --user
SERVICE_DATA_DIR = "/var/lib/ias"   # and its data directory: --data-dir
SERVER_LOG_MAX = 4 * 1024 * 1024   # bytes of the cluster's server.log before a start moves it to server.log.1
CLUSTER_LINGER = 30.0              # seconds the embedded server stays up after its last user left: IAS_PG_LINGER (0: stop at once)
CLUSTER_LINGER_MAX = 3600           # seconds; a longer IAS_PG_LINGER is a configuration error
CLUSTER_MAX_CONNECTIONS = 50        # a daemon (pool + LISTEN) plus ~16 parallel commands of up to 2 each, with room

# MCP servers (ias/mcp/)
MCP_PROTOCOL_TIMEOUT = 10.0         # seconds for initialize, one tools/list page and ping
MCP_LINE_MAX = 4 * 1024 * 1024      # bytes of one JSON-RPC message from a server; longer ends the connection
MCP_PAGES_MAX = 50                  # tools/list pages followed (a server that never ends its cursor is cut off)
MCP_TOOLS_MAX = 500                 # tools taken from one server
MCP_LIST_BYTES_MAX = 4 * 1024 * 1024  # bytes of tools/list pages; no further page is asked for past it
MCP_SCHEMA_NODES_TOTAL = 50_000    # the same for all of one server's tool schemas together (~1 s of CPU)
MCP_DESCRIPTION_MAX = 2000          # characters of a tool's description given to the model (paid on every request)
MCP_STDERR_LINE = 500               # characters of one server stderr line logged
MCP_STDERR_LINES = 200              # stderr lines logged per server start; the rest are counted, not logged
MCP_STOP_GRACE = 2.0                # seconds after stdin is closed before SIGTERM (then KILL_GRACE, then SIGKILL)
MCP_RESTART_FIRST = 1.0             # seconds before restarting a server that died; doubled after each death
MCP_RESTART_MAX = 60.0              # seconds between restarts at most
MCP_UP_RESET = 60.0                 # seconds a server must stay up for its restart delay to start over

# WeChat media (issue 26; protocol facts in reference/wechat-ilink-media.md)
WECHAT_CDN_URL = "https://novac2c.cdn.weixin.qq.com/c2c"    # IAS_WECHAT_CDN_URL: used where the server gives no full URL
MEDIA_DOWNLOAD_MAX = 25 * 1024 * 1024   # bytes of one inbound file; larger is refused before anything is written
MEDIA_UPLOAD_MAX = 25 * 1024 * 1024     # bytes of one file sent to the owner
MEDIA_ITEMS_MAX = 4                 # media items of one inbound message downloaded; the rest are named as skipped
MEDIA_TIMEOUT = 60.0                # seconds for one CDN download or upload request
MEDIA_UPLOAD_ATTEMPTS = 3           # CDN upload tries on a 5xx or a 200 without x-encrypted-param (the plugin's)
MEDIA_NAME_MAX = 80                 # characters of a stored file's name (the server's name is cut to it)
INBOX_MAX_MB = 500                  # megabytes the owner's inbox may hold, oldest files removed first: IAS_INBOX_MAX_MB
IMAGE_PARTS_MAX = 4                 # images of one message sent to a vision model as image parts; the rest are named
IMAGE_TOKENS_ESTIMATE = 1000        # tokens an image part counts for in an estimate (not its base64 bytes)

# Long-term memory (ias/memory.py, SPEC 14)
MEMORY_TEXT_MAX = 500               # characters of one memory (remember's `text`)
MEMORY_PROMPT_MAX = 1500            # characters of the memory lines in one system prompt
MEMORY_PROMPT_CANDIDATES = 50       # best-ranked, then newest, memories tried for the prompt (each at most)
MEMORY_RECALL_DEFAULT = 5           # memories `recall` returns when the model gives no limit
MEMORY_PER_USER_MAX = 20_000        # memories one user may keep; `remember` refuses past it
MEMORY_LIST_MAX = 20                # memories /memory shows, newest first
MEMORY_LIST_TEXT = 200              # characters of each memory /memory shows
MEMORY_SAID_MAX = 500               # characters kept of the owner's message of the turn a memory came from

# Files a skill sends the owner (SPEC 13, out; ias/outgoing.py)
MEDIA_SEND_MAX = 25 * 1024 * 1024   # bytes of one file a skill returns; a larger one is refused (the model told)
MEDIA_SEND_FILES_MAX = 5            # files one skill result may send; the rest are refused
MEDIA_SEND_NAME_MAX = 100           # characters of a sent file's name kept (the rest of a longer name is cut)
MEDIA_CAPTION_MAX = 1000            # characters of a file's caption kept (sent as a text message before the file)
OUTGOING_KEEP = 3600.0              # seconds an outgoing copy no queued message names is kept before it is removed

# Grants (ias/grants.py): later equal High calls that run without a new code (SPEC 12)
GRANT_HOUR = 3600                   # seconds a `CODE+1h` grant lasts
GRANT_DAY = 86400                   # seconds a `CODE+1d` grant lasts
GRANT_USES_MAX = 20                 # N of `CODE+N次` at most (the approving call counts as the first)
GRANT_COUNT_LIFE = 30 * 86400       # seconds a count grant lasts at most, so no grant lives forever
GRANT_CAPPED = 3600                 # seconds any grant of execute_shell or an `- unconfined` skill lasts at most
GRANT_CANDIDATES_MAX = 8            # rows one lookup reads for a call (equal grants of one user are rare)
GRANT_USE_TRIES = 3                 # compare-and-set attempts of one use when equal calls race for a grant
GRANTS_LISTED_MAX = 50              # grants /grants lists
GRANT_PARAMS_SHOWN = 300            # characters of a grant's parameters /grants shows (the rest cut, marked …)
