"""Hugging Face dataset repos written to disk in the layouts huggingface_hub and datasets read, from rows
generated here (nothing is downloaded, no upstream text is copied).

Not a mock: the real libraries read these directories as they read a cache ``hf download`` filled. The
hub cache layout is ``datasets--OWNER--NAME/{blobs/<hash>, refs/<revision> (a commit sha),
snapshots/<commit>/<path> -> ../../blobs/<hash>}``; a mirror is the repo's files in a plain directory, as
``hf download --local-dir`` writes it (with its ``.cache/huggingface`` bookkeeping).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """``rows`` as a Parquet file (the shape ``push_to_hub`` uploads)."""
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def card(configs: dict[str, dict[str, str]] | None, license_id: str = "mit") -> bytes:
    """A dataset card (README.md) whose YAML header declares ``configs`` {name: {split: path glob}}."""
    lines = ["---", f"license: {license_id}"]
    if configs:
        lines.append("configs:")
        for name, splits in configs.items():
            lines += [f"- config_name: {name}", "  data_files:"]
            for split, path in splits.items():
                lines += [f"  - split: {split}", f"    path: {path}"]
    return ("\n".join([*lines, "---", "", "# A generated test dataset", ""])).encode()


def write_hub_cache(
    cache: Path, repo_id: str, files: dict[str, bytes], *, revision: str = "main", commit: str | None = None
) -> str:
    """Put ``files`` of dataset ``repo_id`` into the hub cache ``cache`` at ``revision``; the commit sha."""
    commit = commit or hashlib.sha1(repo_id.encode() + revision.encode()).hexdigest()
    storage = cache / ("datasets--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    for relative, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / revision).write_text(commit)
    return commit


def write_mirror(directory: Path, files: dict[str, bytes]) -> Path:
    """``files`` as a local copy of the repo, with the download bookkeeping ``hf download --local-dir``
    leaves beside them."""
    for relative, data in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        meta = directory / ".cache" / "huggingface" / "download" / f"{relative}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{'0' * 40}\n{hashlib.sha256(data).hexdigest()}\n1700000000.0\n")
    return directory
