"""`python -m autostrat` runs the command line."""

import os
import sys

try:
    from autostrat.cli import command
except KeyboardInterrupt:  # before autostrat.cli's own imports catch it (see there)
    print("\nautostrat: interrupted, nothing written", file=sys.stderr, flush=True)
    os._exit(130)

command()
