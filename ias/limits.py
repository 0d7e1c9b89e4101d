"""Every limit, timeout and buffer size in one place, so they can be read and tuned together."""

# Skills
SKILL_TIMEOUT_DEFAULT = 30          # seconds, when SKILL.md has no ## Timeout
SKILL_TIMEOUT_MAX = 600             # seconds
KILL_GRACE = 2.0                    # seconds between SIGTERM and SIGKILL of a skill's group
DRAIN_TIMEOUT = 2.0                 # seconds to drain pipes after the group is killed
STDOUT_TO_LLM = 64 * 1024           # bytes of stdout the model may see
OUTPUT_HELD_MAX = 1024 * 1024       # bytes of output ever held; past that the group is killed
STDERR_HELD_MAX = 64 * 1024         # bytes of stderr kept (the tail)
ERROR_TAIL = 2000                   # characters of stderr/stdout tail in an error result
KILL_POLL = 0.05                    # seconds between checks that a terminated group is gone
ENV_VALUE_MAX = 64 * 1024           # bytes; a longer IAS_PARAM_*/IAS_PARAMS value is left out of the env
ENV_TOTAL_MAX = 1024 * 1024         # bytes of IAS_PARAM*/IAS_PARAMS values in one env (ARG_MAX is ~2 MiB)

# Agent and LLM
AGENT_MAX_ROUNDS = 8                # model calls per turn (tool rounds included)
HISTORY_WINDOW = 24                 # stored messages sent back to the model
LLM_TIMEOUT = 120.0                 # seconds per chat request
LLM_RETRY_DELAYS = (1.0, 4.0)       # seconds before each retry of a failed request
TOOL_RESULT_MAX = 16 * 1024         # characters of one tool result kept in the history

# Command line
CLI_NUMBER_MAX = 2 ** 31 - 1        # largest --limit or task id accepted (beyond it: a usage error)

# Store
STORED_JSON_DEPTH = 100             # nesting kept in a stored JSON value (the validator allows 64); deeper parts become a marker

# Daemon
SHUTDOWN_GRACE = 5.0                # seconds for channels and turns to stop on SIGTERM

# Scheduler
SCHEDULER_MAX_SLEEP = 3600.0        # seconds; re-check at least this often (clock jumps, lost NOTIFY)
SCHEDULER_RETRY = 5.0               # seconds before the loop retries after a database error
TASK_REPLY_MAX = 4000               # characters of a task's reply kept in task_runs

# WeChat (iLink)
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
WECHAT_REPLY_WINDOW = 23 * 3600.0   # seconds after the user's last message in which sends are tried (iLink: 24 h)
WECHAT_SEND_BUDGET = 8              # bot messages per owner message, the last one being "reply to continue" (iLink: ~10)
WECHAT_LOGIN_DEADLINE = 480.0       # seconds for the whole QR login
WECHAT_QR_POLL_TIMEOUT = 35.0       # seconds of one get_qrcode_status long poll (a client timeout means "wait")
WECHAT_QR_POLL_PAUSE = 1.0          # seconds between QR status polls
WECHAT_QR_CODES_MAX = 3             # QR codes shown (the first and refreshes after expiry) before giving up
WECHAT_QR_POLL_ERRORS_MAX = 5       # failed QR status polls in a row (not timeouts) before giving up
WECHAT_RESPONSE_MAX = 4 * 1024 * 1024   # bytes of one HTTP response body
WECHAT_HEADERS_MAX = 100            # header lines of one HTTP response
WECHAT_STOP_GRACE = 1.0             # seconds stop() waits for cancelled tasks to finish
