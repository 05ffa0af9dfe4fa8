"""Everything the project knows about SGLang 0.5.23, in one place.

- ``flags``: the launch-server flag table (generated from SGLang's parser) and an argparse-faithful parser.
- ``rules``: SGLang's speculative resolution re-implemented, plus the project's stricter rules.
- ``resolver``: the bridge that runs SGLang's own parser and resolver in SGLang's interpreter.
- ``validate``: both layers combined into one report per launch command (and a batch API).
- ``api``: HTTP endpoint paths, response fields and metric names.
- ``drafts``: what the EAGLE3 draft loaders read, and the first SGLang version that loads each feature.
"""

from workers.sglang.api import SGLANG_VERSION
from workers.sglang.flags import ArgvError, LaunchArgs, flag_table, parse_launch_args
from workers.sglang.resolver import SGLangResolver, default_sglang_python
from workers.sglang.rules import Finding, Resolution, SpecParams, builtin_resolve
from workers.sglang.validate import ValidationReport, validate, validate_many

__all__ = [
    "SGLANG_VERSION",
    "ArgvError",
    "Finding",
    "LaunchArgs",
    "Resolution",
    "SGLangResolver",
    "SpecParams",
    "ValidationReport",
    "builtin_resolve",
    "default_sglang_python",
    "flag_table",
    "parse_launch_args",
    "validate",
    "validate_many",
]
