"""Score a seeded random sample of each module's mutants (``make mutation-sample``).

A full ``mutmut run`` of every module in ``[tool.mutmut] only_mutate`` takes hours on a small machine, so
this generates the mutants, draws ``--per-module`` of each module's names with a fixed seed (the same
names on every run of the same source), runs only those (``mutmut run <names>``) and prints per module:
killed of sampled, the score, and the one-sided 95% Clopper-Pearson lower bound of the module's whole
score. Mutants judged equivalent (``--equivalent``: one name a line, ``#`` starts a comment; the reasons
are in docs/testing.md) leave the denominator, so the score is of non-equivalent mutants.

Run from the repository root (mutmut writes ``mutants/`` there):

    .venv/bin/python tests/mutation_sample.py --per-module 30 --seed 32 harness/search/model.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

DETECTED = {"killed", "timeout", "caught by type check", "segfault"}


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed exactly (n is a sample size, a few dozen)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def lower_bound(killed: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower bound: the smallest score p under which seeing ``killed`` or more
    kills of ``n`` still has probability ``1 - confidence`` (bisection on the binomial tail)."""
    if killed == 0:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(60):
        p = (low + high) / 2
        # P(X >= killed) = 1 - P(X <= killed - 1) rises with p.
        if 1 - binomial_cdf(killed - 1, n, p) < 1 - confidence:
            low = p
        else:
            high = p
    return low


def mutmut_module(path: str) -> str:
    """The dotted prefix mutmut gives a file's mutant names (``harness/emit.py`` -> ``harness.emit.``)."""
    return path.removesuffix(".py").replace("/", ".") + "."


def generate(modules: list[str]) -> dict[str, list[str]]:
    """Generate every module's mutants the way ``mutmut run`` does (it finds them already made) and read
    their names from mutmut's ``.meta`` files."""
    from mutmut.__main__ import create_mutants
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    Path("mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    create_mutants(os.cpu_count() or 1)
    names: dict[str, list[str]] = {}
    for module in modules:
        meta = json.loads(Path("mutants", module + ".meta").read_text())
        names[module] = sorted(meta["exit_code_by_key"])
    return names


def statuses(module: str) -> dict[str, str]:
    """Each of the module's mutants with mutmut's word for its last result."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads(Path("mutants", module + ".meta").read_text())
    return {name: status_by_exit_code[code] for name, code in meta["exit_code_by_key"].items()}


def read_equivalent(path: Path | None) -> set[str]:
    if path is None:
        return set()
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def main() -> None:
    from mutmut.configuration import config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="files to sample (default: every only_mutate entry)")
    parser.add_argument("--per-module", type=int, default=30)
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--equivalent", type=Path, help="mutant names judged equivalent, one a line")
    parser.add_argument("--no-run", action="store_true", help="print the sample's scores from the last run")
    args = parser.parse_args()
    modules = args.modules or [str(path) for path in config().only_mutate]
    names = generate(modules)
    sample: dict[str, list[str]] = {}
    for module in modules:
        # One generator per module, seeded with the module's path: adding a module keeps the others' sample.
        rng = random.Random(f"{args.seed}:{module}")
        sample[module] = sorted(rng.sample(names[module], min(args.per_module, len(names[module]))))
    if not args.no_run:
        chosen = [name for module in modules for name in sample[module]]
        command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children), *chosen]
        subprocess.run(command, check=False)
    equivalent = read_equivalent(args.equivalent)
    print(
        f"{'module':42} {'mutants':>7} {'sampled':>7} {'equiv':>5} {'killed':>6} {'score':>6} {'95% low':>7}"
    )
    for module in modules:
        status = statuses(module)
        counted = [name for name in sample[module] if name not in equivalent]
        killed = sum(status[name] in DETECTED for name in counted)
        score = killed / len(counted) if counted else float("nan")
        low = lower_bound(killed, len(counted)) if counted else float("nan")
        print(
            f"{module:42} {len(names[module]):7} {len(sample[module]):7} {len(sample[module]) - len(counted):5}"
            f" {killed:6} {score:6.1%} {low:7.1%}"
        )
        for name in counted:
            if status[name] not in DETECTED:
                print(f"    {status[name]}: {name}")


if __name__ == "__main__":
    main()
