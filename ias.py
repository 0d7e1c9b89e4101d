#!/usr/bin/env python3
"""Entry point: `python ias.py …` is the same as the installed `ias` command."""
from ias.cli import run

if __name__ == "__main__":
    run()
