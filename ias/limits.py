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
READ_CHUNK = 64 * 1024              # bytes per pipe read
KILL_POLL = 0.05                    # seconds between checks that a terminated group is gone
ENV_VALUE_MAX = 64 * 1024           # bytes; a longer IAS_PARAM_*/IAS_PARAMS value is left out of the env
ENV_TOTAL_MAX = 1024 * 1024         # bytes of IAS_PARAM*/IAS_PARAMS values in one env (ARG_MAX is ~2 MiB)

# Agent and LLM
AGENT_MAX_ROUNDS = 8                # model calls per turn (tool rounds included)
HISTORY_WINDOW = 24                 # stored messages sent back to the model
LLM_TIMEOUT = 120.0                 # seconds per chat request
LLM_RETRY_DELAYS = (1.0, 4.0)       # seconds before each retry of a failed request
TOOL_RESULT_MAX = 16 * 1024         # characters of one tool result kept in the history

# Daemon
SHUTDOWN_GRACE = 5.0                # seconds for channels and turns to stop on SIGTERM
