"""iAs: a self-hosted personal assistant daemon (WeChat + LLM + skills)."""
from __future__ import annotations

from pathlib import Path


def version() -> str:
    """iAs's version: pyproject.toml's (the one place it is written), else the installed package's metadata."""
    import tomllib
    try:
        with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as file:
            return tomllib.load(file)["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        from importlib.metadata import PackageNotFoundError, version as installed
        try:
            return installed("ias")
        except PackageNotFoundError:
            return "unknown"
