#!/usr/bin/env python3
"""Entry point: `python ias.py …` is the same as the installed `ias` command."""
import sys

from ias.cli import main

if __name__ == "__main__":
    sys.exit(main())
