"""Where the driver keeps its local state for an output: the queue, its lock, attempts staged on this host.

A local OUT holds its own state (``OUT/queue.sqlite``, ``OUT/_attempts/``, ``OUT/logs/``). An object
store cannot hold a live SQLite database (no file locks, no in-place writes), so for an ``s3://`` or
``gs://`` OUT the state lives on the driver's disk, in a directory keyed by the URI:
``$SPECSWEEP_STATE_DIR/<bucket>-<12 hex digits of sha256(URI)>``, where ``SPECSWEEP_STATE_DIR``
defaults to ``$XDG_STATE_HOME/specsweep`` (``~/.local/state/specsweep``). The key is the URI without its
query, so an endpoint given as ``?endpoint_override=`` or in the environment finds the same state.
``--state-dir DIR`` names the directory itself; ``run --resume`` and ``status`` find it the same way.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from analysis.store import ResultStore
from specsweep.errors import ResultsError

STATE_ENV = "SPECSWEEP_STATE_DIR"


def state_root() -> Path:
    """The directory that holds every object-store sweep's state directory on this host."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "specsweep"


def state_dir(store: ResultStore, override: str | os.PathLike[str] | None = None) -> Path:
    """The driver's state directory of ``store``: the directory itself for a local OUT, else
    ``override`` when given, else the URI-keyed directory under ``state_root()``."""
    if store.local_dir is not None:
        if override is not None and Path(override).absolute() != store.local_dir.absolute():
            raise ResultsError(
                "--state-dir is for object-store outputs: a local OUT holds its own queue",
                where=str(override),
                fix="leave --state-dir out, or pass an s3:// or gs:// --out",
            )
        return store.local_dir
    if override is not None:
        return Path(override)
    digest = hashlib.sha256(store.location.rstrip("/").encode()).hexdigest()[:12]
    return state_root() / f"{store.bucket}-{digest}"
