"""Every memo of the engine is a cache and nothing more: an engine that forgets them all before each question answers
alike (`EngineState.forget_memos` names each memo, its key and what invalidates it, in one place).

Two engines take the same random story of nodes coming, changing and going, pods placed (with and without devices,
with required anti-affinity and spread constraints, so the cluster-wide and class-wide memos are exercised), pods
released, nodes cordoned and nominated, preemptions asked; one keeps its memos, the other, the oracle, forgets them
before every question. Every answer (a cycle's decision, each node's filter status, the extender's score, a
preemption) must be the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.models import (
    LabelSelector,
    PodAffinityTerm,
    PodRequest,
    Requirement,
    SpreadConstraint,
    Taint,
    Toleration,
)
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.intel_gas import scheduler as intel
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler import scores
from kubegpu.scheduler.engine import Decision, Engine

from .test_properties import NODE_KINDS, SHAPES

ZONES = ("a", "b")
APP = LabelSelector((Requirement("app", "In", ("web",)),))
# A pod's flavour beside its device shape: none, required anti-affinity per node, a hard spread over zones; a hard
# spread over hosts honouring taints (1.33's nodeTaintsPolicy, with minDomains), by a pod tolerating the taint some
# nodes carry or not (the spread memo's key holds the tolerations only then).
FLAVOURS = ("plain", "anti", "spread", "cpu", "taints", "tolerant")
TAINT = Taint("example.com/dedicated", None, "NoSchedule")


def engine() -> Engine:
    pm = make_plugin_manager(
        "scheduler", plugins=[("neuron", neuron), ("intel-gas", intel), ("nvidia", nvidia)], autoload=False
    )
    return Engine(pm)


# Small nodes, so that a short story fills some of them (a memo kept past a change shows only then).
NEURON = {
    "trn1": {"aws.amazon.com/neurondevice": "16", "aws.amazon.com/neuroncore": "32"},
    "inf2": {"aws.amazon.com/neurondevice": "6", "aws.amazon.com/neuroncore": "12"},
}


def node(kind: str, serial: int, cordoned: bool = False) -> Any:
    name = f"{kind}-{serial}"
    spec = NODE_KINDS[kind]
    labels = {
        **spec.get("labels", {}),
        "topology.kubernetes.io/zone": ZONES[serial % 2],
        "kubernetes.io/hostname": name,
    }
    allocatable = {**spec.get("allocatable", {}), **NEURON.get(kind, {}), "pods": "6"}
    info = make_node(name, labels=labels, allocatable=allocatable, cpu="3")
    return dataclasses.replace(info, unschedulable=cordoned, taints=(TAINT,) if serial % 3 == 2 else ())


def pod(serial: int, shape: int, flavour: str) -> PodRequest:
    resources = {"cpu": "1"} if flavour == "cpu" else SHAPES[shape]
    request = make_pod(f"p{serial}", {"main": resources}, namespace="ns")
    request = dataclasses.replace(request, labels={"app": "web"}, uid=f"uid-{serial}")
    if flavour == "anti":
        term = PodAffinityTerm(APP, frozenset({"ns"}), "kubernetes.io/hostname")
        request = dataclasses.replace(request, pod_anti_affinity=(term,))
    elif flavour == "spread":
        request = dataclasses.replace(
            request, spread=(SpreadConstraint(1, "topology.kubernetes.io/zone", "DoNotSchedule", APP),)
        )
    elif flavour in ("taints", "tolerant"):
        constraint = SpreadConstraint(1, "kubernetes.io/hostname", "DoNotSchedule", APP, 3, "Honor", "Honor")
        tolerations = (Toleration(TAINT.key, "Exists"),) if flavour == "tolerant" else ()
        request = dataclasses.replace(request, spread=(constraint,), tolerations=tolerations)
    return request


def outcome(decision: Decision) -> tuple[object, ...]:
    return decision.scheduled, decision.node, decision.reason, decision.code


operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.integers(0, len(SHAPES) - 1), st.sampled_from(FLAVOURS)),
        st.tuples(st.just("ask"), st.integers(0, len(SHAPES) - 1), st.sampled_from(FLAVOURS)),
        st.tuples(st.just("again"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("copy"), st.integers(0, 1000), st.sampled_from(("", "tolerations", "labels"))),
        st.tuples(st.just("delete"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("add-node"), st.integers(0, len(NODE_KINDS) - 1), st.just("")),
        st.tuples(st.just("remove-node"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("cordon"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("nominate"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("preempt"), st.integers(0, 1000), st.sampled_from(FLAVOURS)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(sorted(NODE_KINDS)), min_size=1, max_size=6), ops=operations)
def test_an_engine_that_forgets_its_memos_answers_alike(kinds: list[str], ops: list[tuple[str, int, str]]) -> None:
    memoized, oracle = engine(), engine()
    both = (memoized, oracle)
    cordoned: dict[str, bool] = {}
    for serial, kind in enumerate(kinds):
        for e in both:
            e.add_node(node(kind, serial))
        cordoned[f"{kind}-{serial}"] = False
    live: list[str] = []
    asked: list[PodRequest] = []  # the same request object asked again, as the extender asks in filter and bind
    preemptors: list[PodRequest] = []
    for serial, (op, arg, flavour) in enumerate(ops, len(kinds)):
        names = sorted(memoized.node_names())
        if op in ("place", "ask", "again", "copy"):
            if op in ("again", "copy") and not asked:
                continue
            if op == "copy":  # a renamed copy, as a trace replays one: its plan is the original's (`_plans_alike`)
                original = asked[arg % len(asked)]
                request = dataclasses.replace(original, name=f"p{serial}", uid=f"uid-{serial}")
                if flavour == "tolerations":  # its containers shared, but not its tolerations: a plan of its own
                    tolerations = () if original.tolerations else (Toleration(TAINT.key, "Exists"),)
                    request = dataclasses.replace(request, tolerations=tolerations)
                elif flavour == "labels":  # nor its labels, which the anti-affinity and spread terms select by
                    request = dataclasses.replace(request, labels={"app": "other"})
            else:
                request = asked[arg % len(asked)] if op == "again" else pod(serial, arg, flavour)
            asked.append(request)
            oracle.forget_memos()
            assert memoized.filter_nodes(request, names) == oracle.filter_nodes(request, names)
            if op not in ("place", "copy") or request.key in live:
                continue
            oracle.forget_memos()
            decision = memoized.schedule(request)
            assert outcome(decision) == outcome(oracle.schedule(request))
            if decision.scheduled:
                live.append(request.key)
                scored = [n for n in names if memoized.filter_node(n, request).ok]
                oracle.forget_memos()
                assert [memoized.score_node(n, request) for n in scored] == [
                    oracle.score_node(n, request) for n in scored
                ]
        elif op == "delete" and live:
            key = live.pop(arg % len(live))
            for e in both:
                e.release(key)
        elif op == "add-node":
            kind = sorted(NODE_KINDS)[arg]
            for e in both:
                e.add_node(node(kind, serial))
            cordoned[f"{kind}-{serial}"] = False
        elif op == "remove-node" and names:
            name = names[arg % len(names)]
            gone, _ = memoized.remove_node(name), oracle.remove_node(name)
            live = [key for key in live if key not in gone]
        elif op == "cordon" and names:
            name = names[arg % len(names)]
            cordoned[name] = not cordoned[name]
            kind, number = name.rsplit("-", 1)
            for e in both:
                e.add_node(node(kind, int(number), cordoned[name]))
        elif op == "preempt":
            # A preemption's dry runs are remembered per node and pod shape: half the time, one asked before again.
            if preemptors and arg % 2:
                request = preemptors[arg % len(preemptors)]
            else:
                request = dataclasses.replace(pod(serial, arg % len(SHAPES), flavour), priority=1000)
                preemptors.append(request)
            oracle.forget_memos()
            assert memoized.preempt(request) == oracle.preempt(request)
        elif op == "nominate" and names:
            preemptor = pod(10_000 + serial, 0, "plain")
            for e in both:
                e.nominate(dataclasses.replace(preemptor, priority=1000), names[arg % len(names)])
    for shape in range(len(SHAPES)):
        for flavour in FLAVOURS:
            request = pod(20_000 + shape, shape, flavour)
            names = sorted(memoized.node_names())
            oracle.forget_memos()
            assert memoized.filter_nodes(request, names) == oracle.filter_nodes(request, names)


# A cluster past kube-scheduler's 100 nodes, so that every cycle scores a sample of it (`Cycle._schedule_sampled`):
# the memos a sampled cycle reads (`Passing`, `LocalRaws`, the cluster-wide filters' `Refused` nodes and
# `nodes_by_value`) are held against an engine that forgets them before each question.
BIG = 104
SAMPLED = ("plain", "anti", "spread", "cpu", "tolerant", "soft")


def sampled_pod(serial: int, shape: int, flavour: str) -> PodRequest:
    if flavour != "soft":
        return pod(serial, shape, flavour)
    # Scored by the cluster-wide score plugins: preferred affinity to its own app's zone, a soft spread over hosts.
    request = pod(serial, shape, "cpu")
    term = PodAffinityTerm(APP, frozenset({"ns"}), "topology.kubernetes.io/zone")
    soft = SpreadConstraint(1, "kubernetes.io/hostname", "ScheduleAnyway", APP)
    return dataclasses.replace(request, preferred_affinity=((50, term),), spread=(soft,))


def sampled_engine() -> Engine:
    pm = make_plugin_manager(
        "scheduler", plugins=[("neuron", neuron), ("intel-gas", intel), ("nvidia", nvidia)], autoload=False
    )
    return Engine(pm, scoring=scores.Profile(percentage_of_nodes_to_score=30))


sampled_operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.integers(0, len(SHAPES) - 1), st.sampled_from(SAMPLED)),
        st.tuples(st.just("delete"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("cordon"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("nominate"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("dead"), st.integers(0, 1000), st.just("")),
        st.tuples(st.just("remove-node"), st.integers(0, 1000), st.just("")),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(sorted(NODE_KINDS)), min_size=1, max_size=4), ops=sampled_operations)
def test_a_sampled_cycle_decides_as_an_engine_that_forgets_its_memos(
    kinds: list[str], ops: list[tuple[str, int, str]]
) -> None:
    memoized, oracle = sampled_engine(), sampled_engine()
    both = (memoized, oracle)
    cordoned: dict[str, bool] = {}
    for serial in range(BIG):
        kind = kinds[serial % len(kinds)]
        for e in both:
            e.add_node(node(kind, serial))
        cordoned[f"{kind}-{serial}"] = False
    live: list[str] = []
    dead: set[str] = set()
    for serial, (op, arg, flavour) in enumerate(ops, BIG):
        names = sorted(memoized.node_names())
        if arg % 2 and live:  # half the time a node a pod went to: the nodes a sampled cycle has seen change
            names = [memoized.pods[live[arg % len(live)]].node]
        if op == "place":
            request = sampled_pod(serial, arg, flavour)
            oracle.forget_memos()
            decision = memoized.schedule(request)
            assert outcome(decision) == outcome(oracle.schedule(request))
            if decision.scheduled:
                live.append(request.key)
        elif op == "delete" and live:
            key = live.pop(arg % len(live))
            for e in both:
                e.release(key)
        elif op == "remove-node" and names:
            name = names[arg % len(names)]
            gone, _ = memoized.remove_node(name), oracle.remove_node(name)
            live = [key for key in live if key not in gone]
        elif op == "cordon" and names:
            name = names[arg % len(names)]
            cordoned[name] = not cordoned[name]
            kind, number = name.rsplit("-", 1)
            for e in both:
                e.add_node(node(kind, int(number), cordoned[name]))
        elif op == "dead" and names:
            name = names[arg % len(names)]
            dead ^= {name}
            for e in both:
                e.set_node_live(name, name not in dead)
        elif op == "nominate" and names:
            preemptor = pod(10_000 + serial, 0, "plain")
            for e in both:
                e.nominate(dataclasses.replace(preemptor, priority=1000), names[arg % len(names)])
