"""Content digests of the inputs that shape a result, for the resume check and the jobs rows.

Job ids hash the spec, not the files it names, so a prompt file, a drafter checkpoint or a target config
edited in place (same path) would be measured under the same job ids and ranked as repeats of one config.
Each digest covers one kind of input:

- ``prompts``: the prompt set's data files (a local file, or the Hugging Face snapshot files its revision
  resolved to); random token ids have none (the spec alone fixes them).
- ``drafter``: the checkpoint's config, index and weight files (the converter's source digest).
- ``target``: the target's configs and tokenizer files (``TARGET_FILES``), not its weights.
- ``engine``: ``sglang <version>`` of the interpreter that launches the server, or ``sim <digest of the
  simulator's source>``.

The driver computes the digests it can see once per run (an input only on the nodes it takes from the
first worker that reports it: harness.driver); the node worker computes every digest of the job it runs
and records them on the attempt's jobs row.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from pathlib import Path

import xxhash

from workers.job import DrafterSpec, Engine, JobSpec
from workers.load.workloads import PromptSetWorkload, Workload
from workers.node.launcher import python_for
from workers.sglang.installed import installed_version

InputDigests = dict[str, str]
INPUT_KINDS: tuple[str, ...] = ("prompts", "drafter", "target", "engine")
# Files of a target model directory that change what a server computes, besides its weights: the
# configs, the tokenizer (and its chat template) and remote code.
TARGET_FILES: tuple[str, ...] = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer*",
    "vocab.*",
    "merges.txt",
    "*.tiktoken",
    "tiktoken.model",
    "chat_template*",
    "*.py",
)
_SIM_SOURCE = Path(__file__).resolve().parents[1] / "sim"
_CHUNK = 1 << 20


def files_digest(files: Iterable[tuple[str, Path]]) -> str:
    """XXH3-128 over (name, size, content) of each file, in name order; read in chunks, so a large
    file costs its read time and no memory."""
    hasher = xxhash.xxh3_128()
    for name, path in sorted(files):
        hasher.update(json.dumps([name, path.stat().st_size]).encode())
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                hasher.update(chunk)
    return hasher.hexdigest()


def prompts_digest(workload: Workload) -> str | None:
    """The prompt set's data files; None for random ids or a local set this machine lacks."""
    if not isinstance(workload, PromptSetWorkload) or workload.node_only():
        return None
    return files_digest((path.name, path) for path in workload.data_files())


def target_digest(model_path: str) -> str | None:
    """The target directory's ``TARGET_FILES``; None when the directory is not here."""
    root = Path(model_path)
    if not (root / "config.json").is_file():
        return None
    files = [
        (p.name, p)
        for p in root.iterdir()
        if p.is_file() and any(fnmatch.fnmatch(p.name, pattern) for pattern in TARGET_FILES)
    ]
    return files_digest(files)


def drafter_digest(drafter: DrafterSpec) -> str | None:
    """The converter's source digest of the checkpoint; None when it is not here."""
    from workers.convert.converter import source_digest

    path = Path(drafter.path)
    if not path.is_dir():
        return None
    return source_digest(path, allow_pickle=False, allow_external_shards=drafter.allow_external_shards)


def engine_identity(engine: Engine, sglang_python: str | None, *, on_node: bool) -> str | None:
    """``sim <source digest>`` or ``sglang <version>`` of the interpreter the server runs with; None for
    SGLang off the nodes when that interpreter is not here (the spec gave none, or a node path)."""
    if engine == "sim":
        return "sim " + files_digest((p.name, p) for p in _SIM_SOURCE.glob("*.py"))
    python = python_for(engine, sglang_python)
    if not on_node and (sglang_python is None or not Path(sglang_python).exists()):
        return None
    version = installed_version(python)
    return None if version is None else f"sglang {version}"


def input_digests(job: JobSpec, *, on_node: bool, drafter: str | None = None) -> InputDigests:
    """The digests of ``job``'s inputs visible here (``drafter``: its digest when already known, e.g.
    from the node's conversion). Only a job that loads a drafter has a ``drafter`` digest."""
    found = {
        "prompts": prompts_digest(job.load.workload),
        "drafter": (drafter or drafter_digest(job.drafter)) if job.drafter is not None else None,
        "target": target_digest(job.model_path),
        "engine": engine_identity(job.engine, job.sglang_python, on_node=on_node),
    }
    return {kind: digest for kind, digest in found.items() if digest is not None}
