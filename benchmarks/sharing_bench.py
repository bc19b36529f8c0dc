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

Variants: `whole` (kubegpu before sharing: every GPU pod takes whole GPUs on nodes that do not share), `bestfit` and
`fgd` (the profile's KubegpuDevices `sharePolicy`), each under the engine's binpack policy (`--policy spread`: the
other) and default score profile (with `KubegpuFragmentation`: cpu-only pods keep off the cpu that free GPUs need), each
scoring kube-scheduler's adaptive count of feasible nodes and every node (`percentageOfNodesToScore: 100`, as the
paper's simulator does), side by side with the paper's figure and the replay's pods/s (whole process: documents to
decisions). `--traces` adds generated traces of the same shape (`openb_family.py`: the share of GPU-sharing pods, of
multi-GPU pods and of model-constrained pods varied); `--mix trace` measures fragmentation against the trace's own GPU
pods by kind (KubegpuFragmentation's `mix` argument: a mix known in advance, as the paper's is) instead of learning it,
`--mix paper` against the paper's typical pods (cpu-only pods too, the commonest kinds making 95 %); `--devices-only`
scores by KubegpuDevices and KubegpuFragmentation alone, as the paper scores by one policy. `KUBEGPU_BENCH_BREAKDOWN=1`
prints where capacity is lost: the allocation curve, idle GPU capacity by node cpu left, and the commonest refusals.

    .venv/bin/python benchmarks/sharing_bench.py [--seeds 42 43 ...] [--variants whole bestfit fgd]
        [--percentages 0 100] [--traces default share-30 ... | all] [--mix learned|trace] [--devices-only]
        [--fragmentation-weight 5] [--fragmentation-span 23.1] [--fragmentation-lead on off] [--policy spread]
        [--model-access on off]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections import Counter
from pathlib import Path

import openb_family as family

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Engine, kubescores
from kubegpu.scheduler.simulate import young_collections_only
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


def trace_pods(rows: list[dict[str, str]]) -> list[TracePod]:
    """Pods from rows in the trace's format (`openb_family`'s, read and bounded as `read_pods` reads a file)."""
    return [
        TracePod(
            r["name"],
            int(r["cpu_milli"]),
            int(r["memory_mib"]),
            int(r["num_gpu"]),
            int(r["gpu_milli"]) if int(r["num_gpu"]) else 0,
            tuple(m for m in r["gpu_spec"].split("|") if m),
        )
        for r in rows
    ]


def read_trace(folder: Path) -> tuple[list[TraceNode], list[TracePod]]:
    return read_nodes(folder / family.NODE_FILE), read_pods(folder / family.POD_FILE)


def arrivals(pods: list[TracePod], capacity: int, seed: int) -> list[TracePod]:
    """The trace in the seed's order, inflated with random copies to 130 % of the GPU capacity."""
    return experiment_order(pods, capacity, INFLATION, seed)


POPULAR = 95  # % of the trace's pods the commonest kinds cover in the paper's typical pods, added ten at a time


def trace_mix(pods: list[TracePod], *, paper: bool = False) -> tuple[tuple[int, int, int, float], ...]:
    """The pods of the trace by kind (GPUs, thousandths of each, cpu): KubegpuFragmentation's `mix` argument. The
    GPU pods, every kind (`--mix trace`); or, with `paper`, as the FGD paper's simulator takes its typical pods
    (`--mix paper`): cpu-only pods too, and only the commonest kinds, ten at a time, until they cover `POPULAR` % of
    the pods."""
    kinds = Counter((p.gpus, p.milli if p.gpus else 1000, p.cpu_milli) for p in pods if paper or p.gpus)
    common = kinds.most_common(256)
    kept, covered = (0, 0) if paper else (len(common), 0)
    while covered * 100 < POPULAR * len(pods) and kept < len(common):
        covered += sum(n for _, n in common[kept : kept + 10])
        kept += 10
    return tuple((g, m, c, float(n)) for (g, m, c), n in common[:kept])


def replay(
    nodes: list[TraceNode],
    pods: list[TracePod],
    seed: int,
    variant: str,
    percentage: int,
    devices_only: bool,
    mix: tuple[tuple[int, int, int, float], ...] = (),
    weight: int | None = None,
    lead: bool = True,
    policy: str = "binpack",
    model_access: bool = False,
) -> tuple[float, float, int]:
    """(GPU allocated % at arrived 100 %, seconds, pods that arrived), replayed as `kubegpu simulate` replays a trace:
    with the collector's young generations only (`young_collections_only`)."""
    with young_collections_only():
        return _replay(nodes, pods, seed, variant, percentage, devices_only, mix, weight, lead, policy, model_access)


def _replay(
    nodes: list[TraceNode],
    pods: list[TracePod],
    seed: int,
    variant: str,
    percentage: int,
    devices_only: bool,
    mix: tuple[tuple[int, int, int, float], ...],
    weight: int | None,
    lead: bool,
    policy: str,
    model_access: bool,
) -> tuple[float, float, int]:
    share = variant != "whole"
    profile = scores.Profile.default(policy)
    if devices_only:
        profile = scores.Profile({p: profile.weight(p) for p in (scores.DEVICES, scores.FRAGMENTATION)})
    if weight is not None:
        profile = dataclasses.replace(profile, weights={**profile.weights, scores.FRAGMENTATION: weight})
    profile = dataclasses.replace(
        profile,
        percentage_of_nodes_to_score=percentage,
        share_policy=variant if share else None,
        fragmentation_mix=mix,
        fragmentation_lead=lead,
        fragmentation_model_access=model_access,
    )
    plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    engine = Engine(plugins, policy=policy, scoring=profile)  # type: ignore[arg-type]  # argparse's choices
    for node in nodes:
        engine.add_node(node_info(node_document(node, share=share)))
    capacity = sum(n.gpus for n in nodes) * 1000
    arrived = allocated = scheduled = tried = 0
    at_full: list[float] = []
    failures: Counter[tuple[int, int, bool, str]] = Counter()
    curve: dict[int, float] = {}
    started = time.perf_counter()
    for i, pod in enumerate(arrivals(pods, capacity, seed)):
        tried += 1
        arrived += pod.gpu_milli
        decision = engine.schedule(pod_request(pod_document(pod, f"p{i}", share=share))[0])
        if decision.scheduled:
            allocated += pod.gpu_milli
            scheduled += 1
        elif BREAKDOWN:
            failures[
                (10 * (100 * arrived // capacity // 10), pod.gpus, pod.milli < 1000, (decision.reason or "")[:90])
            ] += 1
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
        lost: Counter[tuple[int, int, bool]] = Counter()
        for (decile, gpus, share, _), count in failures.items():
            lost[(decile, gpus, share)] += count
        print("    failed pods by arrived decile (%), GPUs, share:", dict(sorted(lost.items())))
        for key, count in failures.most_common(8):
            print(f"    failed {count}: {key}")
    return (sum(at_full) / len(at_full) if at_full else float("nan")), seconds, tried


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--variants", nargs="+", default=["whole", "bestfit", "fgd"])
    parser.add_argument(
        "--policy", choices=["binpack", "spread"], default="binpack", help="the engine's policy (`--policy`)"
    )
    parser.add_argument(
        "--traces",
        nargs="+",
        default=["default"],
        help=f"the default trace and generated ones (benchmarks/openb_family.py): {', '.join(family.VARIANTS)}, all",
    )
    parser.add_argument(
        "--percentages",
        type=int,
        nargs="+",
        default=[0, 100],
        help="percentageOfNodesToScore per run (0: kube-scheduler's adaptive default; 100: every node, as the paper)",
    )
    parser.add_argument(
        "--devices-only", action="store_true", help="score by the device plugins' scores alone (the paper's setting)"
    )
    parser.add_argument(
        "--mix",
        choices=["learned", "trace", "paper"],
        default="learned",
        help="the mix of pods fragmentation is measured against: learned from the pods placed (kubegpu's default), "
        "the trace's GPU pods by kind (KubegpuFragmentation's mix argument), or the paper's typical pods (cpu-only "
        "pods too, the commonest kinds making 95 %%)",
    )
    parser.add_argument(
        "--fragmentation-weight", type=int, default=None, help="KubegpuFragmentation's weight (the profile's: 5)"
    )
    parser.add_argument(
        "--fragmentation-lead",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="where a pod may reach shared GPUs, KubegpuFragmentation ranks first, the policy's score then the "
        "others breaking its ties (on, shipped), or is weighed with the others (off, as before); both: side by side",
    )
    parser.add_argument(
        "--model-access",
        nargs="+",
        choices=["on", "off"],
        default=["off"],
        help="KubegpuFragmentation's modelAccess: the mix learned keeps the GPU models each kind may use, a node's "
        "free GPUs counting as lost to the kinds barred from its model (the paper's no access; off, shipped); both: "
        "side by side",
    )
    parser.add_argument(
        "--fragmentation-span",
        type=float,
        default=None,
        help=f"KubegpuFragmentation's raw points stretched to its whole weight (shipped: {kubescores.ONE_DEVICE:.1f}, "
        "a device's worth; 100: the raw score used as is, as before)",
    )
    parser.add_argument(
        "--ties",
        choices=["tie-order", "name"],
        default="tie-order",
        help="where KubegpuFragmentation's whole points and the other scores tie under binpack: the first node in "
        "the shipped tie order (scores.tie_order, the CRC-32 of the name), or the first by name, as the FGD paper's "
        "simulator takes it (to hold kubegpu's decisions against that simulator's; the shipped order before)",
    )
    args = parser.parse_args()
    if args.ties == "name":
        scores.tie_order = str  # type: ignore[assignment]  # the engine reads scores.tie_order at each tie
    if args.fragmentation_span is not None:
        kubescores.ONE_DEVICE = args.fragmentation_span
    nodes, default_pods = read_trace(args.trace)
    names = list(family.VARIANTS) if args.traces == ["all"] else args.traces
    generated = family.family(args.trace, 7) if any(n != "default" for n in names) else {}
    scoring = "plugin scores only" if args.devices_only else "default score profile"
    scoring += f", {args.mix} mix"
    print(f"{len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs; seeds {args.seeds}; {args.policy}, {scoring}")
    print(
        f"{'trace':10} {'variant':8} {'scored':>8} {'lead':>4} {'access':>6} {'kubegpu %':>10} {'paper %':>8} "
        f"{'pods/s':>7}  seeds"
    )
    for name in names:
        pods = default_pods if name == "default" else trace_pods(generated[name])
        for variant in args.variants:
            for percentage in args.percentages:
                for lead, access in [(lead, a) for lead in args.fragmentation_lead for a in args.model_access]:
                    mix = trace_mix(pods, paper=args.mix == "paper") if args.mix != "learned" else ()
                    figures = [
                        replay(
                            nodes,
                            pods,
                            seed,
                            variant,
                            percentage,
                            args.devices_only,
                            mix,
                            args.fragmentation_weight,
                            lead == "on",
                            args.policy,
                            access == "on",
                        )
                        for seed in args.seeds
                    ]
                    mean = sum(f[0] for f in figures) / len(figures)
                    rate = sum(f[2] for f in figures) / sum(f[1] for f in figures)
                    paper = PAPER.get(variant, "") if name == "default" else ""
                    scored = f"{percentage}%" if percentage else "adaptive"
                    each = " ".join(f"{f[0]:.2f}" for f in figures) if len(figures) > 1 else ""
                    print(
                        f"{name:10} {variant:8} {scored:>8} {lead:>4} {access:>6} {mean:10.2f} {paper:>8} "
                        f"{rate:7.0f}  {each}",
                        flush=True,
                    )
    print(f"paper, default trace: GpuPacking {PAPER['gpupacking']}, Random {PAPER['random']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
