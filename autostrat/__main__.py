"""`python -m autostrat` runs the command line."""

from autostrat.entry import command

command()
