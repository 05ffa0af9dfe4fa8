"""``--format table|json|csv`` of best, status and sql, and exit code 6 when no config meets the SLOs."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.synthetic import SyntheticSweep
from harness.cli import main
from harness.commands.best import SELECTION_CSV_COLUMNS
from harness.queue import JobQueue

NO_CONFIG_MEETS_SLOS = 6
IMPOSSIBLE = "ttft_p99_ms<=1"  # no synthetic config answers in 1 ms


def test_best_exits_6_after_the_ranking_when_no_config_meets_the_slos(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """With nothing meeting the SLOs at any level, best still prints what each config missed (table or
    JSON), then one line saying there is nothing to deploy, exit 6 (it used to exit 0); one level with a
    winner is enough for exit 0."""
    out, _ = clear_results
    assert main(["best", str(out), "--slo", IMPOSSIBLE, "--bootstrap", "100"]) == NO_CONFIG_MEETS_SLOS
    captured = capsys.readouterr()
    assert "ttft_p99_ms = " in captured.out and "is not <= 1" in captured.out
    assert captured.err.startswith(
        "specsweep best: error: --slo: no config meets every SLO at any load level"
    )
    assert len(captured.err.strip().splitlines()) == 2 and "Traceback" not in captured.err
    args = ["best", str(out), "--slo", IMPOSSIBLE, "--format", "json", "--bootstrap", "100"]
    assert main(args) == NO_CONFIG_MEETS_SLOS
    levels = json.loads(capsys.readouterr().out)["levels"]
    assert all(level["ranked"] == [] and level["excluded"] for level in levels)
    assert main(["best", str(out), "--slo", "ttft_p99_ms<=150", "--bootstrap", "100"]) == 0
    assert "no config meets every SLO here" in capsys.readouterr().out  # the higher loads miss it


def test_best_csv_has_one_row_per_level_and_config_when_asked(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """--format csv: a header of SELECTION_CSV_COLUMNS, one row per level x config, the same numbers as
    --json (whose old spelling --json still works); excluded configs carry their reasons and no rank."""
    out, sweep = clear_results
    assert main(["best", str(out), "--json", "--slo", "tpot_p99_ms<=13", "--bootstrap", "100"]) == 0
    levels = json.loads(capsys.readouterr().out)["levels"]
    assert main(["best", str(out), "--format", "csv", "--slo", "tpot_p99_ms<=13", "--bootstrap", "100"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == len(sweep.configs) * len(sweep.concurrencies)
    assert tuple(rows[0]) == SELECTION_CSV_COLUMNS
    for level in levels:
        mine = [r for r in rows if r["load_level"] == level["load_level"]]
        ranked = [r for r in mine if r["rank"]]
        assert [r["config_label"] for r in ranked] == [c["config_label"] for c in level["ranked"]]
        assert [float(r["objective"]) for r in ranked] == [c["objective"] for c in level["ranked"]]
        excluded = [r for r in mine if not r["rank"]]
        assert [r["excluded_because"] for r in excluded] == [
            "; ".join(e["reasons"]) for e in level["excluded"]
        ]


def test_sql_prints_json_and_csv_when_asked_and_refuses_csv_of_several_statements(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """--format json: {"statements": [{statement, columns, rows, more_rows}]}, one per statement, every
    row (no 100-row cut); --format csv: a header and the rows; csv of two statements is one line, exit 2."""
    out, sweep = clear_results
    query = "SELECT config_label, count(*) AS n FROM results GROUP BY 1 ORDER BY 1; SELECT 1.5 AS x"
    assert main(["sql", str(out), query, "--format", "json"]) == 0
    first, second = json.loads(capsys.readouterr().out)["statements"]
    labels = sorted(c.label for c in sweep.configs)
    assert first["columns"] == ["config_label", "n"] and [r[0] for r in first["rows"]] == labels
    assert first["more_rows"] is False and second == {
        "statement": "SELECT 1.5 AS x",
        "columns": ["x"],
        "rows": [[1.5]],
        "more_rows": False,
    }
    assert main(["sql", str(out), "SELECT request_id FROM requests", "--format", "json"]) == 0
    (every,) = json.loads(capsys.readouterr().out)["statements"]
    assert len(every["rows"]) > 100
    assert (
        main(["sql", str(out), "SELECT config_label, 'a,b' AS c FROM jobs ORDER BY 1", "--format", "csv"])
        == 0
    )
    assert list(csv.reader(io.StringIO(capsys.readouterr().out))) == [["config_label", "c"]] + [
        [label, "a,b"] for label in labels
    ]
    assert main(["sql", str(out), query, "--format", "csv"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--format csv prints one table" in captured.err


def test_status_prints_one_csv_row_per_job_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """status --format csv: the jobs table (id, label, state, attempts, ...), one row per job; --json is
    still --format json."""
    queue = JobQueue(tmp_path)
    queue.add_jobs([(f"job{i}", f"label {i}", "{}") for i in range(3)])
    assert main(["status", str(tmp_path), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["id"], r["label"], r["state"]) for r in rows] == [
        (f"job{i}", f"label {i}", "pending") for i in range(3)
    ]
    assert main(["status", str(tmp_path), "--json"]) == 0
    assert [j["id"] for j in json.loads(capsys.readouterr().out)["jobs"]] == ["job0", "job1", "job2"]


def test_sql_exits_141_without_a_traceback_when_the_reader_closes_the_pipe(
    clear_results: tuple[Path, SyntheticSweep],
) -> None:
    """`specsweep sql OUT ... | head -1`: the reader leaves after one line; the command stops quietly with
    128 + SIGPIPE, as a shell reports it (it ended in a BrokenPipeError traceback)."""
    out, _ = clear_results
    argv = [sys.executable, "-m", "harness.cli", "sql", str(out), "SELECT * FROM range(200000)"]
    proc = subprocess.Popen([*argv, "--format", "csv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == b"range"
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr


def test_best_prints_each_column_with_one_number_of_decimals_when_ranking(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every ranking row shows its objective and MAD with two decimals and its speedup with three (the
    objective was printed to 6 significant digits: 24.1332 beside 23.129)."""
    out, _ = clear_results
    assert main(["best", str(out), "--bootstrap", "100"]) == 0
    ranked = [line for line in capsys.readouterr().out.splitlines() if line[3:5].strip().isdigit()]
    assert len(ranked) >= 4
    for line in ranked:  # rank, label (may hold spaces), objective, MAD, errors, speedup, interval, note
        cells = re.search(r" (\S+) +(\S+) +\d+\.\d%  *(\S+) ", line)
        assert cells is not None, line
        objective, mad, speedup = cells.groups()
        assert re.fullmatch(r"\d+\.\d{2}", objective), line
        assert re.fullmatch(r"\d+\.\d{2}|-", mad), line
        assert re.fullmatch(r"\d+\.\d{3}x|-", speedup), line
