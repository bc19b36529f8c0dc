"""The engine's memos and the nvidia plugin's (`PlacementBook`, the fragmentation table's measures, each state's
content number) against nodes that change under them: a node relabelled to another zone, tainted (NoSchedule or
PreferNoSchedule) and untainted, its cpu resized, cordoned, marked dead, removed; a GPU of a node offering shares
gone unhealthy and back, the node's split changed. Two engines take the same story; the oracle forgets every memo,
the engine's and the plugin's, before each question. Every decision must be the same, also when the memoized engine
is asked not to explain its refusals (`schedule(explain=False)`, a pod waiting for its victims), which must not
leave a memo behind that a later, explained cycle reads. Nodes alike and past kube-scheduler's 100 (a sampled cycle)
or a few; kube-scheduler's adaptive count (shared GPUs) or a set percentage."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.models import (
    DeviceInfo,
    DeviceInventory,
    LabelSelector,
    NodeInfo,
    PodAffinityTerm,
    PodRequest,
    Requirement,
    SpreadConstraint,
    Taint,
    Toleration,
)
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia.sharing import Workload
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Decision, Engine

ZONE = "topology.kubernetes.io/zone"
APP = LabelSelector((Requirement("app", "In", ("web",)),))
HARD = Taint("example.com/hard", None, "NoSchedule")
TAINTS = ((), (Taint("example.com/soft", None, "PreferNoSchedule"),), (HARD,))
GFD = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384"}
KINDS = ("shared", "advertised", "whole", "trn1", "cpu")
SHAPES = (
    {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem-percentage": 25},
    {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 60, "nvidia.com/gpumem-percentage": 50},
    {"nvidia.com/gpu": 1},
    {"nvidia.com/gpu": 2},
    {"aws.amazon.com/neurondevice": 4},
    {"aws.amazon.com/neurondevice": 1},
    {"cpu": "1"},
    (  # two share containers: where the first goes decides whether the second finds room
        {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 40, "nvidia.com/gpumem-percentage": 40},
        {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 80, "nvidia.com/gpumem-percentage": 40},
    ),
)
FLAVOURS = ("plain", "anti", "spread", "preferred", "hosts", "tolerant")


@dataclasses.dataclass
class Facts:
    """What the story changes of one node."""

    kind: str
    serial: int
    zone: int
    taint: int = 0
    cpu: int = 4
    cordoned: bool = False
    sick: int = 0  # bit i: GPU i unhealthy (advertised nodes)
    split: int = 4

    def node(self) -> NodeInfo:
        name = f"{self.kind}-{self.serial}"
        labels = {ZONE: f"z{self.zone}", "kubernetes.io/hostname": name}
        healthy = [not (self.sick >> i) & 1 for i in range(2)]
        shares = {"nvidia.com/gpucores": 100 * sum(healthy), "nvidia.com/gpumem-percentage": 100 * sum(healthy)}
        allocatable: dict[str, Any] = {
            "shared": {
                "nvidia.com/gpu": 2 * self.split,
                "nvidia.com/gpucores": 200,
                "nvidia.com/gpumem-percentage": 200,
            },
            "advertised": {"nvidia.com/gpu": sum(healthy) * self.split, **shares},
            "whole": {"nvidia.com/gpu": 2},
            "trn1": {"aws.amazon.com/neurondevice": 16, "aws.amazon.com/neuroncore": 32},
            "cpu": {},
        }[self.kind]
        if self.kind in ("shared", "whole"):
            labels.update(GFD)
        elif self.kind == "trn1":
            labels["node.kubernetes.io/instance-type"] = "trn1.32xlarge"
        info = make_node(name, labels=labels, allocatable={**allocatable, "pods": 8}, cpu=str(self.cpu))
        if self.kind == "advertised":
            gpus = [
                DeviceInfo(id=str(i), model="Tesla V100-SXM2-16GB", memory=16 << 30, healthy=h)
                for i, h in enumerate(healthy)
            ]
            info = dataclasses.replace(info, inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=gpus)})
        return dataclasses.replace(info, unschedulable=self.cordoned, taints=TAINTS[self.taint])


def pod(serial: int, shape: int, flavour: str) -> PodRequest:
    asked = SHAPES[shape]
    containers = dict(zip(("main", "side"), asked, strict=True)) if isinstance(asked, tuple) else {"main": asked}
    request = make_pod(f"p{serial}", containers, namespace="ns")
    request = dataclasses.replace(request, uid=f"uid-{serial}", labels={"app": "web"})
    if flavour == "anti":
        return dataclasses.replace(request, pod_anti_affinity=(PodAffinityTerm(APP, frozenset({"ns"}), ZONE),))
    if flavour == "spread":
        return dataclasses.replace(request, spread=(SpreadConstraint(1, ZONE, "DoNotSchedule", APP),))
    if flavour == "preferred":
        return dataclasses.replace(request, preferred_affinity=((50, PodAffinityTerm(APP, frozenset({"ns"}), ZONE)),))
    if flavour in ("hosts", "tolerant"):
        spread = SpreadConstraint(1, "kubernetes.io/hostname", "DoNotSchedule", APP, 3, "Honor", "Honor")
        tolerations = (Toleration(HARD.key, "Exists"),) if flavour == "tolerant" else ()
        return dataclasses.replace(request, spread=(spread,), tolerations=tolerations)
    return request


def engine(percentage: int) -> Engine:
    plugins = make_plugin_manager("scheduler", plugins=[("neuron", neuron), ("nvidia", nvidia)], autoload=False)
    built = Engine(plugins, scoring=scores.Profile(percentage_of_nodes_to_score=percentage))
    # A mix learned anew after every pod or so (a replay's moves every 64 or more): the memos kept across its
    # versions (`PlacementBook.steady`, the fragmentation answers per table) meet many of them.
    built._shared["nvidia"][nvidia.WORKLOAD_KEY] = Workload(refresh=1)
    return built


def forget(oracle: Engine) -> None:
    """Every memo of the engine, and the nvidia plugin's: the placements, fit answers and scores its states share
    (those kept across the mix's versions too), the measures and answers of the fragmentation table, each state's
    content number, free thousandths, placement and eligible GPUs."""
    oracle.forget_memos()
    shared = oracle._shared.get("nvidia", {})
    book = shared.get(nvidia.BOOK_KEY)
    if isinstance(book, nvidia.PlacementBook):
        book.answers.clear()
        book.steady.clear()
        book.size = book.steady_size = 0
    workload = shared.get(nvidia.WORKLOAD_KEY)
    if isinstance(workload, Workload):
        for table in workload._tables.values():  # one per set of GPU models of the mix's version
            table.measured.clear()
            table.deltas.clear()
    for record in oracle.nodes.values():
        state = record.states.get("nvidia")
        if isinstance(state, nvidia.NvidiaNodeState):
            state._content = state._free = state._plan = None
            state._eligible.clear()


def outcome(decision: Decision) -> tuple[object, ...]:
    return decision.scheduled, decision.node, decision.reason, decision.code


CHANGES = ("zone", "taint", "cpu", "cordon", "sick", "split", "dead", "remove", "delete")
operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.integers(0, len(SHAPES) * len(FLAVOURS) - 1)),
        st.tuples(st.sampled_from(CHANGES), st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
    ops=operations,
    count=st.sampled_from([5, 104]),
    percentage=st.sampled_from([0, 30]),
)
def test_nodes_changing_under_the_memos_get_the_decisions_of_an_engine_without_them(
    kinds: list[str], ops: list[tuple[str, int]], count: int, percentage: int
) -> None:
    memoized, oracle = engine(percentage), engine(percentage)
    both = (memoized, oracle)
    facts = {}
    for serial in range(count):
        fact = Facts(kinds[serial % len(kinds)], serial, serial % 2)
        facts[f"{fact.kind}-{serial}"] = fact
        for e in both:
            e.add_node(fact.node())
    live: list[str] = []
    dead: set[str] = set()
    for serial, (op, arg) in enumerate(ops, count):
        names = sorted(memoized.node_names())
        if arg % 2 and live:  # half the time a node a pod went to: the nodes a sampled cycle has seen change
            names = [memoized.pods[live[arg % len(live)]].node]
        if op == "place":
            request = pod(serial, arg % len(SHAPES), FLAVOURS[arg // len(SHAPES)])
            if arg % 5 == 0 and names:  # pinned to a node by name: its cycle reads that node's memos alone
                request = dataclasses.replace(request, node_selector={"kubernetes.io/hostname": names[0]})
            forget(oracle)
            if arg % 3 == 0:  # a pod waiting for its victims: its refusal is not explained
                decision, expected = memoized.schedule(request, explain=False), oracle.schedule(request)
                assert (decision.scheduled, decision.node) == (expected.scheduled, expected.node)
            else:
                decision = memoized.schedule(request)
                assert outcome(decision) == outcome(oracle.schedule(request))
            if decision.scheduled:
                live.append(request.key)
        elif op == "delete" and live:
            key = live.pop(arg % len(live))
            for e in both:
                e.release(key)
        elif op == "remove" and names:
            gone, _ = memoized.remove_node(names[arg % len(names)]), oracle.remove_node(names[arg % len(names)])
            live = [key for key in live if key not in gone]
        elif op == "dead" and names:
            dead ^= {names[arg % len(names)]}
            for e in both:
                e.set_node_live(names[arg % len(names)], names[arg % len(names)] not in dead)
        elif names and op in CHANGES:
            fact = facts[names[arg % len(names)]]
            if op == "zone":
                fact.zone = (fact.zone + 1) % 3
            elif op == "taint":
                fact.taint = (fact.taint + 1) % len(TAINTS)
            elif op == "cpu":
                fact.cpu = 2 if fact.cpu == 4 else 4
            elif op == "cordon":
                fact.cordoned = not fact.cordoned
            elif op == "sick":
                fact.sick = (fact.sick + 1) % 4
            elif op == "split":
                fact.split = 2 if fact.split == 4 else 4
            for e in both:
                e.add_node(fact.node())
            assert sorted(memoized.pods) == sorted(oracle.pods)
            live = [key for key in live if key in memoized.pods]  # a pod its node no longer fits is let go


def test_a_node_that_no_longer_offers_a_device_resource_leaves_its_capacity_index() -> None:
    """n0's Intel cards are gone (its GPU labels and allocatable removed, as when the GPU plugin is uninstalled) and
    it is tainted: it must leave the gpu.intel.com indexes, not stay there under its old class. Before, a card pod
    cycle walking the capacity order (here one that need not explain, as a pod waiting for its victims) met n0
    among the old class's candidates, settled its new class, and raised KeyError out of `Engine.schedule`, for every
    such pod; the pod is refused, and once n1 has cards it binds there."""
    from kubegpu.plugins.intel_gas import scheduler as gas

    i915, memory = "gpu.intel.com/i915", "gpu.intel.com/memory.max"
    subject = Engine(make_plugin_manager("scheduler", plugins=[("intel-gas", gas)], autoload=False))
    cards = {"labels": {"gpu.intel.com/gpu-numbers": "0"}, "allocatable": {i915: 4, memory: "8G"}}
    subject.add_node(make_node("n0", **cards))
    subject.add_node(make_node("n0", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]))
    subject.add_node(make_node("n1"))
    assert "n0" not in subject._index[i915]
    card_pod = make_pod("p", {"main": {i915: 1, memory: "2G"}})
    refused = subject.schedule(card_pod, explain=False)
    assert not refused.scheduled
    subject.add_node(make_node("n1", **cards))
    assert subject.schedule(card_pod, explain=False).node == "n1"
