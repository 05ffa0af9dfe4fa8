"""The validator: the mission's three launches, each project rule, and agreement with SGLang's resolver."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests.workers.sglang_rules_corpus import STRICTER_RULES, live_verdicts, recorded
from workers.sglang import SGLangResolver, flag_table, validate, validate_many
from workers.sglang.resolver import ResolverResult
from workers.sglang.validate import ValidationReport, _report, _resolver_argv

FIXTURES = Path(__file__).parent.parent / "fixtures"
KIMI = str(FIXTURES / "kimi-k2")
DRAFT = str(FIXTURES / "eagle3-draft")
LLAMA = str(FIXTURES / "llama-target")

MISSION_BASE = [
    "--model-path", KIMI, "--tp-size", "8", "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", DRAFT, "--speculative-eagle-topk", "1",
]  # fmt: skip
MISSION_1 = [*MISSION_BASE, "--num-speculative-tokens", "16"]
MISSION_2 = [*MISSION_BASE, "--speculative-num-draft-tokens", "16"]
MISSION_3 = [*MISSION_2, "--speculative-num-steps", "1"]


@pytest.fixture(scope="module")
def mission_reports(sglang_python: str):
    """The three mission launches, validated in one SGLang process."""
    return validate_many([MISSION_1, MISSION_2, MISSION_3], sglang_python=sglang_python)


def test_validate_rejects_foreign_flag_when_mission_launch_1(mission_reports) -> None:
    """`--num-speculative-tokens` is invalid and the fix names `--speculative-num-draft-tokens`."""
    report = mission_reports[0]
    assert report.status == "invalid" and report.exit_code == 2
    assert report.errors[0].code == "unknown_flag"
    assert "--speculative-num-draft-tokens" in report.errors[0].suggestion
    assert report.layers["sglang 0.5.23"].startswith("parser exit 2")


def test_validate_explains_bare_assertion_when_mission_launch_2(mission_reports) -> None:
    """Draft tokens without steps: SGLang's bare AssertionError, explained as 'give all three together'."""
    report = mission_reports[1]
    assert report.status == "invalid"
    assert report.layers["sglang 0.5.23"] == "bare AssertionError"
    error = report.errors[0]
    assert error.code == "sglang_error" and "AssertionError" in error.message
    assert "together" in error.suggestion


def test_validate_reports_silent_rewrite_when_mission_launch_3(mission_reports) -> None:
    """topk 1 + 16 draft tokens + 1 step runs 2 draft tokens; the fix is 15 steps."""
    report = mission_reports[2]
    assert report.status == "adjusted" and report.exit_code == 3
    assert report.checked_by == ["builtin", "sglang 0.5.23"]
    assert report.requested.speculative_num_draft_tokens == 16
    assert report.effective.speculative_num_draft_tokens == 2
    assert report.effective.max_running_requests == 48
    corrected = report.corrected_argv
    assert corrected[corrected.index("--speculative-num-steps") + 1] == "15"
    assert corrected[corrected.index("--speculative-num-draft-tokens") + 1] == "16"
    assert not report.warnings  # the built-in mirror agrees with SGLang


def test_validate_corrected_command_really_runs_16_tokens_when_resolved_by_sglang(
    mission_reports, sglang_python: str
) -> None:
    """The suggested command, fed back to SGLang, resolves to a 16-token chain with nothing changed."""
    report = validate(mission_reports[2].corrected_argv, sglang_python=sglang_python)
    assert report.status == "ok"
    assert report.effective.speculative_num_draft_tokens == 16
    assert report.effective.speculative_num_steps == 15


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["--model-path", KIMI, "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", DRAFT],
         "eagle3_draft_with_eagle"),
        (["--model-path", KIMI, "--speculative-algorithm", "EAGLE3"], "eagle3_without_draft"),
        (["--model-path", KIMI, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"],
         "speculation_without_algorithm"),
        ([*MISSION_BASE[:8], "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
          "--speculative-num-draft-tokens", "8"], "draft_tokens_exceed_tree"),
        ([*MISSION_BASE[:8], "--speculative-num-steps", "0", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "1"], "nonpositive"),
        ([*MISSION_BASE[:8], "--speculative-num-steps", "3", "--speculative-eagle-topk", "4"], "incomplete_triple"),
        ([*MISSION_BASE[:8], "--speculative-num-steps", "3"], "incomplete_triple"),
        (["--model-path", LLAMA, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
          str(FIXTURES / "eagle3-draft-llama-arch")], "draft_architecture"),
        (["--model-path", KIMI, "--cuda-graph-max-bs", "8"], "ambiguous_flag"),
        (["--model-path", KIMI, "--speculative-draft", DRAFT], "ambiguous_flag"),
        (["--model-path", KIMI, "--speculative-num-step", "3x"], "bad_value"),
        (["--model-path", KIMI, "--tp-size"], "missing_value"),
    ],
)  # fmt: skip
def test_builtin_rule_refuses_launch_when_rule_applies(argv: list[str], code: str) -> None:
    """Each project rule and parser rule gives its own error code, a message and a fix."""
    report = validate(argv, use_resolver=False)
    assert report.status == "invalid"
    assert report.errors[0].code == code
    assert report.errors[0].message and report.errors[0].suggestion


def test_builtin_accepts_aliases_without_adjustment_when_nextn_lowercase() -> None:
    """NEXTN -> EAGLE and lower-case names are not adjustments; defaults are reported, not adjusted."""
    report = validate(
        ["--model-path", str(FIXTURES / "kimi-k2-mtp"), "--speculative-algorithm", "nextn"],
        use_resolver=False,
    )
    assert report.status == "ok"
    assert report.effective.speculative_algorithm == "EAGLE"
    assert (report.effective.speculative_num_steps, report.effective.speculative_eagle_topk) == (3, 1)


def test_builtin_uses_wide_tree_defaults_when_llama_target() -> None:
    """SGLang's defaults by architecture: (5, 4, 8) for Llama targets."""
    report = validate(
        ["--model-path", LLAMA, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", DRAFT],
        use_resolver=False,
    )
    assert report.effective.speculative_num_steps == 5
    assert report.effective.speculative_eagle_topk == 4
    assert report.effective.speculative_num_draft_tokens == 8


def test_flag_table_matches_installed_sglang_when_regenerated(sglang_python: str) -> None:
    """The packaged flag table is exactly what the installed SGLang's parser declares (drift check)."""
    script = Path(__file__).parents[2] / "workers" / "sglang" / "dump_flags.py"
    out = subprocess.run(
        [sglang_python, str(script)], capture_output=True, text=True, check=True, timeout=300
    )
    live = json.loads(out.stdout)
    packaged = flag_table()
    assert live["sglang_version"] == packaged.sglang_version
    assert [tuple(f["options"]) for f in live["flags"]] == [f.options for f in packaged.flags], (
        "workers/sglang/flags.json drifted from SGLang: regenerate it with "
        "`.venv-sglang/bin/python workers/sglang/dump_flags.py > workers/sglang/flags.json`"
    )
    assert [f["default"] for f in live["flags"]] == [f.default for f in packaged.flags]


# ---------------------------------------------------------------------------------------------------
# Agreement with SGLang on a generated corpus
# ---------------------------------------------------------------------------------------------------

TARGETS = [KIMI, LLAMA, str(FIXTURES / "kimi-k2-mtp")]
DRAFTS = [None, DRAFT, str(FIXTURES / "eagle3-draft-llama-arch")]
ALGORITHMS = [None, "EAGLE3", "EAGLE", "NEXTN", "eagle3", "MEDUSA"]
SMALL_INTS = st.one_of(st.none(), st.integers(min_value=0, max_value=12))
EXTRAS = [
    [], ["--page-size", "16"], ["--attention-backend", "fa3"], ["--attention-backend", "flashinfer"],
    ["--max-running-requests", "128"], ["--speculative-use-rejection-sampling"], ["--cuda-graph-max-bs", "8"],
    ["--num-speculative-tokens", "4"], ["--speculative-algo", "EAGLE3"], ["--tp", "8"],
]  # fmt: skip


@st.composite
def launch_commands(draw: st.DrawFn) -> list[str]:
    argv = ["--model-path", draw(st.sampled_from(TARGETS))]
    algorithm = draw(st.sampled_from(ALGORITHMS))
    if algorithm is not None:
        argv += ["--speculative-algorithm", algorithm]
    draft = draw(st.sampled_from(DRAFTS))
    if draft is not None:
        argv += ["--speculative-draft-model-path", draft]
    for flag in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"):
        value = draw(SMALL_INTS)
        if value is not None:
            argv += [flag, str(value)]
    return argv + draw(st.sampled_from(EXTRAS))


@pytest.fixture(scope="module")
def resolver(sglang_python: str) -> Iterator[SGLangResolver]:
    with SGLangResolver(sglang_python) as live:
        yield live


@dataclass(frozen=True)
class Judged:
    """One generated launch with both layers' verdicts."""

    argv: list[str]
    builtin: ValidationReport
    sglang: ResolverResult


@pytest.fixture(scope="module")
def corpus(resolver: SGLangResolver) -> list[Judged]:
    """220 generated launches, each judged by the built-in layer and by SGLang's resolver.

    Hardware-dependent backends (trtllm_mha needs SM90+) are left out: SGLang checks them against the GPU
    it runs on, which a CPU-only validator does not have (see docs/validation.md). Derandomised and
    generated inside this fixture, so every test below sees the same corpus in any order or alone.
    """
    launches: list[list[str]] = []

    @settings(max_examples=220, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(argv=launch_commands())
    def collect(argv: list[str]) -> None:
        launches.append(argv)

    collect()
    return [
        Judged(
            argv, _report(argv, None, None, None, None), resolver.resolve(_resolver_argv(argv, None, None))
        )
        for argv in launches
    ]


def test_builtin_never_says_ok_when_sglang_says_invalid(corpus: list[Judged]) -> None:
    """Whenever SGLang's resolver refuses a generated launch, the built-in layer does too; whenever both
    accept, they agree on the effective speculative config."""
    for case in corpus:
        if not case.sglang.ok:
            assert case.builtin.status == "invalid", (
                f"SGLang refused {case.argv} ({case.sglang.error_type}) but builtin said ok"
            )
        elif case.builtin.status != "invalid":
            combined = _report(case.argv, case.sglang, "sglang", None, None)
            assert not [w for w in combined.warnings if w.code == "builtin_drift"], (
                case.argv,
                combined.warnings,
            )


def test_builtin_refuses_only_by_documented_rules_when_sglang_accepts(corpus: list[Judged]) -> None:
    """A launch SGLang runs is refused by the built-in layer only through a stricter project rule that
    docs/validation.md documents: an over-strict copy of one of SGLang's own rules fails here."""
    for case in corpus:
        if case.sglang.ok and case.builtin.status == "invalid":
            codes = {f.code for f in case.builtin.errors}
            assert codes <= STRICTER_RULES, f"builtin refused {case.argv} with {codes}, SGLang runs it"


def test_recorded_rule_verdicts_are_sglangs_when_resolved_live(
    resolver: SGLangResolver, tmp_path: Path
) -> None:
    """tests/fixtures/sglang-rules-corpus.json (the verdicts test_sglang_rules.py holds the rules to) is
    what the installed SGLang says today: regenerate it with `python -m tests.workers.sglang_rules_corpus`."""
    assert dict(live_verdicts(resolver, tmp_path)) == recorded()


def test_stricter_rules_are_the_documented_ones_when_docs_validation_read() -> None:
    """The list above is the docs' table of rules SGLang does not enforce, no more and no less."""
    text = (Path(__file__).parents[2] / "docs" / "validation.md").read_text()
    table = text.split("## Rules SGLang does not enforce")[1].split("\n## ")[0]
    assert set(re.findall(r"^\| `([a-z_0-9]+)` \|", table, flags=re.M)) == STRICTER_RULES


def test_agreement_corpus_was_large_and_mixed(corpus: list[Judged]) -> None:
    """The corpus has >= 200 launches and a real share of each case: SGLang refuses, only the project's
    rules refuse, and both accept (so none of the agreement tests above can pass on an empty case)."""
    sglang_invalid = sum(not c.sglang.ok for c in corpus)
    only_ours = sum(c.sglang.ok and c.builtin.status == "invalid" for c in corpus)
    both_ok = sum(c.sglang.ok and c.builtin.status != "invalid" for c in corpus)
    assert len(corpus) >= 200
    assert min(sglang_invalid, only_ours, both_ok) >= 20, (sglang_invalid, only_ours, both_ok)


# ---------------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "validate", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_validate_prints_json_and_exit_3_when_adjusted(sglang_python: str) -> None:
    """`specsweep validate --json` prints the documented object; exit code 3 for an adjusted launch."""
    proc = _cli("--json", "--sglang-python", sglang_python, "--", *MISSION_3)
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "adjusted"
    assert set(out["requested"]) == set(out["effective"]) == {
        "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens", "max_running_requests", "speculative_adaptive",
    }  # fmt: skip
    assert out["effective"]["speculative_num_draft_tokens"] == 2
    assert out["checked_by"] == ["builtin", "sglang 0.5.23"]
    assert out["errors"] == []


def test_cli_validate_human_report_shows_fix_and_exit_2_when_invalid() -> None:
    """The human report names the bad flag and the fix; no traceback."""
    proc = _cli("--builtin-only", "--", *MISSION_1)
    assert proc.returncode == 2
    assert "--speculative-num-draft-tokens" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_cli_validate_names_missing_interpreter_when_sglang_python_wrong() -> None:
    """A wrong --sglang-python is a user error with the fix, not a traceback."""
    proc = _cli("--sglang-python", "/nonexistent/python", "--", *MISSION_3)
    assert proc.returncode == 2
    assert "make sglang-venv" in proc.stderr and "Traceback" not in proc.stderr


def test_every_finding_code_is_documented_when_docs_validation_read() -> None:
    """docs/validation.md lists every error and warning code the validator can emit."""
    source = "\n".join(p.read_text() for p in (Path(__file__).parents[2] / "workers" / "sglang").glob("*.py"))
    codes = set(re.findall(r'(?:Finding|\.fail|ArgvError)\(\s*"([a-z_0-9]+)"', source))
    codes |= set(re.findall(r'code = "([a-z_]+)"', source))
    codes |= {"removed_flag", "unknown_flag"}
    docs = (Path(__file__).parents[2] / "docs" / "validation.md").read_text()
    assert len(codes) > 20
    missing = sorted(code for code in codes if f"`{code}`" not in docs)
    assert not missing, f"undocumented validation codes: {missing}"


ADAPTIVE_BASE = [
    "--model-path", KIMI, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", DRAFT,
    "--speculative-adaptive",
]  # fmt: skip
ADAPTIVE_TREE = [*ADAPTIVE_BASE, "--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                 "--speculative-num-draft-tokens", "8"]  # fmt: skip


MALFORMED_ADAPTIVE = (
    ({"1": {"candidate_steps": [3]}, "64": {"candidate_steps": "x"}}, "'64'"),
    ({"16": {"candidate_steps": [-1, 3]}}, "'16'"),
    ({"ema_alpha": 0.2}, "batch-size key"),
)


def _adaptive_chain(config_path: str) -> list[str]:
    return [*ADAPTIVE_BASE, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--speculative-adaptive-config", config_path]  # fmt: skip


@pytest.fixture(scope="module")
def adaptive_reports(tmp_path_factory: pytest.TempPathFactory, sglang_python: str):
    """One SGLang process: the tree that falls back, a supported chain, and each malformed config."""
    root = tmp_path_factory.mktemp("adaptive")
    configs = [{"1": {"candidate_steps": [3, 7]}, "16": {"candidate_steps": [0, 3]}}]
    configs += [config for config, _ in MALFORMED_ADAPTIVE]
    paths = []
    for i, config in enumerate(configs):
        path = root / f"adaptive-{i}.json"
        path.write_text(json.dumps(config))
        paths.append(str(path))
    argvs = [ADAPTIVE_TREE, *(_adaptive_chain(p) for p in paths)]
    return argvs, validate_many(argvs, sglang_python=sglang_python)


def test_validate_reports_adjusted_with_sglang_reason_when_adaptive_falls_back(adaptive_reports) -> None:
    """A topk-4 tree with --speculative-adaptive: SGLang serves static steps; `adjusted`, in SGLang's words
    (the builtin layer alone says the same)."""
    argvs, reports = adaptive_reports
    for report in (reports[0], validate(argvs[0], use_resolver=False)):
        assert report.status == "adjusted" and report.exit_code == 3
        assert report.requested.speculative_adaptive and not report.effective.speculative_adaptive
        (finding,) = [w for w in report.warnings if w.code == "adaptive_fallback"]
        assert "speculative_eagle_topk=4 (only topk=1 is supported)" in finding.message
        assert not [w for w in report.warnings if w.code == "builtin_drift"]


def test_validate_reports_ok_when_adaptive_chain_supported(adaptive_reports) -> None:
    """A topk-1 chain whose steps are among the config's candidates runs adaptive: `ok`, no fallback."""
    _, reports = adaptive_reports
    assert reports[1].status == "ok", reports[1].to_json_dict()
    assert reports[1].effective.speculative_adaptive and not reports[1].warnings


def test_validate_names_key_when_adaptive_config_malformed(adaptive_reports) -> None:
    """A config SGLang's _load_adaptive_config raises on is `invalid`, naming the key, in both layers."""
    argvs, reports = adaptive_reports
    for argv, report, (_, named) in zip(argvs[2:], reports[2:], MALFORMED_ADAPTIVE, strict=True):
        builtin = validate(argv, use_resolver=False)
        assert builtin.status == "invalid" and builtin.errors[0].code == "adaptive_config"
        assert named in builtin.errors[0].message
        assert report.status == "invalid"
        assert report.layers["sglang 0.5.23"].startswith("ValueError")


def test_cli_validate_judges_by_builtin_rules_and_names_target_config_when_model_path_is_not_here(
    sglang_python: str,
) -> None:
    """The README's launch on a model path that exists only on the GPU nodes: exit 3 (adjusted, 2 draft
    tokens), judged by the built-in rules, with a warning that SGLang's resolver was not run and the fix
    `--target-config DIR`; never SGLang's "Repo id" message as an INVALID verdict (it was exit 2)."""
    argv = ["--model-path", "/models/Kimi-K2.5", *MISSION_3[2:]]
    proc = _cli("--json", "--sglang-python", sglang_python, "--", *argv)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "adjusted" and out["effective"]["speculative_num_draft_tokens"] == 2
    assert out["checked_by"] == ["builtin"]
    assert out["layers"]["sglang 0.5.23"].startswith("not run")
    (note,) = [w for w in out["warnings"] if w["code"] == "sglang_not_run"]
    assert "/models/Kimi-K2.5" in note["message"] and "--target-config DIR" in note["suggestion"]
    human = _cli("--sglang-python", sglang_python, "--", *argv)
    assert human.returncode == 3 and "fix: pass --target-config DIR" in human.stdout
    assert "Repo id" not in human.stdout + human.stderr
