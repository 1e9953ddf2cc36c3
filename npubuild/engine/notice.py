"""One warning line on the build's stderr, also from inside a doit action.

doit runs a task's action with sys.stdout/sys.stderr swapped for its capture (verbosity 0) and shows the
capture only when the task fails, so a warning from a task that goes on (a cache entry that is not trusted)
would be lost: inside an action it goes to sys.__stderr__, the stream the process started with."""

from __future__ import annotations

import sys


def warn(text: str) -> None:
    stream = sys.stderr
    if type(stream).__module__.startswith("doit"):
        stream = sys.__stderr__ or stream
    stream.write(f"warning: {text}\n")
    stream.flush()
