"""Configuration: optional ias.toml, then the env file ($IAS_DATA_DIR/ias.env, `envfile`), then the real
environment, each overriding the one before; secrets from the env file or the environment only.

The data directory itself comes from the real environment or ias.toml, never from the env file it holds."""
from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from . import envfile
from .errors import ConfigError
from .limits import (APPROVAL_TIMEOUT, CLUSTER_LINGER, CLUSTER_LINGER_MAX, FALLBACK_AFTER, FALLBACK_MODELS_MAX, LLM_TIMEOUT, MAX_TOOLS_CEILING, MAX_TOOLS_DEFAULT,
                     MODEL_DEFAULT, OUTBOX_EXPIRE, RETENTION_DAYS, TIMEOUT_SETTING_MAX, TOOLS_BYTES_DEFAULT,
                     TOOLS_BYTES_MIN, TURN_TIMEOUT, WECHAT_REPLY_WINDOW, WECHAT_SEND_BUDGET)
from .limits import DAILY_TOKENS_MAX
from .limits import INBOX_MAX_MB, WECHAT_CDN_URL

REPO_ROOT = Path(__file__).resolve().parent.parent
SKILL_LIB = REPO_ROOT / "resources" / "lib"      # the ias_skill helper library, on every skill's PYTHONPATH

# ias.toml top-level key -> (environment variable, type)
_SETTINGS = {
    "database_url": ("IAS_DATABASE_URL", str),
    "data_dir": ("IAS_DATA_DIR", str),
    "pg_linger": ("IAS_PG_LINGER", (float, 0, CLUSTER_LINGER_MAX)),
    "secret_key_file": ("IAS_SECRET_KEY_FILE", str),
    "openai_base_url": ("OPENAI_BASE_URL", str),
    "model": ("IAS_MODEL", str),
    "fallback_models": ("IAS_FALLBACK_MODELS", str),      # parsed into Endpoints by fallback_models()
    "owner": ("IAS_OWNER", str),
    "approval_timeout": ("IAS_APPROVAL_TIMEOUT", float),
    "llm_timeout": ("IAS_LLM_TIMEOUT", (float, 1, TIMEOUT_SETTING_MAX)),
    "turn_timeout": ("IAS_TURN_TIMEOUT", (float, 1, TIMEOUT_SETTING_MAX)),
    "wechat_base_url": ("IAS_WECHAT_BASE_URL", str),
    "wechat_owner": ("IAS_WECHAT_OWNER", str),
    "skills_dir": ("IAS_SKILLS_DIR", str),
    "max_tools": ("IAS_MAX_TOOLS", (int, 1, MAX_TOOLS_CEILING)),
    "tools_bytes": ("IAS_TOOLS_BYTES", (int, TOOLS_BYTES_MIN, 1024 * 1024)),
    "wechat_window": ("IAS_WECHAT_WINDOW", (float, 60, 86400)),
    "wechat_budget": ("IAS_WECHAT_BUDGET", (int, 2, 100)),
    "outbox_expire": ("IAS_OUTBOX_EXPIRE", (float, 60, 90 * 86400)),
    "fallback_after": ("IAS_FALLBACK_AFTER", (float, 0, 7 * 86400)),
    "retention_days": ("IAS_RETENTION_DAYS", (int, 1, 36500)),
    "notify_email": ("IAS_NOTIFY_EMAIL", str),
    "notify_wecom_url": ("IAS_NOTIFY_WECOM_URL", str),
    "notify_webhook_url": ("IAS_NOTIFY_WEBHOOK_URL", str),
    "notify_webhook_body": ("IAS_NOTIFY_WEBHOOK_BODY", str),
    "daily_tokens": ("IAS_DAILY_TOKENS", (int, 1, DAILY_TOKENS_MAX)),
    "wechat_cdn_url": ("IAS_WECHAT_CDN_URL", str),
    "inbox_max_mb": ("IAS_INBOX_MAX_MB", (int, 1, 1024 * 1024)),
    "vision": ("IAS_VISION", (int, 0, 1)),
}
# Never read from ias.toml: a config file is too easily committed or shared.
_SECRETS = {"openai_api_key": "OPENAI_API_KEY", "wechat_token": "IAS_WECHAT_TOKEN",
            "notify_webhook_token": "IAS_NOTIFY_WEBHOOK_TOKEN"}

FALLBACK_KEY = "IAS_FALLBACK_KEY_"      # + N: the key of IAS_FALLBACK_MODELS' entry N (a secret, like OPENAI_API_KEY)
ENV_FILE = "ias.env"            # the data directory's env file (Config.env_file; the service's unit names it too)


def _in_data_dir(name: str, doc: str) -> property:
    """A Config property: the path `name` in the data directory (already absolute: data_dir is)."""
    return property(lambda config: config.data_dir / name, doc=doc)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One fallback model (IAS_FALLBACK_MODELS): its base URL (None: the SDK's default), model and key; the
    key stays out of every repr, and `key_from` names the variable it came from, for messages."""
    base_url: str | None
    model: str
    key: str | None = field(repr=False)
    key_from: str


@dataclass(frozen=True, slots=True)
class Config:
    """Everything configurable, resolved once at start."""
    database_url: str | None = None
    data_dir: Path = Path("var")
    secret_key_file: Path | None = None
    pg_linger: float = CLUSTER_LINGER       # seconds the embedded cluster stays up after the last iAs process left
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    model: str = MODEL_DEFAULT
    fallback_models: tuple[Endpoint, ...] = ()     # tried in order when the primary model is unavailable
    owner: str | None = None
    approval_timeout: float = APPROVAL_TIMEOUT
    llm_timeout: float = LLM_TIMEOUT        # seconds one model request may take in all (not per read)
    turn_timeout: float = TURN_TIMEOUT      # seconds one turn may take, not counting the wait for the owner's code
    wechat_base_url: str | None = None      # None: the stored login's, else https://ilinkai.weixin.qq.com
    wechat_token: str | None = None
    wechat_owner: str | None = None
    wechat_window: float = WECHAT_REPLY_WINDOW  # seconds after the owner's last message in which WeChat sends are tried
    wechat_budget: int = WECHAT_SEND_BUDGET  # bot messages per owner message, the last being "reply to continue"
    outbox_expire: float = OUTBOX_EXPIRE  # seconds a queued message may wait before it expires
    fallback_after: float = FALLBACK_AFTER  # seconds past due before a reminder/task result goes to the fallback
    retention_days: int = RETENTION_DAYS  # history, settled outbox rows and task runs older than this are pruned daily
    notify_email: str | None = None
    notify_wecom_url: str | None = None
    notify_webhook_url: str | None = None
    notify_webhook_token: str | None = None
    notify_webhook_body: str | None = None      # a JSON object template for the generic webhook
    daily_tokens: int | None = None         # model tokens per owner per Beijing day; None: no limit
    smtp: object = None                     # IAS_SMTP_*, checked: an ias_skill.smtp.Server, None without a host
    imap: object = None                     # IAS_IMAP_*, likewise
    skills_dir: Path = REPO_ROOT / "skills"
    system_skills_dir: Path | None = REPO_ROOT / "resources" / "skills"
    allow_risk_downgrade: frozenset[str] = frozenset()
    max_tools: int = MAX_TOOLS_DEFAULT
    tools_bytes: int = TOOLS_BYTES_DEFAULT
    repo_root: Path = REPO_ROOT
    sandbox_user: str | None = None         # [sandbox] user: whom skills run as when iAs is root (default nobody)
    sandbox_allow_partial: bool = False     # [sandbox] allow_partial: user skills load below the full level
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    wechat_cdn_url: str = WECHAT_CDN_URL    # the WeChat CDN, where the server gives no full URL (a local one in tests)
    inbox_max_mb: int = INBOX_MAX_MB        # megabytes the owner's inbox may hold; the oldest files go first
    vision: int = 0                         # 1: the model sees images (IAS_VISION, or a provider preset's)

    def __post_init__(self) -> None:
        # Resolved once, against the working directory at start: a skill runs in its own
        # directory, so a relative path handed downstream would point somewhere else.
        for name in ("data_dir", "secret_key_file", "skills_dir", "system_skills_dir", "repo_root"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, absolute(value))

    # The data directory's layout: every file iAs keeps there is named here and nowhere else.

    @property
    def key_file(self) -> Path:
        """The secret key (approval codes, the audit chain): IAS_SECRET_KEY_FILE, else in the data directory."""
        return self.secret_key_file or self.data_dir / "secret.key"

    env_file = _in_data_dir(ENV_FILE, "KEY=VALUE settings and secrets read by every command (`ias setup` writes it).")
    audit_head = _in_data_dir("audit.head", "The audit chain's newest row (id and keyed value), outside the database.")
    cluster_dir = _in_data_dir("pg", "The embedded PostgreSQL cluster (no IAS_DATABASE_URL); pgcluster.Cluster names "
                                     "its sibling files (pg.password, pg.users, pg.lock).")
    run_dir = _in_data_dir("runs", "The skill runs' and MCP servers' private HOMEs (what crash recovery looks at).")
    daemon_lock = _in_data_dir("daemon.lock", "The daemon's single-instance lock (a flock held while it runs).")
    unwritten_file = _in_data_dir("unwritten-ends.jsonl", "Skill ends a stopping daemon could not write yet.")
    skills_cache = _in_data_dir("skills.cache.json", "The parsed skill directories, for the `skills` listing.")
    mcp_cache = _in_data_dir("mcp", "Each MCP server's last tool list (`<skill>.json`).")
    inbox = _in_data_dir("inbox", "What the owner sent (WeChat images, files, voice): `YYYY-MM-DD/` directories, "
                                  "bounded by IAS_INBOX_MAX_MB.")
    outgoing = _in_data_dir("outgoing", "Private copies of the files skills send the owner, until the outbox sent them.")


def absolute(path: str | os.PathLike) -> Path:
    """`path` with ~ expanded, made absolute against the current directory and normalised."""
    return Path(os.path.abspath(os.path.expanduser(path)))


def _convert(name: str, value, kind):
    if isinstance(kind, tuple):         # (int or float, lowest, highest)
        number_type, low, high = kind
        try:
            number = number_type(value)
            if isinstance(value, bool) or (number_type is int and isinstance(value, float) and value != number):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{name} must be {'an integer' if number_type is int else 'a number'}, "
                              f"got {value!r}") from None
        if not low <= number <= high:
            raise ConfigError(f"{name} must be between {low} and {high}, got {value!r}")
        return number
    if kind is float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be a number of seconds, got {value!r}") from None
        if not 1 <= number <= 86400:
            raise ConfigError(f"{name} must be between 1 and 86400 seconds, got {value!r}")
        return number
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name} must be a non-empty string")
    return _utf8(name, value.strip())


def _utf8(name: str, value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:          # invalid UTF-8 in the environment (decoded with surrogateescape)
        raise ConfigError(f"{name} is not valid UTF-8") from None
    return value


def _sandbox_table(file: Path, table) -> dict:
    """`[sandbox]`: `user` (a user name) and `allow_partial` (a boolean), as Config fields."""
    if not isinstance(table, dict) or set(table) - {"user", "allow_partial"}:
        raise ConfigError(f"{file}: [sandbox] accepts only user = \"NAME\" and allow_partial = true|false")
    out = {}
    if "user" in table:
        out["sandbox_user"] = _convert(f"{file}: [sandbox] user", table["user"], str)
    if "allow_partial" in table:
        if not isinstance(table["allow_partial"], bool):
            raise ConfigError(f"{file}: [sandbox] allow_partial must be true or false")
        out["sandbox_allow_partial"] = table["allow_partial"]
    return out


def load(path: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read ias.toml (path, else $IAS_CONFIG, else ./ias.toml if present) and apply the environment."""
    env = dict(os.environ if environ is None else environ)
    explicit = path or env.get("IAS_CONFIG")
    file = Path(explicit) if explicit else Path("ias.toml")
    data: dict = {}
    if explicit or file.exists():
        import tomllib                  # only with a file to read: most set-ups have none
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config {file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start})") from None
        except RecursionError:
            raise ConfigError(f"{file}: values nested too deeply") from None

    env = _with_env_file(env, data.get("data_dir"))
    values: dict = {}
    skills_table = data.pop("skills", {})
    sandbox = _sandbox_table(file, data.pop("sandbox", {}))
    for key, value in data.items():
        if key in _SECRETS:
            raise ConfigError(f"{file}: '{key}' is a secret; set {_SECRETS[key]} in the environment instead")
        if key not in _SETTINGS:
            raise ConfigError(f"{file}: unknown setting '{key}'")
        values[key] = _convert(f"{file}: {key}", value, _SETTINGS[key][1])
    if not isinstance(skills_table, dict) or set(skills_table) - {"allow_risk_downgrade"}:
        raise ConfigError(f"{file}: [skills] accepts only allow_risk_downgrade = [\"name\", …]")
    downgrade = skills_table.get("allow_risk_downgrade", [])
    if not isinstance(downgrade, list) or not all(isinstance(n, str) for n in downgrade):
        raise ConfigError(f"{file}: [skills] allow_risk_downgrade must be a list of skill names")

    for key, (var, kind) in _SETTINGS.items():
        if env.get(var, "").strip():
            values[key] = _convert(var, env[var], kind)
    for key, var in _SECRETS.items():
        if env.get(var, "").strip():
            values[key] = _utf8(var, env[var].strip())
    for key in ("data_dir", "secret_key_file", "skills_dir"):
        if key in values:
            values[key] = absolute(values[key])
    values["fallback_models"] = fallback_models(values.get("fallback_models"), env, values.get("openai_base_url"),
                                                values.get("openai_api_key"))
    smtp, imap = (mail_server(prefix, env) for prefix in ("IAS_SMTP", "IAS_IMAP"))
    config = Config(**values, allow_risk_downgrade=frozenset(downgrade), smtp=smtp, imap=imap, environ=env,
                    **sandbox)
    if config.notify_email and config.smtp is None:     # else found out only when the fallback is needed
        raise ConfigError("IAS_NOTIFY_EMAIL is set but IAS_SMTP_HOST is not: the fallback e-mail is sent with the "
                          "IAS_SMTP_* settings")
    if config.notify_webhook_body is not None:
        try:
            body = json.loads(config.notify_webhook_body)
        except (ValueError, RecursionError):
            body = None
        if not isinstance(body, dict):
            raise ConfigError("IAS_NOTIFY_WEBHOOK_BODY must be a JSON object, e.g. "
                              '{"topic": "ias", "title": "{title}", "message": "{text}"}')
    if config.data_dir.exists() and not config.data_dir.is_dir():
        raise ConfigError(f"IAS_DATA_DIR {config.data_dir} is not a directory")
    return config


def _with_env_file(env: dict[str, str], toml_data_dir) -> dict[str, str]:
    """`env` over the env file's settings, the env file being in the data directory that the real environment
    (else ias.toml, else the default) names; its own IAS_DATA_DIR and IAS_CONFIG are not used."""
    where = env.get("IAS_DATA_DIR", "").strip() or (toml_data_dir if isinstance(toml_data_dir, str) else None)
    path = (Config(data_dir=Path(where)) if where else Config()).env_file
    settings = envfile.read(path) if path.parent.is_dir() else {}      # not a directory: load() says so
    for name in ("IAS_DATA_DIR", "IAS_CONFIG"):
        settings.pop(name, None)
    return {**settings, **env}


def mail_server(prefix: str, environ: Mapping[str, str]):
    """The checked `prefix`_* settings (IAS_SMTP or IAS_IMAP) by the rules the email skill applies to the
    same variables (ias_skill.smtp), None without a host; a bad one is a ConfigError naming it."""
    if not any(name.startswith(prefix + "_") and value.strip() for name, value in environ.items()):
        return None         # nothing set: the helper is not even loaded
    smtp = skill_lib("smtp")
    try:
        return smtp.server(prefix, environ)
    except smtp.SettingError as exc:
        raise ConfigError(str(exc)) from None


def skill_lib(name: str) -> ModuleType:
    """`ias_skill.<name>` from resources/lib: code the daemon shares with skills (the SMTP client) lives
    there, as a sandboxed skill reaches nothing else of the repository. Loaded as the package
    `ias_skill` (the same module a skill imports), without putting resources/lib on sys.path."""
    if "ias_skill" not in sys.modules:
        from importlib.util import module_from_spec, spec_from_file_location     # here: most commands send no mail
        init = SKILL_LIB / "ias_skill" / "__init__.py"
        spec = spec_from_file_location("ias_skill", init, submodule_search_locations=[str(init.parent)])
        package = module_from_spec(spec)
        sys.modules["ias_skill"] = package
        try:
            spec.loader.exec_module(package)
        except BaseException:
            del sys.modules["ias_skill"]
            raise
    return importlib.import_module(f"ias_skill.{name}")


def fallback_models(text: str | None, environ: Mapping[str, str], base_url: str | None,
                    api_key: str | None) -> tuple[Endpoint, ...]:
    """IAS_FALLBACK_MODELS (comma-separated `model` or `base_url|model`) as Endpoints; entry N takes its key
    from IAS_FALLBACK_KEY_<N>, else OPENAI_API_KEY (`api_key`), and without a base URL the primary's
    (`base_url`). A malformed entry, too many, or a key variable naming no entry is a ConfigError."""
    entries = [] if text is None else [entry.strip() for entry in text.split(",")]
    if len(entries) > FALLBACK_MODELS_MAX:
        raise ConfigError(f"IAS_FALLBACK_MODELS has {len(entries)} entries; at most {FALLBACK_MODELS_MAX} are allowed")
    endpoints = []
    for n, entry in enumerate(entries, 1):
        where = f"IAS_FALLBACK_MODELS entry {n} ({entry!r})"
        if not entry:
            raise ConfigError(f"IAS_FALLBACK_MODELS entry {n} is empty (two commas in a row, or one at the end?)")
        parts = [part.strip() for part in entry.split("|")]
        if len(parts) > 2:
            raise ConfigError(f"{where}: write `model` or `base_url|model`, with one |")
        url, model = parts if len(parts) == 2 else (base_url, parts[0])
        if len(parts) == 2 and not _http_url(url):
            raise ConfigError(f"{where}: the base URL must be an http:// or https:// URL with a host "
                              "(and no user:password@)")
        if not model or "://" in model:
            raise ConfigError(f"{where}: no model name (write `model` or `base_url|model`)")
        if any(c.isspace() or not c.isprintable() for c in model):
            raise ConfigError(f"{where}: a model name has no spaces or control characters")
        name = f"{FALLBACK_KEY}{n}"
        own = environ.get(name, "").strip()
        endpoints.append(Endpoint(url, model, _utf8(name, own) if own else api_key,
                                  name if own else "OPENAI_API_KEY"))
    stray = sorted(name for name, value in environ.items() if name.startswith(FALLBACK_KEY.rstrip("_"))
                   and value.strip() and name not in {f"{FALLBACK_KEY}{n}" for n in range(1, len(entries) + 1)})
    if stray:
        raise ConfigError(f"{stray[0]} is set but IAS_FALLBACK_MODELS has {len(entries)} entries: "
                          f"{FALLBACK_KEY}<N> is the key of entry N, counted from 1")
    return tuple(endpoints)


def _http_url(url: str) -> bool:
    """Whether `url` is an http(s) URL with a host (and a valid port, if any), without blanks, controls or
    credentials (a key belongs in IAS_FALLBACK_KEY_<N>, which no log or doctor line shows)."""
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname) and parts.username is None
            and not any(c.isspace() or not c.isprintable() for c in url))
