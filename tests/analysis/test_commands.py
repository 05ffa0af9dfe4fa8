"""The sql, best and report commands as a user runs them: output, JSON, and exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.synthetic import SyntheticSweep


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_best_json_names_true_winner_and_command_when_sweep_finished(clear_results) -> None:  # type: ignore[no-untyped-def]
    """--json gives, per level, the true best config, its speedup interval and launch argv."""
    out, sweep = clear_results
    result = _cli("best", str(out), "--json", "--slo", "tpot_p99_ms<=13")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    levels = {lv["load_level"]: lv for lv in data["levels"]}
    winner = levels["concurrency=16"]["ranked"][0]
    assert winner["config_label"] == "chain d=4"
    truth = sweep.true_speedup("chain d=4", 16)
    assert winner["speedup_ci"]["low"] <= truth <= winner["speedup_ci"]["high"]
    assert winner["sglang_argv"][:3] == ["python", "-m", "sglang.launch_server"]
    assert levels["concurrency=128"]["ranked"] == []
    assert data["slos"] == ["tpot_p99_ms<=13"]


def test_best_text_shows_winner_and_command_when_at_given(clear_results) -> None:  # type: ignore[no-untyped-def]
    """--at limits the output to one level; the text names the winner and its launch command."""
    out, _ = clear_results
    result = _cli("best", str(out), "--at", "concurrency=1")
    assert result.returncode == 0, result.stderr
    assert "== concurrency=1" in result.stdout and "== concurrency=16" not in result.stdout
    winner_line = next(line for line in result.stdout.splitlines() if "winner" in line)
    assert "chain d=4" in winner_line
    assert "launch: python -m sglang.launch_server" in result.stdout
    assert "--speculative-num-draft-tokens 4" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo", "ttft_p99_ms<=2000,tpot_p99_ms=>50"], "at character 30"),
        (["--slo", "ttft_p99ms<=1"], "unknown metric 'ttft_p99ms'"),
        (["--objective", "speed"], "unknown metric 'speed'"),
        (["--at", "concurrency=7"], "was not measured"),
    ],
)
def test_best_exits_2_with_message_when_input_bad(clear_results, args, message) -> None:  # type: ignore[no-untyped-def]
    """A user mistake -> exit 2, the message on stderr, no traceback."""
    out, _ = clear_results
    result = _cli("best", str(out), *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "fix:" in result.stderr


@pytest.mark.parametrize("command", ["best", "report", "sql"])
def test_command_refuses_directory_alike_when_no_results(tmp_path: Path, command: str) -> None:
    """best, report and sql refuse an empty directory the same way; sql opens no shell."""
    result = _cli(command, str(tmp_path), stdin="SELECT 42;\n")
    assert result.returncode == 2
    assert "holds no sweep results" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""  # the shell never read or answered the query
    assert not (tmp_path / "report.html").exists()


def test_sql_prints_table_when_query_given(clear_results) -> None:  # type: ignore[no-untyped-def]
    """A query prints its rows as an aligned table."""
    out, sweep = clear_results
    result = _cli("sql", str(out), "SELECT config_label, count(*) AS n FROM results GROUP BY 1 ORDER BY 1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["config_label", "n"]
    assert "baseline" in lines[2] and lines[2].split()[-1] == str(len(sweep.concurrencies))
    assert lines[-1] == f"({len(sweep.configs)} rows)"


def test_sql_reads_queries_from_stdin_when_no_query(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Without a query, ';'-terminated statements are read from stdin; a bad one reports and goes on."""
    out, _ = clear_results
    result = _cli(
        "sql", str(out), stdin="SELECT count(*) AS jobs\nFROM jobs;\nSELECT nope FROM jobs;\nSELECT 7 AS x;\n"
    )
    assert result.returncode == 2
    assert "jobs" in result.stdout and "4" in result.stdout and "7" in result.stdout
    assert "nope" in result.stderr


def test_sql_exits_2_when_query_bad(clear_results) -> None:  # type: ignore[no-untyped-def]
    """A failing query is a user error."""
    out, _ = clear_results
    result = _cli("sql", str(out), "SELECT * FROM no_such_view")
    assert result.returncode == 2 and "query failed" in result.stderr and "Traceback" not in result.stderr


def test_report_writes_file_when_sweep_finished(clear_results, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """report -o writes one HTML file and says where."""
    out, _ = clear_results
    target = tmp_path / "r" / "report.html"
    result = _cli("report", str(out), "-o", str(target), "--bootstrap", "200")
    assert result.returncode == 0, result.stderr
    assert target.exists() and str(target) in result.stdout
    assert [p.name for p in target.parent.iterdir()] == ["report.html"]


def test_best_works_when_single_level_sweep(tmp_path: Path) -> None:
    """A one-config, one-level sweep still ranks (and notes the missing baseline)."""
    from analysis.synthetic import SyntheticConfig, write_sweep

    write_sweep(
        tmp_path,
        SyntheticSweep(
            configs=(SyntheticConfig("chain d=2", "EAGLE3", 1, 1, 2, accept_length=1.6),),
            concurrencies=(2,),
            requests_per_level=50,
        ),
    )
    result = _cli("best", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "no no-speculation baseline" in result.stdout


# Mean TPOT (ms) of each config's requests per category: the deep chain serves code best, the tree chat.
CATEGORY_TPOT_MS = {
    "baseline": {"code": 20.0, "chat": 12.0},
    "chain d=8": {"code": 5.0, "chat": 10.0},
    "tree s=3 k=4 n=8": {"code": 8.0, "chat": 6.0},
}


def _categorised_sweep(out: Path) -> None:
    """A finished sweep whose requests alternate code and chat, each config's TPOT per category fixed."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from analysis.synthetic import SyntheticConfig, job_id_of, write_sweep

    configs = (
        SyntheticConfig("baseline"),
        SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4),
        SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.0),
    )
    sweep = SyntheticSweep(configs=configs, concurrencies=(1, 16), requests_per_level=40)
    write_sweep(out, sweep)
    for cfg in configs:
        (path,) = (out / "requests").rglob(f"job={job_id_of(sweep, cfg, 0)}/*.parquet")
        table = pq.read_table(path)
        code = pa.array([i % 2 == 0 for i in range(table.num_rows)])
        tpot = CATEGORY_TPOT_MS[cfg.label]
        for name, column in (
            ("category", pc.if_else(code, "code", "chat")),
            ("tpot_ms", pc.if_else(code, tpot["code"], tpot["chat"])),
            ("error_type", pa.nulls(table.num_rows, pa.string())),
        ):
            table = table.set_column(table.schema.get_field_index(name), name, column)
        pq.write_table(table, path)


def test_best_by_category_names_each_categorys_fastest_config_when_winners_differ(tmp_path: Path) -> None:
    """`best --by category` prints, per level and category, the config whose requests of that category
    decode fastest, with its speedup over the baseline; --json carries the whole ranking."""
    _categorised_sweep(tmp_path)
    result = _cli("best", str(tmp_path), "--by", "category")
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("concurrency=")]
    winners = {(row[0], row[1]): row[2:5] for row in rows}
    for level in ("concurrency=1", "concurrency=16"):
        assert winners[level, "code"][:2] == ["chain", "d=8"]
        assert winners[level, "chat"][:2] == ["tree", "s=3"]
    assert "4.000x" in result.stdout and "2.000x" in result.stdout  # 20/5 for code, 12/6 for chat
    data = json.loads(
        _cli("best", str(tmp_path), "--by", "category", "--json", "--at", "concurrency=16").stdout
    )
    assert [(c["load_level"], c["category"]) for c in data["levels"]] == [
        ("concurrency=16", "chat"),
        ("concurrency=16", "code"),
    ]
    chat = [r["config_label"] for r in data["levels"][0]["ranked"]]
    assert chat == ["tree s=3 k=4 n=8", "chain d=8", "baseline"]


def test_best_by_category_exits_2_when_emit_or_unknown_level_given(tmp_path: Path) -> None:
    """--by category ranks per category: --emit (a deployment per level) and an unmeasured --at are refused."""
    _categorised_sweep(tmp_path)
    emit = _cli("best", str(tmp_path), "--by", "category", "--emit", str(tmp_path / "deploy"))
    assert emit.returncode == 2 and "--emit" in emit.stderr and "Traceback" not in emit.stderr
    at = _cli("best", str(tmp_path), "--by", "category", "--at", "concurrency=7")
    assert at.returncode == 2 and "was not measured" in at.stderr and "Traceback" not in at.stderr
    assert not (tmp_path / "deploy").exists()
