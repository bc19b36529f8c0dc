"""The score phase: which of the nodes that passed every filter is best, as kube-scheduler 1.20 decides it.

Each enabled score plugin gives every feasible node a raw score, normalizes the raw scores over those nodes to
0..100 (kube-scheduler's NormalizeScore), and a node's score is the sum of weight x normalized score; the highest
wins (the engine's candidate order breaks ties). The plugins, with kube-scheduler 1.20's default weights:

* NodeResourcesBalancedAllocation (weight 1): 100 x (1 - |cpu share - memory share|) with the pod added, 0 once
  either share reaches 1; used as is.
* NodeAffinity (1): the weights of the pod's preferred node affinity terms the node matches; scaled so that the
  highest is 100.
* TaintToleration (1): the node's `PreferNoSchedule` taints the pod does not tolerate; scaled and reversed, so that
  the fewest score 100.
* InterPodAffinity (1): per topology pair the node is in, + the weight of each preferred affinity term of the pod
  that an existing pod there matches (- for anti-affinity), + the weight of existing pods' preferred affinity terms
  that match the pod (1 for their required ones; - for their preferred anti-affinity); min..max, 0 included,
  stretched to 0..100.
* PodTopologySpread (2): per `ScheduleAnyway` constraint, the matching pods in the node's domain x log(domains + 2)
  + maxSkew - 1; reversed to 100 x (max + min - raw) / max, nodes lacking a topology key 0. A pod with no
  constraints of its own gets the profile's default constraints (`Profile.default_spread`; kube-scheduler's system
  defaults unless a configuration lists others), selecting what the Services, ReplicationControllers, ReplicaSets
  and StatefulSets that select it select (`kubegpu.scheduler.owners`); 1.20 scores them as the pod's own.
* NodeResourcesMostAllocated (`--policy binpack`) or NodeResourcesLeastAllocated (`spread`) (1): kubegpu's policy,
  the used share of the devices the pod asks for, or kube-scheduler's cpu and memory formula for a pod without
  devices; used as is.
* KubegpuDevices (1): the device plugins' topology score (0..100); used as is.
* KubegpuFragmentation (5): 100 x sigmoid(-d), d the devices the pod would leave unusable on the node by the device
  plugins' measure against the mix of pods the cluster sees (`kubegpu_scheduler_fragmentation`; the nvidia plugin's
  is the FGD paper's): 50 for none, 27 for one more; asked for every pod, so a cpu-only pod keeps off the node whose
  GPUs its cpu would strand; stretched over the feasible nodes, the least stranding 100 and a device more (23.1
  raw points) or the most 0, so that, weighed 5, a quarter of a GPU stranded less outweighs the policy's and
  NodeResourcesBalancedAllocation's whole ranges (used as is, a tenth of a GPU was 12 weighed points and balance
  decided most share placements: `benchmarks/sharing_bench.py`).
* ImageLocality (1): the sizes of the pod's container images the node lists in `status.images` (a name without a
  tag read as `:latest`), each scaled by the share of all nodes that list it, summed and clamped between 23 MiB and
  1000 MiB x the pod's containers, stretched to 0..100; used as is.
* NodePreferAvoidPods (10000): 0 on a node whose `scheduler.alpha.kubernetes.io/preferAvoidPods` annotation names
  the ReplicationController or ReplicaSet that controls the pod (by kind and UID), else 100; used as is. An annotation
  that is not the JSON kube-scheduler reads counts as absent.

Requests count as the scores count them: a container without a cpu or memory request counts 100 millicores and
200 MiB (kube-scheduler's non-zero requests).

Raw scores that depend only on the node and the pod's spec are remembered by the engine per node version and pod
signature; InterPodAffinity and PodTopologySpread depend on other pods and are computed once per cycle. Normalized
scores are never remembered: they depend on which other nodes are feasible. Nor are ImageLocality's (how many nodes
list an image moves with every node added or removed) and NodePreferAvoidPods' (one lookup): both cost a lookup per
image or controller, and the engine skips them where they would score every node alike.

The `Profile` says which plugins are on and their weights; `kubegpu.scheduler.config` reads it from a
KubeSchedulerConfiguration file.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from operator import add, itemgetter, methodcaller

from kubegpu.core.models import PodAffinityTerm, PodRequest, SpreadConstraint, Taint
from kubegpu.scheduler import filters

__all__ = [
    "DEFAULT_WEIGHTS",
    "FILTER_PLUGINS",
    "SCORE_PLUGINS",
    "Profile",
    "SpreadScores",
    "affinity_prescore",
    "affinity_raw",
    "affinity_raws",
    "avoidance_key",
    "avoided_controllers",
    "balanced_allocation",
    "feasible_to_find",
    "image_locality",
    "least_allocated",
    "most_allocated",
    "node_affinity_raw",
    "nonzero_requests",
    "normalize_affinity",
    "normalize_default",
    "normalize_range",
    "normalize_spread",
    "normalized_image",
    "prefer_avoid_score",
    "spread_prescore",
    "spread_raw",
    "spread_raws",
    "taint_raw",
]

MAX_NODE_SCORE = 100
DEFAULT_MILLI_CPU = 100  # kube-scheduler's non-zero request of a container that asks for no cpu
DEFAULT_MEMORY = 200 * 1024 * 1024  # ... and no memory
HOSTNAME = "kubernetes.io/hostname"

BALANCED = "NodeResourcesBalancedAllocation"
NODE_AFFINITY = "NodeAffinity"
TAINTS = "TaintToleration"
INTER_POD_AFFINITY = "InterPodAffinity"
SPREAD = "PodTopologySpread"
MOST_ALLOCATED = "NodeResourcesMostAllocated"
LEAST_ALLOCATED = "NodeResourcesLeastAllocated"
DEVICES = "KubegpuDevices"
FRAGMENTATION = "KubegpuFragmentation"
IMAGE_LOCALITY = "ImageLocality"
PREFER_AVOID = "NodePreferAvoidPods"
SCHEDULING_GATES = "SchedulingGates"  # PreEnqueue
PRIORITY_SORT = "PrioritySort"  # QueueSort

SCORE_PLUGINS = (
    BALANCED, NODE_AFFINITY, TAINTS, INTER_POD_AFFINITY, SPREAD, MOST_ALLOCATED, LEAST_ALLOCATED, DEVICES,
    FRAGMENTATION, IMAGE_LOCALITY, PREFER_AVOID,
)  # fmt: skip
# kube-scheduler 1.20's default profile, kubegpu's policy and device scores added; the policy plugin is chosen by
# `--policy` (binpack: MostAllocated, spread: LeastAllocated, kube-scheduler's default).
DEFAULT_WEIGHTS: Mapping[str, int] = {
    BALANCED: 1,
    NODE_AFFINITY: 1,
    TAINTS: 1,
    INTER_POD_AFFINITY: 1,
    SPREAD: 2,
    DEVICES: 1,
    FRAGMENTATION: 5,
    IMAGE_LOCALITY: 1,
    PREFER_AVOID: 10000,
}
POLICY_WEIGHT = 1
# PodTopologySpread's default constraints in kube-scheduler 1.20 (DefaultPodTopologySpread, `defaultingType: System`):
# for a pod with no constraints of its own, soft spread over hosts and zones; the selector comes from the pod's owners.
SYSTEM_DEFAULT_SPREAD = (
    SpreadConstraint(3, HOSTNAME, "ScheduleAnyway", None),
    SpreadConstraint(5, "topology.kubernetes.io/zone", "ScheduleAnyway", None),
)
# kube-scheduler's score plugins that kubegpu does not implement: a configuration may disable them, not enable them.
UNSUPPORTED_SCORES = frozenset(
    {"SelectorSpread", "RequestedToCapacityRatio", "NodeLabel", "ServiceAffinity"}
)  # fmt: skip
# The filters the engine runs (kube-scheduler's names), each of which a configuration may disable.
FILTER_PLUGINS = (
    "NodeUnschedulable",
    "NodeResourcesFit",
    "NodePorts",
    "NodeAffinity",
    "TaintToleration",
    "VolumeBinding",
    "DynamicResources",
    "PodTopologySpread",
    "InterPodAffinity",
)
# kube-scheduler's filters with nothing to do in kubegpu (volume limits and zones, NodeName which every pod with
# `spec.nodeName` already obeys): accepted in a disabled list.
UNSUPPORTED_FILTERS = frozenset(
    {"NodeName", "VolumeRestrictions", "EBSLimits", "GCEPDLimits", "NodeVolumeLimits", "AzureDiskLimits",
     "VolumeZone", "NodeLabel", "ServiceAffinity"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Profile:
    """Which score plugins are on with their weights (kube-scheduler's plugin absent or weighted 0 is off; a third
    party's is on with weight 1 unless `weights` or `scores_off` name it), which filters are off, and
    kube-scheduler's `percentageOfNodesToScore` (0: its adaptive default), `hardPodAffinityWeight` and
    PodTopologySpread's default constraints (their selectors None: each pod's owners give it; empty: none); the
    PreEnqueue plugins turned off (`SchedulingGates`) and the one QueueSort plugin (`PrioritySort`); and what the
    device plugins are told (`share_policy`, `fragmentation_mix`, `fragmentation_model_access`), and whether
    KubegpuFragmentation leads (`fragmentation_lead`)."""

    weights: Mapping[str, int] = field(default_factory=dict)
    filters_off: frozenset[str] = frozenset()
    percentage_of_nodes_to_score: int = 0
    hard_pod_affinity_weight: int = 1
    default_spread: tuple[SpreadConstraint, ...] = SYSTEM_DEFAULT_SPREAD
    scores_off: frozenset[str] = frozenset()
    pre_enqueue_off: frozenset[str] = frozenset()
    queue_sort: str = PRIORITY_SORT
    # KubegpuDevices' `sharePolicy` and KubegpuFragmentation's `mix` (`ProfileSettings`): None and () leave the
    # device plugins' defaults (their own policy, a mix learned from the pods placed).
    share_policy: str | None = None
    fragmentation_mix: tuple[tuple[int, int, int, float], ...] = ()
    # KubegpuFragmentation's `lead`: it ranks first where a pod may reach shared devices
    # (`Scoring.fragmentation_leads`); False weighs it with the others everywhere.
    fragmentation_lead: bool = True
    # KubegpuFragmentation's `modelAccess`: the mix learned keeps the GPU models each kind may use (`ProfileSettings`).
    fragmentation_model_access: bool = False

    @classmethod
    def default(cls, policy: str = "binpack") -> Profile:
        return cls({**DEFAULT_WEIGHTS, policy_plugin(policy): POLICY_WEIGHT})

    def weight(self, plugin: str) -> int:
        return self.weights.get(plugin, 0)


def policy_plugin(policy: str) -> str:
    return MOST_ALLOCATED if policy == "binpack" else LEAST_ALLOCATED


@lru_cache(maxsize=1 << 16)
def tie_order(name: str) -> tuple[int, str]:
    """Where a node stands among the nodes tied on KubegpuFragmentation's whole points (and the other scores that
    break its ties) for a pod packed under the binpack policy: the first by the CRC-32 of its name, then by name.
    Fixed for a node's life and alike in every process and replica, so that tied pods pack onto the same nodes pod
    after pod, as the FGD paper's simulator packs them by name over every node. Not the name itself: nodes join
    kube-scheduler's node tree in their names' order (the API server lists them so), and its sample starts where
    the last one stopped, so the first by name within the sample moves with it and tied pods went round the cluster
    (`benchmarks/sharing_bench.py`, learned mix, adaptive count: 95.05 % seeds 42-51 and 94.96 % seeds 52-61 by
    name, 95.24 % and 95.14 % by this order; every node 95.19 and 95.32 %, seeds 42-46)."""
    return (zlib.crc32(name.encode("utf-8", "surrogatepass")), name)


def feasible_to_find(total: int, percentage: int = 0) -> int:
    """kube-scheduler's number of feasible nodes to find before scoring: all of a cluster under 100 nodes, else an
    adaptive share (50% less 1% per 125 nodes, at least 5%) and never fewer than 100."""
    if total < 100 or percentage >= 100:
        return total
    share = percentage if percentage > 0 else max(5, 50 - total // 125)
    return max(100, total * share // 100)


# ---------------------------------------------------------------------------------------------------------------
# Node-local scores
# ---------------------------------------------------------------------------------------------------------------


def nonzero_requests(pod: PodRequest) -> tuple[int, int]:
    """The pod's cpu (millicores) and memory as the scores count them: a container without a request of one counts
    kube-scheduler's default; what init containers and overhead add to the pod's request is added as it is."""
    cpu = memory = 0
    running = pod.containers
    if any(container.init for container in running):  # an init container there holds devices only
        running = tuple(container for container in running if not container.init)
    for container in running:
        resources = container.resources
        cpu += resources.get("cpu", DEFAULT_MILLI_CPU)
        memory += resources.get("memory", DEFAULT_MEMORY)
    plain_cpu = sum(c.resources.get("cpu", 0) for c in running)
    plain_memory = sum(c.resources.get("memory", 0) for c in running)
    return cpu + max(0, pod.cpu_milli - plain_cpu), memory + max(0, pod.memory - plain_memory)


def _share(requested: int, capacity: int) -> float:
    return 1.0 if capacity == 0 else requested / capacity


def balanced_allocation(cpu: int, memory: int, cpu_capacity: int, memory_capacity: int) -> int:
    """NodeResourcesBalancedAllocation: nodes whose cpu and memory would be used in equal shares score highest."""
    cpu_share, memory_share = _share(cpu, cpu_capacity), _share(memory, memory_capacity)
    if cpu_share >= 1 or memory_share >= 1:
        return 0
    return int((1 - abs(cpu_share - memory_share)) * MAX_NODE_SCORE)


def least_allocated(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def most_allocated(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return requested * MAX_NODE_SCORE // capacity


def node_affinity_raw(pod: PodRequest, name: str, labels: Mapping[str, str]) -> int:
    """NodeAffinity's raw score: the weights of the preferred terms the node matches (an empty term matches none)."""
    terms = pod.preferred_node_affinity
    return sum(weight for weight, term in terms if filters.node_matches_terms((term,), name, labels))


def taint_raw(pod: PodRequest, taints: Iterable[Taint]) -> int:
    """TaintToleration's raw score: `PreferNoSchedule` taints not tolerated by a toleration whose effect is empty or
    `PreferNoSchedule`."""
    tolerations = [t for t in pod.tolerations if not t.effect or t.effect == "PreferNoSchedule"]
    return sum(
        1 for taint in taints if taint.effect == "PreferNoSchedule" and not any(t.tolerates(taint) for t in tolerations)
    )


# ---------------------------------------------------------------------------------------------------------------
# ImageLocality and NodePreferAvoidPods
# ---------------------------------------------------------------------------------------------------------------

MIB = 1024 * 1024
IMAGE_FLOOR = 23 * MIB  # image bytes a node must hold for ImageLocality to score above 0
IMAGE_CEILING = 1000 * MIB  # ... per container, for it to score 100
PREFER_AVOID_KEY = "scheduler.alpha.kubernetes.io/preferAvoidPods"
AVOIDABLE_KINDS = frozenset({"ReplicationController", "ReplicaSet"})


def normalized_image(name: str) -> str:
    """The name a node lists a pod's image under: `:latest` added when no tag follows the last `/`."""
    return name if name.rfind(":") > name.rfind("/") else f"{name}:latest"


def image_locality(images: Sequence[str], node_images: Mapping[str, int], listed: Mapping[str, int], nodes: int) -> int:
    """ImageLocality's score of one node: `images` are the pod's containers' images, normalized; `node_images` the
    node's image names with their sizes; `listed` how many of the cluster's `nodes` list each image. Each image the
    node holds adds its size x the share of nodes that list it (so that an image few nodes hold does not draw every
    replica to them); the sum, clamped to [23 MiB, 1000 MiB x containers], is stretched to 0..100."""
    total = 0
    for image in images:
        size = node_images.get(image)
        if size is not None and nodes > 0:
            total += int(size * (listed.get(image, 0) / nodes))
    ceiling = IMAGE_CEILING * len(images)
    if ceiling <= IMAGE_FLOOR:
        return 0
    total = min(max(total, IMAGE_FLOOR), ceiling)
    return MAX_NODE_SCORE * (total - IMAGE_FLOOR) // (ceiling - IMAGE_FLOOR)


def _field(document: Mapping[str, object], name: str) -> object:
    """A JSON object's field as Go's decoder finds it: the exact key, else one that differs only in case."""
    if name in document:
        return document[name]
    folded = name.casefold()
    return next((value for key, value in document.items() if key.casefold() == folded), None)


def avoided_controllers(raw: str) -> frozenset[tuple[str, str]]:
    """The (kind, UID) of each ReplicationController or ReplicaSet a node's `preferAvoidPods` annotation names
    (`{"preferAvoidPods": [{"podSignature": {"podController": {"kind": ..., "uid": ...}}}, ...]}`). ValueError,
    naming the problem, when the annotation is not that JSON (kube-scheduler then scores the node as if it had none)."""
    try:
        document = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {str(exc)[:200]}") from None
    if document is None:
        return frozenset()
    if not isinstance(document, dict):
        raise ValueError("expected a JSON object")
    entries = _field(document, "preferAvoidPods")
    if entries is None:
        return frozenset()
    if not isinstance(entries, list):
        raise ValueError("preferAvoidPods: expected a list")
    found: set[tuple[str, str]] = set()
    for i, entry in enumerate(entries):
        where = f"preferAvoidPods[{i}]"
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object")
        for text in ("reason", "message"):
            if not isinstance(_field(entry, text), str | None):
                raise ValueError(f"{where}.{text}: expected a string")
        signature = _field(entry, "podSignature")
        if signature is None:
            continue
        if not isinstance(signature, dict):
            raise ValueError(f"{where}.podSignature: expected an object")
        controller = _field(signature, "podController")
        if controller is None:
            continue
        if not isinstance(controller, dict):
            raise ValueError(f"{where}.podSignature.podController: expected an object")
        values = {}
        for text in ("apiVersion", "kind", "name", "uid"):
            value = _field(controller, text)
            if not isinstance(value, str | None):
                raise ValueError(f"{where}.podSignature.podController.{text}: expected a string")
            values[text] = value or ""
        if values["kind"] in AVOIDABLE_KINDS:
            found.add((values["kind"], values["uid"]))
    return frozenset(found)


def avoidance_key(pod: PodRequest) -> tuple[str, str] | None:
    """The (kind, UID) NodePreferAvoidPods looks for: the pod's controller when it is a ReplicationController or a
    ReplicaSet; None for any other pod (which scores 100 everywhere)."""
    controller = pod.controller
    if controller is None or controller.kind not in AVOIDABLE_KINDS:
        return None
    return controller.kind, controller.uid


def prefer_avoid_score(key: tuple[str, str] | None, avoided: frozenset[tuple[str, str]]) -> int:
    """NodePreferAvoidPods: 0 where the node asks to avoid the pod's controller, else 100."""
    return 0 if key is not None and key in avoided else MAX_NODE_SCORE


# ---------------------------------------------------------------------------------------------------------------
# Scores that depend on other pods
# ---------------------------------------------------------------------------------------------------------------


def has_affinity_terms(pod: PodRequest) -> bool:
    """Whether an existing pod can change other pods' InterPodAffinity score: required affinity terms and preferred
    terms count (kube-scheduler visits its PodsWithAffinity, whose required anti-affinity scores nothing)."""
    return bool(pod.pod_affinity or pod.preferred_affinity or pod.preferred_anti_affinity)


def scoring_terms(pod: PodRequest) -> list[PodAffinityTerm]:
    """The pod's terms that score other pods' nodes (`has_affinity_terms`)."""
    return [
        *pod.pod_affinity,
        *(term for _, term in pod.preferred_affinity),
        *(term for _, term in pod.preferred_anti_affinity),
    ]


def _add(
    scores: dict[tuple[str, str], int],
    term: PodAffinityTerm,
    weight: int,
    pod: PodRequest,
    labels: Mapping[str, str],
    namespace_labels: filters.NamespaceLabels,
) -> None:
    if not labels or not filters.pod_matches_term(term, pod, namespace_labels):
        return
    value = labels.get(term.topology_key)
    if value is not None:
        pair = (term.topology_key, value)
        scores[pair] = scores.get(pair, 0) + weight


def affinity_prescore(
    pod: PodRequest,
    existing: Iterable[tuple[PodRequest, Mapping[str, str]]],
    hard_weight: int = 1,
    namespace_labels: filters.NamespaceLabels = filters.namespace_named,
) -> dict[tuple[str, str], int]:
    """InterPodAffinity's PreScore: (topology key, value) -> score, over `existing` (placed pods with their node's
    labels: every pod when the incoming pod has preferred terms, else only pods with affinity terms)."""
    scores: dict[tuple[str, str], int] = {}
    ns = namespace_labels
    for other, labels in existing:
        for weight, term in pod.preferred_affinity:
            _add(scores, term, weight, other, labels, ns)
        for weight, term in pod.preferred_anti_affinity:
            _add(scores, term, -weight, other, labels, ns)
        if hard_weight > 0:
            for term in other.pod_affinity:
                _add(scores, term, hard_weight, pod, labels, ns)
        for weight, term in other.preferred_affinity:
            _add(scores, term, weight, pod, labels, ns)
        for weight, term in other.preferred_anti_affinity:
            _add(scores, term, -weight, pod, labels, ns)
    return scores


def affinity_raw(scores: Mapping[tuple[str, str], int], labels: Mapping[str, str]) -> int:
    return sum(score for (key, value), score in scores.items() if labels.get(key) == value)


def affinity_raws(scores: Mapping[tuple[str, str], int], nodes: Iterable[Mapping[str, str]]) -> list[int]:
    """`affinity_raw` for each of `nodes` (their labels), the pairs grouped by topology key first: a node costs one
    lookup per key instead of a pass over every pair (a hostname term has a pair per node holding a matching pod)."""
    by_key: dict[str, dict[str | None, int]] = {}  # a node without the key looks up None, which no pair holds
    for (key, value), score in scores.items():
        values = by_key.setdefault(key, {})
        values[value] = values.get(value, 0) + score
    if len(by_key) == 1:
        ((key, values),) = by_key.items()
        return list(map(values.get, map(methodcaller("get", key), nodes), repeat(0)))
    groups = list(by_key.items())
    return [sum(values.get(labels.get(key), 0) for key, values in groups) for labels in nodes]


@dataclass(slots=True)
class SpreadScores:
    """PodTopologySpread's PreScore: the pod's `ScheduleAnyway` constraints, the feasible nodes lacking one of their
    topology keys (they score 0), matching pods per topology pair and each constraint's normalizing weight; and,
    when the engine counted them from its index, per constraint by hostname its matching pods per node (None for
    the other constraints; empty: `spread_raw` counts the node's pods itself)."""

    constraints: tuple[SpreadConstraint, ...]
    ignored: set[str]
    counts: dict[tuple[str, str], int]
    weights: tuple[float, ...]
    hosts: tuple[Mapping[str, int] | None, ...] = ()


def soft_constraints(pod: PodRequest) -> tuple[SpreadConstraint, ...]:
    return tuple(c for c in pod.spread if c.when_unsatisfiable == "ScheduleAnyway")


def _matching(pods: Iterable[PodRequest], constraint: SpreadConstraint, namespace: str) -> int:
    return sum(
        1
        for p in pods
        if not p.terminating and p.namespace == namespace and filters.selector_matches(constraint.selector, p.labels)
    )


def spread_prescore(
    pod: PodRequest,
    feasible: Sequence[tuple[str, Mapping[str, str]]],
    nodes: Iterable[tuple[str, Mapping[str, str], Iterable[PodRequest]]],
    constraints: Sequence[SpreadConstraint] | None = None,
    taints: Mapping[str, Sequence[Taint]] | None = None,
) -> SpreadScores | None:
    """None when the pod has no `ScheduleAnyway` constraint. `feasible` are (name, labels) of the nodes to score,
    `nodes` (name, labels, pods on it) of every node, `taints` their taints (None: none): pods count for a
    constraint on nodes its node inclusion policies admit (`filters.counts_toward_spread`). `constraints` are the
    soft constraints to apply (a pod's defaulted ones); None: the pod's own."""
    constraints = soft_constraints(pod) if constraints is None else tuple(constraints)
    if not constraints:
        return None
    ignored: set[str] = set()
    counts: dict[tuple[str, str], int] = {}
    sizes = [0] * len(constraints)
    keys = [c.topology_key for c in constraints]
    counted = [(i, key) for i, key in enumerate(keys) if key != HOSTNAME]  # a host's pair is its own: not counted
    for name, labels in feasible:  # every node the pod may go to, each cycle: no generators here
        for key in keys:
            if key not in labels:
                ignored.add(name)
                break
        else:
            for i, key in counted:
                pair = (key, labels[key])
                if pair not in counts:
                    counts[pair] = 0
                    sizes[i] += 1
    weights = tuple(
        math.log((len(feasible) - len(ignored) if c.topology_key == HOSTNAME else sizes[i]) + 2)
        for i, c in enumerate(constraints)
    )
    for name, labels, pods in nodes:
        if not all(c.topology_key in labels for c in constraints):
            continue
        members: list[PodRequest] | None = None
        on = taints.get(name, ()) if taints is not None else ()
        for c in constraints:
            pair = (c.topology_key, labels[c.topology_key])
            if pair in counts and filters.counts_toward_spread(pod, c, name, labels, on):
                members = list(pods) if members is None else members
                counts[pair] += _matching(members, c, pod.namespace)
    return SpreadScores(constraints, ignored, counts, weights)


def spread_raws(state: SpreadScores, pod: PodRequest, nodes: Sequence[tuple[str, Mapping[str, str]]]) -> list[int]:
    """`spread_raw` for each of `nodes` (name, labels), a constraint at a time (the same sums in the same order)."""
    if not state.hosts or not nodes:
        return [spread_raw(state, pod, name, labels) for name, labels in nodes]
    if not state.ignored:
        return _spread_raws_keyed(state, nodes)
    totals = [0.0] * len(nodes)
    for c, weight, on in zip(state.constraints, state.weights, state.hosts, strict=True):
        key, extra = c.topology_key, c.max_skew - 1
        if key != HOSTNAME:
            counts = state.counts
            column = [
                counts.get((key, value), 0) * weight + extra if (value := labels.get(key)) is not None else None
                for _, labels in nodes
            ]
        else:
            hosts = on if on is not None else {}
            column = [
                hosts.get(name, 0) * weight + extra if labels.get(key) is not None else None for name, labels in nodes
            ]
        totals = [total if add is None else total + add for total, add in zip(totals, column, strict=True)]
    ignored = state.ignored
    return [0 if name in ignored else int(total) for (name, _), total in zip(nodes, totals, strict=True)]


def _spread_raws_keyed(state: SpreadScores, nodes: Sequence[tuple[str, Mapping[str, str]]]) -> list[int]:
    """`spread_raws` where every node holds every constraint's topology key (none ignored): each constraint's
    count looked up node by node without a step in Python, its weighed term worked out once per distinct count,
    and added to the totals in the same order (the same floats)."""
    names = list(map(itemgetter(0), nodes))
    labels = list(map(itemgetter(1), nodes))
    totals = [0.0] * len(nodes)
    for c, weight, on in zip(state.constraints, state.weights, state.hosts, strict=True):
        key, extra = c.topology_key, c.max_skew - 1
        if key != HOSTNAME:
            pairs = zip(repeat(key), map(itemgetter(key), labels))
            found = list(map(state.counts.get, pairs, repeat(0)))
        else:
            found = list(map((on if on is not None else {}).get, names, repeat(0)))
        term = {count: count * weight + extra for count in set(found)}
        totals = list(map(add, totals, map(term.__getitem__, found)))
    return list(map(int, totals))


def spread_raw(
    state: SpreadScores, pod: PodRequest, name: str, labels: Mapping[str, str], pods: Iterable[PodRequest] = ()
) -> int:
    """A feasible node's raw score; `pods` are the pods on it, read only when `state.hosts` is empty."""
    if name in state.ignored:
        return 0
    score = 0.0
    hosts = state.hosts or (None,) * len(state.constraints)
    for c, weight, on in zip(state.constraints, state.weights, hosts, strict=True):
        value = labels.get(c.topology_key)
        if value is None:
            continue
        if c.topology_key != HOSTNAME:
            count = state.counts[(c.topology_key, value)]
        else:
            count = on.get(name, 0) if on is not None else _matching(pods, c, pod.namespace)
        score += count * weight + (c.max_skew - 1)
    return int(score)


# ---------------------------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------------------------


def normalize_default(raw: Sequence[float], *, reverse: bool = False) -> list[float]:
    """kube-scheduler's DefaultNormalizeScore: scaled so that the highest raw score is 100 (reversed: 0), in whole
    points as kube-scheduler's integer arithmetic has them."""
    top = max(raw, default=0)
    if top <= 0:
        return [float(MAX_NODE_SCORE if reverse else score) for score in raw]
    scaled = [float(MAX_NODE_SCORE * score // top) for score in raw]
    return [MAX_NODE_SCORE - score for score in scaled] if reverse else scaled


def normalize_range(raw: Sequence[float], span: float = 0.0) -> list[float]:
    """The range from min to max stretched to 0..100, or `span` points of it where the range is narrower (all 0 when
    every score is the same). Scores are compared to a millionth of a point, so that the rounding of equal measures
    reached by different sums does not read as a lead."""
    rounded = [round(score, 6) for score in raw]
    bottom, top = min(rounded, default=0.0), max(rounded, default=0.0)
    if top <= bottom:
        return [0.0] * len(rounded)
    width = max(top - bottom, span)
    return [MAX_NODE_SCORE * (score - bottom) / width for score in rounded]


def normalize_affinity(raw: Sequence[int]) -> list[int]:
    """InterPodAffinity: the range from min to max (both counting 0) stretched to 0..100."""
    top, bottom = max(0, *raw) if raw else 0, min(0, *raw) if raw else 0
    spread = top - bottom
    if spread <= 0:
        return [0 for _ in raw]
    return [int(MAX_NODE_SCORE * ((score - bottom) / spread)) for score in raw]


def normalize_spread(raw: Sequence[int], ignored: Sequence[bool]) -> list[int]:
    """PodTopologySpread: fewer matching pods score higher; nodes lacking a topology key score 0."""
    counted = [score for score, skip in zip(raw, ignored, strict=True) if not skip]
    top = max(counted, default=0)
    bottom = min(counted, default=0)
    out = []
    for score, skip in zip(raw, ignored, strict=True):
        if skip:
            out.append(0)
        elif top == 0:
            out.append(MAX_NODE_SCORE)
        else:
            out.append(MAX_NODE_SCORE * (top + bottom - score) // top)
    return out
