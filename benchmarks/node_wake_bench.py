"""Benchmark: what one Node update costs the custom scheduler when many pods fit nowhere.

200 nodes (8 cpu each, full: 8 bound pods of 1 cpu on each) and 1000 pending pods of 1 cpu, all parked as
unschedulable. Then one node changes, in each of the ways a kubelet or an operator changes a node, and the scheduler
runs until no pod is active again. For each change: how many parked pods it wakes and the engine time (process time
of the scheduling loop) that round costs, once as kubegpu does now (`filters.node_change_may_help`: only a change to
what the filters read wakes anyone) and once as it did before (any change to the node's record woke every pod), side
by side. The change that frees room (allocatable grows) wakes everyone both ways, and the pods it has room for are
placed.

    .venv/bin/python benchmarks/node_wake_bench.py [--nodes 200] [--pods 1000]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler import queue
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.scores import PREFER_AVOID_KEY

KEY = b"k" * 32


class NullWriter:
    """Stands in for the API server: the scheduler's writes (Bindings, Events) are dropped."""

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        coroutine.close()


def pod(name: str, node: str | None = None) -> dict[str, Any]:
    manifest = pod_manifest(name, {"main": {"cpu": "1"}}, scheduler_name="kubegpu")
    manifest["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    if node is not None:
        manifest["spec"].update(nodeName=node, schedulerName="someone-else")
    return manifest


def images(node: dict[str, Any]) -> None:
    node["status"]["images"] = [{"names": [f"registry.example/app:{i}"], "sizeBytes": 10**8} for i in range(20)]


def annotation(node: dict[str, Any]) -> None:
    node["metadata"]["annotations"]["example.com/last-audit"] = "2026-01-01"


def avoid(node: dict[str, Any]) -> None:
    value = {"preferAvoidPods": [{"podSignature": {"podController": {"kind": "ReplicaSet", "uid": "u1"}}}]}
    node["metadata"]["annotations"][PREFER_AVOID_KEY] = json.dumps(value)


def cordon(node: dict[str, Any]) -> None:
    node["spec"]["unschedulable"] = True


def grow(node: dict[str, Any]) -> None:
    node["status"]["allocatable"]["cpu"] = "16"


CHANGES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("image pulled (status.images)", images),
    ("unrelated annotation", annotation),
    ("preferAvoidPods annotation", avoid),
    ("cordoned", cordon),
    ("allocatable grows", grow),
]


def round_after(
    nodes: int, pods: int, change: Callable[[dict[str, Any]], None], *, wake_all: bool
) -> tuple[int, int, float]:
    """Parked pods woken by the change, pods placed, and the process time of the loop until no pod is active."""
    clock = [1000.0]
    real = time.monotonic
    queue.time.monotonic = lambda: clock[0]  # type: ignore[attr-defined]
    try:
        engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False), signing_key=KEY)
        svc = CustomScheduler(None, NullWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
        manifests = [node_manifest(f"n{i}", cpu="8") for i in range(nodes)]
        svc.mirror.on_nodes("SYNC", manifests)
        bound = [pod(f"b{i}-{j}", f"n{i}") for i in range(nodes) for j in range(8)]
        svc.mirror.on_pods("SYNC", bound + [pod(f"p{i}") for i in range(pods)])
        while svc.queue.active:
            svc.schedule_active(pods)
        assert len(svc.queue.unschedulable) == pods
        changed = copy.deepcopy(manifests[0])
        change(changed)
        svc.mirror.on_nodes("MODIFIED", changed)
        if wake_all:
            svc.queue.wake()  # as before: any change to the node's record woke every pod
        woken = pods - len(svc.queue.unschedulable)
        clock[0] += queue.MAX_BACKOFF
        started = time.process_time()
        svc.queue.promote()
        while svc.queue.active:
            svc.schedule_active(pods)
        return woken, len(svc.queue.in_flight), time.process_time() - started
    finally:
        queue.time.monotonic = real  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=1000)
    args = parser.parse_args()
    print(f"{args.nodes} full nodes, {args.pods} parked pods; one node changes")
    print(
        f"{'change':<30} {'woken before':>12} {'woken now':>10} {'placed':>7} {'engine before':>14} {'engine now':>11}"
    )
    for label, change in CHANGES:
        woken_before, _, before = round_after(args.nodes, args.pods, change, wake_all=True)
        woken_now, placed, now = round_after(args.nodes, args.pods, change, wake_all=False)
        print(f"{label:<30} {woken_before:>12} {woken_now:>10} {placed:>7} {before:>13.3f}s {now:>10.3f}s")


if __name__ == "__main__":
    main()
