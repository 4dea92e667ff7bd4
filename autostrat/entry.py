"""The `autostrat` executable's process: the command line's imports, `autostrat.cli.main`, and
the exit. Only `os` and `sys` are imported here, so Ctrl-C during the second it takes to import
the search ends the command in one line, as it does later (`autostrat.cli._dispatch`).
"""

import os
import sys

INTERRUPTED = "\nautostrat: interrupted, nothing written"  # Ctrl-C: outputs are written only once complete


def command() -> None:
    """The `autostrat` executable (also ``python -m autostrat``): `autostrat.cli.main`, then exit
    without freeing the search's memos.

    A 1024-device search leaves millions of small objects in its memos; freeing them one by one
    at interpreter exit, after a last garbage collection over all of them, took 6 of 20 s.
    Everything is written and flushed before the process ends.
    """
    try:
        from autostrat.cli import main

        code = main()
    except KeyboardInterrupt:  # while importing or parsing the command line, before `_dispatch` catches it
        print(INTERRUPTED, file=sys.stderr)
        code = 130
    for stream in filter(None, (sys.stdout, sys.stderr)):  # None: started with it closed
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader gone (`| head`), or the stream closed after it
            pass
    # not sys.exit: besides the memos, an extension whose import Ctrl-C ended (PyRun_*) has marked
    # the interpreter to kill itself with SIGINT (exit -2) on its way out
    os._exit(code)
