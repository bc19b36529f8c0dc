#!/usr/bin/env python3
"""Print how many of kube-scheduler 1.20's transcribed test rows kubegpu holds, per plugin, as the Markdown table
docs/framework.md shows: runs tests/scheduler/upstream (a few seconds, no cluster) and keeps its report's lines
(tests/scheduler/upstream/conftest.py makes them). Exit status: pytest's.

    .venv/bin/python scripts/upstream_report.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    env = {**os.environ, "KUBEGPU_UPSTREAM_REPORT": "markdown"}
    command = [sys.executable, "-m", "pytest", "tests/scheduler/upstream", "-q", "-p", "no:cacheprovider", "-rN"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in run.stdout.splitlines() if line.startswith("|")]
    print("\n".join(lines) if lines else run.stdout[-4000:])
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
