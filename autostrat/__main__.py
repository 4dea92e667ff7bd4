"""`python -m autostrat` runs the command line."""

import sys

from autostrat.cli import main

sys.exit(main())
