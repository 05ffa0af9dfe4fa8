"""Run every benchmark script in bench/ in turn (``make bench``; ``python -m bench NAME`` for one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).parent
SKIP = {"__init__.py", "__main__.py", "common.py"}


def main(argv: list[str]) -> int:
    scripts = sorted(p for p in BENCH_DIR.glob("*.py") if p.name not in SKIP)
    if argv:
        scripts = [p for p in scripts if p.stem in argv]
    failed = []
    for script in scripts:
        print(f"# bench/{script.name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", f"bench.{script.stem}"], cwd=BENCH_DIR.parent)
        if proc.returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"# failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
