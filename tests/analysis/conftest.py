"""Synthetic result sets with known truth, written once per module in the sweep's on-disk layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep

# Configs far enough apart that 600 requests per level separate them; the winner flips with load.
CLEAR_CONFIGS = (
    SyntheticConfig("baseline"),
    SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1),
    SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4, step_cost=2.2),
    SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.0, step_cost=1.9),
)


def clear_sweep(**overrides: object) -> SyntheticSweep:
    params: dict[str, object] = {
        "configs": CLEAR_CONFIGS,
        "concurrencies": (1, 16, 128),
        "requests_per_level": 600,
        "seed": 7,
    }
    params.update(overrides)
    return SyntheticSweep(**params)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def clear_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SyntheticSweep]:
    """A finished sweep: 4 configs x 3 concurrencies, one repeat each."""
    out = tmp_path_factory.mktemp("clear")
    sweep = clear_sweep()
    write_sweep(out, sweep)
    return out, sweep
