"""`python -m ias.pgcluster DATADIR TOKEN BINDIR`: the embedded cluster's reaper, run (by its sh, after sleeping
out the linger) to stop the server if it is still idle since the mark carrying TOKEN. Not handled: waiting
itself (sh and sleep do that, for a megabyte or two) and any other command."""
import sys
from pathlib import Path

from . import Cluster


def main(argv: list[str]) -> None:
    datadir, token, bindir = argv
    Cluster(Path(datadir), bindir=Path(bindir) if bindir else None).reap(token)


if __name__ == "__main__":
    main(sys.argv[1:])
