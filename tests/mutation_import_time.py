"""Score mutants of code that runs at import (``analysis.metrics`` builds METRICS when imported).

mutmut switches a mutant on inside a process that has already imported the project, so a mutant of a
function that only runs at import never takes effect there and is reported as surviving whatever the
tests do. This runs each named mutant in a fresh fork that imports the project anew with the mutant on.
From ``mutants/`` after a ``mutmut run`` generated them:

    mutmut results --all true | awk '{print $1}' | tr -d : | grep 'x__latency_metrics\\|x__itl_metrics' \
        | (cd mutants && ../.venv/bin/python ../tests/mutation_import_time.py \
        tests/analysis/test_metrics.py::test_every_latency_metric_is_numpys_statistic_of_successful_requests_when_five_rows)
"""

from __future__ import annotations

import contextlib
import os
import sys

import duckdb  # noqa: F401  third-party modules load once; the project is imported in each fork
import numpy  # noqa: F401
import pyarrow  # noqa: F401
import pytest


def main() -> None:
    sys.path.insert(0, os.getcwd())
    tests = sys.argv[1:]
    for name in sys.stdin.read().split():
        pid = os.fork()
        if pid == 0:
            os.environ["MUTANT_UNDER_TEST"] = name
            with (
                open(os.devnull, "w") as sink,
                contextlib.redirect_stdout(sink),
                contextlib.redirect_stderr(sink),
            ):
                code = pytest.main(["-p", "no:cacheprovider", "-q", "-x", *tests])
            os._exit(int(code))
        _, status = os.waitpid(pid, 0)
        print(name, "killed" if os.waitstatus_to_exitcode(status) != 0 else "survived", flush=True)


if __name__ == "__main__":
    main()
