"""The node-local cache of converted drafters: each node converts a drafter once, every job reuses it.

The planner converts here too when the drafter is on the driver's disk (so it validates launches against
the converted config), and the node worker converts on its node; both call ``converted_drafter``.
"""

from __future__ import annotations

import os
from pathlib import Path

from workers.convert.converter import CachedConversion, ConvertOptions, convert_cached
from workers.convert.eagle3_format import SourceFormat
from workers.job import DrafterSpec


def drafter_cache_dir() -> Path:
    """Node-local cache of converted drafters (SPECSWEEP_DRAFTER_CACHE overrides)."""
    default = Path("/tmp") / f"specsweep-{os.getuid()}" / "drafters"
    return Path(os.environ.get("SPECSWEEP_DRAFTER_CACHE", default))


def converted_drafter(drafter: DrafterSpec, model_path: str) -> Path:
    """Convert the drafter into the node cache (a no-op when this node already did), checked against
    the target's config when the node has it; returns the directory SGLang loads."""
    return drafter_conversion(drafter, model_path).path


def drafter_conversion(drafter: DrafterSpec, model_path: str) -> CachedConversion:
    """``converted_drafter``'s conversion with its report (whose source digest names the checkpoint)."""
    target = Path(model_path)
    options = ConvertOptions(
        source_format=None if drafter.format == "auto" else SourceFormat(drafter.format),
        target_config=target if (target / "config.json").is_file() else None,
        allow_external_shards=drafter.allow_external_shards,
    )
    return convert_cached(drafter.path, drafter_cache_dir(), options)
