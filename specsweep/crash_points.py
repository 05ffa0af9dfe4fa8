"""Named points of the commit sequence where a test can make this process die, as kill -9 would.

The exactly-once tests set ``SPECSWEEP_CRASH_AT`` to one point (``commit:<table>`` after each rename of
an attempt's files, ``queue:<transition>`` after each committed queue transition) and run the real
commit path in a child process; it ends with ``os._exit`` right there, with no cleanup and no flush,
and the test resumes from what is on disk. Unset (always, outside those tests) this does nothing.
"""

from __future__ import annotations

import os

CRASH_ENV = "SPECSWEEP_CRASH_AT"
CRASH_EXIT_CODE = 137  # what a shell reports for a process killed with SIGKILL


def crash_point(name: str) -> None:
    """Die here when the test hook names this point."""
    if os.environ.get(CRASH_ENV) == name:
        os._exit(CRASH_EXIT_CODE)
