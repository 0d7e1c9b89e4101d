"""The LLM endpoint: chat completions with tools on `openai.AsyncOpenAI`, with our own retries.

The SDK's own retries are switched off so that the delays are ours (named in limits, and
injectable for tests). Every failure ends as LLMError; its text is for the log only — the
owner gets one short apology from the agent, never an exception string.

Each attempt has a total deadline (IAS_LLM_TIMEOUT): the SDK's timeout is per read, so an
endpoint that drips a byte at a time would never end without it. A reply that is not a chat
completion (broken JSON, an HTML error page with status 200, no choices) is retried like a 5xx.
The agent's turn deadline bounds the attempts and their delays together.

`Models` chains the primary with the fallback models (IAS_FALLBACK_MODELS, SPEC §12): the next one is
asked only when one is `Unavailable` (its retries of transient failures exhausted), never after a
refused key, refused tools or another 4xx, which the next endpoint would not cure and which the owner
must hear about. It does not remember an outage: every request starts at the primary again.

Small local models served without a tool-call parser write their calls as text; a reply that is
nothing but such a call of an offered tool becomes that call (`text_calls`, SPEC §15).

Every Reply names the model that answered (the configured name, not the endpoint's own label) and
its token `Usage` from the completion's `usage`. A `usage` that is absent or not believable (not a
whole number, negative, above USAGE_TOKENS_MAX) is estimated instead, marked so: UTF-8 bytes of
the request (messages and tools as JSON) and of the reply (text and calls), each divided by
ESTIMATE_BYTES_PER_TOKEN, rounded up; an image part counts IMAGE_TOKENS_ESTIMATE. Not handled: cached
or reasoning tokens (counted as the endpoint counts them, inside prompt and completion), prices.

`openai` is imported (by `sdk`, its type packages deferred) on the first request, not at start: a
daemon that only sends reminders or answers /commands never needs it. In the daemon the import runs
in a worker thread, so the first turn does not hold up the channels and other turns on the event
loop; `--once` imports it at once (`warm`).
"""
from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import re
import uuid
from dataclasses import dataclass

from . import sdk
from .jsonschema import values as jsonvalues
from .errors import IasError
from .limits import ESTIMATE_BYTES_PER_TOKEN, IMAGE_TOKENS_ESTIMATE, LLM_RETRY_DELAYS, LLM_TIMEOUT, USAGE_TOKENS_MAX

log = logging.getLogger(__name__)


class LLMError(IasError):
    """The endpoint failed after all retries (or refused for good, e.g. a bad key)."""


class KeyRefused(LLMError):
    """The endpoint refused the API key (401 or 403): no retry helps; the owner must fix `key_from`
    (OPENAI_API_KEY, or a fallback's IAS_FALLBACK_KEY_<N>)."""

    def __init__(self, message: str, key_from: str = "OPENAI_API_KEY"):
        super().__init__(message)
        self.key_from = key_from


class ToolsRefused(LLMError):
    """The endpoint refused the request because of its tools (too many, or too large): a 400 naming them."""


class Unavailable(LLMError):
    """Every attempt failed transiently (connection, timeout, 429, 5xx, not a completion): another model
    may answer (`Models`)."""


class NotACompletion(LLMError):
    """A 200 reply that is not a chat completion (not JSON, or without choices): retried like a 5xx."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens of one model response; `estimated`: the endpoint did not say (believably), so counted by
    the rule in the module docstring."""
    prompt: int
    completion: int
    estimated: bool = False

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass(frozen=True, slots=True)
class Reply:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    model: str = ""                 # the configured model that answered ("" in a test's scripted reply)
    usage: Usage | None = None      # None only in a test's scripted reply: nothing to count

    def message(self) -> dict:
        """This reply as an assistant message for the conversation."""
        message: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in self.tool_calls]
        return message


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode(value):
    """`value` (a shallow message structure) with lone surrogates as U+FFFD: valid Unicode both ways.

    A request body must be UTF-8, and a reply with a `\\ud800` escape must still reach the owner.
    """
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, dict):
        return {key: _unicode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unicode(item) for item in value]
    return value


def _transient(openai) -> tuple[type[Exception], ...]:
    """Failures worth another try: the endpoint may recover. Anything else (400, 401, 404 …) will not."""
    return (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
            openai.InternalServerError, openai.ConflictError, openai.APIResponseValidationError,
            TimeoutError, json.JSONDecodeError, NotACompletion)


class LLM:
    """One OpenAI-compatible endpoint and model."""

    def __init__(self, api_key: str, base_url: str | None, model: str,
                 retry_delays: tuple[float, ...] = LLM_RETRY_DELAYS, timeout: float = LLM_TIMEOUT,
                 key_from: str = "OPENAI_API_KEY"):
        self.key_from = key_from        # the variable the key came from: what a refused key tells the owner to fix
        self._settings = {"api_key": api_key, "base_url": base_url, "max_retries": 0, "timeout": timeout}
        self._client = None
        self._first = asyncio.Lock()        # one import and one client, however many turns start at once
        self.model = model
        self.base_url = base_url        # None: the SDK's default
        self.retry_delays = retry_delays
        self.timeout = timeout          # seconds per attempt in all; the SDK's own timeout is per read

    @property
    def client(self):
        """The SDK client, made (and `openai` imported) on first use; then what the import left behind is
        handed back to the system (a daemon idles with it for hours)."""
        if self._client is None:
            self._client = sdk.client(self._settings)
            release_memory()
        return self._client

    def warm(self) -> None:
        """Import `openai` and make the client now, on this thread (`--once`, where a request is certain and
        nothing else is under way but the cluster's start: an import in a worker thread would only make each of
        the store's round trips wait for the interpreter lock)."""
        if self._client is None:
            self._client = sdk.client(self._settings)

    async def _loaded_client(self):
        """The SDK client; on first use `openai` is imported and the client made in a worker thread."""
        async with self._first:
            if self._client is None:
                await asyncio.to_thread(lambda: self.client)
        return self._client

    async def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        """One chat completion; transient failures are retried with backoff, then LLMError.

        Each attempt ends within `timeout` seconds, whatever the endpoint sends (or does not).
        """
        client = await self._loaded_client()
        openai = sdk.load()
        for attempt in range(len(self.retry_delays) + 1):
            try:
                async with asyncio.timeout(self.timeout):
                    response = await sdk.chat(client, {"model": self.model, "messages": _unicode(messages),
                                                       **({"tools": tools} if tools else {})})
                return _reply(response, messages, tools, self.model)
            except _transient(openai) as exc:
                if attempt == len(self.retry_delays):     # a 409 is a 4xx: SPEC §12 asks no fallback for it
                    kind = LLMError if isinstance(exc, openai.ConflictError) else Unavailable
                    raise kind(f"LLM endpoint failed {attempt + 1} times: {_failure(exc)}") from exc
                log.warning("LLM request failed (%s), retrying in %.1fs", _failure(exc), self.retry_delays[attempt])
                await asyncio.sleep(self.retry_delays[attempt])
            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                raise KeyRefused(f"LLM endpoint refused the API key: {type(exc).__name__} "
                                 f"{getattr(exc, 'status_code', '')}", self.key_from) from exc
            except openai.BadRequestError as exc:
                if "tool" in str(exc).lower():
                    raise ToolsRefused(f"LLM endpoint refused the tools ({len(tools)} offered): "
                                       f"{str(exc)[:300]}") from exc
                raise LLMError("LLM endpoint refused the request: BadRequestError 400") from exc
            except openai.APIError as exc:
                raise LLMError(f"LLM endpoint refused the request: {type(exc).__name__} "
                               f"{getattr(exc, 'status_code', '')}") from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def models(self) -> list[str] | None:
        """For `doctor`: the model names the endpoint lists; None when it has no model list (a 404: some
        OpenAI-compatible servers offer chat completions only). A refused key is KeyRefused; any other
        failure is the SDK's exception."""
        client = await self._loaded_client()
        openai = sdk.load()
        try:
            async with asyncio.timeout(self.timeout):
                listing = await client.models.list()
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise KeyRefused(f"LLM endpoint refused the API key: {type(exc).__name__}", self.key_from) from exc
        except openai.NotFoundError:
            return None
        return [m.id for m in listing.data]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class Models:
    """The primary LLM, then each fallback in order, behind LLM's interface: a model `Unavailable` after its
    retries hands the request to the next (one warning in the log, nothing in the reply); any other
    failure, and the last model's, is the caller's."""

    def __init__(self, primary: LLM, fallbacks: tuple[LLM, ...] = ()):
        self.primary = primary
        self.fallbacks = fallbacks

    @property
    def members(self) -> tuple[LLM, ...]:
        return (self.primary, *self.fallbacks)

    @property
    def model(self) -> str:
        return self.primary.model

    def warm(self) -> None:
        """Warm the primary only: a fallback is made on its first request (`openai` is imported by then)."""
        self.primary.warm()

    async def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        *first, last = self.members
        for llm, after in zip(first, self.fallbacks):
            try:
                return await llm.complete(messages, tools)
            except Unavailable as exc:
                log.warning("LLM model %s failed (%s); trying fallback %s", llm.model, exc, after.model)
        return await last.complete(messages, tools)

    async def models(self) -> list[str] | None:
        """The primary's model list (`doctor` asks each member itself)."""
        return await self.primary.models()

    async def close(self) -> None:
        """Close every member (all of them, even when one fails)."""
        await asyncio.gather(*(llm.close() for llm in self.members))


def release_memory() -> None:
    """Collect garbage and hand the C heap's free pages back to the system (glibc `malloc_trim`, where there
    is one): a large import in a worker thread leaves a whole malloc arena of freed pages behind."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):          # not glibc: nothing to trim
        pass


def _failure(exc: BaseException) -> str:
    """A failed attempt for the log: its kind, never the reply's text."""
    if isinstance(exc, TimeoutError):
        return "no complete reply within the deadline"
    if isinstance(exc, json.JSONDecodeError):
        return "a reply that is not valid JSON"
    return str(exc) if isinstance(exc, NotACompletion) else type(exc).__name__


def _reply(response, messages: list[dict], tools: list[dict], model: str) -> Reply:
    """The Reply in a chat completion, from `model`, to a request of `messages` and `tools`; NotACompletion if
    it is none (e.g. a 200 HTML page, which the SDK returns as a string)."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices or getattr(choices[0], "message", None) is None:
        raise NotACompletion("a 200 reply that is not a chat completion")
    message = choices[0].message
    calls = tuple(ToolCall(c.id, c.function.name, _unicode(c.function.arguments or "{}"))
                  for c in (message.tool_calls or []) if c.type == "function")
    content = _unicode(message.content)
    if not calls and content:
        offered = {t["function"]["name"] for t in tools if isinstance(t.get("function"), dict)}
        calls = text_calls(content, offered)
        if calls:
            log.info("the model wrote %d tool call(s) as text: run as calls", len(calls))
            content = None
    return Reply(content, calls, model, _usage(getattr(response, "usage", None), messages, tools, content, calls))


def _usage(reported, messages: list[dict], tools: list[dict], content: str | None,
           calls: tuple[ToolCall, ...]) -> Usage:
    """The endpoint's count of tokens when it is believable (hostile input: any type, any size), else the
    estimate of the module docstring."""
    counts = [getattr(reported, name, None) for name in ("prompt_tokens", "completion_tokens")]
    if all(type(n) is int and 0 <= n <= USAGE_TOKENS_MAX for n in counts):
        return Usage(counts[0], counts[1])
    images = 0
    texts = []
    for message in messages:        # an image part (a vision turn) counts as an image, not as its base64 bytes
        parts = message.get("content")
        if isinstance(parts, list):
            kept = [part for part in parts if not (isinstance(part, dict) and part.get("type") == "image_url")]
            images += len(parts) - len(kept)
            message = {**message, "content": kept}
        texts.append(message)
    sent = json.dumps(texts, ensure_ascii=False) + (json.dumps(tools, ensure_ascii=False) if tools else "")
    received = (content or "") + "".join(call.name + call.arguments for call in calls)
    return Usage(_tokens(sent) + images * IMAGE_TOKENS_ESTIMATE, _tokens(received), estimated=True)


def _tokens(text: str) -> int:
    """The estimated tokens of `text`: its UTF-8 bytes / ESTIMATE_BYTES_PER_TOKEN, rounded up."""
    return -(-len(text.encode("utf-8", "replace")) // ESTIMATE_BYTES_PER_TOKEN)


# Tool calls written as text (SPEC §15 "Real models' habits"). Forms seen from llama.cpp, Ollama and vLLM
# without a tool-call parser: a JSON object {"name": …, "arguments": {…}} ("parameters" for Llama 3),
# bare or in a ```json fence; Hermes/Qwen tags <tool_call>{…}</tool_call> (one per call) and <tools>{…}</tools>;
# and <function name=NAME arguments='{…}'/>. Nothing else in the content, or it stays text.
_TAG = re.compile(r"<(tool_call|tools)>")
_FUNCTION = re.compile(r"""<function\s+name\s*=\s*(?:"([^"<>]*)"|'([^'<>]*)'|([^\s"'<>/]+))"""
                       r"""\s+arguments\s*=\s*(?:'([^']*)'|"([^"]*)")\s*(?:/>|>\s*</function>)""")
_SPACE = re.compile(r"\s*")
_CALL_KEYS = ({"name", "arguments"}, {"name", "parameters"})


def text_calls(content: str, offered: set[str]) -> tuple[ToolCall, ...]:
    """The tool calls `content` consists of, if it is nothing but calls written as text, each naming a tool
    in `offered` with an object of arguments; else () and the content stays an answer."""
    text = content.strip()
    if text.startswith("```") and text.endswith("```") and len(text) > 6:
        first, _, rest = text[3:-3].partition("\n")
        if first.strip().lower() not in ("", "json"):
            return ()
        text = rest.strip()
    if text.startswith(("{", "[")):
        blocks = [(None, text)]
    elif text.startswith("<"):
        blocks = _tagged(text)
    else:
        return ()
    found: list[tuple[str, str]] = []
    for name, payload in blocks or ():
        calls = _payload_calls(name, payload)
        if not calls:
            return ()
        found.extend(calls)
    if not found or any(name not in offered for name, _ in found):
        return ()
    turn = uuid.uuid4().hex[:12]
    return tuple(ToolCall(f"call_text_{turn}_{i}", name, arguments) for i, (name, arguments) in enumerate(found))


def _tagged(text: str) -> list[tuple[str | None, str]] | None:
    """`text` as a sequence of tagged calls (whitespace between them only): (name or None, payload) each."""
    import html                         # only for a reply written as calls (~2 ms of every start otherwise)
    blocks: list[tuple[str | None, str]] = []
    pos = _SPACE.match(text).end()
    while pos < len(text):
        if tag := _TAG.match(text, pos):
            end = text.find(f"</{tag[1]}>", tag.end())
            if end < 0:
                return None
            blocks.append((None, text[tag.end():end]))
            pos = end + len(tag[1]) + 3
        elif function := _FUNCTION.match(text, pos):
            name = function[1] or function[2] or function[3]
            arguments = function[4] if function[4] is not None else html.unescape(function[5])     # "{&quot;…"
            blocks.append((html.unescape(name), arguments))
            pos = function.end()
        else:
            return None
        pos = _SPACE.match(text, pos).end()
    return blocks


def _payload_calls(name: str | None, payload: str) -> list[tuple[str, str]]:
    """(name, arguments as JSON text) of each call in one block; [] if the block is not only calls."""
    try:
        value = jsonvalues.loads(payload.strip())
    except (ValueError, RecursionError):
        return []
    if name is not None:            # <function name=… arguments='…'/>: the payload is the arguments
        return [(name, payload.strip())] if isinstance(value, dict) else []
    calls = []
    for call in value if isinstance(value, list) else [value]:
        if not isinstance(call, dict) or set(call) not in _CALL_KEYS or not isinstance(call["name"], str):
            return []
        arguments = call.get("arguments", call.get("parameters"))
        if isinstance(arguments, str):      # arguments as a JSON string, as the API itself sends them
            try:
                if not isinstance(jsonvalues.loads(arguments), dict):
                    return []
            except (ValueError, RecursionError):
                return []
        elif isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        else:
            return []
        calls.append((call["name"], arguments))
    return calls
