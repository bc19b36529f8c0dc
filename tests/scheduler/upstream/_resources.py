"""The three NodeResources score tables share one shape: nodes (name, cpu, memory), existing pods (containers'
requests, node), the incoming pod's containers' requests, and the expected 0..100 score per node. This module turns
a row into the engine and the numbers kubegpu's pure score functions give."""

from __future__ import annotations

from collections.abc import Callable

from kubegpu.core.manifests import node_info
from kubegpu.scheduler import scores

from ._kube import Requests, engine, node, requesting, scored_sums

Nodes = list[tuple[str, str, str]]  # (name, cpu, memory), as the Node's capacity and allocatable
Placed = list[tuple[Requests, str]]


def expected_from(
    nodes: Nodes, placed: Placed, incoming: Requests, score: Callable[[int, int, int, int], int]
) -> dict[str, int]:
    pod = requesting("incoming", incoming)
    existing = [(requesting(f"existing-{i}", r, where), where) for i, (r, where) in enumerate(placed)]
    out = {}
    for name, cpu, memory in nodes:
        info = node_info(node(name, cpu=cpu, memory=memory))
        used_cpu, used_memory = scored_sums(pod, existing, name)
        out[name] = score(used_cpu, used_memory, info.allocatable.get("cpu", 0), info.allocatable.get("memory", 0))
    return out


def engine_choice(nodes: Nodes, placed: Placed, incoming: Requests, plugin: str, policy: str) -> str | None:
    """The node the engine picks with `plugin` the only score; None when the incoming pod does not fit every node
    (the table scores nodes a pod may not fit; the engine scores only those it fits)."""
    existing = [(requesting(f"existing-{i}", r, where), where) for i, (r, where) in enumerate(placed)]
    e = engine(
        [node(name, cpu=cpu, memory=memory) for name, cpu, memory in nodes],
        existing,
        profile=scores.Profile({plugin: 1}),
        policy=policy,
    )
    pod = requesting("incoming", incoming)
    if not all(e.filter_node(name, pod).ok for name, _, _ in nodes):
        return None
    return e.schedule(pod).node


def least(cpu: int, memory: int, cpu_capacity: int, memory_capacity: int) -> int:
    """NodeResourcesLeastAllocated with 1.20's equal cpu and memory weights."""
    return (scores.least_allocated(cpu, cpu_capacity) + scores.least_allocated(memory, memory_capacity)) // 2


def most(cpu: int, memory: int, cpu_capacity: int, memory_capacity: int) -> int:
    """NodeResourcesMostAllocated with 1.20's equal cpu and memory weights."""
    return (scores.most_allocated(cpu, cpu_capacity) + scores.most_allocated(memory, memory_capacity)) // 2
