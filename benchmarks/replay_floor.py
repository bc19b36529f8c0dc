"""Benchmark: how much of the trace replay's time is the search for each pod's node, and what the rest costs.

The goal is the FGD experiment's replay (`kubegpu simulate --trace-nodes ... --trace-pods ... --json`, the default
`openb` trace, 10,772 arrivals at seed 42) at 4,000 pods/s, the whole process. This runs that command three ways in
turn, each a process of its own, and prints each one's CPU:

* `as shipped`: the command itself;
* `search recorded`: the same, noting each pod's decision (the node, or the refusal) as the cycle returns it;
* `search given`: every cycle answered from that record (`Cycle._decide` replaced), so nothing is filtered, sampled
  or ranked; everything else runs as shipped: reading the trace, the requests, each placement's Reserve (the plugins'
  allocate, the signed annotation, the node's books), the allocation curve and the report.

The three reports must be equal byte for byte (the given decisions place every pod on the same devices); the
benchmark says so or stops. `search given` is the floor any search leaves: what is left of the goal's budget (10,772
arrivals / 4,000 pods/s) after it is what the search may cost, per pod.

    .venv/bin/python benchmarks/replay_floor.py [--rounds 2] [--seed 42] [--traces DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GOAL_PODS_PER_SECOND = 4000
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"


def child(mode: str, record: str, argv: list[str]) -> None:
    """Run `kubegpu` with `argv` in this process, recording (`record`) or answering (`given`) every cycle."""
    from kubegpu import cli
    from kubegpu.scheduler.engine import cycle
    from kubegpu.scheduler.engine.records import Decision

    shipped = cycle.Cycle._decide
    if mode == "record":
        seen: dict[str, Any] = {}

        def recording(self: Any, pod: Any, *, explain: bool = True) -> Any:
            chosen = shipped(self, pod, explain=explain)
            seen[pod.key] = chosen if isinstance(chosen, Decision) else chosen[0].name
            return chosen

        cycle.Cycle._decide = recording  # type: ignore[method-assign]
    else:
        with open(record, "rb") as f:
            known = pickle.load(f)

        def given(self: Any, pod: Any, *, explain: bool = True) -> Any:
            chosen = known[pod.key]
            return chosen if isinstance(chosen, Decision) else (self.nodes[chosen], self.plan(pod))

        cycle.Cycle._decide = given  # type: ignore[method-assign]
    sys.argv = ["kubegpu", *argv]
    try:
        cli.main()
    finally:
        if mode == "record":
            with open(record, "wb") as f:
                pickle.dump(seen, f)


def run(argv: list[str], mode: str | None, record: str) -> tuple[float, str]:
    """(CPU seconds, md5 of the report) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    prefix = (
        [sys.executable, "-m", "kubegpu.cli"] if mode is None else [sys.executable, __file__, "--child", mode, record]
    )
    out = subprocess.run([*prefix, *argv], check=True, capture_output=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, hashlib.md5(out).hexdigest()[:8]


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    args = parser.parse_args()
    argv = [
        "simulate",
        "--trace-nodes", str(args.traces / "openb_node_list_gpu_node.csv"),
        "--trace-pods", str(args.traces / "openb_pod_list_default.csv"),
        "--inflate", "1.3", "--seed", str(args.seed), "--json",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        record = str(Path(scratch) / "decisions.pickle")
        _, recorded = run(argv, "record", record)
        with open(record, "rb") as f:
            arrivals = len(pickle.load(f))
        times: dict[str, list[float]] = {"as shipped": [], "search given": []}
        for round_ in range(args.rounds):  # taking turns, so the machine's load falls on both alike
            shipped, ours = run(argv, None, record)
            given, theirs = run(argv, "given", record)
            if not ours == theirs == recorded:
                sys.exit(f"round {round_ + 1}: the reports differ (md5 {ours}, {theirs}, recorded {recorded})")
            times["as shipped"].append(shipped)
            times["search given"].append(given)
            print(f"round {round_ + 1}: as shipped {shipped:5.2f} s, search given {given:5.2f} s of CPU (md5 {ours})")
    shipped, given = min(times["as shipped"]), min(times["search given"])
    budget = arrivals / GOAL_PODS_PER_SECOND
    print(f"{arrivals} arrivals, best of {args.rounds} rounds, CPU of the whole process:")
    print(f"  as shipped          {shipped:5.2f} s  {arrivals / shipped:6.0f} pods/s")
    print(f"  search given        {given:5.2f} s  {arrivals / given:6.0f} pods/s  (the floor any search leaves)")
    print(f"  the search          {shipped - given:5.2f} s  {1e6 * (shipped - given) / arrivals:6.0f} us a pod")
    print(
        f"  goal {GOAL_PODS_PER_SECOND} pods/s: {budget:.2f} s in all, so the search may cost "
        f"{max(0.0, budget - given):.2f} s ({1e6 * max(0.0, budget - given) / arrivals:.0f} us a pod), "
        f"{(shipped - given) / max(1e-9, budget - given):.1f}x less than now"
    )


if __name__ == "__main__":
    main()
