"""Synthetic result sets with known truth, written once per module in the sweep's on-disk layout."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.schema import write_parquet_atomic
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


def as_open_loop(out: Path, rate_rps: float) -> str:
    """Rewrite every committed requests and levels file as if its one level ran open loop at ``rate_rps``
    (arrivals at a set rate: no concurrency); returns the level's name."""
    level = f"rate={rate_rps:g}"
    for table in ("requests", "levels"):
        for path in sorted(out.glob(f"{table}/sweep=*/job=*/*.parquet")):
            rows = pq.read_table(path)
            n = rows.num_rows
            for name, column in (
                ("load_level", pa.array([level] * n, pa.string())),
                ("concurrency", pa.nulls(n, pa.int32())),
                ("rate_rps", pa.array([rate_rps] * n, pa.float64())),
            ):
                rows = rows.set_column(rows.schema.get_field_index(name), name, column)
            write_parquet_atomic(rows, path)
    return level
