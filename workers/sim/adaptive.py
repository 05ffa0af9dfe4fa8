"""The simulator's ``--speculative-adaptive``: SGLang 0.5.23's per-batch-size draft-depth controller.

A replay of ``sglang/srt/speculative/adaptive_spec_params.py`` (``AdaptiveStepSlot`` and
``AdaptiveSpeculativeParams``), so a simulated adaptive server switches depth exactly when SGLang would:

- the config maps batch-size thresholds to slots; a batch goes to the slot of the largest threshold at
  or below its size (``_find_closest_bs``; the smallest slot below every threshold). The simulator
  captures no CUDA graphs, so batch sizes are not padded up first (``_pad_to_cuda_graph_bs`` with
  ``cuda_graph_bs=None``);
- each slot keeps an EMA (``ema_alpha``, default 0.2) of the mean accepted drafts per request of the
  verify steps routed to it, starting at ``current_steps - 1``; a slot at 0 steps leaves its EMA alone;
- after ``warmup_batches`` (10) verify steps, every ``update_interval`` (5) it recomputes: from 0 steps
  it probes the next candidate; otherwise it steps down while the EMA is at or below
  ``prev - 0.5 + down_hysteresis`` (``0.5 + down_hysteresis`` towards 0), else up while above
  ``current - 0.5 + up_hysteresis``; ``ceiling_coeff`` > 0 caps a non-rising target at
  ``ceil(ema * ceiling_coeff)``;
- a slot starts at the launch's ``--speculative-num-steps`` when it is a candidate, else at its middle
  candidate; step 0 means no drafting (a plain decode step).

The engine asks ``steps_for_batch`` before each decode iteration (SGLang's ``activate_step_by_batch``)
and reports each verify step's per-request accepted drafts with ``on_verify_complete`` (SGLang's
``on_verify_complete_cpu``, fed with ``len(batch.reqs)``).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.sglang.rules import adaptive_config_problem

# SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG: served when --speculative-adaptive has no config file.
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict[str, Any]] = {
    "1": {
        "candidate_steps": [1, 3, 5, 7],
        "up_hysteresis": 0.0,
        "down_hysteresis": -0.25,
        "ceiling_coeff": 0,
    },
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


@dataclass(frozen=True, slots=True)
class SlotSettings:
    """One batch-size slot's knobs: its own entry over the file's shared defaults over SGLang's."""

    candidate_steps: tuple[int, ...]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0.0

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> SlotSettings:
        knobs = {name: entry[name] for name in cls.__dataclass_fields__ if name in entry}
        knobs["candidate_steps"] = tuple(sorted(set(entry["candidate_steps"])))
        return cls(**knobs)


class AdaptiveSlot:
    """One slot's EMA of accepted drafts and its current depth (SGLang's ``AdaptiveStepSlot``)."""

    def __init__(self, initial_steps: int, settings: SlotSettings) -> None:
        self.settings = settings
        candidates = settings.candidate_steps
        self.current_steps = (
            initial_steps if initial_steps in candidates else candidates[len(candidates) // 2]
        )
        self.ema_accept_len = float(self.current_steps - 1)
        self._batch_count = 0

    def update(self, correct_drafts: list[int]) -> bool:
        """Fold one verify step into the EMA; True when the depth changed."""
        if not correct_drafts:
            return False
        s = self.settings
        if self.current_steps > 0:
            batch_avg = sum(correct_drafts) / len(correct_drafts)
            self.ema_accept_len = (1 - s.ema_alpha) * self.ema_accept_len + s.ema_alpha * batch_avg
        self._batch_count += 1
        if self._batch_count <= s.warmup_batches:
            return False
        if (self._batch_count - s.warmup_batches) % s.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        s, candidates = self.settings, self.settings.candidate_steps
        old = self.current_steps
        index = old_index = candidates.index(old)
        if old == 0:  # probe the smallest positive depth after an interval without drafting
            index = min(index + 1, len(candidates) - 1)
            target = candidates[index]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            return self._apply(target)
        while index > 0:
            prev = candidates[index - 1]
            drop = (0.5 if prev == 0 else prev - 0.5) + s.down_hysteresis
            if self.ema_accept_len > drop:
                break
            index -= 1
        if index == old_index:
            while (
                index < len(candidates) - 1
                and self.ema_accept_len > candidates[index] - 0.5 + s.up_hysteresis
            ):
                index += 1
        target = candidates[index]
        if s.ceiling_coeff > 0:
            ceiling = max(1, math.ceil(self.ema_accept_len * s.ceiling_coeff))
            if ceiling < target <= old:
                while index > 0 and candidates[index] > ceiling:
                    index -= 1
                target = candidates[index]
        return self._apply(target)

    def _apply(self, target: int) -> bool:
        changed = target != self.current_steps
        self.current_steps = target
        return changed


class AdaptiveSchedule:
    """Routes batch sizes to slots (SGLang's ``AdaptiveSpeculativeParams`` without CUDA-graph padding)."""

    def __init__(self, initial_steps: int, config: Mapping[str, Any]) -> None:
        problem = adaptive_config_problem(dict(config))
        if problem is not None:
            raise ValueError(problem)
        shared = {key: value for key, value in config.items() if not key.isdigit()}
        self.thresholds = sorted(int(key) for key in config if key.isdigit())
        self.slots = {
            bs: AdaptiveSlot(initial_steps, SlotSettings.from_entry({**shared, **config[str(bs)]}))
            for bs in self.thresholds
        }

    @classmethod
    def from_file(cls, initial_steps: int, path: str | None) -> AdaptiveSchedule:
        """The schedule a launch serves: its config file, or SGLang's default table without one."""
        config = DEFAULT_ADAPTIVE_CONFIG if path is None else json.loads(Path(path).read_text())
        return cls(initial_steps, config)

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """Every slot's candidates together (SGLang sizes its buffers by the largest)."""
        return tuple(sorted({s for slot in self.slots.values() for s in slot.settings.candidate_steps}))

    def slot_for(self, batch_size: int) -> AdaptiveSlot:
        index = bisect.bisect_right(self.thresholds, batch_size) - 1
        return self.slots[self.thresholds[max(0, index)]]

    def steps_for_batch(self, batch_size: int) -> int:
        return self.slot_for(batch_size).current_steps

    def on_verify_complete(self, correct_drafts: list[int], batch_size: int) -> int | None:
        """Feed one verify step to its slot; the new depth when the slot switched, else None."""
        slot = self.slot_for(batch_size)
        return slot.current_steps if slot.update(correct_drafts) else None
