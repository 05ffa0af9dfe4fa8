"""The simulated SGLang 0.5.23 server: ``python -m workers.sim <SGLang's launch arguments>``.

``launch`` resolves the command as SGLang would, ``server`` is the HTTP app, ``responses`` shapes the
OpenAI bodies, ``engine`` is the continuous-batching scheduler running ``model`` (costs and acceptance)
in real time, ``settings`` reads the simulator's knobs from the environment, ``faults`` fails like
SGLang, ``metrics`` renders ``/metrics``, ``tokenizer`` writes a tokenizer for its word vocabulary. It
imports only ``workers.sglang`` and ``specsweep``, never ``workers.node``.
"""
