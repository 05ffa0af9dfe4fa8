"""The simulator's performance model, its ground truth, and its knobs (no server, no I/O but files): the truths on
the default preset (the server's own physics), the linear model's formulas on DEFAULT_PROFILE (a profile file's model)."""

from __future__ import annotations

import itertools
import random

import pytest

from workers.sglang import SpecParams, capacity
from workers.sim.model import (
    DEFAULT_MIX,
    DEFAULT_PROFILE,
    RANDOM_IDS,
    DraftShape,
    Load,
    accepted_drafts_distribution,
    admissions,
    content_category,
    decode_step_seconds,
    depth_accept_probs,
    depth_candidates,
    expected_accept_length,
    ground_truth,
    sample_accepted_drafts,
    steady_state,
)
from workers.sim.presets import DEFAULT_PRESET
from workers.sim.settings import FaultMode, SimSettingsError, load_profile, settings_from_env


def chain(steps: int) -> SpecParams:
    return SpecParams("EAGLE3", steps, 1, steps + 1, 48)


BASELINE = SpecParams(max_running_requests=48)


def test_depth_candidates_spend_extra_nodes_on_shallow_depths_when_topk_above_one():
    """A tree of n-1 nodes has one node per depth, extra siblings at the shallowest depths, <= topk each."""
    assert depth_candidates(DraftShape(3, 1, 4)) == (1, 1, 1)
    assert depth_candidates(DraftShape(5, 4, 8)) == (3, 1, 1, 1, 1)
    assert depth_candidates(DraftShape(3, 4, 10)) == (4, 4, 1)
    assert depth_candidates(DraftShape(7, 1, 3)) == (1, 1)  # fewer draft tokens than steps: depth 2


def test_accept_probs_decay_with_depth_and_rise_with_topk_when_shape_varies():
    """Acceptance per depth decays with depth; extra candidates raise it; temperature lowers it."""
    probs = depth_accept_probs(DEFAULT_PROFILE, DraftShape(7, 1, 8), 0.0)
    assert all(a > b for a, b in itertools.pairwise(probs))
    wide = depth_accept_probs(DEFAULT_PROFILE, DraftShape(7, 4, 16), 0.0)
    assert wide[0] > probs[0]
    hot = depth_accept_probs(DEFAULT_PROFILE, DraftShape(7, 1, 8), 1.0)
    assert all(h < c for h, c in zip(hot, probs, strict=True))


def test_expected_accept_length_matches_sampling_when_drawn_many_times():
    """The closed form 1 + sum P(prefix accepted) is what repeated verify steps average to."""
    probs = depth_accept_probs(DEFAULT_PROFILE, DraftShape(5, 1, 6), 0.0)
    rng = random.Random(3)
    draws = [1 + sample_accepted_drafts(probs, rng) for _ in range(200_000)]
    assert sum(draws) / len(draws) == pytest.approx(expected_accept_length(probs), rel=0.01)
    assert sum(accepted_drafts_distribution(probs)) == pytest.approx(1.0)


def test_decode_step_grows_with_batch_times_draft_tokens_when_speculating():
    """Deep drafts cost little at batch 1 and a lot at batch 48: the verify pass scales with b x n."""
    deep, shallow = DraftShape(15, 1, 16), DraftShape(1, 1, 2)
    at_1 = decode_step_seconds(DEFAULT_PROFILE, deep, 1) / decode_step_seconds(DEFAULT_PROFILE, shallow, 1)
    at_48 = decode_step_seconds(DEFAULT_PROFILE, deep, 48) / decode_step_seconds(DEFAULT_PROFILE, shallow, 48)
    assert at_1 < 1.8 < 3.0 < at_48


def test_admissions_fill_free_slots_only_when_requests_wait():
    """A prefill admits every waiting request that fits under max_running_requests; else decode (0)."""
    assert admissions([1] * 5, [1] * 45, 48, None) == 3
    assert admissions([1] * 5, [1] * 48, 48, None) == 0
    assert admissions([], [1] * 3, 48, None) == 0
    assert admissions([1] * 7, [1] * 100, None, None) == 7


def test_admissions_stop_at_kv_tokens_when_whole_requests_do_not_fit():
    """Admission reserves each request's whole life (prompt + output + draft slots): requests join in
    arrival order while their tokens fit next to the running ones'; a request alone on an idle server
    joins whatever its size. The old rule counted requests only and admitted all three below."""
    assert admissions([400, 400, 400], [300], 48, 1000) == 1
    assert admissions([800, 100], [300], 48, 1000) == 0  # in order: the small one waits behind the big one
    assert admissions([5000], [], 48, 1000) == 1
    assert admissions([600], [500], 48, 1000) == 0


def test_ground_truth_batch_is_what_the_kv_pool_holds_when_requests_are_long():
    """On the default preset (Kimi-K2 FP8 on H200 x8, 112,100 KV tokens a GPU) 64 streams of 2,000-token
    prompts and 4,096-token outputs cannot all run: each holds 2,000 + 4,096 + 1 + 4 tokens for its life,
    so 18 decode together and the rest wait. Their TPOT is a batch of 18's (9.1 ms, one step of 18 over
    2.6 tokens a step), not 64's (18.8 ms), which admission by request count alone gave."""
    spec = SpecParams("EAGLE3", 3, 1, 4, 64)
    reserve = capacity.request_token_reserve(2000, 4096, 4)
    assert DEFAULT_PRESET.kv_token_capacity() // reserve == 18
    truth = ground_truth(DEFAULT_PRESET, spec, Load(64, 2000, 4096, 64))
    assert truth.batch == 18
    shape = DraftShape(3, 1, 4)
    step_64 = DEFAULT_PRESET.decode_step_seconds(shape, 64, 4000, max_running=64)
    assert truth.tpot_s < 0.6 * step_64 / DEFAULT_PRESET.accept_length(shape)


def test_ground_truth_prefers_deep_chains_at_concurrency_one_and_shallow_at_high_load():
    """The default preset has the crossover the search must find: depth wins alone, loses under load
    (Kimi-K2 physics: 5 steps best alone, 3 steps at 48; the old linear profile's were 7+ and 1-2)."""
    shapes = [BASELINE, chain(1), chain(2), chain(3), chain(5), chain(7), chain(9), chain(15)]

    def best(concurrency: int) -> SpecParams:
        load = Load(concurrency, input_len=256, output_len=256, num_requests=4 * concurrency)
        return min(shapes, key=lambda spec: ground_truth(DEFAULT_PRESET, spec, load).tpot_s)

    alone, crowded = best(1), best(48)
    assert alone.speculative_num_steps is not None and alone.speculative_num_steps >= 5
    assert crowded.speculative_num_steps is not None and crowded.speculative_num_steps <= 3
    load_1 = Load(1, 256, 256, 4)
    assert (
        ground_truth(DEFAULT_PRESET, chain(7), load_1).tpot_s
        < 0.4 * ground_truth(DEFAULT_PRESET, BASELINE, load_1).tpot_s
    )


def test_ground_truth_is_repeatable_and_caps_batch_when_concurrency_exceeds_max_running():
    """Same inputs, same truth; 64 clients on max_running 48 decode 48 at a time and queue the rest."""
    load = Load(64, input_len=128, output_len=64, num_requests=128)
    first = ground_truth(DEFAULT_PRESET, chain(3), load)
    assert first == ground_truth(DEFAULT_PRESET, chain(3), load)
    assert first.batch == 48
    assert first.ttft_s > ground_truth(DEFAULT_PRESET, chain(3), Load(48, 128, 64, 96)).ttft_s


def test_ground_truth_accept_length_is_one_without_speculation():
    """The baseline verifies nothing: accept length 1, no reported speculative length."""
    truth = ground_truth(DEFAULT_PRESET, BASELINE, Load(4, 64, 32, 8))
    assert truth.accept_length == 1.0
    assert truth.tpot_s == pytest.approx(truth.decode_step_s, rel=0.3)


def test_content_category_follows_profile_markers_when_prompt_is_text_or_ids():
    """Token ids are random_ids; text takes the first category with a marker in it; else the default."""
    assert content_category(DEFAULT_PROFILE, [5, 17, 9]) == RANDOM_IDS
    assert content_category(DEFAULT_PROFILE, "Write a Python function that sorts a list") == "code"
    assert content_category(DEFAULT_PROFILE, "SOLVE for x: 3x + 4 = 19") == "math"
    assert content_category(DEFAULT_PROFILE, "Tell me about the history of tea") == "chat"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "how many legs?"}]
    assert content_category(DEFAULT_PROFILE, messages) == "math"
    # the first category in the profile's order wins when two match
    assert content_category(DEFAULT_PROFILE, "Solve this with a python function") == "code"


def test_ground_truth_accept_length_depends_on_category_when_mix_is_given():
    """Each category has its own acceptance (code > math > chat > random ids for a deep chain); a mix's
    server-wide accept length is the weight-harmonic mean of its categories' (equal output lengths)."""
    load = Load(4, 64, 64, 16, mix=DEFAULT_MIX)
    truth = ground_truth(DEFAULT_PRESET, chain(7), load)
    by_category = dict(truth.accept_length_by_category)
    assert set(by_category) == {"code", "chat", "math"}
    ids = ground_truth(DEFAULT_PRESET, chain(7), Load(4, 64, 64, 16, mix=((RANDOM_IDS, 1.0),)))
    ((_, random_length),) = ids.accept_length_by_category
    assert by_category["code"] > by_category["math"] > by_category["chat"] > random_length + 1.0
    harmonic = 1.0 / (0.3 / by_category["code"] + 0.5 / by_category["chat"] + 0.2 / by_category["math"])
    assert truth.accept_length == pytest.approx(harmonic)
    assert min(by_category.values()) < truth.accept_length < max(by_category.values())


def test_ground_truth_winner_differs_between_random_ids_and_default_mix_when_loaded():
    """Random ids are a stress shape, not a speed answer: at 16 and 64 concurrent requests the config
    that is truly fastest on them is not the one that is fastest on the default category mix."""
    configs = [SpecParams(max_running_requests=64), SpecParams("EAGLE3", 5, 4, 16, 64)]
    configs += [SpecParams("EAGLE3", steps, 1, steps + 1, 64) for steps in (1, 3, 11)]  # the demo's grid

    def best(concurrency: int, mix: tuple[tuple[str, float], ...]) -> SpecParams:
        load = Load(concurrency, 256, 128, 4 * concurrency, mix=mix)
        return max(configs, key=lambda spec: ground_truth(DEFAULT_PRESET, spec, load).output_throughput)

    for concurrency in (16, 64):
        assert best(concurrency, ((RANDOM_IDS, 1.0),)) != best(concurrency, DEFAULT_MIX), concurrency


def test_profile_refuses_category_named_like_another_when_built():
    """Category names are unique and random_ids is reserved, so a name picks one acceptance."""
    data = DEFAULT_PROFILE.model_dump()
    data["categories"] = [*data["categories"], {"name": "chat", "accept_first": 0.5, "accept_decay": 0.9}]
    with pytest.raises(ValueError, match="unique"):
        type(DEFAULT_PROFILE).model_validate(data)
    with pytest.raises(ValueError, match="no category"):
        DEFAULT_PROFILE.acceptance("poetry")


def test_draft_shape_from_spec_refuses_unresolved_config():
    """Only effective configs can be priced: a missing steps/topk/draft-tokens value is a caller bug."""
    assert DraftShape.from_spec(BASELINE) is None
    with pytest.raises(ValueError, match="not resolved"):
        DraftShape.from_spec(SpecParams("EAGLE3", None, 1, None, 48))


def test_load_profile_overrides_default_fields_when_file_is_partial_yaml(tmp_path):
    """A profile file names only what it changes; the rest keeps the default profile's values."""
    path = tmp_path / "profile.yaml"
    path.write_text("name: slow-gpu\ntarget_fixed_s: 0.03\n")
    profile = load_profile(path)
    assert (profile.name, profile.target_fixed_s) == ("slow-gpu", 0.03)
    assert profile.accept_first == DEFAULT_PROFILE.accept_first


def test_load_profile_reads_categories_when_yaml_lists_them(tmp_path):
    """Categories and the random-ids acceptance come from the file as plain YAML lists and mappings."""
    path = tmp_path / "profile.yaml"
    path.write_text(
        "categories:\n  - {name: sql, markers: [select ], accept_first: 0.9, accept_decay: 0.99}\n"
        "random_ids: {name: random_ids, accept_first: 0.5, accept_decay: 0.9}\n"
    )
    profile = load_profile(path)
    assert content_category(profile, "SELECT * FROM t") == "sql"
    assert profile.acceptance("sql") == (0.9, 0.99)
    assert profile.acceptance(RANDOM_IDS) == (0.5, 0.9)


def test_load_profile_names_the_field_when_value_is_bad(tmp_path):
    """A misspelt or out-of-range field is a SimSettingsError naming it, not a traceback."""
    path = tmp_path / "profile.json"
    path.write_text('{"accept_frist": 0.5, "accept_decay": 3}')
    with pytest.raises(SimSettingsError) as err:
        load_profile(path)
    assert "accept_frist" in str(err.value) and "accept_decay" in str(err.value)


@pytest.mark.parametrize(
    ("name", "text"),
    [("profile.json", "[" * 100_000 + "]" * 100_000), ("profile.yaml", "name: x\nseed: " + "[" * 5000)],
    ids=["json_deep", "yaml_deep"],
)
def test_load_profile_names_the_file_when_it_nests_too_deep(tmp_path, name, text):
    """A profile nested past the parser's depth is a SimSettingsError naming the file, not a RecursionError."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SimSettingsError, match="nested") as err:
        load_profile(path)
    assert str(path) in str(err.value)


def test_settings_from_env_reads_knobs_and_rejects_unknown_fault():
    """Environment knobs become typed settings; an unknown fault lists the valid ones."""
    settings = settings_from_env(
        {"SPECSWEEP_SIM_TIME_SCALE": "0.1", "SPECSWEEP_SIM_SEED": "9", "SPECSWEEP_SIM_FAULT": "http_500"}
    )
    assert (settings.time_scale, settings.seed, settings.fault) == (0.1, 9, FaultMode.HTTP_500)
    with pytest.raises(SimSettingsError, match="hang_mid_stream"):
        settings_from_env({"SPECSWEEP_SIM_FAULT": "explode"})
    with pytest.raises(SimSettingsError, match="time_scale"):
        settings_from_env({"SPECSWEEP_SIM_TIME_SCALE": "-1"})


def test_settings_from_env_reads_reuse_port_switch_when_given():
    """SPECSWEEP_SIM_REUSE_PORT is off by default, on for 1/true/yes; another word names the variable."""
    assert not settings_from_env({}).reuse_port
    assert settings_from_env({"SPECSWEEP_SIM_REUSE_PORT": "1"}).reuse_port
    assert not settings_from_env({"SPECSWEEP_SIM_REUSE_PORT": "false"}).reuse_port
    with pytest.raises(SimSettingsError, match="SPECSWEEP_SIM_REUSE_PORT"):
        settings_from_env({"SPECSWEEP_SIM_REUSE_PORT": "maybe"})


def test_steady_state_ttft_tail_is_a_decode_step_plus_a_prefill_when_streams_are_spread() -> None:
    """At 64 spread-out streams a replacement request waits for the decode step under way and its own
    prefill, so the steady TTFT p99 of the baseline is one full-batch step (at a context between the
    prompt's and the whole request's) plus a prefill of a few prompts, well under the burst of 64 prompts
    prefilled together that a simultaneous start gives (on the default preset 81 ms against 46 ms, 1.75x;
    the old linear profile's per-token prefill made it over 2x); its throughput is Little's law over the
    steady requests."""
    spec = SpecParams(None, None, None, None, 64)
    load = Load(64, 40, 128, 64)
    steady = steady_state(DEFAULT_PRESET, spec, load)
    step_first = DEFAULT_PRESET.decode_step_seconds(None, 64, 40, max_running=64)
    step_last = DEFAULT_PRESET.decode_step_seconds(None, 64, 40 + 128, max_running=64)
    assert step_first + DEFAULT_PRESET.prefill_seconds(40) <= steady.ttft_p99_s
    assert steady.ttft_p99_s <= step_last + DEFAULT_PRESET.prefill_seconds(3 * 40)
    burst = ground_truth(DEFAULT_PRESET, spec, load)
    assert burst.ttft_s > 1.5 * steady.ttft_p99_s
    assert steady.requests >= 1500
    assert steady.output_throughput == pytest.approx(64 * 128 / (steady.ttft_mean_s + 127 * steady.tpot_s))
