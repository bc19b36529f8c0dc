"""kube-scheduler 1.20's score plugins as `ScorePlugin` objects (`framework.py`), with kubegpu's device score among
them; the rules themselves are pure functions in `kubegpu.scheduler.scores`, which also has their default weights.

The local ones (their raw score reads only the node and the pod's spec) come first; the engine remembers their raw
scores per node version and pod shape. The others read other pods or other nodes and are asked in every cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from operator import attrgetter

from kubegpu.core.models import PodRequest, SpreadConstraint
from kubegpu.scheduler import podindex, scores
from kubegpu.scheduler.engine.framework import ScoreContext, ScorePlugin
from kubegpu.scheduler.engine.records import NodeRecord, Plan

# A local plugin's state when it has one to give: the pod's spec is all it reads.
ON = True


class Local:
    """What the local plugins share: a state that follows from the pod's spec, and raw scores used as they are.
    `reads_mix`: whether a raw score may read a fragmenting plugin's learned mix (its epoch: `LocalRaws.before`)."""

    local, reads_mix = True, False

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return False

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return ON

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return raw


class BalancedAllocation(Local):
    name = scores.BALANCED

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        cpu, memory = plan.nonzero
        out = []
        for record in records:
            allocatable = record.info.allocatable
            out.append(
                float(
                    scores.balanced_allocation(
                        cpu + record.nonzero_cpu,
                        memory + record.nonzero_memory,
                        allocatable.get("cpu", 0),
                        allocatable.get("memory", 0),
                    )
                )
            )
        return out


class NodeAffinity(Local):
    """The weights of the pod's preferred node affinity terms each node matches, scaled so the highest is 100."""

    name = scores.NODE_AFFINITY

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return bool(pod.preferred_node_affinity)

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return ON if pod.preferred_node_affinity else None

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        return [float(scores.node_affinity_raw(pod, r.info.name, r.info.labels)) for r in records]

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return scores.normalize_default(raw)


class TaintToleration(Local):
    """The node's PreferNoSchedule taints the pod does not tolerate, scaled and reversed: the fewest score 100."""

    name = scores.TAINTS

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return bool(engine.soft_tainted)

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        soft = engine.soft_tainted
        return [float(scores.taint_raw(pod, r.info.taints)) if r.info.name in soft else 0.0 for r in records]

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return scores.normalize_default(raw, reverse=True)


class Allocated(Local):
    """kubegpu's policy: the used share of the devices the pod asks for on the node, or, for a pod without devices,
    kube-scheduler's cpu and memory formula; NodeResourcesMostAllocated for `binpack`, LeastAllocated for `spread`.
    Only the policy's own runs (`enabled_scores`)."""

    def __init__(self, name: str, policy: str) -> None:
        self.name, self.policy = name, policy

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        binpack = self.policy == "binpack"
        allocated = scores.most_allocated if binpack else scores.least_allocated
        cpu, memory = plan.nonzero
        out = []
        for record in records:
            used = engine.device_usage(record, pod)
            if used is not None:
                out.append(100.0 * (used if binpack else 1.0 - used))
                continue
            allocatable = record.info.allocatable
            cpu_score = allocated(cpu + record.nonzero_cpu, allocatable.get("cpu", 0))
            memory_score = allocated(memory + record.nonzero_memory, allocatable.get("memory", 0))
            out.append(float((cpu_score + memory_score) // 2))
        return out


class KubegpuDevices(Local):
    """The device plugins' mean topology score (0..100) on the node (`kubegpu_scheduler_score`)."""

    name, reads_mix = scores.DEVICES, True  # a plugin's topology score may read its mix (neuron's does)

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return ON if plan.devices else None

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        return engine.device_scores(records, pod)


# KubegpuFragmentation's raw points for one device stranded (100 x (sigmoid(0) - sigmoid(-1)), 23.1): its stretch.
# Used as is, a tenth of a GPU was 12 points (x 5) against NodeResourcesBalancedAllocation's 100, and balance decided
# most share placements (sharing_bench: fgd 92.8 % against 94.6 % scored by fragmentation alone); stretched over any
# range, however narrow, a hair of fragmentation overrode the Neuron topology score too (placement_bench's mixes lost
# to first-fit): a device's worth is where the measure leads without erasing the others.
ONE_DEVICE = 100.0 * (0.5 - 1.0 / (1.0 + math.e))


class KubegpuFragmentation(Local):
    """100 x sigmoid(-d), d the devices the pod would strand on the node by the device plugins' measure
    (`kubegpu_scheduler_fragmentation`), asked for every pod: a cpu-only pod keeps off the cpu free GPUs need.
    Stretched over the feasible nodes: the node that strands least scores 100, and one that strands a whole device
    more (`ONE_DEVICE` points of the raw score) or the most 0 (`scores.normalize_range`)."""

    name, reads_mix = scores.FRAGMENTATION, True

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return engine.fragmentation_matters(pod, plan)

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        return engine.fragmentation_scores(records, pod, plan)

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return scores.normalize_range(raw, ONE_DEVICE)


class InterPodAffinity:
    """Per topology pair, the weights of the pod's preferred terms that pods there match and of placed pods' terms
    that match the pod; min..max, 0 included, stretched to 0..100."""

    name, local = scores.INTER_POD_AFFINITY, False

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return bool(pod.preferred_affinity or pod.preferred_anti_affinity or engine.placed.drawn(pod))

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        if not self.matters(engine, pod, plan):
            return None
        table = podindex.affinity_scores(
            pod, engine.placed, engine.node_labels, engine.scoring.hard_pod_affinity_weight
        )
        return table or None

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        assert isinstance(state, dict)
        return list(map(float, scores.affinity_raws(state, map(_LABELS, records))))

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return _per_distinct(raw, lambda values: scores.normalize_affinity([int(value) for value in values]))


class _SpreadCycle:
    """PodTopologySpread's state in one cycle: its constraints, and the scored nodes lacking a topology key (they
    score 0 whatever their raw score), found by `score`."""

    __slots__ = ("constraints", "ignored")

    def __init__(self, constraints: tuple[SpreadConstraint, ...]) -> None:
        self.constraints = constraints
        self.ignored: list[bool] = []


class PodTopologySpread:
    """Per ScheduleAnyway constraint (the pod's own, or the defaults its owners give it), the matching pods in the
    node's domain, weighed; fewer score higher, nodes lacking a topology key 0."""

    name, local = scores.SPREAD, False

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return bool(plan.soft_spread)

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return _SpreadCycle(plan.soft_spread) if plan.soft_spread else None

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        assert isinstance(state, _SpreadCycle)
        soft = state.constraints
        nodes = list(map(_NAME_AND_LABELS, records))
        spread = podindex.spread_scores(pod, engine.placed, nodes, engine.spread_domains(pod, soft), soft)
        if spread is None:
            state.ignored = [False] * len(records)
            return [0.0] * len(records)
        ignored = spread.ignored
        state.ignored = [name in ignored for name, _ in nodes] if ignored else [False] * len(nodes)
        return list(map(float, scores.spread_raws(spread, pod, nodes)))

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        assert isinstance(state, _SpreadCycle)
        if True in state.ignored:
            return list(map(float, scores.normalize_spread([int(value) for value in raw], state.ignored)))
        return _per_distinct(
            raw, lambda values: scores.normalize_spread([int(value) for value in values], [False] * len(values))
        )


class NodePreferAvoidPods:
    """0 on a node whose preferAvoidPods annotation names the pod's controller, else 100; used as is."""

    name, local = scores.PREFER_AVOID, False

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return engine.avoiding(pod) is not None

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return engine.avoiding(pod)

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        assert isinstance(state, tuple)
        return [float(scores.prefer_avoid_score(state, engine.avoided_on(record.name))) for record in records]

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return raw


class ImageLocality:
    """The sizes of the pod's images each node lists, scaled by how many nodes list them; used as is."""

    name, local = scores.IMAGE_LOCALITY, False

    def matters(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> bool:
        return engine.images_matter(pod)

    def prescore(self, engine: ScoreContext, pod: PodRequest, plan: Plan) -> object | None:
        return engine.listed_images(pod) or None

    def score(
        self, engine: ScoreContext, state: object, records: Sequence[NodeRecord], pod: PodRequest, plan: Plan
    ) -> list[float]:
        assert isinstance(state, tuple)
        listed, count = engine.image_nodes, len(engine.nodes)
        return [float(scores.image_locality(state, r.info.images, listed, count)) for r in records]

    def normalize(self, state: object, raw: list[float]) -> list[float]:
        return raw


_LABELS = attrgetter("info.labels")
_NAME_AND_LABELS = attrgetter("info.name", "info.labels")


def _per_distinct(raw: list[float], normalize: Callable[[list[float]], Sequence[float]]) -> list[float]:
    """`normalize` over `raw` (as floats) worked out once per distinct raw score: for a normalization that reads
    only the least and the greatest score and maps each score alone (InterPodAffinity's and PodTopologySpread's),
    the same list as over every node's, at the cost of a lookup per node."""
    values = list(set(raw))
    table = dict(zip(values, map(float, normalize(values)), strict=True))
    return list(map(table.__getitem__, raw))


def may_matter(plugin: ScorePlugin) -> bool:
    """Whether the plugin's `matters` may answer True: not for a built-in local plugin that keeps `Local.matters`
    (BalancedAllocation, the policy's, KubegpuDevices: their scores never make a cycle find more feasible nodes than
    the policy's first few), so that `_sample_size` does not ask them in every cycle."""
    return getattr(type(plugin), "matters", None) is not Local.matters


# The built-in score plugins by name: the local ones first, in the order their raw scores are remembered.
KUBE_SCORES: tuple[ScorePlugin, ...] = (
    BalancedAllocation(),
    NodeAffinity(),
    TaintToleration(),
    Allocated(scores.MOST_ALLOCATED, "binpack"),
    Allocated(scores.LEAST_ALLOCATED, "spread"),
    KubegpuDevices(),
    KubegpuFragmentation(),
    InterPodAffinity(),
    PodTopologySpread(),
    NodePreferAvoidPods(),
    ImageLocality(),
)


def enabled_scores(
    extra: tuple[ScorePlugin, ...], profile: scores.Profile, policy: str
) -> tuple[tuple[ScorePlugin, int], ...]:
    """The built-in score plugins then `extra`, each with its weight, less those the profile weighs 0 (a plugin a
    third party adds weighs 1 unless the profile names it) and the policy plugin of the other policy; the local ones
    first. A name given twice is refused."""
    names = [plugin.name for plugin in (*KUBE_SCORES, *extra)]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"score plugin(s) named twice: {', '.join(twice)}")
    chosen: list[tuple[ScorePlugin, int]] = []
    for plugin in KUBE_SCORES:
        if isinstance(plugin, Allocated) and plugin.policy != policy:
            continue
        weight = profile.weight(plugin.name)
        if weight:
            chosen.append((plugin, weight))
    for plugin in extra:
        weight = profile.weights.get(plugin.name, 0 if plugin.name in profile.scores_off else 1)
        if weight:
            chosen.append((plugin, weight))
    return tuple(sorted(chosen, key=lambda pair: not pair[0].local))
