"""specsweep: find the fastest speculative-decoding configuration for an SGLang server.

Code lives in three layers that import downwards only: ``harness`` (spec, plan, queue, driver, CLI)
-> ``workers`` (node actor, launcher, converter, load generator, simulated server) -> ``analysis``
(Parquet schema, DuckDB views, selection, report). This package holds what all of them share.
"""

__version__ = "0.1.0"
