"""Hugging Face datasets by id, revision and split: the local data files a prompt set reads.

Two well-kept libraries do the work. ``huggingface_hub`` turns an id and a revision into a snapshot
directory of its cache (the cache ``hf download`` fills, so a cluster without internet uses a copied
cache), honouring offline mode; ``datasets`` turns a config and a split into data files inside that
directory exactly as it does on the Hub (the dataset card's ``configs``, else its file-name conventions).
A local mirror (a dataset repo as ``hf download --local-dir`` or ``git clone`` writes it) skips the Hub.
The prompt-set reader then reads the files like a local prompt file. Every way this fails (offline and
not cached, an unknown id, a bad revision, config or split) is one ``WorkloadError`` naming the dataset
and the fix.
"""

from __future__ import annotations

import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from specsweep.errors import WorkloadError

_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's truthy environment values
_CARD_FILES = ("README.md", ".huggingface.yaml")  # where a dataset repo declares its configs


class HubDataset(BaseModel):
    """A dataset on the Hugging Face Hub (or a mirrored copy of one) and the split to read."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    id: str | None = Field(
        default=None,
        description="Dataset repo id (owner/name); null = the preset format's own Hub copy (docs/workloads.md).",
    )
    revision: str = Field(
        default="main", description="Branch, tag or commit sha; pin a commit for a reproducible sweep."
    )
    config: str | None = Field(
        default=None, description="Dataset config (subset) name; null = the preset's, else the only one."
    )
    split: str | None = Field(
        default=None, description="Split to read; null = the preset's, else the only one."
    )
    data_files: tuple[str, ...] | None = Field(
        default=None,
        description="Files (glob patterns) of the repo to read instead of the config's; only these are "
        "downloaded.",
    )
    cache_dir: str | None = Field(
        default=None,
        description="Hugging Face hub cache directory, as seen on the nodes (a copy of one made where there "
        "is internet); null = HF_HUB_CACHE or ~/.cache/huggingface/hub.",
    )
    mirror: str | None = Field(
        default=None,
        description="Local directory holding the dataset repo (hf download --local-dir, or git clone), as "
        "seen on the nodes: read instead of the Hub or its cache.",
    )
    offline: bool = Field(
        default=False,
        description="Never contact the Hub (read the cache only); also on when HF_HUB_OFFLINE or "
        "HF_DATASETS_OFFLINE is set.",
    )

    @property
    def label(self) -> str:
        """``owner/name@revision``, or the mirror's path: how errors name the dataset."""
        return self.mirror if self.mirror is not None else f"{self.id}@{self.revision}"


@dataclass(frozen=True, slots=True)
class HubDefaults:
    """Where a preset's set lives on the Hub: what a ``HubDataset`` without an id reads."""

    id: str
    split: str
    config: str | None = None
    data_files: tuple[str, ...] | None = None


def hub_data_files(source: HubDataset, defaults: HubDefaults | None) -> list[Path]:
    """The local data files of ``source``'s split, in the order ``datasets`` lists them."""
    dataset = _with_defaults(source, defaults)
    directory = _mirror(dataset) if dataset.mirror is not None else _snapshot(dataset)
    return _split_files(directory, dataset)


def is_offline(source: HubDataset) -> bool:
    """Offline by the spec or by Hugging Face's environment variables (read now, not at import)."""
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("HF_DATASETS_OFFLINE"))
    return source.offline or any((flag or "").upper() in _TRUE for flag in flags)


def _with_defaults(source: HubDataset, defaults: HubDefaults | None) -> HubDataset:
    """``source`` with the preset's id, config, split and files where it names none (the preset's own
    copy only: another repo's files are its own)."""
    if source.id is None and source.mirror is None and defaults is None:
        raise WorkloadError(
            "hf has no id and this format has no Hub copy",
            where="load.workload.hf",
            fix="set hf.id to the dataset repo (owner/name), or hf.mirror to a local copy of it",
        )
    if defaults is None or source.id not in (None, defaults.id):
        return source
    return source.model_copy(
        update={
            "id": defaults.id,
            "config": source.config or defaults.config,
            "split": source.split or defaults.split,
            "data_files": source.data_files or defaults.data_files,
        }
    )


def _mirror(source: HubDataset) -> Path:
    directory = Path(str(source.mirror))
    if not directory.is_dir():
        raise WorkloadError(
            "the dataset mirror directory does not exist",
            where=str(directory),
            fix="point hf.mirror at a local copy of the dataset repo (hf download REPO --repo-type dataset "
            "--local-dir DIR), present on every node",
        )
    return directory


def _snapshot(source: HubDataset) -> Path:
    """The snapshot directory of ``source``'s revision in the hub cache, downloaded first when online."""
    patterns = None if source.data_files is None else (*source.data_files, *_CARD_FILES)
    return _cached_snapshot(str(source.id), source.revision, source.cache_dir, is_offline(source), patterns)


@functools.lru_cache(maxsize=16)
def _cached_snapshot(
    repo_id: str, revision: str, cache_dir: str | None, offline: bool, patterns: tuple[str, ...] | None
) -> Path:
    """Resolved once per process, so every level of a job reads the same commit of a moving branch."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                repo_id,
                repo_type="dataset",
                revision=revision,
                cache_dir=cache_dir,
                local_files_only=offline,
                allow_patterns=list(patterns) if patterns else None,
                endpoint=os.environ.get("HF_ENDPOINT"),
            )
        )
    except (OSError, ValueError) as err:  # its errors are OSError (HTTP, not cached) or ValueError (bad id)
        raise _hub_error(err, repo_id, revision, cache_dir, offline) from None


def _hub_error(
    err: Exception, repo_id: str, revision: str, cache_dir: str | None, offline: bool
) -> WorkloadError:
    """Why huggingface_hub could not give the snapshot, as one error naming the dataset, field and fix."""
    from huggingface_hub import errors

    label = f"{repo_id}@{revision}"
    cache = cache_dir or "the default hub cache (HF_HUB_CACHE)"
    reason = "offline mode is on" if offline else "the Hub cannot be reached"
    copy = (
        f"where there is internet run `hf download {repo_id} --repo-type dataset --revision {revision} "
        "--cache-dir DIR`, copy DIR to the nodes and set hf.cache_dir to it (or point hf.mirror at a local "
        "copy); check the id and revision"
    )
    cases: list[tuple[type[Exception], str, str, str]] = [  # the first that matches; subclasses first
        (
            errors.IncompleteSnapshotError,
            f"Hugging Face dataset {label} is only partly in {cache} and {reason}",
            "hf",
            copy,
        ),
        (
            errors.LocalEntryNotFoundError,
            f"Hugging Face dataset {label} is not in {cache} and {reason}",
            "hf",
            copy,
        ),
        (
            errors.RevisionNotFoundError,
            f"Hugging Face dataset {repo_id} has no revision {revision!r}",
            "hf.revision",
            "use a branch, tag or commit sha of the dataset repo",
        ),
        (  # also gated and private repos without a token
            errors.RepositoryNotFoundError,
            f"no Hugging Face dataset {repo_id!r} can be read (unknown, private, or gated without a token)",
            "hf.id",
            "check the id (owner/name); for a gated or private set accept its terms and set HF_TOKEN",
        ),
        (
            errors.HfHubHTTPError,
            f"the Hub refused Hugging Face dataset {label}: {_first_line(err)}",
            "hf",
            "retry later, or read a copy: hf.cache_dir or hf.mirror",
        ),
        (
            OSError,
            f"cannot use the hub cache {cache} for Hugging Face dataset {label}: {_first_line(err)}",
            "hf.cache_dir",
            "point hf.cache_dir (or HF_HUB_CACHE) at a directory this process can read and write",
        ),
        (  # HFValidationError
            ValueError,
            f"{repo_id!r} is not a Hugging Face dataset id: {_first_line(err)}",
            "hf.id",
            "write it as owner/name",
        ),
    ]
    problem, field, fix = next((p, w, f) for kind, p, w, f in cases if isinstance(err, kind))
    return WorkloadError(problem, where=f"load.workload.{field}", fix=fix)


def _split_files(directory: Path, source: HubDataset) -> list[Path]:
    """The split's data files in ``directory``, found by ``datasets`` as for the Hub repo."""
    import datasets

    try:
        with tempfile.TemporaryDirectory(prefix="specsweep-hf-") as scratch:  # its lock file goes here
            builder = datasets.load_dataset_builder(
                str(directory),
                source.config,
                data_files=list(source.data_files) if source.data_files else None,
                cache_dir=scratch,
            )
    except (ValueError, OSError, RuntimeError) as err:  # unknown config, no data files, a dataset script
        raise WorkloadError(
            f"Hugging Face dataset {source.label} cannot be read: {_first_line(err)}",
            where="load.workload.hf",
            fix="check hf.config and hf.data_files against the dataset's files",
        ) from None
    splits: dict[str, Any] = {str(name): files for name, files in (builder.config.data_files or {}).items()}
    split = source.split or (next(iter(splits)) if len(splits) == 1 else None)
    if split not in splits:
        have = ", ".join(sorted(splits)) or "none"
        problem = "names no split" if source.split is None else f"names split {source.split!r}"
        raise WorkloadError(
            f"hf {problem}, and Hugging Face dataset {source.label} has: {have}",
            where="load.workload.hf.split",
            fix=f"set hf.split to one of: {have}",
        )
    return [Path(str(path)) for path in splits[split]]


def _first_line(err: Exception) -> str:
    """The first line of a library's message (they add paragraphs of advice)."""
    return next(iter(str(err).splitlines()), type(err).__name__)
