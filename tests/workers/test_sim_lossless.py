"""The simulated server under the lossless check's requests: greedy output ids that depend on the prompt
alone, and the lossy fault modes that break that for speculative configs."""

from __future__ import annotations

from pathlib import Path

from tests.launch_args import chain_launch_args
from workers.load.lossless import CHECK_OUTPUT_TOKENS, CHECK_PROMPTS, run_check
from workers.node.launcher import start_sim

FAST = {"SPECSWEEP_SIM_TIME_SCALE": "0.05"}


def _outputs(args: list[str], env: dict[str, str]) -> dict[tuple[str, int], tuple[int, ...] | None]:
    """(mode, prompt index) -> output ids of the check's requests on a simulated server."""
    with start_sim(args, env={**FAST, **env}) as server:
        records = run_check(server.url, sweep_id="s", job_id="j", request_timeout_s=30)
    assert all(r.error is None for r in records)
    return {(r.mode, r.prompt_index): r.output_ids for r in records}


def test_sim_greedy_output_ids_are_the_same_when_a_prompt_is_sent_alone_or_batched(kimi_target: Path) -> None:
    """At temperature 0 the simulator's ids (and where EOS ends them) depend on the prompt only: the same
    one at a time as all at once, on the resend too, so the baseline's noise floor there is 0. Some
    outputs end at EOS before max_new_tokens, so the lengths are part of what is compared."""
    outputs = _outputs(["--model-path", str(kimi_target)], {})
    for index in range(len(CHECK_PROMPTS)):
        assert outputs["serial", index] == outputs["batched", index], f"prompt {index}"
    lengths = {len(ids or ()) for ids in outputs.values()}
    assert CHECK_OUTPUT_TOKENS in lengths and min(lengths) < CHECK_OUTPUT_TOKENS


def test_sim_lossy_fault_changes_ids_from_fault_after_when_the_server_speculates(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """Under SPECSWEEP_SIM_FAULT=lossy a speculative server emits the baseline's ids up to position
    FAULT_AFTER and other ids from there; lossy_tree leaves a topk-1 chain exact."""
    fault = {"SPECSWEEP_SIM_FAULT_AFTER": "4"}
    baseline = _outputs(["--model-path", str(kimi_target)], {"SPECSWEEP_SIM_FAULT": "lossy", **fault})
    chain = chain_launch_args(kimi_target, eagle3_draft, 3)
    lossy = _outputs(chain, {"SPECSWEEP_SIM_FAULT": "lossy", **fault})
    exact_chain = _outputs(chain, {"SPECSWEEP_SIM_FAULT": "lossy_tree", **fault})
    assert exact_chain == baseline
    for key, ids in baseline.items():
        assert ids is not None and lossy[key] is not None
        assert lossy[key][:4] == ids[:4]
        if len(ids) > 4:
            assert lossy[key][4] != ids[4], key
