"""The LLM endpoint: chat completions with tools on `openai.AsyncOpenAI`, with our own retries.

The SDK's own retries are switched off so that the delays are ours (named in limits, and
injectable for tests). Every failure ends as LLMError; its text is for the log only — the
owner gets one short apology from the agent, never an exception string.

`openai` is imported on the first request, not at start: its ~500 type modules are a quarter of
an idle daemon's memory, and a daemon that only sends reminders or answers /commands never
needs them.
"""
from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from .errors import IasError
from .limits import LLM_RETRY_DELAYS, LLM_TIMEOUT

log = logging.getLogger(__name__)


class LLMError(IasError):
    """The endpoint failed after all retries (or refused for good, e.g. a bad key)."""


class ToolsRefused(LLMError):
    """The endpoint refused the request because of its tools (too many, or too large): a 400 naming them."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str          # JSON text, as the model wrote it


@dataclass(frozen=True, slots=True)
class Reply:
    content: str | None
    tool_calls: tuple[ToolCall, ...]

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
            openai.InternalServerError, openai.ConflictError)


class LLM:
    """One OpenAI-compatible endpoint and model."""

    def __init__(self, api_key: str, base_url: str | None, model: str,
                 retry_delays: tuple[float, ...] = LLM_RETRY_DELAYS, timeout: float = LLM_TIMEOUT):
        self._settings = {"api_key": api_key, "base_url": base_url, "max_retries": 0, "timeout": timeout}
        self._client = None
        self.model = model
        self.retry_delays = retry_delays

    @property
    def client(self):
        """The SDK client, made (and `openai` imported) on first use."""
        if self._client is None:
            import openai
            self._client = openai.AsyncOpenAI(**self._settings)
        return self._client

    async def complete(self, messages: list[dict], tools: list[dict]) -> Reply:
        """One chat completion; transient failures are retried with backoff, then LLMError."""
        client = self.client
        import openai
        for attempt in range(len(self.retry_delays) + 1):
            try:
                response = await client.chat.completions.create(
                    model=self.model, messages=_unicode(messages), **({"tools": tools} if tools else {}))
                break
            except _transient(openai) as exc:
                if attempt == len(self.retry_delays):
                    raise LLMError(f"LLM endpoint failed {attempt + 1} times: {type(exc).__name__}") from exc
                log.warning("LLM request failed (%s), retrying in %.1fs", type(exc).__name__, self.retry_delays[attempt])
                await asyncio.sleep(self.retry_delays[attempt])
            except openai.BadRequestError as exc:
                if "tool" in str(exc).lower():
                    raise ToolsRefused(f"LLM endpoint refused the tools ({len(tools)} offered): "
                                       f"{str(exc)[:300]}") from exc
                raise LLMError("LLM endpoint refused the request: BadRequestError 400") from exc
            except openai.APIError as exc:
                raise LLMError(f"LLM endpoint refused the request: {type(exc).__name__} "
                               f"{getattr(exc, 'status_code', '')}") from exc
        if not response.choices:
            raise LLMError("LLM endpoint returned no choices")
        message = response.choices[0].message
        calls = tuple(ToolCall(c.id, c.function.name, _unicode(c.function.arguments or "{}"))
                      for c in (message.tool_calls or []) if c.type == "function")
        return Reply(_unicode(message.content), calls)

    async def check(self) -> str:
        """For `doctor`: list the endpoint's models; returns a short description."""
        models = await self.client.models.list()
        names = [m.id for m in models.data]
        found = "found" if self.model in names else "not listed"
        return f"{len(names)} models, {self.model} {found}"

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
