"""GPU sharing for the nvidia plugin: what a share asks, and how much a placement fragments a node.

A container asks for shares the way HAMi's users write it: `nvidia.com/gpu: N` GPUs, each possibly shared, with
`nvidia.com/gpucores: P` (percent of each GPU's compute, 1-100) and `nvidia.com/gpumem: MiB` or
`nvidia.com/gpumem-percentage: P` (memory of each GPU). As in HAMi, a share without a memory request takes the
whole memory of each GPU (so it shares compute with nobody who needs memory), and one without `gpucores` reserves
no compute. A container asking `nvidia.com/gpu` alone gets whole GPUs nobody shares.

Placement of shares (`kubegpu.plugins.nvidia.scheduler`) keeps per-GPU books; this module holds the pure rules:

* `Share` and `read_share`: one container's request, validated with refusals that name the field;
* fragmentation, after the FGD paper (Weng et al., USENIX ATC 2023), in its own terms here: a node's GPU capacity
  is *fragmented for a kind of pod* (GPUs, share of each, cpu, the GPU models it may use) when that kind could not
  use it: all of the node for a kind whose cpu the node no longer has free or that may not use the node's GPU model
  (the paper's "no access"), a GPU with less free capacity than a share of that kind asks, a partly used GPU for a
  kind that needs whole GPUs, and all of the node for a kind that needs more whole GPUs than it has free. The
  *expected* fragmentation weighs each kind by how often it comes (`Workload`, learned per engine from the pods
  placed; `FragmentationTable` makes it one pass over a node's GPUs, summed in integer parts so that it is exact).
  The policy places a pod where it makes the expected fragmentation grow least, and the engine's
  `KubegpuFragmentation` score keeps every pod, a cpu-only one included, off the node where it would grow most.
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
    "PRIORITY",
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
# HAMi's task priority (0 high, 1 low), which HAMi's device plugin hands HAMi-core as `CUDA_TASK_PRIORITY`. kubegpu
# has no counterpart: the node writes every share's priority at HAMi-core's default (`limits.HAMI_NEUTRAL`).
PRIORITY = "nvidia.com/priority"

WHOLE = 1000  # a GPU's capacity in thousandths (the unit of `Workload` kinds and of fragmentation)
# Kinds a `Workload` keeps: its memory and the cost of its tables stay bounded whatever pods come. A shape counts once
# per set of GPU models its pods may use (the openb family with half the GPU pods constrained has 514 kinds).
MAX_KINDS = 1024
# GPU models a kind keeps: a pod allowing more (a tenant's `In` list of made-up names) is weighed as one that may use
# any, so a kind, kept after its pods went, never holds what a pod wrote (50,000 names: 6 MiB a kind).
MAX_KIND_MODELS = 64
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
    if PRIORITY in resources:
        # Named at all, 0 included: kube-scheduler and the kubelet let a request of 0 of a resource no node lists
        # through, and the container would run at HAMi-core's low priority where its spec asked for the high one.
        raise ShareError(
            f"container {name} requests {PRIORITY} (HAMi's task priority), which kubegpu does not set: every GPU "
            f"share runs at HAMi-core's default priority; remove {PRIORITY} from the container"
        )
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


Models = frozenset[str] | None
"""The GPU models a kind may run on (`topology.normalize_model` keys), None for any."""

Kind = tuple[int, int, int] | tuple[int, int, int, Models]
"""A kind of pod for fragmentation: (GPUs, thousandths of each GPU, cpu millicores) or, in full, with the GPU models
it may run on after them; (n, 1000, ...) asks for n whole GPUs. `Workload` keeps kinds in full (`full_kind`): models
None (any) where not given."""

WEIGHT_UNIT = 1 << 24  # a table's kinds weigh their probability in these integer parts: the measure sums exactly


def full_kind(kind: Sequence[object]) -> tuple[int, int, int, Models]:
    """(GPUs, thousandths, cpu, models) of a kind given short (GPUs, thousandths, cpu) or in full."""
    gpus, milli, cpu = (int(kind[0]), int(kind[1]), int(kind[2]))  # type: ignore[call-overload]
    models = kind[3] if len(kind) > 3 else None
    return (gpus, milli if gpus == 1 else WHOLE, cpu, models if isinstance(models, frozenset) else None)


class Workload:
    """How often each kind of pod comes, learned from the pods placed (oldest counts fade: halved past `horizon`).

    The policy needs the mix of pods to come; the pods placed so far are its estimate, as the FGD paper takes the
    mix from the cluster's recent history. One per engine (the plugin keeps it in the engine's `shared` dict), so two
    engines in one process learn apart. `version` grows with the first pod, then every `refresh` pods or every eighth
    of the pods it counts, whichever is more (the mix of a busy cluster moves slowly, and each version has the engine
    score every node again; a new kind waits its turn, as rare as it is new), so a memo keyed by it is at most that
    many pods behind; `table` is remade per version (one per set of GPU models a node has: kinds barred from that
    model count all its free capacity, the paper's "no access").

    `models`: whether the kinds learned keep the GPU models their pods may use (KubegpuFragmentation's `modelAccess`).
    Off by default: the "no access" term draws a pod free to go anywhere to the models the constrained pods need
    least by the capacity it takes times their share, which outweighs the GPU-level fragmentation the measure is for;
    on the generated traces where a fifth and a half of the GPU pods name a model it cost 1.05 and 0.93 points of
    capacity allocated (docs/benchmarks.md). A cluster where one scarce model must stay free for the pods that need
    it turns it on.
    """

    def __init__(self, horizon: int = 4096, refresh: int = 64, most: int = MAX_KINDS, models: bool = False) -> None:
        self.horizon = horizon
        self.models = models
        self.most = most
        self.refresh = refresh
        self.counts: dict[tuple[int, int, int, Models], float] = {}
        self.total = 0.0
        self.version = 0
        self._since = 0
        self._tables: dict[Models, FragmentationTable] = {}
        self._tables_version = -1
        self._kinds: list[tuple[int, int, int, Models, float]] = []
        self.learns = True  # False for a configured mix (`configured`)

    @classmethod
    def configured(cls, mix: Sequence[Sequence[object]]) -> Workload:
        """A mix given by the profile (KubegpuFragmentation's `mix`: GPUs, thousandths per GPU, cpu millicores,
        weight, and optionally the GPU models), which the pods placed do not move: its version never changes."""
        workload = cls()
        for entry in mix[: workload.most]:
            kind = full_kind((*entry[:3], *entry[4:]))
            weight = float(entry[3])  # type: ignore[arg-type]
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
        key = full_kind(kind)
        self._since += 1
        if key not in self.counts:
            if len(self.counts) >= self.most:  # bounded: pods of ever new shapes push out the rarest kind
                rarest = min(self.counts, key=self.counts.__getitem__)
                self.total -= self.counts.pop(rarest)
            self.counts[key] = 0.0
        first = not self.total
        self.counts[key] += 1.0
        self.total += 1.0
        if self.total > self.horizon:  # the older pods count half: the shares of the kinds stay as they were
            for k in self.counts:
                self.counts[k] /= 2
            self.total /= 2
        if first or self._since >= max(self.refresh, self.total / 8):
            self._since = 0
            self.version += 1

    def mix(self) -> list[tuple[int, int, int, float]]:
        """(GPUs, thousandths per GPU, cpu millicores, probability) of each kind; empty before any pod."""
        return [(n, milli, cpu, p) for n, milli, cpu, _, p in self.kinds()]

    def kinds(self) -> list[tuple[int, int, int, Models, float]]:
        """(GPUs, thousandths per GPU, cpu millicores, models, probability) of each kind."""
        total = self.total
        return [(*kind, c / total) for kind, c in self.counts.items()] if total else []

    def table(self, models: Models = None) -> FragmentationTable:
        """The mix as `node_fragmentation` reads it on a node whose GPUs are of `models` (None: a kind's models are
        not asked), made once per version and set of models. A mix learned without models (`models` false) reads
        no node's models: every node shares one table, and its memo of measures."""
        if self.learns and not self.models:
            models = None
        if self._tables_version != self.version:
            self._tables.clear()
            self._tables_version = self.version
            self._kinds = self.kinds()  # every node's table of one version reads the same mix
        table = self._tables.get(models)
        if table is None:
            if len(self._tables) >= 64:
                self._tables.clear()
            table = self._tables[models] = FragmentationTable.of(self._kinds, models)
        return table


Row = tuple[int, tuple[int, ...], tuple[int, ...], int, int]
"""A table's sums over the kinds that run on a node (`FragmentationTable.row`)."""


@dataclass(frozen=True, slots=True)
class FragmentationTable:
    """A mix of kinds arranged so that a node's fragmentation costs one pass over its GPUs.

    Kinds run on a node only where its free cpu holds their request and its GPU model is one they may use: `cpus` are
    the kinds' cpu requests ascending, and a node's row (`row`: the level `j` its free cpu reaches in `cpus`) sums
    the kinds it runs, with each kind's probability in
    integer parts (`WEIGHT_UNIT` in all, `weight`), so that the measure is exact: equal fragmentation compares equal
    whatever the order of the sums. A row: (their weight; by `share_over[i]` that of the share kinds (one GPU, less
    than all of it) asking more than `millis[i - 1]` thousandths, `millis` the share kinds' asks ascending and i = 0
    every share kind; by `whole_upto[w]` that of the kinds needing whole GPUs that need at most `w` of them; that of
    all of those). Kinds barred from the node's GPU models never run there (their capacity counts whole).

    `measured` is a memo of `node_fragmentation` on this table: (the GPUs' free thousandths, j) -> the measure,
    all the measure reads besides the table. A table is made per mix version (`Workload.table`), so the memo never
    outlives the mix it measured against; past `MEASURES_REMEMBERED` entries it is dropped all at once. Nodes whose
    GPUs are alike share one measure: in the FGD experiment over 99 % of the measures a cycle asks for were asked
    before under the same version (`benchmarks/sharing_bench.py`).
    """

    cpus: tuple[int, ...]
    millis: tuple[int, ...]
    most: int
    weight: int
    kinds: tuple[tuple[int, int, int, int], ...]  # (cpu level, GPUs, thousandths, weight)
    rows: dict[int, Row] = field(default_factory=dict, compare=False, repr=False)
    measured: dict[tuple[tuple[int, ...], int], int] = field(default_factory=dict, compare=False, repr=False)
    # A memo of the plugin's `kubegpu_scheduler_fragmentation` on this table (`NvidiaPlugin`): (the state's content
    # number, id of the ask or 0 for a pod taking no GPU, the cpu levels before and after) -> (the ask, the answer).
    deltas: dict[tuple[int, int, int, int], tuple[object, float | None]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(cls, mix: Sequence[Sequence[object]], models: Models = None) -> FragmentationTable:
        """The table of `mix` ((GPUs, thousandths, cpu, probability) or `Workload.kinds`' (GPUs, thousandths, cpu,
        models, probability)) on a node whose GPUs are of `models`."""
        full = [(full_kind(k[:-1]), float(k[-1])) for k in mix]  # type: ignore[arg-type]
        cpus = sorted({cpu for (_, _, cpu, _), _ in full})
        level = {cpu: j for j, cpu in enumerate(cpus, 1)}
        weighed = []
        for (n, milli, cpu, allowed), p in full:
            weight = round(p * WEIGHT_UNIT)
            if allowed is not None and (models is None or not allowed & models):
                continue  # no access: never runs here, its share of the capacity counts whole
            weighed.append((level[cpu], n, milli, weight))
        millis = sorted({milli for _, n, milli, _ in weighed if n == 1 and milli < WHOLE})
        most = max((n for _, n, milli, _ in weighed if n > 1 or milli >= WHOLE), default=0)
        total = sum(round(p * WEIGHT_UNIT) for _, p in full)
        return cls(tuple(cpus), tuple(millis), most, total, tuple(weighed))

    def row(self, j: int) -> Row:
        """The sums over the kinds whose cpu level is at most `j`, made once."""
        known = self.rows.get(j)
        if known is not None:
            return known
        millis = self.millis
        where = {milli: i for i, milli in enumerate(millis)}
        share = [0] * len(millis)
        whole_by_n = [0] * (self.most + 1)
        runs = cpu_only = 0
        for cpu_level, n, milli, weight in self.kinds:
            if cpu_level > j:
                continue
            runs += weight
            if n == 1 and milli < WHOLE:
                share[where[milli]] += weight
            elif n == 0:
                cpu_only += weight
            else:
                whole_by_n[n] += weight
        over = [0] * (len(millis) + 1)
        for i in range(len(millis) - 1, -1, -1):
            over[i] = over[i + 1] + share[i]
        upto = [0] * (self.most + 1)
        acc = 0
        for w in range(self.most + 1):
            acc += whole_by_n[w]
            upto[w] = acc
        known = self.rows[j] = (runs, tuple(over), tuple(upto), acc, cpu_only)
        return known


EMPTY_TABLE = FragmentationTable.of([])
ANY_CPU = 1 << 62  # a node's free cpu where it is not to limit which kinds run


def node_fragmentation(free: Sequence[int], table: FragmentationTable, cpu: int = ANY_CPU) -> float:
    """The expected free GPU capacity (thousandths of a GPU) that the next pod, drawn from the table's mix, could not
    use on a node whose GPUs have `free` thousandths each free (GPUs the node cannot share out count 0) and `cpu`
    millicores free: all of it for a kind whose cpu does not fit or that may not use the node's GPU model, or that
    asks for no GPU (a cpu-only pod, as the FGD paper counts it), a GPU with less free than a share kind asks, partly
    used GPUs for a kind that needs whole ones, and all of it for a kind that needs more whole GPUs than are free.
    Exact: nodes that strand alike measure equal to the last bit."""
    if not table.weight:
        return 0.0  # no pod seen yet: nothing to measure against
    return _measure(free, table, cpu) / table.weight


def _measure(free: Sequence[int], table: FragmentationTable, cpu: int) -> int:
    """`node_fragmentation` in the table's integer parts, remembered (`FragmentationTable.measured`)."""
    key = (tuple(free), bisect_right(table.cpus, cpu))
    measured = table.measured
    known = measured.get(key)
    if known is not None:
        return known
    if len(measured) >= MEASURES_REMEMBERED:
        measured.clear()
    known = measured[key] = _fragmentation(key[0], table, table.row(key[1]))
    return known


def _fragmentation(free: tuple[int, ...], table: FragmentationTable, row: Row) -> int:
    """`node_fragmentation` computed in the table's integer parts, `row` the kinds that run on the node."""
    runs, over, whole_upto, whole_all, cpu_only = row
    whole = partial = share_lost = 0
    millis = table.millis
    for f in free:
        if f >= WHOLE:
            whole += 1
        elif f > 0:
            partial += f
            share_lost += f * over[bisect_right(millis, f)]
    total = partial + whole * WHOLE
    upto = whole_upto[min(whole, table.most)]
    lost_whole = total * (table.weight - runs + cpu_only + whole_all - upto)
    return lost_whole + share_lost + partial * upto


def fragmentation_delta(
    free: Sequence[int],
    taken: Mapping[int, int],
    table: FragmentationTable,
    cpu: int = ANY_CPU,
    cpu_taken: int = 0,
) -> float:
    """How much `node_fragmentation` grows when `taken` (GPU index -> thousandths) and `cpu_taken` millicores are
    placed on the node; exact, so nodes that strand alike compare equal."""
    if not table.weight:
        return 0.0
    after = list(free)
    for i, amount in taken.items():
        after[i] -= amount
    grown = _measure(after, table, cpu - cpu_taken) - _measure(free, table, cpu)
    return grown / table.weight
