"""Fault injection for the reliability tests: kill this process at a named point.

``QUANTKIT_FAILPOINT=NAME`` (or ``NAME=INDEX``) makes ``failpoint(NAME[, INDEX])`` send
SIGKILL to the running process, the way a crash, the OOM killer or a power loss would stop
it: no cleanup, no ``finally``. Unset (the normal case), a failpoint does nothing.
With ``QUANTKIT_FAILPOINT_ONCE=FILE`` it fires only in the first process that creates FILE
(a sweep test kills one worker mid-run, and the retry of that run goes through).
"""

from __future__ import annotations

import os
import signal

ENV = "QUANTKIT_FAILPOINT"
ONCE_ENV = "QUANTKIT_FAILPOINT_ONCE"


def failpoint(name: str, index: int | None = None) -> None:
    """Die here with SIGKILL if ``QUANTKIT_FAILPOINT`` names this point (and index)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    point, _, at = wanted.partition("=")
    if point == name and (not at or (index is not None and at == str(index))) and _first():
        os.kill(os.getpid(), signal.SIGKILL)


def _first() -> bool:
    """True unless QUANTKIT_FAILPOINT_ONCE names a file that exists (which it then creates)."""
    once = os.environ.get(ONCE_ENV)
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
