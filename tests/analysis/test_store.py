"""Result stores: a local directory or an S3 prefix (moto's server on 127.0.0.1), read the same way.

The readers (views, best, sql, report) get the same answers from a bucket as from the directory it was
copied from; a reader shows only jobs whose commit object exists; bad URIs, an unreachable endpoint, a
missing bucket and missing or refused credentials are one line each, before any request that matters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from analysis import layout
from analysis.store import ResultStore, open_store
from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep
from analysis.views import connect
from harness.cli import main
from specsweep.errors import ResultsError, StoreError
from tests.object_store import S3Server, free_port, moto_server

CONFIGS = (
    SyntheticConfig("baseline"),
    SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1),
    SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4, step_cost=2.2),
)


def upload(local: Path, store: ResultStore) -> None:
    """Copy every file of a local results directory into the store, key for key."""
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        store.write_bytes(path.relative_to(local).as_posix(), path.read_bytes())


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic")
    write_sweep(out, SyntheticSweep(configs=CONFIGS, concurrencies=(1, 16), requests_per_level=120, seed=3))
    return out


@pytest.fixture
def bucket_copy(s3: S3Server, synthetic_dir: Path) -> str:
    """The synthetic sweep copied into a fresh bucket; its URI."""
    uri = f"s3://{s3.new_bucket()}/sweeps/synthetic"
    upload(synthetic_dir, open_store(uri))
    return uri


def test_store_round_trips_objects_when_s3(s3: S3Server) -> None:
    """Bytes and tables read back as written, listing is recursive and relative, a missing key reads as
    None, delete is idempotent, and a prefix's keys do not leak into a sibling prefix."""
    bucket = s3.new_bucket()
    store = open_store(f"s3://{bucket}/a/b")
    sibling = open_store(f"s3://{bucket}/a/bc")
    store.write_bytes("x/y.bin", b"\x00data")
    store.write_table("t/part-0.parquet", pa.table({"v": [1, 2, 3]}))
    sibling.write_bytes("z.bin", b"other")
    assert store.read_bytes("x/y.bin") == b"\x00data"
    table = store.read_table("t/part-0.parquet")
    assert table is not None and table.column("v").to_pylist() == [1, 2, 3]
    assert store.list_files("") == ["t/part-0.parquet", "x/y.bin"]
    assert store.read_bytes("missing") is None and not store.exists("missing")
    store.delete("x/y.bin")
    store.delete("x/y.bin")
    assert store.list_files("x") == []
    assert store.describe("t") == f"s3://{bucket}/a/b/t"


def test_store_reaches_the_endpoint_named_in_the_uri_when_no_endpoint_variable_is_set(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``?endpoint_override=HOST:PORT&scheme=http`` alone names an S3-compatible store."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    bucket = s3.new_bucket()
    host = s3.endpoint.removeprefix("http://")
    store = open_store(f"s3://{bucket}/p?endpoint_override={host}&scheme=http")
    store.check(write=True)
    store.write_bytes("k", b"v")
    assert open_store(f"s3://{bucket}/p?endpoint_override=http://{host}").read_bytes("k") == b"v"
    assert store.location == f"s3://{bucket}/p" and store.endpoint == host


def test_store_read_table_is_none_when_object_is_not_parquet(s3: S3Server) -> None:
    """A damaged object (not Parquet) reads as absent, as a damaged local file does: the driver then
    runs that job again instead of crashing."""
    store = open_store(f"s3://{s3.new_bucket()}/p")
    store.write_bytes("jobs/part-0.parquet", b"PAR1 torn")
    assert store.read_table("jobs/part-0.parquet") is None


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s4://bucket/prefix", "unsupported output location scheme 's4://'"),
        ("s3:///prefix", "needs a bucket"),
        ("s3://bucket/a/*/b", "no wildcards"),
        ("s3://bucket/p?endpoint=127.0.0.1:9000", "unknown URI option(s) endpoint"),
        ("s3://bucket/p?scheme=ftp", "scheme='ftp' is not http or https"),
        ("gs://bucket/p?anonymous=maybe", "anonymous='maybe' is not true or false"),
    ],
)
def test_open_store_refuses_in_one_line_when_uri_is_malformed(uri: str, message: str) -> None:
    """A malformed URI is refused without a request, naming the problem and the fix."""
    with pytest.raises(StoreError) as caught:
        open_store(uri)
    assert message in caught.value.problem and caught.value.fix


def test_store_check_names_missing_bucket_when_bucket_does_not_exist(s3: S3Server) -> None:
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-x' does not exist") as caught:
        open_store("s3://no-such-bucket-x/p").check(write=False)
    assert "create it first" in (caught.value.fix or "")


def test_store_check_names_endpoint_when_nothing_listens(s3: S3Server) -> None:
    """An endpoint where nothing listens is reported as unreachable, with the endpoint, quickly."""
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(StoreError, match=f"cannot reach the object store at {dead}"):
        open_store(f"s3://bucket/p?endpoint_override={dead}&scheme=http").check(write=False)


def test_store_check_refuses_when_no_credentials_are_found(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No key in the environment, no ~/.aws files, metadata service off: refused before any request."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StoreError, match="no AWS credentials found") as caught:
        open_store(f"s3://{s3.new_bucket()}/p").check(write=True)
    assert "AWS_ACCESS_KEY_ID" in (caught.value.fix or "")


@pytest.fixture(scope="module")
def strict_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A moto server that checks access keys (none is known to it, so every key is refused)."""
    log = tmp_path_factory.mktemp("moto-strict") / "moto.log"
    with moto_server(log, {"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as server:
        yield server


def test_store_check_says_credentials_were_refused_when_key_is_unknown(
    strict_s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in strict_s3.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StoreError, match="refused the credentials") as caught:
        open_store("s3://any-bucket/p").check(write=True)
    assert "AWS_SECRET_ACCESS_KEY" in (caught.value.fix or "")


def test_connect_shows_a_job_only_once_its_commit_object_exists_when_s3(s3: S3Server, tmp_path: Path) -> None:
    """Data objects published before their ``jobs`` commit are invisible to every view, and are never
    opened: removing them under a live connection (as a resume drops an uncommitted attempt's files)
    breaks no query. Once the commit is written the job's rows appear whole."""
    store = open_store(f"s3://{s3.new_bucket()}/p")
    write_sweep(
        tmp_path, SyntheticSweep(configs=CONFIGS[:2], concurrencies=(1,), requests_per_level=20, seed=1)
    )
    keys = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet")]
    commits = sorted(k for k in keys if k.startswith("jobs/"))
    held_back = commits[0]
    _, job_id = layout.part_ids(held_back, "jobs") or ("", "")
    for key in keys:
        if key != held_back:
            store.write_bytes(key, (tmp_path / key).read_bytes())
    con = connect(store)
    for view in ("requests", "levels", "server_metrics", "results"):
        assert con.sql(f"SELECT count(*) FROM {view} WHERE job_id = '{job_id}'").fetchall() == [(0,)], view
    assert con.sql("SELECT count(*) FROM jobs").fetchall() == [(len(commits) - 1,)]
    uncommitted = [k for k in keys if f"/job={job_id}/" in k and k != held_back]
    for key in uncommitted:
        store.delete(key)
    assert con.sql("SELECT count(*) FROM requests").fetchall()[0][0] > 0
    assert con.sql("SELECT count(*) FROM levels").fetchall()[0][0] > 0
    for key in uncommitted:
        store.write_bytes(key, (tmp_path / key).read_bytes())
    store.write_bytes(held_back, (tmp_path / held_back).read_bytes())
    con, local = connect(store), connect(tmp_path)
    query = f"SELECT count(*) FROM requests WHERE job_id = '{job_id}'"
    assert con.sql(query).fetchall() == local.sql(query).fetchall() != [(0,)]
    assert con.sql("SELECT count(*) FROM jobs").fetchall() == [(len(commits),)]


def test_views_agree_with_the_local_directory_when_results_are_in_a_bucket(
    synthetic_dir: Path, bucket_copy: str
) -> None:
    """Every view has the same rows over the bucket as over the directory it was copied from."""
    local, remote = connect(synthetic_dir), connect(open_store(bucket_copy))
    for view in ("sweep", "jobs", "levels", "requests", "results", "acceptance_by_position"):
        query = f"SELECT * FROM {view} ORDER BY ALL"
        assert remote.sql(query).fetchall() == local.sql(query).fetchall(), view


def test_sql_read_only_reads_no_file_when_results_are_in_a_bucket(
    bucket_copy: str, synthetic_dir: Path, tmp_path: Path
) -> None:
    """Over a bucket the sandbox leaves DuckDB no file access at all: neither a local file nor another
    key of the bucket can be read; the views still answer."""
    con = connect(open_store(bucket_copy), read_only=True)
    assert con.sql("SELECT count(*) FROM jobs").fetchall() == [(3,)]
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    part = next(synthetic_dir.rglob("part-0.parquet"))
    for query in (
        f"SELECT * FROM read_csv('{secret}')",
        f"SELECT * FROM read_parquet('{part}')",
        f"SELECT * FROM read_parquet('{bucket_copy}/jobs/*/*/part-0.parquet')",
    ):
        with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
            con.sql(query).fetchall()


def test_best_sql_and_report_read_the_bucket_when_out_is_a_uri(
    bucket_copy: str, synthetic_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``best --json`` names the same winners from the bucket as from the directory; ``sql`` answers the
    same; ``report`` writes report.html into the bucket."""
    assert main(["best", str(synthetic_dir), "--json", "--bootstrap", "200"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["best", bucket_copy, "--json", "--bootstrap", "200"]) == 0
    remote = json.loads(capsys.readouterr().out)
    assert [lv["ranked"][0]["config_label"] for lv in remote["levels"]] == [
        lv["ranked"][0]["config_label"] for lv in local["levels"]
    ]
    assert remote == local
    query = (
        "SELECT config_label, count(*) FROM requests JOIN jobs USING (sweep_id, job_id) GROUP BY 1 ORDER BY 1"
    )
    assert main(["sql", str(synthetic_dir), query]) == 0
    local_sql = capsys.readouterr().out
    assert main(["sql", bucket_copy, query]) == 0
    assert capsys.readouterr().out == local_sql
    assert main(["report", bucket_copy, "--bootstrap", "200"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {bucket_copy}/report.html"
    page = open_store(bucket_copy).read_bytes("report.html")
    assert page is not None and b"<html" in page


def test_readers_refuse_in_one_line_when_the_bucket_holds_no_results(
    s3: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty prefix is 'no sweep results', a missing bucket says so; exit 2, no traceback."""
    empty = f"s3://{s3.new_bucket()}/nothing"
    for argv in (
        ["best", empty],
        ["sql", empty, "SELECT 1"],
        ["status", empty],
        ["best", "s3://nobucket-q/x"],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.startswith(f"specsweep {argv[0]}: error:"), err
    with pytest.raises(ResultsError, match="holds no sweep results"):
        connect(open_store(empty))


@pytest.mark.parametrize("command", ["best", "sql"])
def test_readers_name_the_object_when_a_result_object_is_truncated(
    command: str, bucket_copy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated levels object in the bucket: one line naming it and saying it is damaged, exit 2."""
    store = open_store(bucket_copy)
    damaged = next(k for k in store.list_files("levels") if k.endswith(layout.PART))
    store.write_bytes(damaged, (store.read_bytes(damaged) or b"")[:100])
    argv = {"best": ["best", bucket_copy], "sql": ["sql", bucket_copy, "SELECT count(*) FROM levels"]}
    assert main(argv[command]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "damaged" in err and damaged in err, err


def test_best_refuses_an_unfinished_sweep_when_a_leased_attempt_has_no_commit_in_the_bucket(
    bucket_copy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver's leased mark of an attempt that has not committed makes the sweep unfinished, as a
    worker's attempt directory does locally: `best` refuses, `--allow-partial` ranks the committed."""
    store = open_store(bucket_copy)
    store.write_bytes(layout.leased_mark("f00dfeedf00dfeed", 1), b"")
    assert main(["best", bucket_copy]) == 2
    assert (
        "sweep is not finished: 1 job(s) started but not committed (f00dfeedf00dfeed)"
        in capsys.readouterr().err
    )
    assert main(["best", bucket_copy, "--allow-partial", "--bootstrap", "200"]) == 0
    assert "ranking covers committed jobs only" in capsys.readouterr().out
