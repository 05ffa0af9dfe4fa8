"""Every reader ranks only the jobs of the sweep's current inputs (issue #26, finding 2).

After `run --resume --accept-changed-inputs` an output holds done jobs of the earlier inputs beside the
new ones, under other job ids. A synthetic sweep with capacity probes gets such a superseded job for two
configs (and a superseded confirmation job): `best` at every objective and `--by category`, the report,
`--emit` and the confirmation must read the current jobs only, through the one `current_jobs` view.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.layout import JOB_TABLES, job_part_path
from analysis.report import render_report
from analysis.schema import write_parquet_atomic
from analysis.select import select_best
from analysis.synthetic import SyntheticConfig, SyntheticSweep, job_id_of
from analysis.views import connect
from harness.cli import main
from harness.deploy_launch import deploy_launches
from tests.analysis.test_capacity import _write_results

CURRENT = {"prompts": "p-new", "target": "t-1"}
EARLIER = {"prompts": "p-old", "target": "t-1"}
CONFIGS = (
    SyntheticConfig("baseline"),
    SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, repeats=2),
    SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4),
    SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.0),
)
SWEEP = SyntheticSweep(configs=CONFIGS, concurrencies=(1,), requests_per_level=40)
# chain d=4's current launches carry 40 and 36 req/s (it ranks second, at 36); its earlier launch only 4.
EARLIER_JOBS = {"old-chain4": ("chain d=4", 0), "old-base": ("baseline", 0)}


def _set_column(path: Path, name: str, values: list[object]) -> None:
    table = pq.read_table(path)
    field = table.schema.field(name)
    table = table.set_column(table.schema.get_field_index(name), field, pa.array(values, field.type))
    write_parquet_atomic(table, path)


def _copy_job(out: Path, source: str, target: str, **columns: object) -> None:
    """Commit ``source``'s files again as job ``target`` (jobs row last) with ``columns`` in its jobs row."""
    for table in sorted(JOB_TABLES, key=lambda t: t == "jobs"):
        src = job_part_path(out, table, SWEEP.sweep_id, source)
        if not src.exists():
            continue
        dst = job_part_path(out, table, SWEEP.sweep_id, target)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        if "job_id" in pq.read_schema(dst).names:
            _set_column(dst, "job_id", [target] * pq.read_metadata(dst).num_rows)
        if table == "jobs":
            for name, value in columns.items():
                _set_column(dst, name, [value])


def _with_inputs(out: Path, *, sweep_inputs: dict[str, str] | None) -> Path:
    """Every synthetic job measured on CURRENT; the EARLIER_JOBS copies (and an adaptive confirmation
    copied from chain d=8) on EARLIER; the sweep row says ``sweep_inputs`` are current."""
    for path in out.glob("jobs/sweep=*/job=*/*.parquet"):
        _set_column(path, "input_digests", [json.dumps(CURRENT, sort_keys=True)])
    earlier = json.dumps(EARLIER, sort_keys=True)
    for target, (label, repeat) in EARLIER_JOBS.items():
        _copy_job(out, job_id_of(SWEEP, SWEEP.config(label), repeat), target, input_digests=earlier)
    # chain d=4's earlier launch found capacity 4 req/s only
    probes = job_part_path(out, "capacity", SWEEP.sweep_id, "old-chain4")
    rows = pq.read_table(probes).num_rows
    _set_column(probes, "passed", [False] * rows)
    _set_column(probes, "probe_load", [5.0 + i for i in range(rows)])
    _copy_job(
        out,
        job_id_of(SWEEP, SWEEP.config("chain d=8"), 0),
        "old-confirmation",
        input_digests=earlier,
        role="confirmation",
        config_label="adaptive",
        requested_points=["adaptive batch>=1: 7 steps"],
    )
    sweep_row = next(out.glob("sweep/sweep=*/*.parquet"))
    _set_column(sweep_row, "input_digests", [None if sweep_inputs is None else json.dumps(sweep_inputs)])
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.analysis.test_capacity import PROBES

    out = _write_results(tmp_path_factory.mktemp("inputs") / "out", PROBES)
    return _with_inputs(out, sweep_inputs=CURRENT)


def test_views_read_current_jobs_only_when_output_holds_jobs_of_earlier_inputs(results: Path) -> None:
    """`current_jobs` holds the done jobs with no input differing from the sweep's; `results`,
    `category_results` and `capacity_results` read jobs through it; `jobs` keeps every row for `sql`."""
    con = connect(results, read_only=True)
    try:
        earlier = {*EARLIER_JOBS, "old-confirmation"}
        assert earlier <= {r[0] for r in con.sql("SELECT job_id FROM jobs").fetchall()}
        stale = con.sql("SELECT job_id, stale_inputs FROM job_inputs WHERE len(stale_inputs) > 0").fetchall()
        assert sorted(stale) == sorted((job, ["prompts"]) for job in earlier)
        for view in ("current_jobs", "results", "capacity_results"):
            shown = {r[0] for r in con.sql(f"SELECT DISTINCT job_id FROM {view}").fetchall()}
            assert shown and not shown & earlier, view
        ((num_ok,),) = con.sql(
            "SELECT sum(num_ok) FROM category_results WHERE config_label = 'baseline'"
        ).fetchall()
        ((one_job,),) = con.execute(
            "SELECT count(*) FROM requests WHERE job_id = ? AND in_window AND error_type IS NULL",
            [job_id_of(SWEEP, SWEEP.config("baseline"), 0)],
        ).fetchall()
        assert num_ok == one_job  # the earlier baseline's requests are not pooled with the current one's
    finally:
        con.close()


def test_best_capacity_ranks_current_launches_only_when_earlier_inputs_measured_worse(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`best --objective capacity` credits a config with its smallest capacity over the launches of the
    current inputs: chain d=4's earlier launch (4 req/s on other prompts) neither counts as a launch nor
    drags its capacity down, and a note says a job was left out."""
    assert main(["best", str(results), "--objective", "capacity", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    chain = next(r for r in answer["ranked"] if r["config_label"] == "chain d=4")
    assert (chain["capacity"], chain["launches"]) == (36.0, 2), chain
    assert any("measured on other inputs" in note for note in answer["notes"]), answer["notes"]
    assert main(["best", str(results), "--objective", "capacity"]) == 0
    text = capsys.readouterr().out
    assert "note: 3 job(s) measured on other inputs than the sweep's current ones (prompts differ" in text


def test_best_by_category_pools_current_jobs_only_when_earlier_inputs_present(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`best --by category` counts the requests of the current baseline only, and notes the others."""
    assert main(["best", str(results), "--by", "category", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    ranks = [r for level in answer["levels"] for r in level["ranked"] if r["config_label"] == "baseline"]
    con = connect(results)
    try:
        ((one_job,),) = con.execute(
            "SELECT count(*) FROM requests WHERE job_id = ? AND in_window AND error_type IS NULL",
            [job_id_of(SWEEP, SWEEP.config("baseline"), 0)],
        ).fetchall()
    finally:
        con.close()
    assert sum(r["num_ok"] for r in ranks) == one_job
    assert any("measured on other inputs" in note for note in answer["notes"])


def test_report_capacity_counts_current_launches_only_when_earlier_inputs_present(results: Path) -> None:
    """The report's capacity table credits chain d=4 with its current launches only: capacity 36, bracket
    from 36 to its highest lowest failing load 45, widened by 1.96 x 2% ([34.6, 46.8]), 2 launches."""
    con = connect(results)
    try:
        page = render_report(con, select_best(con, results, replicates=100), launches=deploy_launches(con))
    finally:
        con.close()
    section = page.split("<section id='capacity'>", 1)[1].split("</section>", 1)[0]
    row = section.split("<td class='label'>chain d=4</td>", 1)[1]
    assert row.startswith("<td>36 req/s</td><td>[34.6, 46.8]</td><td>2</td>"), row[:80]


def test_best_json_has_no_confirmation_when_the_only_one_measured_earlier_inputs(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A done confirmation job of the earlier inputs is not reported as this sweep's confirmation."""
    assert main(["best", str(results), "--json", "--bootstrap", "100"]) == 0
    assert json.loads(capsys.readouterr().out)["confirmation"] is None


def test_best_capacity_refuses_when_current_jobs_disagree_on_an_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the sweep row does not name the inputs (an input only the nodes could see), jobs that still
    differ are refused by `best --objective capacity` and `--by category` too: one line, exit 2."""
    from tests.analysis.test_capacity import PROBES

    out = _with_inputs(_write_results(tmp_path / "out", PROBES), sweep_inputs=None)
    for argv in (["--objective", "capacity"], ["--by", "category"]):
        capsys.readouterr()
        assert main(["best", str(out), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert "measured on different inputs" in err and "prompts" in err and "Traceback" not in err, err
