"""The simulator's performance model, its ground truth, and its knobs (no server, no I/O but files)."""

from __future__ import annotations

import itertools
import random

import pytest

from workers.sglang import SpecParams
from workers.sim.model import (
    DEFAULT_PROFILE,
    DraftShape,
    Load,
    accepted_drafts_distribution,
    admissions,
    decode_step_seconds,
    depth_accept_probs,
    depth_candidates,
    expected_accept_length,
    ground_truth,
    sample_accepted_drafts,
)
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
    assert admissions(5, 45, 48) == 3
    assert admissions(5, 48, 48) == 0
    assert admissions(0, 3, 48) == 0
    assert admissions(7, 100, None) == 7


def test_ground_truth_prefers_deep_chains_at_concurrency_one_and_shallow_at_high_load():
    """The default profile has the crossover the search must find: depth wins alone, loses under load."""
    shapes = [BASELINE, chain(1), chain(2), chain(3), chain(5), chain(7), chain(9), chain(15)]

    def best(concurrency: int) -> SpecParams:
        load = Load(concurrency, input_len=256, output_len=256, num_requests=4 * concurrency)
        return min(shapes, key=lambda spec: ground_truth(DEFAULT_PROFILE, spec, load).tpot_s)

    alone, crowded = best(1), best(48)
    assert alone.speculative_num_steps >= 7
    assert crowded.speculative_num_steps is None or crowded.speculative_num_steps <= 2
    load_1 = Load(1, 256, 256, 4)
    assert (
        ground_truth(DEFAULT_PROFILE, chain(7), load_1).tpot_s
        < 0.4 * ground_truth(DEFAULT_PROFILE, BASELINE, load_1).tpot_s
    )


def test_ground_truth_is_repeatable_and_caps_batch_when_concurrency_exceeds_max_running():
    """Same inputs, same truth; 64 clients on max_running 48 decode 48 at a time and queue the rest."""
    load = Load(64, input_len=128, output_len=64, num_requests=128)
    first = ground_truth(DEFAULT_PROFILE, chain(3), load)
    assert first == ground_truth(DEFAULT_PROFILE, chain(3), load)
    assert first.batch == 48
    assert first.ttft_s > ground_truth(DEFAULT_PROFILE, chain(3), Load(48, 128, 64, 96)).ttft_s


def test_ground_truth_accept_length_is_one_without_speculation():
    """The baseline verifies nothing: accept length 1, no reported speculative length."""
    truth = ground_truth(DEFAULT_PROFILE, BASELINE, Load(4, 64, 32, 8))
    assert truth.accept_length == 1.0
    assert truth.tpot_s == pytest.approx(truth.decode_step_s, rel=0.3)


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


def test_load_profile_names_the_field_when_value_is_bad(tmp_path):
    """A misspelt or out-of-range field is a SimSettingsError naming it, not a traceback."""
    path = tmp_path / "profile.json"
    path.write_text('{"accept_frist": 0.5, "accept_decay": 3}')
    with pytest.raises(SimSettingsError) as err:
        load_profile(path)
    assert "accept_frist" in str(err.value) and "accept_decay" in str(err.value)


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
