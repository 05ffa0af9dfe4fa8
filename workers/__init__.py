"""What runs on the nodes, in four wings around one contract.

- ``job``: the contract with the harness: what a node worker is handed (``JobSpec``, ``LoadPlan``,
  ``LoadLevel``) and what it hands back (``AttemptResult``).
- ``node``: the node worker (Ray actor), the server launcher, preflight, the attempt's jobs row.
- ``convert``: drafter checkpoints into the layout SGLang loads, with every check, and the node cache.
- ``load``: the load generator and everything it parses (SSE, SGLang streams, socket stamps, workloads).
- ``sim``: the simulated SGLang server (demo and tests).
- ``sglang``: everything the project knows about SGLang.

``node`` may import every other wing; ``convert``, ``load`` and ``sim`` never import ``node`` or each
other's internals; all may import ``job``, ``sglang``, ``analysis`` and ``specsweep``.
"""
