"""How each speculative algorithm drafts, for the simulated server: small pure functions the engine (and
the truth functions, ``workers.sim.model`` / ``workers.sim.physics``) call on top of the EAGLE3 model.

The profile's (or preset's) acceptance and draft cost describe a separately trained one-layer drafter
(EAGLE3, or EAGLE with an EAGLE draft). The other algorithms change one of the two (docs/sim_server.md):

- NEXTN (SGLang runs it as EAGLE with the target's own MTP layers as the draft, ``MTP`` here): the head
  was trained with the target, so it misses the first draft ``MTP_FIRST_MISS`` as often as a separate
  drafter; it is one layer reused for every further step, so each deeper depth keeps ``MTP_DEPTH_KEEP``
  of the drafter's acceptance per step. Its draft forward costs one decoder layer, as the drafter's.
- STANDALONE (a small causal LM drafting on its own): acceptance ``STANDALONE_KEEP`` of the drafter's at
  every depth (it sees no target hidden states); each draft forward reads its ``num_hidden_layers``
  layers of width ``hidden_size``, so it costs ``layers x hidden^2 / target_hidden^2`` of a one-layer
  drafter at the target's width (``draft_cost_scale``).
- NGRAM (SGLang's n-gram cache): no draft model and no draft forward, only a CPU lookup per request
  (``NGRAM_LOOKUP_S``); its drafts are the continuations of the context's suffix seen earlier, so a
  request's acceptance is its prompt's ``prompt_repetition`` (how often the suffix predicts the next
  token), falling ``NGRAM_DEPTH_KEEP`` per depth. The tree is SGLang's: ``--speculative-ngram-max-bfs-
  breadth`` (the effective topk) candidates at most per depth, ``num_draft_tokens - 1`` nodes.

These numbers are stated assumptions, not fits to measurements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MTP_FIRST_MISS = 0.75
MTP_DEPTH_KEEP = 0.85
STANDALONE_KEEP = 0.9
NGRAM_DEPTH_KEEP = 0.9
NGRAM_LOOKUP_S = 2e-5  # per running request and decode step, on the scheduler's CPU
NGRAM_MATCH = 3  # suffix length matched against the earlier context
DRAFTED_KINDS = ("EAGLE3", "EAGLE", "MTP", "STANDALONE", "NGRAM")


@dataclass(frozen=True, slots=True)
class Drafting:
    """How a launch drafts: ``kind`` (one of ``DRAFTED_KINDS``) and its draft forward's cost relative to
    the profile's one-layer drafter (0 for NGRAM: no draft model)."""

    kind: str
    draft_cost_scale: float = 1.0

    @property
    def uses_prompt(self) -> bool:
        """Whether a request's acceptance depends on its own prompt (n-gram matching)."""
        return self.kind == "NGRAM"

    def lookup_seconds(self, batch: int) -> float:
        """The CPU work of a decode step that is not a forward pass (NGRAM's cache lookups)."""
        return NGRAM_LOOKUP_S * batch if self.kind == "NGRAM" else 0.0

    def depth_probs(self, drafter: Sequence[float]) -> tuple[float, ...]:
        """This kind's per-depth acceptance from a one-layer drafter's (NGRAM: see ``ngram_depth_probs``)."""
        if self.kind == "MTP":
            return tuple(
                1.0 - MTP_FIRST_MISS * (1.0 - q) if d == 0 else q * MTP_DEPTH_KEEP**d
                for d, q in enumerate(drafter)
            )
        if self.kind == "STANDALONE":
            return tuple(q * STANDALONE_KEEP for q in drafter)
        return tuple(drafter)


def drafting_of(
    algorithm: str | None,
    *,
    draft_path: str | None,
    model_path: str | None,
    draft_config: Mapping[str, Any] | None,
    target_config: Mapping[str, Any] | None,
) -> Drafting | None:
    """The drafting of a resolved launch (SGLang's algorithm after NEXTN -> EAGLE), None without one. EAGLE
    whose draft is the target itself is the target's MTP head."""
    if algorithm is None:
        return None
    if algorithm == "EAGLE" and draft_path is not None and draft_path == model_path:
        return Drafting("MTP")
    if algorithm == "NGRAM":
        return Drafting("NGRAM", draft_cost_scale=0.0)
    if algorithm == "STANDALONE":
        return Drafting("STANDALONE", standalone_cost_scale(draft_config or {}, target_config or {}))
    return Drafting(algorithm)


def _width(config: Mapping[str, Any]) -> tuple[int, int]:
    text = config.get("text_config")
    source = text if isinstance(text, Mapping) else config
    return int(source.get("num_hidden_layers") or 1), int(source.get("hidden_size") or 0)


def standalone_cost_scale(draft_config: Mapping[str, Any], target_config: Mapping[str, Any]) -> float:
    """A STANDALONE draft forward's cost over a one-layer drafter at the target's width: the weights it
    reads, ``layers x hidden^2``, over ``target_hidden^2`` (1 when either width is unknown)."""
    layers, hidden = _width(draft_config)
    _, target_hidden = _width(target_config)
    if not hidden or not target_hidden:
        return 1.0
    return layers * hidden**2 / target_hidden**2


def prompt_repetition(tokens: Sequence[Any], match: int = NGRAM_MATCH) -> float:
    """How often an n-gram cache drafts the prompt's next token right: over every position whose
    preceding ``match`` tokens occurred before, the share where the token that followed them last time
    is the next one (0 for a prompt shorter than ``match + 1`` tokens or without any repeat)."""
    last_next: dict[tuple[Any, ...], Any] = {}
    hits = 0
    for i in range(match, len(tokens)):
        key = tuple(tokens[i - match : i])
        if key in last_next and last_next[key] == tokens[i]:
            hits += 1
        last_next[key] = tokens[i]
    positions = len(tokens) - match
    return hits / positions if positions > 0 else 0.0


def ngram_depth_candidates(num_draft_tokens: int, breadth: int) -> tuple[int, ...]:
    """Nodes per depth of SGLang's n-gram BFS tree: ``num_draft_tokens - 1`` nodes, at most ``breadth``
    per depth, filled from the root down."""
    nodes = max(num_draft_tokens - 1, 0)
    depth = math.ceil(nodes / max(breadth, 1)) if nodes else 0
    counts = []
    for _ in range(depth):
        take = min(breadth, nodes)
        counts.append(take)
        nodes -= take
    return tuple(counts)


def ngram_depth_probs(
    repetition: float, num_draft_tokens: int, breadth: int, sibling_gain: float
) -> tuple[float, ...]:
    """Chance each depth of the n-gram tree is accepted given the one before was: the repetition rate,
    ``NGRAM_DEPTH_KEEP`` less per depth, with more candidates at a depth catching more (``sibling_gain``
    as the profile's ``topk_gain``)."""
    return tuple(
        1.0 - (1.0 - repetition * NGRAM_DEPTH_KEEP**d) ** (1.0 + sibling_gain * (count - 1))
        for d, count in enumerate(ngram_depth_candidates(num_draft_tokens, breadth))
    )
