"""Launch noise in every interval and ties called ties: ``best``'s answer at a level is a tie set."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.deploy import ConfigShape, plan_deployment
from analysis.select import Interval, LevelChoice, RankedConfig, Selection, select_best
from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep
from analysis.views import connect
from harness.cli import main

from .test_capacity import _write_results as _write_capacity_results

LEVEL = 16
BASELINE = SyntheticConfig("baseline")


def _chain(label: str, accept_length: float, draft_tokens: int = 4, **kwargs: object) -> SyntheticConfig:
    return SyntheticConfig(
        label,
        "EAGLE3",
        draft_tokens - 1,
        1,
        draft_tokens,
        accept_length=accept_length,
        step_cost=1.1,
        **kwargs,
    )  # type: ignore[arg-type]


def _best(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "best", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_select_best_estimates_launch_noise_when_configs_are_repeated(tmp_path: Path) -> None:
    """Three configs, three launches each, every launch's TPOT scaled by 0.97, 1.00 or 1.03: the launch
    factors' relative sd is sqrt(((-0.03)^2 + 0 + 0.03^2) / 2) = 3.0% by construction. The p50 TPOT of
    a launch of 3000 requests varies by itself only ~1.25 x 0.15 / sqrt(3000) = 0.34% (lognormal sigma
    0.15), which the estimate takes off, so it reads 3.0% +- 0.3%, from 3 repeated configs."""
    factors = (0.97, 1.0, 1.03)
    configs = tuple(
        SyntheticConfig(c.label, c.algorithm, c.num_steps, c.eagle_topk, c.num_draft_tokens,
                        accept_length=c.accept_length, step_cost=c.step_cost, repeats=3, launch_tpot_factors=factors)
        for c in (BASELINE, _chain("chain d=4", 2.6), _chain("chain d=8", 3.4, 8))
    )  # fmt: skip
    write_sweep(tmp_path, SyntheticSweep(configs=configs, concurrencies=(LEVEL,), requests_per_level=3000))
    selection = select_best(connect(tmp_path), tmp_path, objective="tpot_p50_ms")
    assert selection.launch_noise.repeated_configs == 3
    assert selection.launch_noise.relative_sd == pytest.approx(0.03, abs=0.003)
    noise = selection.launch_noise
    assert noise.text == f"launch noise {noise.relative_sd:.1%} (from 3 repeated configs)"


def test_select_best_reads_no_launch_noise_when_launches_differ_only_by_their_requests(
    tmp_path: Path,
) -> None:
    """Twelve launches of each of three configs, all alike (factor 1.00), 100 requests per level at four
    levels: a launch's p50 TPOT varies by itself by ~1.25 x 0.15 / sqrt(100) = 1.9%, so its launches
    spread by that much; that spread is request sampling, not launch noise, and taking it off (the
    launches' own bootstrap variance) leaves ~0 (under 1.2%; without it the estimate reads ~1.9%)."""
    configs = tuple(
        SyntheticConfig(c.label, c.algorithm, c.num_steps, c.eagle_topk, c.num_draft_tokens,
                        accept_length=c.accept_length, step_cost=c.step_cost, repeats=12)
        for c in (BASELINE, _chain("chain d=4", 2.6), _chain("chain d=8", 3.4, 8))
    )  # fmt: skip
    sweep = SyntheticSweep(configs=configs, concurrencies=(1, 8, 16, 64), requests_per_level=100)
    write_sweep(tmp_path, sweep)
    noise = select_best(connect(tmp_path), tmp_path, objective="tpot_p50_ms").launch_noise
    assert noise.repeated_configs == 3 and noise.relative_sd < 0.012


def test_select_best_assumes_the_spec_launch_noise_when_no_config_was_repeated(tmp_path: Path) -> None:
    """One launch per config: the launch noise is the spec's ``launch_noise`` (5% here), said to be
    assumed, and each speedup interval carries it for both launches: half-width ~ 1.96 x sqrt(2) x 5% =
    13.9% of the speedup (the request-level part, ~0.3%, adds nothing visible)."""
    write_sweep(
        tmp_path,
        SyntheticSweep(
            configs=(BASELINE, _chain("chain d=4", 2.6)), concurrencies=(LEVEL,), requests_per_level=3000
        ),
        spec_text="launch_noise: 0.05\n",
    )
    selection = select_best(connect(tmp_path), tmp_path)
    assert selection.launch_noise.text == (
        "launch noise 5.0% (assumed: no config was repeated; set repeats >= 2 to measure it)"
    )
    chain = next(r for r in selection.levels[0].ranked if r.config_label == "chain d=4")
    assert chain.speedup is not None and chain.speedup_ci is not None
    half_width = (chain.speedup_ci.high - chain.speedup_ci.low) / 2 / chain.speedup
    assert half_width == pytest.approx(1.96 * 2**0.5 * 0.05, rel=0.15)


def test_best_shows_a_tie_set_when_configs_differ_by_less_than_launch_noise(tmp_path: Path) -> None:
    """Two chains ~3% apart (accept length 2.68 vs 2.60), one launch each, 4000 requests per level: the
    requests alone separate them (their interval is ~0.3% wide), but two launches under the assumed 2%
    launch noise differ by sd 2.8%, so the difference's 95% interval is about +-5.5% and holds 0. `best`
    says tie instead of naming a winner, with the launches that would separate a 1% difference
    (2 x 1.96^2 x (0.02^2 + the requests' ~0.003^2) / 0.01^2 = 31 or 32 launches of each, so
    about 30-31 more); JSON and CSV mark both."""
    configs = (BASELINE, _chain("chain d=4", 2.68), _chain("chain d=5", 2.6, 5))
    write_sweep(tmp_path, SyntheticSweep(configs=configs, concurrencies=(LEVEL,), requests_per_level=4000))
    text = _best(str(tmp_path))
    assert text.returncode == 0, text.stderr
    assert (
        "launch noise 2.0% (assumed: no config was repeated; set repeats >= 2 to measure it)" in text.stdout
    )
    tie = re.search(
        r"tie: chain d=4, chain d=5 - not separable at 95%; about (\d+) more launches of each would separate a "
        r"1% difference",
        text.stdout,
    )
    assert tie is not None and 30 <= int(tie.group(1)) <= 32
    assert "winner" not in text.stdout
    data = json.loads(_best(str(tmp_path), "--json").stdout)
    (level,) = data["levels"]
    assert level["tie_set"] == ["chain d=4", "chain d=5"]
    assert {r["config_label"]: r["tie"] for r in level["ranked"]} == {
        "chain d=4": True, "chain d=5": True, "baseline": False,
    }  # fmt: skip
    rows = _best(str(tmp_path), "--format", "csv").stdout.splitlines()
    tie_column = rows[0].split(",").index("tie")
    assert [row.split(",")[tie_column] for row in rows[1:]] == ["True", "True", "False"]


def test_best_names_one_winner_when_it_is_clear_beyond_launch_noise(tmp_path: Path) -> None:
    """Chains ~25% apart (accept length 3.4 vs 2.6): far beyond 2% launch noise, so the winner stands
    alone, no tie line, its tie set is itself; the output says the launch noise was assumed."""
    configs = (BASELINE, _chain("chain d=4", 2.6), _chain("chain d=8", 3.4, 8))
    write_sweep(tmp_path, SyntheticSweep(configs=configs, concurrencies=(1,), requests_per_level=1000))
    text = _best(str(tmp_path))
    assert text.returncode == 0, text.stderr
    assert "launch noise 2.0% (assumed" in text.stdout
    assert "tie:" not in text.stdout
    winner = next(line for line in text.stdout.splitlines() if line.rstrip().endswith("winner"))
    assert "chain d=8" in winner
    (level,) = json.loads(_best(str(tmp_path), "--json").stdout)["levels"]
    assert level["tie_set"] == ["chain d=8"] and level["launches_to_separate"] is None


LOW, HIGH = "concurrency=1", "concurrency=16"
SHAPES = {
    "baseline": ConfigShape("baseline", True, None, None),
    "chain d=4": ConfigShape("chain d=4", False, 3, 1, 4),
    "chain d=8": ConfigShape("chain d=8", False, 7, 1, 8),
}


def _ranked(label: str, objective: float, rank: int) -> RankedConfig:
    """A ranked config whose 95% interval is +-2% of its objective: a relative sd of 0.02 / 1.96."""
    return RankedConfig(
        rank=rank, config_label=label, is_baseline=label == "baseline", repeats=1, job_ids=(label,),
        objective=objective, objective_mad=None, objective_ci=Interval(objective * 0.98, objective * 1.02),
        speedup=None, speedup_ci=None, tie=False, difference_ci=None, more_repeats=None, error_rate=0.0,
        goodput_rps=None, goodput_share=None, slo_values={}, launch_command=None, sglang_argv=None,
    )  # fmt: skip


def _selection(values: dict[str, dict[str, float]]) -> Selection:
    levels = tuple(
        LevelChoice(level, "baseline", row["baseline"], tuple(
            _ranked(label, value, rank)
            for rank, (label, value) in enumerate(sorted(row.items(), key=lambda i: -i[1]), start=1)
        ), ())
        for level, row in values.items()
    )  # fmt: skip
    return Selection(
        sweep_id="s", objective="output_tok_s_per_gpu", objective_unit="", better="higher", slos=(),
        request_slos=(), confidence=0.95, max_error_rate=0.01, replicates=100, levels=levels, notes=(),
    )  # fmt: skip


def test_plan_deployment_recommends_static_when_the_adaptive_schedule_is_the_same_launch() -> None:
    """The chain d=8 wins both levels, so the adaptive schedule runs its depth everywhere: its mix score
    equals the static chain d=8's (1.000 and 1.000, the case seen as 0.979 vs 0.979). Equal is not
    better: static is recommended, the simpler launch, and the preference says why."""
    selection = _selection(
        {LOW: {"chain d=8": 100.0, "chain d=4": 80.0, "baseline": 50.0},
         HIGH: {"chain d=8": 200.0, "chain d=4": 150.0, "baseline": 120.0}}
    )  # fmt: skip
    deployment = plan_deployment(selection, SHAPES, {LOW: 1, HIGH: 16})
    assert (
        deployment.adaptive is not None
        and deployment.adaptive.mix_score == deployment.static.mix_score == 1.0
    )
    assert deployment.recommended == "static" and deployment.static.config_label == "chain d=8"
    assert deployment.tie == ("chain d=8", "adaptive")
    assert deployment.preference == (
        "adaptive (1.000) and static 'chain d=8' (1.000) are not separable at 95% on the mix: static "
        "recommended, the simpler launch",
    )


def test_plan_deployment_takes_the_fewer_draft_token_config_when_static_configs_tie_on_the_mix() -> None:
    """chain d=8 beats chain d=4 by 0.5% at both levels (mix 1.000 vs 0.995), each +-2% at 95% (relative
    sd 1.02%): their mix difference has sd sqrt(2 x 0.5^2 x (1 + 0.995^2)) x 1.02% = 1.02%, so 0.005 is
    well inside 1.96 x 1.02% = 2.0%: a tie, and the chain d=4 (4 draft tokens, not 8) is deployed,
    saying so; the adaptive schedule (chain d=8's depth everywhere, 1.000) does not separate from it
    either. The baseline, 50% below, is no part of the tie."""
    selection = _selection(
        {LOW: {"chain d=8": 100.0, "chain d=4": 99.5, "baseline": 50.0},
         HIGH: {"chain d=8": 200.0, "chain d=4": 199.0, "baseline": 100.0}}
    )  # fmt: skip
    deployment = plan_deployment(selection, SHAPES, {LOW: 1, HIGH: 16})
    assert deployment.static.config_label == "chain d=4"
    assert deployment.static.mix_score == pytest.approx(0.995)
    assert deployment.recommended == "static"
    assert deployment.tie == ("chain d=8", "chain d=4", "adaptive")
    assert deployment.preference[0] == (
        "static 'chain d=4' (0.995) is the simplest of the configs tied on the mix with 'chain d=8' (1.000; "
        "tie: chain d=8, chain d=4, not separable at 95%): preferred, the simpler launch"
    )


# Two configs whose searches both end at 20 (20 passed, 22 failed), one at 16 (18 failed), one below 8.
TIED_PROBES: dict[tuple[str, int], list[tuple[float, bool]]] = {
    ("chain d=8", 0): [(16.0, True), (32.0, False), (24.0, False), (20.0, True), (22.0, False)],
    ("chain d=4", 0): [(16.0, True), (32.0, False), (24.0, False), (20.0, True), (22.0, False)],
    ("chain d=4", 1): [(16.0, True), (32.0, False), (24.0, False), (20.0, True), (22.0, False)],
    ("baseline", 0): [(16.0, True), (32.0, False), (24.0, False), (20.0, False), (18.0, False)],
    ("tree s=3 k=4 n=8", 0): [(16.0, False), (8.0, False)],
}


def test_best_capacity_shows_brackets_and_marks_ties_when_brackets_overlap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Brackets run from the smallest passing load to the highest lowest failing one, widened by
    1.96 x 2% = 3.92% each side: both chains [20 x 0.9608, 22 x 1.0392] = [19.2, 22.9], so they overlap and
    are a tie (ranks 1 and 2 are no ranking); the baseline's [16 x 0.9608, 18 x 1.0392] = [15.4, 18.7]
    ends below 19.2 and the tree's [0, 8.31] too: not tied. JSON carries the bracket and the tie."""
    out = _write_capacity_results(tmp_path / "out", TIED_PROBES)
    assert main(["best", str(out), "--objective", "capacity", "--json"]) == 0
    ranked = {r["config_label"]: r for r in json.loads(capsys.readouterr().out)["ranked"]}
    assert (ranked["chain d=4"]["low"], ranked["chain d=4"]["high"]) == pytest.approx((19.216, 22.8624))
    assert (ranked["baseline"]["low"], ranked["baseline"]["high"]) == pytest.approx((15.3728, 18.7056))
    assert {label: r["tie"] for label, r in ranked.items()} == {
        "chain d=4": True, "chain d=8": True, "baseline": False, "tree s=3 k=4 n=8": False,
    }  # fmt: skip
    assert main(["best", str(out), "--objective", "capacity"]) == 0
    text = capsys.readouterr().out
    for label in ("chain d=4", "chain d=8"):
        assert re.search(rf"{label} +20 req/s +\[19\.2, 22\.9\] .* tie$", text, flags=re.M), text
    assert re.search(r"baseline +16 req/s +\[15\.4, 18\.7\] +1 +5$", text, flags=re.M), text
    assert "tie: chain d=4, chain d=8 - brackets overlap the best's, not separable at 95%" in text


def test_report_shows_the_tie_set_and_the_launch_noise_when_configs_tie(tmp_path: Path) -> None:
    """The report's winner box names the tie set as the answer (the same two chains ~3% apart, one launch
    each, 2% launch noise assumed, as `best` shows them) and its header says which launch noise every
    interval carries; the tied rows of the level's table are marked tie."""
    out = tmp_path / "out"
    configs = (BASELINE, _chain("chain d=4", 2.68), _chain("chain d=5", 2.6, 5))
    write_sweep(out, SyntheticSweep(configs=configs, concurrencies=(LEVEL,), requests_per_level=4000))
    page_path = tmp_path / "report.html"
    assert main(["report", str(out), "-o", str(page_path)]) == 0
    page = page_path.read_text()
    assert "launch noise 2.0% (assumed: no config was repeated; set repeats &gt;= 2 to measure it)" in page
    assert re.search(
        r"tie: chain d=4, chain d=5 - not separable at 95%; about \d+ more launches of each", page
    )
    assert page.count("<td>tie</td>") == 2
