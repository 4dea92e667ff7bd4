"""`python -m autostrat` runs the command line."""

from autostrat.cli import command

command()
