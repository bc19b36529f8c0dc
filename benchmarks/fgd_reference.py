"""Benchmark: the FGD paper's policy as its simulator runs it, on kubegpu's arrivals, beside the paper's figures.

Not kubegpu: a small stand-alone model of the scheduler the FGD paper (USENIX ATC'23) measured with
(`hkust-adsl/kubernetes-scheduler-simulator`, read to learn its rules, not copied), replaying the same arrivals as
`benchmarks/sharing_bench.py` (`kubegpu.scheduler.traces.experiment_order`: the same seeds, the same pods in the same
order). It tells what the paper's own policy reaches in kubegpu's experiment, so that kubegpu's figure is compared
with the policy, not with the paper's random stream of arrivals. Its rules, as the simulator has them:

* a node fits a pod where its free cpu and memory hold the pod's, its GPU model is one the pod may use and it has a
  GPU with the share's thousandths free (a share) or enough untouched GPUs (whole GPUs);
* the "typical pods" are the trace's commonest kinds (cpu, thousandths, GPUs, models), cpu-only pods included, added
  ten at a time until they make 95 % of the pods; a node's fragmentation is, over the kinds by frequency, all of its
  free GPU capacity for a kind that asks no GPU, may not use its model, or does not fit its cpu or GPUs, else its GPUs
  with less free than the kind asks;
* a node scores int(100 x sigmoid(d)), d the GPUs of fragmentation the pod's placement removes (negative: adds); a
  share goes to the GPU of the best score, the first GPU on a tie; whole GPUs to the first untouched ones;
* every node is scored and the best score wins, the first node by name on a tie (its vendored kube-scheduler's
  `selectHost`; upstream picks at random among ties).

`--ties random`, `--quantize exact`, `--gpu-choice exact`, `--threshold 100`, `--cpu-pods off`, `--memory off`,
`--mix learned` (the typical pods of the pods placed so far, made again as often as kubegpu's learned mix moves) and
`--policy bestfit` (the simulator's BestFit: (1 - (cpu left / 128 cores + GPUs left / 8) / 2) x 100, normalized
over the feasible nodes, the tightest GPU) vary one rule each.

    .venv/bin/python benchmarks/fgd_reference.py [--seeds 42 43 ...] [--policy fgd|bestfit] [--ties name|random]
        [--traces default share-30 ... | all]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import openb_family as family
from sharing_bench import trace_pods

from kubegpu.scheduler.traces import TraceNode, TracePod, experiment_order, read_nodes, read_pods

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
PAPER = {"fgd": 95.2, "bestfit": 92.9}
WHOLE = 1000

Kind = tuple[int, int, int, tuple[str, ...]]  # cpu, thousandths of each GPU (0: none), GPUs, models


def kind_of(pod: TracePod) -> Kind:
    return (pod.cpu_milli, pod.milli if pod.gpus else 0, pod.gpus, pod.models)


def typical(pods: Sequence[TracePod], threshold: float, cpu_pods: bool) -> list[tuple[Kind, float]]:
    """The commonest kinds, ten at a time, until they make `threshold` % of the pods; frequencies over those kept."""
    counts = Counter(kind_of(p) for p in pods if cpu_pods or p.gpus)
    ordered = sorted(counts.items(), key=lambda kc: (kc[1], kc[0]), reverse=True)
    total = sum(counts.values())
    kept, covered = 0, 0
    while covered * 100 < threshold * total and kept < len(ordered):
        covered += sum(c for _, c in ordered[kept : kept + 10])
        kept += 10
    return [(k, c / covered) for k, c in ordered[:kept]]


class Fragmentation:
    """A node's fragmentation against the typical pods, remembered by (cpu free, GPUs free sorted, model)."""

    def __init__(self, kinds: list[tuple[Kind, float]]) -> None:
        self.kinds = kinds
        self.known: dict[tuple[int, tuple[int, ...], str], float] = {}

    def __call__(self, cpu: int, free: Sequence[int], model: str) -> float:
        key = (cpu, tuple(sorted(free)), model)
        known = self.known.get(key)
        if known is None:
            known = self.known[key] = self._measure(cpu, free, model)
        return known

    def _measure(self, cpu: int, free: Sequence[int], model: str) -> float:
        total = sum(free)
        lost = 0.0
        for (need, milli, gpus, models), p in self.kinds:
            if not milli or (models and model not in models):
                lost += p * total
            elif cpu >= need and sum(1 for f in free if f >= milli) >= gpus:
                lost += p * sum(f for f in free if f < milli)
            else:
                lost += p * total
        return lost


def replay(nodes: list[TraceNode], pods: list[TracePod], seed: int, args: argparse.Namespace) -> float:
    """GPU capacity allocated (%) at arrived 100 %, the paper's accounting."""
    learned = args.mix == "learned"
    placed: list[TracePod] = []
    measure = Fragmentation([] if learned else typical(pods, args.threshold, args.cpu_pods == "on"))
    since = 0
    capacity = sum(n.gpus for n in nodes) * WHOLE
    state = [[n.cpu_milli, n.memory_mib, [WHOLE] * n.gpus] for n in nodes]
    by_name = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    rng = random.Random(seed)
    arrived = allocated = 0
    at_full: list[float] = []

    def score(d: float) -> float:
        return d if args.quantize == "exact" else int(100 / (1 + math.exp(-d / WHOLE)))

    for pod in experiment_order(pods, capacity, 1.3, seed):
        candidates: list[tuple[float, int, tuple[int, ...]]] = []
        for i in by_name:
            cpu, memory, free = state[i]
            model = nodes[i].model
            if cpu < pod.cpu_milli or (args.memory == "on" and memory < pod.memory_mib):
                continue
            if pod.gpus and pod.models and model not in pod.models:
                continue
            if pod.gpus == 1 and pod.milli < WHOLE:
                options = [g for g, f in enumerate(free) if f >= pod.milli]
                if not options:
                    continue
                if args.policy == "bestfit":
                    gpu = min(options, key=lambda g: (free[g], g))
                    candidates.append((bestfit(cpu - pod.cpu_milli, sum(free) - pod.milli), i, (gpu,)))
                    continue
                before = measure(cpu, free, model)
                best: tuple[float, int] | None = None
                for g in options:
                    after = list(free)
                    after[g] -= pod.milli
                    d = before - measure(cpu - pod.cpu_milli, after, model)
                    rank = score(d) if args.gpu_choice == "quantized" else d
                    if best is None or rank > best[0]:
                        best = (rank, g)
                assert best is not None
                s = best[0] if args.gpu_choice == "quantized" else score(best[0])
                candidates.append((s, i, (best[1],)))
                continue
            untouched = [g for g, f in enumerate(free) if f == WHOLE]
            if len(untouched) < pod.gpus:
                continue
            chosen = tuple(untouched[: pod.gpus])
            if args.policy == "bestfit":
                candidates.append((bestfit(cpu - pod.cpu_milli, sum(free) - pod.gpu_milli), i, chosen))
                continue
            after = [0 if g in chosen else f for g, f in enumerate(free)]
            d = measure(cpu, free, model) - measure(cpu - pod.cpu_milli, after, model)
            candidates.append((score(d), i, chosen))
        arrived += pod.gpu_milli
        if candidates:
            if args.policy == "bestfit":  # the simulator normalizes BestFit's scores over the feasible nodes
                high, low = max(c[0] for c in candidates), min(c[0] for c in candidates)
                candidates = [((c[0] - low) * 100 // (high - low) if high > low else 0, c[1], c[2]) for c in candidates]
            top = max(c[0] for c in candidates)
            tied = [c for c in candidates if c[0] == top]  # in node-name order
            _, i, gpus = rng.choice(tied) if args.ties == "random" else tied[0]
            state[i][0] -= pod.cpu_milli
            state[i][1] -= pod.memory_mib
            for g in gpus:
                state[i][2][g] -= pod.milli
            allocated += pod.gpu_milli
            if learned:  # as kubegpu's learned mix moves: with the first pod, then every 64 or eighth of those placed
                placed.append(pod)
                since += 1
                if len(placed) == 1 or since >= max(64, len(placed) / 8):
                    since = 0
                    measure = Fragmentation(typical(placed, args.threshold, args.cpu_pods == "on"))
        if round(100 * arrived / capacity) == 100:
            at_full.append(100 * allocated / capacity)
        elif arrived > capacity * 1.01:
            break
    return sum(at_full) / len(at_full)


def bestfit(cpu_left: int, gpu_left: int) -> int:
    return int((1 - (cpu_left / 128000 + gpu_left / 8000) / 2) * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--policy", choices=["fgd", "bestfit"], default="fgd")
    parser.add_argument("--ties", choices=["name", "random"], default="name")
    parser.add_argument("--quantize", choices=["sigmoid", "exact"], default="sigmoid")
    parser.add_argument("--gpu-choice", choices=["quantized", "exact"], default="quantized")
    parser.add_argument("--threshold", type=float, default=95.0)
    parser.add_argument(
        "--mix",
        choices=["trace", "learned"],
        default="trace",
        help="typical pods of the whole trace, or of those placed",
    )
    parser.add_argument("--cpu-pods", choices=["on", "off"], default="on")
    parser.add_argument("--memory", choices=["on", "off"], default="on")
    parser.add_argument(
        "--traces", nargs="+", default=["default"], help="the default trace and generated ones, as sharing_bench's"
    )
    args = parser.parse_args()
    nodes = read_nodes(args.trace / family.NODE_FILE)
    default = read_pods(args.trace / family.POD_FILE)
    names = list(family.VARIANTS) if args.traces == ["all"] else args.traces
    generated = family.family(args.trace, 7) if any(n != "default" for n in names) else {}
    for name in names:
        pods = default if name == "default" else trace_pods(generated[name])
        started = time.process_time()
        figures = [replay(nodes, pods, seed, args) for seed in args.seeds]
        mean = sum(figures) / len(figures)
        each = " ".join(f"{f:.2f}" for f in figures)
        paper = f"; the paper {PAPER[args.policy]} %" if name == "default" else ""
        print(f"{name}: reference {args.policy}: {mean:.2f} % at 100 % arrived ({each}){paper}; "
              f"{time.process_time() - started:.0f} s CPU", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
