"""The `openai` SDK, imported with its type packages deferred.

The SDK's `openai/types/__init__.py` (and each of its subpackages' `__init__`) imports every type module of
every API eagerly: ~700 modules and ~0.25 s on a 2-core machine, and ~20 MB that a daemon keeps for hours,
while a chat completion needs a few dozen of them. `load()` imports `openai` with each of those package
`__init__`s deferred (PEP 562): the package exists at once, with its `__path__`, so its submodules import
as usual; the first attribute read from the package itself (`openai.types.Batch`, `from openai.types.chat
import ChatCompletion`) runs its `__init__` in full, once, under a lock, and is answered from it. What the SDK
does is unchanged; only when a package's `__init__` runs moves.

Deferred only while `load()` imports the SDK; a type package first imported later is imported as usual. Not
handled: an SDK that defines objects (not only re-exports) in a type package's `__init__` sees them appear
on first use, which is when anything could read them.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import ssl
import sys
import threading
from contextlib import contextmanager
from types import ModuleType
from typing import Iterator
from urllib.parse import urlsplit

DEFERRED = "openai.types"           # this package and its subpackages


def load() -> ModuleType:
    """`openai`, imported now unless it already is (then as it is)."""
    with _LOCK:
        if "openai" not in sys.modules:
            with deferring(DEFERRED):
                importlib.import_module("openai")
    return sys.modules["openai"]


_LOCK = threading.Lock()


@contextmanager
def deferring(package: str) -> Iterator[None]:
    """Inside it, `package` and its subpackages, when first imported, have their `__init__` deferred."""
    finder = _Finder(package)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def client(settings: dict):
    """An `openai.AsyncOpenAI(**settings)`, its TLS context `tls_context`'s."""
    openai = load()
    context = tls_context(settings.get("base_url"))
    if context is None:
        return openai.AsyncOpenAI(**settings)
    return openai.AsyncOpenAI(**settings, http_client=openai.DefaultAsyncHttpxClient(verify=context))


def tls_context(base_url: str | None) -> ssl.SSLContext | None:
    """None (the SDK's own, with the system's CA bundle) unless `base_url` is plain HTTP (a local Ollama or vLLM):
    then a context that verifies against no CA at all, instead of loading the bundle (~30 ms a process) for
    connections that never speak TLS. A redirect to an https URL fails closed."""
    if not base_url or urlsplit(base_url).scheme.lower() != "http":
        return None
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)          # CERT_REQUIRED and check_hostname, no CA loaded


async def chat(client, body: dict):
    """One chat completion: `body` (JSON iAs built) posted through `client`'s own HTTP stack (its key, timeout,
    errors and parsing into a ChatCompletion). `chat.completions.create` would walk the body again by its typed
    parameters (hundreds of calls for a request's tools) and first import the streaming and parsing helpers of
    the chat resource, which iAs never uses."""
    from openai.types.chat.chat_completion import ChatCompletion
    return await client.post("/chat/completions", body=body, cast_to=ChatCompletion)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `package` and its subpackages as the path finder does, their loader wrapped in `_Deferred`."""

    def __init__(self, package: str):
        self.package = package

    def find_spec(self, fullname, path, target=None):
        if fullname != self.package and not fullname.startswith(self.package + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return spec                             # a plain module: imported as usual
        spec.loader = _Deferred(spec.loader)
        return spec


class _Deferred(importlib.abc.Loader):
    """A package whose `__init__` runs on the first attribute read from it (a module `__getattr__`)."""

    def __init__(self, loader: importlib.abc.Loader):
        self.loader = loader

    def __getattr__(self, name: str):
        return getattr(self.loader, name)      # get_source, is_package, get_resource_reader: the real loader's

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        lock = threading.RLock()
        running = []                    # while the `__init__` runs (in the one thread holding the lock)

        def __getattr__(name: str):
            with lock:                  # another thread waits here until the `__init__` has run
                if not running and module.__dict__.get("__getattr__") is __getattr__:
                    running.append(True)
                    try:
                        self.loader.exec_module(module)
                        del module.__getattr__
                    finally:
                        running.clear()             # failed: tried again on the next read
            try:
                return module.__dict__[name]        # (the `__init__` itself: only what it has set so far)
            except KeyError:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None
        module.__getattr__ = __getattr__
