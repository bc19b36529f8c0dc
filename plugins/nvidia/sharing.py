"""GPU sharing for the nvidia plugin: what a share asks, and how much a placement fragments a node.

A container asks for shares the way HAMi's users write it: `nvidia.com/gpu: N` GPUs, each possibly shared, with
`nvidia.com/gpucores: P` (percent of each GPU's compute, 1-100) and `nvidia.com/gpumem: MiB` or
`nvidia.com/gpumem-percentage: P` (memory of each GPU). As in HAMi, a share without a memory request takes the
whole memory of each GPU (so it shares compute with nobody who needs memory), and one without `gpucores` reserves
no compute. A container asking `nvidia.com/gpu` alone gets whole GPUs nobody shares.

Placement of shares (`kubegpu.plugins.nvidia.scheduler`) keeps per-GPU books; this module holds the pure rules:

* `Share` and `read_share`: one container's request, validated with refusals that name the field;
* fragmentation, after the FGD paper (Weng et al., USENIX ATC 2023), in its own terms here: a node's GPU capacity
  is *fragmented for a kind of pod* when that kind could not use it: a GPU with less free capacity than a share of
  that kind asks, a partly used GPU for a kind that needs whole GPUs, and all of the node for a kind that needs more
  whole GPUs than it has free. The *expected* fragmentation weighs each kind by how often it comes (`Workload`,
  learned from the pods placed). The policy places a pod where it makes the expected fragmentation grow least.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubegpu.plugins.nvidia import RESOURCE

__all__ = [
    "CORES",
    "MEMORY",
    "MEMORY_PERCENT",
    "SHARE_RESOURCES",
    "Share",
    "Workload",
    "fragmentation_delta",
    "read_share",
]

CORES = "nvidia.com/gpucores"
MEMORY = "nvidia.com/gpumem"
MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
SHARE_RESOURCES = (CORES, MEMORY, MEMORY_PERCENT)

WHOLE = 1000  # a GPU's capacity in thousandths (the unit of `Workload` kinds and of fragmentation)


class ShareError(ValueError):
    """A share request that can never be scheduled; the message names the field and says what to change."""


@dataclass(frozen=True, slots=True)
class Share:
    """One container's share of each of `count` GPUs: `cores` percent of compute (0: no compute reserved), memory
    as `memory_mib` MiB or `memory_percent` percent of each GPU's memory (exactly one is set); `asked`: the share
    resources the container names (a node must offer each, or its kubelet refuses the pod)."""

    container: str
    count: int
    cores: int
    memory_mib: int | None
    memory_percent: int | None
    asked: tuple[str, ...] = ()


def read_share(name: str, resources: Mapping[str, int]) -> Share | None:
    """The share a container asks for, None when it asks for whole GPUs (or none); raises `ShareError`."""
    asked = [r for r in SHARE_RESOURCES if resources.get(r, 0) > 0]
    if not asked:
        return None
    count = resources.get(RESOURCE, 0)
    if count <= 0:
        raise ShareError(
            f"container {name} requests {asked[0]} without {RESOURCE}; "
            f"ask for {RESOURCE}: 1 (the number of GPUs) and {asked[0]} per GPU"
        )
    cores = resources.get(CORES, 0)
    if cores > 100:
        raise ShareError(f"container {name}: {CORES} is {cores}; give a percent of each GPU's compute, 1-100")
    memory_mib = resources.get(MEMORY, 0) or None
    memory_percent = resources.get(MEMORY_PERCENT, 0) or None
    if memory_mib is not None and memory_percent is not None:
        raise ShareError(f"container {name} requests both {MEMORY} and {MEMORY_PERCENT}; request one")
    if memory_percent is not None and memory_percent > 100:
        raise ShareError(
            f"container {name}: {MEMORY_PERCENT} is {memory_percent}; give a percent of each GPU's memory, 1-100"
        )
    if memory_mib is None and memory_percent is None:
        memory_percent = 100  # HAMi: a share without a memory request gets all of each GPU's memory
    return Share(name, count, cores, memory_mib, memory_percent, tuple(asked))


# ---------------------------------------------------------------------------------------------------------------
# Fragmentation
# ---------------------------------------------------------------------------------------------------------------


Kind = tuple[int, int]
"""A kind of pod for fragmentation: (GPUs, thousandths of each GPU); (n, 1000) asks for n whole GPUs."""


class Workload:
    """How often each kind of pod comes, learned from the pods placed (oldest counts fade: halved past `horizon`).

    The policy needs the mix of pods to come; the pods placed so far are its estimate, as the FGD paper takes the
    mix from the cluster's recent history. `version` grows with every change of the mix's shape (a new kind, a halving),
    so a memo keyed by it stays correct.
    """

    def __init__(self, horizon: int = 4096) -> None:
        self.horizon = horizon
        self.counts: dict[Kind, float] = {}
        self.total = 0.0
        self.version = 0

    def clear(self) -> None:
        self.counts.clear()
        self.total = 0.0
        self.version += 1

    def add(self, kind: Kind) -> None:
        if kind not in self.counts:
            self.counts[kind] = 0.0
            self.version += 1
        self.counts[kind] += 1.0
        self.total += 1.0
        if self.total > self.horizon:
            for key in self.counts:
                self.counts[key] /= 2
            self.total /= 2
            self.version += 1

    def mix(self) -> list[tuple[int, int, float]]:
        """(GPUs, thousandths per GPU, probability) of each kind; empty before any pod."""
        total = self.total
        return [(n, milli, c / total) for (n, milli), c in self.counts.items()] if total else []


def node_fragmentation(free: Sequence[int], mix: Sequence[tuple[int, int, float]]) -> float:
    """The expected free capacity (thousandths of a GPU) that the next pod, drawn from `mix`, could not use on a
    node whose GPUs have `free` thousandths each free (GPUs the node cannot share out count 0)."""
    whole = sum(1 for f in free if f >= WHOLE)
    partial = sum(f for f in free if f < WHOLE)
    total = partial + whole * WHOLE
    expected = 0.0
    for count, milli, p in mix:
        if milli >= WHOLE or count > 1:
            # whole GPUs: partly used ones are lost to this kind, and all of the node when too few are whole
            lost = total if whole < count else partial
        else:
            lost = sum(f for f in free if f < milli)
        expected += p * lost
    return expected


def fragmentation_delta(free: Sequence[int], taken: Mapping[int, int], mix: Sequence[tuple[int, int, float]]) -> float:
    """How much `node_fragmentation` grows when `taken` (GPU index -> thousandths) is placed on the node."""
    after = list(free)
    for i, amount in taken.items():
        after[i] -= amount
    return node_fragmentation(after, mix) - node_fragmentation(free, mix)
