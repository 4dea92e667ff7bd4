"""Ctrl-C's default handling for a test's child process.

A shell's background job (a suite started with ``&``, as a CI script may start it) starts with
SIGINT ignored, which Python and every child it starts then keep: a test that interrupts a child
must give it the default handling back, or the child runs on to its end.

Example:
    >>> import subprocess, sys
    >>> subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT).__name__)"],
    ...                preexec_fn=sigint_default, capture_output=True, text=True).stdout
    'default_int_handler\\n'
"""

from __future__ import annotations

import signal


def sigint_default() -> None:
    """In the child, before it runs: SIGINT handled by default again (``preexec_fn``)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
