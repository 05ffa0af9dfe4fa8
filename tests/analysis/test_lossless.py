"""The lossless check's views and verdicts on small result sets: the first diverging position on three
prompts, the floor a config must exceed, and a config lossy by design in `best` and `--emit` without a
check run."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.layout import job_part_path
from analysis.lossless import lossless_summary
from analysis.schema import LosslessRecord, lossless_table, write_parquet_atomic
from analysis.synthetic import SyntheticConfig, SyntheticSweep, job_id_of, write_sweep
from analysis.views import connect
from harness.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BASELINE = SyntheticConfig("baseline")
CHAIN = SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1)
THRESHOLD = "--speculative-accept-threshold-acc 0.5 below 1.0 accepts drafts the target would not pick"


def _sweep(out: Path, *configs: SyntheticConfig) -> SyntheticSweep:
    sweep = SyntheticSweep(
        configs=configs,
        concurrencies=(1, 16),
        requests_per_level=200,
        seed=7,
        model_path=str(FIXTURES / "kimi-k2"),
        draft_model_path=str(FIXTURES / "eagle3-draft"),
    )
    spec = (
        f"model_path: {FIXTURES / 'kimi-k2'}\ndrafter: {{path: {FIXTURES / 'eagle3-draft'}}}\n"
        "speculative: {chain_depths: [4]}\nload: {concurrency: [1, 16], requests_per_level: 200}\n"
    )
    write_sweep(out, sweep, spec_text=spec)
    return sweep


def _outputs(out: Path, sweep: SyntheticSweep, cfg: SyntheticConfig, ids: dict[str, list[list[int]]]) -> None:
    """The lossless file of ``cfg``'s job: per mode, one output per prompt (as the node worker writes it)."""
    job = job_id_of(sweep, cfg, 0)
    records = [
        LosslessRecord(sweep.sweep_id, job, mode, index, tuple(output), None)
        for mode, outputs in ids.items()
        for index, output in enumerate(outputs)
    ]
    write_parquet_atomic(lossless_table(records), job_part_path(out, "lossless", sweep.sweep_id, job))


def test_lossless_divergence_gives_the_first_differing_position_when_outputs_differ_or_end_early(
    tmp_path: Path,
) -> None:
    """first_diverging_position is the 0-based index of the first differing id, the shorter length when one
    output is a prefix of the other, null when equal; the config is lossy only above the floor, which is
    the baseline's serial vs batched divergence (here 1 of 3 prompts)."""
    out = tmp_path / "out"
    sweep = _sweep(out, BASELINE, CHAIN)
    serial = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    _outputs(out, sweep, BASELINE, {"serial": serial, "batched": [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]]})
    _outputs(out, sweep, CHAIN, {"serial": [[1, 2, 3, 4], [5, 6, 0, 8], [9, 10, 11]], "batched": serial})
    con = connect(out)
    assert con.sql("SELECT prompts, diverged FROM lossless_floor").fetchall() == [(3, 1)]
    rows = con.sql(
        "SELECT mode, prompt_index, first_diverging_position FROM lossless_divergence ORDER BY mode DESC, "
        "prompt_index"
    ).fetchall()
    assert rows == [
        ("serial", 0, None),
        ("serial", 1, 2),
        ("serial", 2, 3),
        ("batched", 0, None),
        ("batched", 1, None),
        ("batched", 2, 2),
    ]
    summary = lossless_summary(con)
    assert summary is not None
    (chain,) = summary.configs
    # 3 of 6 pairs differ (0.5) against a floor of 1 of 3 (0.33): lossy
    assert (chain.diverged, chain.compared, chain.lossy) == (3, 6, True)
    assert chain.first_diverging_positions == (2, 3, 2)


def test_best_marks_and_emit_refuses_a_config_lossy_by_design_when_no_check_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config whose jobs row says it is lossy by design (an accept threshold below 1.0) is ranked with the
    LOSSY mark and its reason, and `--emit` refuses it before it validates or writes anything."""
    out = tmp_path / "out"
    _sweep(out, BASELINE, SyntheticConfig(**{**CHAIN.__dict__, "lossy_by_design": THRESHOLD}))
    assert main(["best", str(out), "--bootstrap", "200"]) == 0
    text = capsys.readouterr().out
    assert any(
        line.strip().startswith("1  chain d=4") and line.endswith("LOSSY") for line in text.splitlines()
    )
    assert f"LOSSY    chain d=4: {THRESHOLD}" in text
    assert "noise floor" not in text  # nothing was measured
    dest = tmp_path / "deploy"
    assert main(["best", str(out), "--bootstrap", "200", "--emit", str(dest)]) == 2
    assert f"'chain d=4', is flagged lossy: {THRESHOLD}" in capsys.readouterr().err
    assert not dest.exists() or not any(dest.iterdir())
