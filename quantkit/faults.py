"""Fault injection for the reliability tests: kill this process at a named point.

``QUANTKIT_FAILPOINT=NAME`` (or ``NAME=INDEX``) makes ``failpoint(NAME[, INDEX])`` send
SIGKILL to the running process, the way a crash, the OOM killer or a power loss would stop
it: no cleanup, no ``finally``. Unset (the normal case), a failpoint does nothing.
"""

from __future__ import annotations

import os
import signal

ENV = "QUANTKIT_FAILPOINT"


def failpoint(name: str, index: int | None = None) -> None:
    """Die here with SIGKILL if ``QUANTKIT_FAILPOINT`` names this point (and index)."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    point, _, at = wanted.partition("=")
    if point == name and (not at or (index is not None and at == str(index))):
        os.kill(os.getpid(), signal.SIGKILL)
