"""The terms specsweep's output uses, defined once: the report's glossary and docs/results.md's "Terms"
(a test keeps the doc equal to this table)."""

from __future__ import annotations

GLOSSARY: dict[str, str] = {
    "baseline": "the same server without speculative decoding; speedups are over it",
    "speedup": "a config's objective over the baseline's at the same level (throughput: higher is better)",
    "CI": "confidence interval from a bootstrap: requests resampled within each launch, launches resampled "
    "with replacement, so launch-to-launch noise widens it",
    "tie / not distinguishable": "the interval of the difference to the winner holds 0: the data cannot "
    "tell the two apart",
    "MAD": "median absolute deviation of the objective over repeats (launches): how much a launch varies",
    "accept length": "tokens emitted per verify step (1 = every draft rejected); higher means the drafter "
    "guesses better",
    "TTFT / TPOT": "time to first token / time per output token after the first (ms)",
    "goodput": "requests per second that succeeded within the per-request SLOs",
    "mix score": "a config's objective at each level as a fraction of that level's winner, averaged with "
    "the spec's deploy_weights (1 = wins every level)",
    "MRR": "--max-running-requests: how many requests the server batches at most",
    "slot": "the GPUs one server runs on (gpus_per_server of a node)",
    "leased": "a job taken from the queue by a node worker, which must renew its lease or the job is "
    "retried elsewhere",
    "client-added delay": "the load generator's own delay between a chunk leaving a loopback server and its "
    "time stamp (calibrated before the sweep): the floor under every latency measured",
    "Pareto front": "the config x level points no other point beats in both per-user and per-GPU tokens/s",
    "capacity": "the highest load at which a config still met the capacity SLO",
    "noise floor": "with lossless_check: the share of check prompts whose greedy output ids differ between "
    "the baseline sent one prompt at a time and all at once: the divergence the hardware alone causes",
    "LOSSY": "a config whose greedy outputs differ from the baseline's more often than the noise floor, or "
    "with an accept threshold below 1.0; ranked as measured, never emitted without --allow-lossy",
}


def glossary_markdown() -> str:
    """The terms as the Markdown list docs/results.md holds under "Terms"."""
    return "".join(f"- **{term}**: {text}.\n" for term, text in GLOSSARY.items())
