"""The demo end to end as `specsweep demo` runs it: its winners and measurements are the simulator's truth."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from analysis.select import select_best
from analysis.views import connect
from harness.cli import main
from harness.commands.demo import DEMO_NODES
from harness.demo import DRAFTER_DIR, demo_spec, prepare_output, simulated_cluster, write_demo_inputs
from harness.driver import run_sweep
from harness.plan import plan_with_local_configs
from harness.progress import progress_for
from harness.spec import parse_spec
from workers.sim.model import DEFAULT_MIX, RANDOM_IDS, Load, ground_truth, steady_state
from workers.sim.presets import DEFAULT_PRESET
from workers.sim.reported import job_launch_factors

# The first test of the module waits for both fixtures' sweeps (one embedded cluster, a few minutes each on a
# 2-core machine), which is more than the suite's per-test default. Quiet: its TTFT tails at real time are
# the machine's too, so `make test` runs it alone (tests/split_run.py).
pytestmark = [pytest.mark.ray, pytest.mark.quiet, pytest.mark.timeout(900)]

# The demo's own seconds per level (examples/demo.yaml), checked here because the tests' statistics need it:
# on the default preset (Kimi-K2 on H200 x8) a request at 64 streams takes 2.3 s (the 4-token chain) to
# 4.4 s (the baseline), so a level of 12 s holds at least two cycles of every config's replacement
# prefills (its throughput is their steady state). The demo's DEMO_NODES (5) run its five jobs in one round.
DURATION_S = 12.0
RANDOM_IDS_DURATION_S = 6.0  # that sweep's test compares winners only
RAMP_UP_S = 1.0  # the demo's load.ramp_up_s


RANDOM_IDS_WORKLOAD = {"kind": "random_ids", "input_tokens": 256, "output_tokens": 128, "vocab_size": 163840}
# The random-ids sweep's grid: the configs that can win on random ids (three jobs, one round; the baseline
# and chain d=12 would only load the box). ``steady_state`` (256-token prompts, 128 out, 1 s ramp-up), as a
# share of the level's best at 16 (and 64) streams: chain d=2 1 (1), chain d=4 0.941 (0.916), the tree 0.885
# (0.865), the baseline 0.786 (0.807), chain d=12 0.651 (0.651). The baseline and chain d=12 are 19% and
# more below the winner at both levels, far beyond the 1.5% launch factor and a 6 s level's noise, so they
# never decide the winner (the statistic checked); the mix winner under load (chain d=4) is kept.
RANDOM_IDS_GRID = {"baseline": False, "chain_depths": [2, 4]}
DEMO_CONFIGS, RANDOM_IDS_CONFIGS = 5, 3  # the demo's baseline, tree and three chains; the tree and two chains


@pytest.fixture(scope="module")
def demo_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One embedded cluster of the demo's DEMO_NODES simulated 8-GPU nodes for both sweeps (one start-up, one drafter
    conversion: the second sweep's nodes reuse the first's, as a node does across sweeps); its address and
    its nodes' drafter cache.

    The cache is this module's own (the raylets inherit the variable): the drafter is converted here, never
    taken from an earlier run's /tmp/specsweep-<uid>/drafters.
    """
    cache = tmp_path_factory.mktemp("drafters")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECSWEEP_DRAFTER_CACHE", str(cache))
        with simulated_cluster(nodes=DEMO_NODES, gpus_per_node=8, cpus_per_node=2) as address:
            yield address, cache


def _run_demo(
    out: Path, cluster: tuple[str, Path], grid: dict[str, object] | None = None, **load: object
) -> Path:
    """The demo spec as `specsweep demo` runs it, with ``load`` fields changed, on ``cluster`` (builtin
    validation); ``grid`` (``baseline``, ``chain_depths``) narrows its configs."""
    address, cache = cluster
    prepare_output(out)
    spec, _ = demo_spec(out, write_demo_inputs(out))
    data = spec.model_dump(mode="json")
    assert data["load"]["duration_s"] == DURATION_S, (
        "examples/demo.yaml's levels are not the 12 s tested here"
    )
    data["load"].update(load)
    if grid is not None:
        data["baseline"] = grid["baseline"]
        data["speculative"]["chain_depths"] = grid["chain_depths"]
    spec = parse_spec(data, source="the demo spec")
    plan = plan_with_local_configs(spec, use_resolver=False)
    summary = run_sweep(
        spec,
        yaml.safe_dump(data, sort_keys=False),  # the sweep row keeps the spec, as `specsweep run` stores it
        plan,
        out,
        ray_address=address,
        resume=False,
        progress=progress_for(sys.stdout),
    )
    assert summary.counts["done"] == len(plan.jobs) == (DEMO_CONFIGS if grid is None else RANDOM_IDS_CONFIGS)
    assert any(cache.iterdir()), "the demo's nodes did not convert the drafter into their own cache"
    return out


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory, demo_cluster: tuple[str, Path]) -> Path:
    """The demo's sweep as shipped (its generated prompt set, default category mix, 12 s per level)."""
    return _run_demo(tmp_path_factory.mktemp("demo") / "results", demo_cluster)


@pytest.fixture(scope="module")
def random_ids_out(tmp_path_factory: pytest.TempPathFactory, demo_cluster: tuple[str, Path]) -> Path:
    """The grid's configs that can win on random token ids (the stress shape), at the loaded levels only."""
    out = tmp_path_factory.mktemp("demo-random") / "results"
    return _run_demo(
        out,
        demo_cluster,
        RANDOM_IDS_GRID,
        concurrency=[16, 64],
        workload=RANDOM_IDS_WORKLOAD,
        duration_s=RANDOM_IDS_DURATION_S,
    )


def _true_winner(con, level: str, concurrency: int) -> str:
    """The config with the highest steady-state throughput (what the level's window measures) for this
    level's content (the rows' categories: the default mix, or random ids) and mean prompt length, each
    at its own launch's factor. A closed loop started all at once (``ground_truth``) over the level's
    request count is not it: a count that adds a second wave of a few requests alone can swap two
    configs (on the old linear profile it swapped the baseline, steady 1430 tok/s, and the depth-2 chain,
    1327, at 64 streams on random ids). On the default preset the margins are 16-19% on the mix and
    6-9% on random ids, against a 1.5% launch factor."""
    factors = job_launch_factors(con)
    rows = con.sql(
        "SELECT j.config_label, j.effective_speculative_algorithm, j.effective_speculative_num_steps, "
        "j.effective_speculative_eagle_topk, j.effective_speculative_num_draft_tokens, "
        "j.effective_max_running_requests, round(avg(r.prompt_tokens)), "
        "bool_and(r.category = 'random_ids') "
        "FROM requests r JOIN jobs j USING (sweep_id, job_id) "
        "WHERE r.load_level = ? AND NOT r.warmup GROUP BY ALL",
        params=[level],
    ).fetchall()
    from workers.sglang import SpecParams

    truth = {
        label: steady_state(
            DEFAULT_PRESET,
            SpecParams(algo, steps, topk, draft, mrr),
            Load(concurrency, int(prompt), 128, 0, mix=((RANDOM_IDS, 1.0),) if random_ids else DEFAULT_MIX),
            ramp_up_s=RAMP_UP_S,
            factor=factors[label],
        ).output_throughput
        for label, algo, steps, topk, draft, mrr, prompt, random_ids in rows
    }
    assert len(truth) == (RANDOM_IDS_CONFIGS if rows[0][-1] else DEMO_CONFIGS)
    return max(truth, key=truth.__getitem__)


def _winners(out: Path) -> dict[str, str]:
    con = connect(out)
    selection = select_best(con, out)
    con.close()
    return {level.load_level: level.winner.config_label for level in selection.levels}


def test_demo_winner_differs_from_random_ids_winner_when_loaded(demo_out: Path, random_ids_out: Path) -> None:
    """Random ids are not a basis for choosing a config: on the same grid, the winner on random ids
    differs from the winner on the default category mix at some level, and each is the simulator's
    truth for its own content."""
    mix, random_ids = _winners(demo_out), _winners(random_ids_out)
    assert any(random_ids[level] != mix[level] for level in random_ids), (mix, random_ids)
    con = connect(random_ids_out)
    for level, winner in random_ids.items():
        assert winner == _true_winner(con, level, int(level.split("=")[1])), (level, winner)
    con.close()


def test_demo_accept_length_per_category_matches_truth_when_prompt_set_is_mixed(demo_out: Path) -> None:
    """Each speculative config's token-weighted accept length per category (all levels) is within 3%
    of the simulator's truth for that category, and every row has a category and cached_tokens."""
    from workers.sglang import SpecParams

    con = connect(demo_out)
    assert con.sql(
        "SELECT count(*) FROM requests WHERE category IS NULL OR cached_tokens IS NULL OR dataset IS NULL"
    ).fetchall() == [(0,)]
    rows = con.sql(
        "SELECT j.effective_speculative_num_steps, j.effective_speculative_eagle_topk, "
        "j.effective_speculative_num_draft_tokens, r.category, count(*), "
        "sum(r.completion_tokens) / sum(r.spec_verify_ct) "
        "FROM requests r JOIN jobs j USING (sweep_id, job_id) "
        "WHERE NOT r.warmup AND r.error_type IS NULL AND j.effective_speculative_algorithm IS NOT NULL "
        "GROUP BY ALL"
    ).fetchall()
    con.close()
    checked = [row for row in rows if row[4] >= 30]  # enough requests for a 3% comparison
    assert {row[3] for row in checked} == {"code", "chat", "math"}
    assert len(checked) >= 9
    for steps, topk, draft, category, _, measured in checked:
        spec = SpecParams("EAGLE3", steps, topk, draft, 64)
        truth = ground_truth(DEFAULT_PRESET, spec, Load(1, 20, 128, 64, mix=((category, 1.0),)))
        assert measured == pytest.approx(truth.reported_accept_length, rel=0.03), (
            steps,
            topk,
            draft,
            category,
        )


def test_demo_picks_simulators_true_best_config_when_run_at_each_level(demo_out: Path) -> None:
    """At every concurrency level the demo's winner is the config the performance model says is fastest:
    the wide tree alone, the 4-token chain under load (the crossover the demo exists to show)."""
    con = connect(demo_out)
    selection = select_best(con, demo_out)
    winners = {level.load_level: level.winner.config_label for level in selection.levels}
    assert set(winners) == {"concurrency=1", "concurrency=16", "concurrency=64"}
    for level, winner in winners.items():
        assert winner == _true_winner(con, level, int(level.split("=")[1])), (level, winner)
    assert winners["concurrency=1"] != winners["concurrency=64"]
    con.close()


# Tolerances of the end-to-end truth test against the steady-state truth (at each launch's factor), from 12 s
# levels on this loaded 2-core box. Measured on the old linear profile (three runs at load averages of 9 to
# 14): throughput within 2.3% and speedup within 3.1% at every level but for the depth-12 chain at 64
# streams (+1.5/+5.4/+1.9%, +1.2/+6.4/+2.4%); TPOT within 6.7% but for that chain there (-10.5/-9.9/-11.1%),
# whose first requests took 8.3 s, so the window's decode was mostly theirs. On the default preset every
# request at 64 streams takes 2.3-4.4 s, so every window holds replacement requests; the tolerances stay.
THROUGHPUT_TOLERANCE = 0.07
SPEEDUP_TOLERANCE = 0.08
TPOT_TOLERANCE = 0.15


def test_demo_measures_every_config_within_tolerance_of_truth_when_run_at_each_level(demo_out: Path) -> None:
    """Not only the winner: every config's throughput, speedup over the baseline and TPOT at every level
    are the simulator's steady-state truth (the level's window leaves out the ramp-up and the drain) within
    the stated tolerances, so a uniform bias (a window off, a rate divided by the GPUs twice, a scaled
    TPOT) fails here."""
    con = connect(demo_out)
    factors = job_launch_factors(con)
    rows = con.sql(
        "SELECT r.load_level, j.config_label, j.effective_speculative_algorithm, "
        "j.effective_speculative_num_steps, j.effective_speculative_eagle_topk, "
        "j.effective_speculative_num_draft_tokens, j.effective_max_running_requests, "
        "median(r.tpot_ms) FILTER (WHERE r.error_type IS NULL), "
        "any_value(l.output_tok_s), round(avg(r.prompt_tokens)) "
        "FROM requests r JOIN jobs j USING (sweep_id, job_id) "
        "JOIN levels l ON l.sweep_id = r.sweep_id AND l.job_id = r.job_id AND l.load_level = r.load_level "
        "WHERE NOT r.warmup GROUP BY ALL"
    ).fetchall()
    con.close()
    from workers.sglang import SpecParams

    measured: dict[tuple[str, str], tuple[float, float]] = {}
    truth: dict[tuple[str, str], tuple[float, float]] = {}
    for level, label, algo, steps, topk, draft, mrr, tpot_ms, tok_s, prompt in rows:
        concurrency = int(level.split("=")[1])
        load = Load(concurrency, int(prompt), 128, 0, mix=DEFAULT_MIX)
        true = steady_state(
            DEFAULT_PRESET,
            SpecParams(algo, steps, topk, draft, mrr),
            load,
            ramp_up_s=RAMP_UP_S,
            factor=factors[label],
        )
        measured[level, label] = (tok_s, tpot_ms)
        truth[level, label] = (true.output_throughput, true.tpot_s * 1e3)
    assert len(measured) == 15
    for (level, label), (tok_s, tpot_ms) in measured.items():
        true_tok_s, true_tpot_ms = truth[level, label]
        assert tok_s == pytest.approx(true_tok_s, rel=THROUGHPUT_TOLERANCE), (level, label)
        assert tpot_ms == pytest.approx(true_tpot_ms, rel=TPOT_TOLERANCE), (level, label)
        speedup = tok_s / measured[level, "baseline"][0]
        true_speedup = true_tok_s / truth[level, "baseline"][0]
        assert speedup == pytest.approx(true_speedup, rel=SPEEDUP_TOLERANCE), (level, label)


# A p99 over the window's requests needs this many of them: in a 12 s level every config's window at 64
# streams holds at least one replacement request a stream (in a 6 s level the depth-12 chain's and the
# tree's held almost none).
WINDOW_MIN_REQUESTS = 48
# The acceptance bound of issue 14 on TTFT p99 at concurrency 64, plus this box's scheduling delays. The
# demo runs at real time, and on this shared 2-core box a first token waits for the CPU on top of its decode
# step and prefill: the server writes it late and the client reads it late (one 64-stream level of the
# depth-2 chain alone at a load average of 5 to 10: p99 16-46 ms and 9-77 ms, while the simulator's own
# wait from a request's arrival to its first token's deadline is the model's, p99 72 ms against 74.6 ms).
# Those delays do not scale with the simulated step: twice slower than real time, on five nodes, measured
# +35%, +106% and +37% for the baseline and the two short chains. The baseline's tail (one 40 ms step plus a
# prefill, 50 ms) is within 4% on an idle box (bench/demo_ttft.py, four runs) but 62 to 206 ms at a load
# average of 5 to 10, and up to 423 ms with one busy loop beside it (a client read 97 ms late), so the demo
# checks the speculative configs; tests/workers/test_steady_state.py checks the baseline at 64 streams,
# three times slower than real time, both with the ramp-up and without it.
TTFT_P99_TOLERANCE = 0.25
SCHEDULING_ALLOWANCE_MS = 30.0


def test_demo_ttft_p99_at_64_is_steady_state_truth_when_streams_ramp_up(demo_out: Path) -> None:
    """With the demo's ramp-up and each level's window, every config's window at concurrency 64 holds at
    least one request a stream, and each speculative config's TTFT p99 there is the simulator's steady-state
    truth (at the launch's factor) within 25% (plus this box's scheduling allowance): one decode step plus
    a prefill, 49 ms for the depth-2 chain to 88 ms for the tree on the default preset (75 to 434 ms on
    the old linear profile), not the start-up burst of 64 simultaneous prefills."""
    from workers.sglang import SpecParams

    con = connect(demo_out)
    factors = job_launch_factors(con)
    rows = con.sql(
        "SELECT j.config_label, j.effective_speculative_algorithm, j.effective_speculative_num_steps, "
        "j.effective_speculative_eagle_topk, j.effective_speculative_num_draft_tokens, "
        "j.effective_max_running_requests, any_value(l.ttft_p99_ms), any_value(l.window_start_s), "
        "count(*) FILTER (WHERE r.in_window AND r.error_type IS NULL), round(avg(r.prompt_tokens)) "
        "FROM requests r JOIN jobs j USING (sweep_id, job_id) "
        "JOIN levels l ON l.sweep_id = r.sweep_id AND l.job_id = r.job_id AND l.load_level = r.load_level "
        "WHERE r.load_level = 'concurrency=64' AND NOT r.warmup GROUP BY ALL"
    ).fetchall()
    con.close()
    assert len(rows) == 5
    checked = {}
    for label, algo, steps, topk, draft, mrr, p99_ms, window_start_s, n, prompt in rows:
        assert window_start_s == RAMP_UP_S
        assert n >= WINDOW_MIN_REQUESTS, (label, n)
        if algo is None:
            continue
        load = Load(64, int(prompt), 128, 0, mix=DEFAULT_MIX)
        truth = steady_state(
            DEFAULT_PRESET,
            SpecParams(algo, steps, topk, draft, mrr),
            load,
            ramp_up_s=RAMP_UP_S,
            factor=factors[label],
        )
        checked[label] = (p99_ms, truth.ttft_p99_s * 1e3, n)
    assert len(checked) == 4
    for label, (measured_ms, true_ms, _) in checked.items():
        allowed = TTFT_P99_TOLERANCE * true_ms + SCHEDULING_ALLOWANCE_MS
        assert abs(measured_ms - true_ms) <= allowed, (label, checked)


def test_demo_winner_command_is_an_sglang_launch_when_engine_is_sim(demo_out: Path) -> None:
    """The printed command is SGLang's (`-m sglang.launch_server`), with the effective speculative flags."""
    con = connect(demo_out)
    selection = select_best(con, demo_out)
    con.close()
    for level in selection.levels:
        command = level.winner.launch_command
        assert " -m sglang.launch_server " in command and "workers.sim" not in command
        assert "--speculative-num-draft-tokens" in command or level.winner.is_baseline


def test_demo_command_refuses_foreign_output_directory_when_not_empty(tmp_path: Path) -> None:
    """`specsweep demo --out DIR` never deletes a directory it did not write."""
    (tmp_path / "precious.txt").write_text("keep me")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "demo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "holds no earlier demo" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_stores_client_delay_calibration_when_levels_ran(demo_out: Path) -> None:
    """Each level keeps the load generator's loopback calibration; the sweep row holds their median."""
    con = connect(demo_out)
    levels = con.sql("SELECT client_delay_p50_us, client_delay_p99_us FROM levels").fetchall()
    ((p50, p99),) = con.sql("SELECT client_delay_p50_us, client_delay_p99_us FROM sweep").fetchall()
    con.close()
    assert len(levels) == 15 and all(a is not None and b is not None and 0 < a <= b for a, b in levels)
    assert p50 is not None and 0 < p50 <= p99


def test_demo_launches_name_no_node_copy_or_loopback_and_provenance_names_own_drafter_when_cache_reused(
    demo_out: Path, random_ids_out: Path, demo_cluster: tuple[str, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """On real node conversions (the second sweep's nodes reuse the first's converted drafter, whose
    conversion.json names the first sweep's directory): `best`'s `launch:` lines, the report's launches
    and `--emit`'s launch.sh and argvs name the spec's paths, never the node cache or a loopback
    host/port, and deploy.json's conversion record names each sweep's own drafter directory."""
    _, cache = demo_cluster
    loopback = re.compile(r"--host|--port|127\.0\.0\.1|localhost")
    for out in (demo_out, random_ids_out):
        own = str((out / DRAFTER_DIR).absolute())
        dest, report = tmp_path / out.parent.name / "deploy", tmp_path / out.parent.name / "report.html"
        assert main(["best", str(out), "--bootstrap", "100", "--emit", str(dest)]) == 0
        assert main(["report", str(out), "--bootstrap", "100", "-o", str(report)]) == 0
        text = capsys.readouterr().out
        launch_lines = [line for line in text.splitlines() if line.strip().startswith("launch:")]
        page = report.read_text()
        shown = [
            *launch_lines,
            *re.findall(r"<pre class='launch'>(.*?)</pre>", page, flags=re.DOTALL),
            (dest / "launch.sh").read_text(),
        ]
        result = json.loads((dest / "deploy.json").read_text())
        shown += [shlex.join(result[kind]["argv"]) for kind in ("static", "adaptive") if result[kind]]
        assert len(shown) > 4, text
        for line in shown:
            assert str(cache) not in line and "/drafters/" not in line and not loopback.search(line), line
        assert str(cache) not in page.split("</head>", 1)[1]
        assert result["drafter"]["conversion"]["source"] == own
