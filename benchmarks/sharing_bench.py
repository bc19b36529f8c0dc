"""Benchmark: GPU sharing on the FGD paper's workload, kubegpu's figures beside the paper's.

Replays Alibaba's `openb` trace (`../shared/traces/openb/`, see its README) as the FGD paper (USENIX ATC'23) does:
every trace pod arrives once in a random order per seed, the workload inflated to 130 % of the cluster's GPU
capacity with copies of randomly drawn trace pods, each pod scheduled at once or failed for good, nobody leaves.
The figure is the share of GPU capacity allocated when the arrived pods have asked for 100 % of it (the mean over
the pods whose arrived share rounds to 100 %).

Pods and nodes go through the real engine as `kubegpu simulate --trace-nodes ... --trace-pods ...` takes them
(`kubegpu.scheduler.traces` reads the CSV files and writes the manifests):

* nodes advertise as HAMi's device plugin does: `nvidia.com/gpu` = GPUs x 10 (HAMi's default split count),
  `nvidia.com/gpucores` and `nvidia.com/gpumem-percentage` = 100 x GPUs, GFD's `nvidia.com/gpu.count` and
  `nvidia.com/gpu.product`, the trace's cpu and memory;
* a pod asking a fraction of one GPU asks `nvidia.com/gpu: 1` with `gpucores` and `gpumem-percentage` of that
  fraction; other GPU pods `nvidia.com/gpu: N`; a GPU model constraint (`A|B`) is a required node affinity on
  `nvidia.com/gpu.product`; cpu and memory are requested as the trace says.

Variants: `whole` (today's kubegpu: every GPU pod takes whole GPUs on nodes that do not share), `bestfit` and `fgd`
(`KUBEGPU_NVIDIA_SHARE_POLICY`), each under the engine's binpack policy and default score profile (with
`KubegpuFragmentation`: cpu-only pods keep off the cpu that free GPUs need); `--devices-only` scores by
KubegpuDevices and KubegpuFragmentation alone, as the paper scores by one policy. `KUBEGPU_BENCH_BREAKDOWN=1`
prints where capacity is lost: the allocation curve, idle GPU capacity by node cpu left, and the commonest refusals.

    .venv/bin/python benchmarks/sharing_bench.py [--seeds 42 43 ...] [--variants whole bestfit fgd]
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.traces import (
    TraceNode,
    TracePod,
    experiment_order,
    node_document,
    pod_document,
    read_nodes,
    read_pods,
)

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
PAPER = {"fgd": 95.2, "bestfit": 92.9, "gpupacking": 91.8, "random": 86.3}
INFLATION = 1.3
BREAKDOWN = bool(os.environ.get("KUBEGPU_BENCH_BREAKDOWN"))  # where capacity is lost, printed per replay


def read_trace(folder: Path) -> tuple[list[TraceNode], list[TracePod]]:
    return read_nodes(folder / "openb_node_list_gpu_node.csv"), read_pods(folder / "openb_pod_list_default.csv")


def arrivals(pods: list[TracePod], capacity: int, seed: int) -> list[TracePod]:
    """The trace in the seed's order, inflated with random copies to 130 % of the GPU capacity."""
    return experiment_order(pods, capacity, INFLATION, seed)


def replay(
    nodes: list[TraceNode], pods: list[TracePod], seed: int, variant: str, sample: int, devices_only: bool
) -> tuple[float, float, int]:
    """(GPU allocated % at arrived 100 %, seconds, pods scheduled)."""
    share = variant != "whole"
    if share:
        os.environ[nvidia.POLICY_ENV] = variant
    default = scores.Profile.default("binpack")
    profile = None
    if devices_only:
        profile = scores.Profile({p: default.weight(p) for p in (scores.DEVICES, scores.FRAGMENTATION)})
    try:
        engine = Engine(
            make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False),
            sample=sample,
            scoring=profile,
        )
        for node in nodes:
            engine.add_node(node_info(node_document(node, share=share)))
    finally:
        os.environ.pop(nvidia.POLICY_ENV, None)
    capacity = sum(n.gpus for n in nodes) * 1000
    arrived = allocated = scheduled = 0
    at_full: list[float] = []
    failures: Counter[tuple[int, bool, str]] = Counter()
    curve: dict[int, float] = {}
    started = time.perf_counter()
    for i, pod in enumerate(arrivals(pods, capacity, seed)):
        arrived += pod.gpu_milli
        decision = engine.schedule(pod_request(pod_document(pod, f"p{i}", share=share))[0])
        if decision.scheduled:
            allocated += pod.gpu_milli
            scheduled += 1
        elif BREAKDOWN and arrived > 0.9 * capacity:
            failures[(pod.gpus, pod.milli < 1000, (decision.reason or "")[:140])] += 1
        percent = round(100 * arrived / capacity)
        if BREAKDOWN and percent in (70, 80, 85, 90, 95) and percent not in curve:
            curve[percent] = round(100 * allocated / capacity, 2)
        if round(100 * arrived / capacity) == 100:
            at_full.append(100 * allocated / capacity)
        elif arrived > capacity * 1.01:
            break
    seconds = time.perf_counter() - started
    if BREAKDOWN:
        idle = Counter()
        for name in engine.node_names():
            record = engine.nodes[name]
            state = record.states.get("nvidia")
            if state is None:
                continue
            cpu = record.free("cpu")
            for f in state.free_millis():
                band = "cpu<4" if cpu < 4000 else "cpu<12" if cpu < 12000 else "cpu>=12"
                idle[("whole" if f >= 1000 else "partial", band)] += f
        print(f"  curve {curve}")
        print(f"  seed {seed} {variant}: idle GPU milli by kind and node cpu free (cores):")
        for key, value in sorted(idle.items()):
            print(f"    {key}: {value / 1000:.0f} GPUs")
        for key, count in failures.most_common(8):
            print(f"    failed {count}: {key}")
    return (sum(at_full) / len(at_full) if at_full else float("nan")), seconds, scheduled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(42, 52)))
    parser.add_argument("--variants", nargs="+", default=["whole", "bestfit", "fgd"])
    parser.add_argument(
        "--devices-only", action="store_true", help="score by the device plugins' scores alone (the paper's setting)"
    )
    parser.add_argument("--sample", type=int, default=8, help="feasible nodes scored per pod (the engine's default: 8)")
    args = parser.parse_args()
    nodes, pods = read_trace(args.trace)
    scoring = "plugin score only" if args.devices_only else "default score profile"
    print(f"{len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs, {len(pods)} pods; seeds {args.seeds}")
    print(f"engine: binpack, sample {args.sample}, {scoring}")
    print(f"{'variant':10} {'kubegpu %':>10} {'paper %':>8} {'seconds':>8}")
    for variant in args.variants:
        figures = [replay(nodes, pods, seed, variant, args.sample, args.devices_only) for seed in args.seeds]
        mean = sum(f[0] for f in figures) / len(figures)
        seconds = sum(f[1] for f in figures)
        paper = PAPER.get(variant)
        print(f"{variant:10} {mean:10.1f} {paper if paper else '':>8} {seconds:8.0f}", flush=True)
    print(f"{'random':10} {'':>10} {PAPER['random']:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
