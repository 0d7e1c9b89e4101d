#!/usr/bin/env python3
"""Entry point: `python ias.py …` is the same as the installed `ias` command.

Run by an interpreter without iAs's dependencies (the system's python3), it runs again with the
checkout's venv when that one can be run; else it goes on, and a command that needs them says in
one line to run `make` first (`cli`). The cyclic garbage collector is off while iAs starts (see
`cli.run`)."""
import gc
import os
import sys
from pathlib import Path


def _missing() -> bool:
    """Whether this interpreter lacks iAs's dependencies (not imported: `skills` needs neither)."""
    import importlib.util
    return not all(importlib.util.find_spec(name) for name in ("psycopg", "openai"))


if __name__ == "__main__":
    gc.disable()
    venv = Path(__file__).resolve().parent / ".venv"
    python = venv / "bin" / "python"
    # Never twice: a venv whose install failed lacks them too. Run by that venv (the usual case), nothing is looked up.
    if Path(sys.executable) != python and Path(sys.prefix).resolve() != venv and os.access(python, os.X_OK) \
            and _missing():
        os.execv(python, [str(python), __file__, *sys.argv[1:]])
    from ias.cli import run
    run()
