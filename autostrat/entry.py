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
    except (KeyboardInterrupt, RuntimeError) as error:  # while importing or parsing the command line,
        if interruption(error) is None:  # before `_dispatch` catches it
            raise
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


def interruption(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C (or SIGTERM) behind `error`: `error` itself, or the one Python 3.11 wraps in a
    RuntimeError when it lands while a class is made (a dataclass field's ``__set_name__``, as
    an import defines the class); None for any other error.

    Example:
        >>> try:
        ...     raise RuntimeError("Error calling __set_name__") from KeyboardInterrupt()
        ... except RuntimeError as error:
        ...     type(interruption(error)).__name__, interruption(ValueError())
        ('KeyboardInterrupt', None)
    """
    if isinstance(error, KeyboardInterrupt):
        return error
    if isinstance(error, RuntimeError) and isinstance(error.__cause__, KeyboardInterrupt):
        return error.__cause__
    return None
