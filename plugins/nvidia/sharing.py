"""GPU sharing for the nvidia plugin: what a share asks, and how much a placement fragments a node.

A container asks for shares the way HAMi's users write it: `nvidia.com/gpu: N` GPUs, each possibly shared, with
`nvidia.com/gpucores: P` (percent of each GPU's compute, 1-100) and `nvidia.com/gpumem: MiB` or
`nvidia.com/gpumem-percentage: P` (memory of each GPU). As in HAMi, a share without a memory request takes the
whole memory of each GPU (so it shares compute with nobody who needs memory), and one without `gpucores` reserves
no compute. A container asking `nvidia.com/gpu` alone gets whole GPUs nobody shares.

Placement of shares (`kubegpu.plugins.nvidia.scheduler`) keeps per-GPU books; this module holds the pure rules:

* `Share` and `read_share`: one container's request, validated with refusals that name the field;
* fragmentation, after the FGD paper (Weng et al., USENIX ATC 2023), in its own terms here: a node's GPU capacity
  is *fragmented for a kind of pod* (GPUs, share of each, cpu) when that kind could not use it: all of the node for
  a kind whose cpu the node no longer has free, a GPU with less free capacity than a share of that kind asks, a
  partly used GPU for a kind that needs whole GPUs, and all of the node for a kind that needs more whole GPUs than
  it has free. The *expected* fragmentation weighs each kind by how often it comes (`Workload`, learned per engine
  from the pods placed; `FragmentationTable` makes it one pass over a node's GPUs). The policy places a pod where
  it makes the expected fragmentation grow least, and the engine's `KubegpuFragmentation` score keeps every pod,
  a cpu-only one included, off the node where it would grow most.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kubegpu.plugins.nvidia import RESOURCE

__all__ = [
    "CORES",
    "MEMORY",
    "MEMORY_PERCENT",
    "SHARE_RESOURCES",
    "FragmentationTable",
    "Share",
    "Workload",
    "fragmentation_delta",
    "node_fragmentation",
    "read_share",
]

CORES = "nvidia.com/gpucores"
MEMORY = "nvidia.com/gpumem"
MEMORY_PERCENT = "nvidia.com/gpumem-percentage"
SHARE_RESOURCES = (CORES, MEMORY, MEMORY_PERCENT)

WHOLE = 1000  # a GPU's capacity in thousandths (the unit of `Workload` kinds and of fragmentation)
MAX_KINDS = 256  # kinds a `Workload` keeps: its memory and the cost of its table stay bounded whatever pods come
MEASURES_REMEMBERED = 1 << 16  # `FragmentationTable.measured` entries; past it, dropped all at once


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


Kind = tuple[int, int, int]
"""A kind of pod for fragmentation: (GPUs, thousandths of each GPU, cpu millicores); (n, 1000, c) asks for n whole
GPUs."""


class Workload:
    """How often each kind of pod comes, learned from the pods placed (oldest counts fade: halved past `horizon`).

    The policy needs the mix of pods to come; the pods placed so far are its estimate, as the FGD paper takes the
    mix from the cluster's recent history. One per engine (the plugin keeps it in the engine's `shared` dict), so two
    engines in one process learn apart. `version` grows with the first pod, then every `refresh` pods or every eighth
    of the pods it counts, whichever is more (the mix of a busy cluster moves slowly, and each version has the engine
    score every node again; a new kind waits its turn, as rare as it is new), so a memo keyed by it is at most that
    many pods behind; `table` is remade per version.
    """

    def __init__(self, horizon: int = 4096, refresh: int = 64, most: int = MAX_KINDS) -> None:
        self.horizon = horizon
        self.most = most
        self.refresh = refresh
        self.counts: dict[Kind, float] = {}
        self.total = 0.0
        self.version = 0
        self._since = 0
        self._table: tuple[int, FragmentationTable] | None = None
        self.learns = True  # False for a configured mix (`configured`)

    @classmethod
    def configured(cls, mix: Sequence[tuple[int, int, int, float]]) -> Workload:
        """A mix given by the profile (KubegpuFragmentation's `mix`: GPUs, thousandths per GPU, cpu millicores,
        weight), which the pods placed do not move: its version never changes."""
        workload = cls()
        for gpus, milli, cpu, weight in mix[: workload.most]:
            kind = (gpus, milli if gpus == 1 else WHOLE, cpu)
            workload.counts[kind] = workload.counts.get(kind, 0.0) + weight
            workload.total += weight
        workload.learns = False
        return workload

    def clear(self) -> None:
        self.counts.clear()
        self.total = 0.0
        self.version += 1

    def add(self, kind: Kind) -> None:
        if not self.learns:
            return
        self._since += 1
        if kind not in self.counts:
            if len(self.counts) >= self.most:  # bounded: pods of ever new shapes push out the rarest kind
                rarest = min(self.counts, key=self.counts.__getitem__)
                self.total -= self.counts.pop(rarest)
            self.counts[kind] = 0.0
        first = not self.total
        self.counts[kind] += 1.0
        self.total += 1.0
        if self.total > self.horizon:  # the older pods count half: the shares of the kinds stay as they were
            for key in self.counts:
                self.counts[key] /= 2
            self.total /= 2
        if first or self._since >= max(self.refresh, self.total / 8):
            self._since = 0
            self.version += 1

    def mix(self) -> list[tuple[int, int, int, float]]:
        """(GPUs, thousandths per GPU, cpu millicores, probability) of each kind; empty before any pod."""
        total = self.total
        return [(n, milli, cpu, c / total) for (n, milli, cpu), c in self.counts.items()] if total else []

    def table(self) -> FragmentationTable:
        """The mix as `node_fragmentation` reads it, made once per version."""
        cached = self._table
        if cached is None or cached[0] != self.version:
            cached = self._table = (self.version, FragmentationTable.of(self.mix()))
        return cached[1]


@dataclass(frozen=True, slots=True)
class FragmentationTable:
    """A mix of kinds arranged so that a node's fragmentation costs one pass over its GPUs.

    Kinds run on a node only where its free cpu holds their request: `cpus` are the kinds' cpu requests ascending,
    and row `j` of each table sums the kinds whose request is at most `cpus[j - 1]` (row 0: none runs). `runs[j]`:
    their probability; `share_over[j][i]`: that of the share kinds (one GPU, less than all of it) asking more than
    `millis[i - 1]` thousandths (`millis`: the share kinds' asks ascending; i = 0: every share kind);
    `whole_upto[j][w]`: that of the kinds needing whole GPUs that need at most `w` of them; `whole[j]`: all of those.

    `measured` is a memo of `node_fragmentation` on this table: (the GPUs' free thousandths, the row `j` the node's
    free cpu selects) -> the measure, all the measure reads besides the table. A table is made per mix version
    (`Workload.table`), so the memo never outlives the mix it measured against; past `MEASURES_REMEMBERED` entries
    it is dropped all at once. Nodes whose GPUs are alike share one measure: in the FGD experiment over 99 % of the
    measures a cycle asks for were asked before under the same version (`benchmarks/sharing_bench.py`).
    """

    cpus: tuple[int, ...]
    millis: tuple[int, ...]
    runs: tuple[float, ...]
    share_over: tuple[tuple[float, ...], ...]
    whole_upto: tuple[tuple[float, ...], ...]
    whole: tuple[float, ...]
    most: int
    measured: dict[tuple[tuple[int, ...], int], float] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, mix: Sequence[tuple[int, int, int, float]]) -> FragmentationTable:
        cpus = sorted({cpu for _, _, cpu, _ in mix})
        millis = sorted({milli for n, milli, _, _ in mix if n == 1 and milli < WHOLE})
        most = max((n for n, milli, _, _ in mix if n > 1 or milli >= WHOLE), default=0)
        level = {cpu: j for j, cpu in enumerate(cpus, 1)}
        where = {milli: i for i, milli in enumerate(millis)}
        by_level: list[list[tuple[int, int, float]]] = [[] for _ in range(len(cpus) + 1)]
        for n, milli, cpu, p in mix:
            by_level[level[cpu]].append((n, milli, p))
        share = [0.0] * len(millis)
        whole_by_n = [0.0] * (most + 1)
        runs, share_over, whole_upto, whole = [], [], [], []
        ran = 0.0
        for kinds in by_level:
            for n, milli, p in kinds:
                ran += p
                if n == 1 and milli < WHOLE:
                    share[where[milli]] += p
                else:
                    whole_by_n[n] += p
            runs.append(ran)
            over = [0.0] * (len(millis) + 1)
            for i in range(len(millis) - 1, -1, -1):
                over[i] = over[i + 1] + share[i]
            share_over.append(tuple(over))
            upto = [0.0] * (most + 1)
            acc = 0.0
            for w in range(most + 1):
                acc += whole_by_n[w]
                upto[w] = acc
            whole_upto.append(tuple(upto))
            whole.append(acc)
        return cls(tuple(cpus), tuple(millis), tuple(runs), tuple(share_over), tuple(whole_upto), tuple(whole), most)


EMPTY_TABLE = FragmentationTable.of([])
ANY_CPU = 1 << 62  # a node's free cpu where cpu is not to limit which kinds run


def node_fragmentation(free: Sequence[int], table: FragmentationTable, cpu: int = ANY_CPU) -> float:
    """The expected free GPU capacity (thousandths of a GPU) that the next pod, drawn from the table's mix, could not
    use on a node whose GPUs have `free` thousandths each free (GPUs the node cannot share out count 0) and `cpu`
    millicores free: all of it for a kind whose cpu does not fit, a GPU with less free than a share kind asks, partly
    used GPUs for a kind that needs whole ones, and all of it for a kind that needs more whole GPUs than are free."""
    if not table.cpus:
        return 0.0  # no pod seen yet: nothing to measure against
    j = bisect_right(table.cpus, cpu)
    key = (tuple(free), j)
    measured = table.measured
    known = measured.get(key)
    if known is not None:
        return known
    if len(measured) >= MEASURES_REMEMBERED:
        measured.clear()
    known = measured[key] = _fragmentation(key[0], table, j)
    return known


def _fragmentation(free: tuple[int, ...], table: FragmentationTable, j: int) -> float:
    """`node_fragmentation` computed, `j` the table's row for the node's free cpu."""
    whole = partial = 0
    share_lost = 0.0
    over, millis = table.share_over[j], table.millis
    for f in free:
        if f >= WHOLE:
            whole += 1
        elif f > 0:
            partial += f
            share_lost += f * over[bisect_right(millis, f)]
    total = partial + whole * WHOLE
    upto = table.whole_upto[j][min(whole, table.most)]
    return total * (1.0 - table.runs[j]) + share_lost + partial * upto + total * (table.whole[j] - upto)


def fragmentation_delta(
    free: Sequence[int], taken: Mapping[int, int], table: FragmentationTable, cpu: int = ANY_CPU, cpu_taken: int = 0
) -> float:
    """How much `node_fragmentation` grows when `taken` (GPU index -> thousandths) and `cpu_taken` millicores are
    placed on the node."""
    after = list(free)
    for i, amount in taken.items():
        after[i] -= amount
    return node_fragmentation(after, table, cpu - cpu_taken) - node_fragmentation(free, table, cpu)
