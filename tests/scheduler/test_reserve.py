"""Deciding is not reserving, and Reserve/Unreserve are idempotent (the Kubernetes scheduler framework's contract).

`decide` answers where a pod should go and holds nothing; `reserve` holds its devices there; a retried `reserve` of
the same pod on the same node answers the same allocation and holds nothing more; `unreserve` gives back only what
this very pod (same UID) holds, so a front-end rolling back a failed Binding never frees a newer pod of the same name.
"""

from __future__ import annotations

import dataclasses

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine

from .test_properties import NODE_KINDS

KEY = b"k" * 32


def gpu_cluster(nodes: int = 2) -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    for i in range(nodes):
        engine.add_node(make_node(f"p3-{i}", **NODE_KINDS["p3"]))
    return engine


def test_deciding_holds_nothing_and_reserving_the_decided_node_holds_the_devices() -> None:
    engine = gpu_cluster()
    pod = make_pod("train", {"main": {"nvidia.com/gpu": 8}}, namespace="ns")
    decision = engine.decide(pod)
    assert decision.scheduled and decision.node == "p3-0" and decision.allocation is None
    assert engine.placement(pod.key) is None  # nothing held: the second pod may take the same node
    assert engine.decide(make_pod("other", {"main": {"nvidia.com/gpu": 8}}, namespace="ns")).node == "p3-0"
    reserved = engine.reserve(pod, decision.node)
    assert reserved.scheduled and reserved.allocation is not None
    assert engine.decide(make_pod("other", {"main": {"nvidia.com/gpu": 8}}, namespace="ns")).node == "p3-1"


def test_a_retried_reserve_answers_the_same_allocation_and_holds_nothing_more() -> None:
    engine = gpu_cluster(1)
    pod = make_pod("half", {"main": {"nvidia.com/gpu": 4}}, namespace="ns")
    first = engine.reserve(pod, "p3-0")
    again = engine.reserve(pod, "p3-0")
    assert first.scheduled and again == first
    assert engine.reserve(make_pod("rest", {"main": {"nvidia.com/gpu": 4}}, namespace="ns"), "p3-0").scheduled
    # Elsewhere it is still refused: the pod holds devices on p3-0.
    engine.add_node(make_node("p3-1", **NODE_KINDS["p3"]))
    assert not engine.reserve(pod, "p3-1").scheduled


def test_unreserve_gives_back_only_this_very_pods_reservation_and_only_once() -> None:
    engine = gpu_cluster(1)
    old = dataclasses.replace(make_pod("job", {"main": {"nvidia.com/gpu": 8}}, namespace="ns"), uid="uid-old")
    new = dataclasses.replace(old, uid="uid-new")  # deleted and created again under the same name
    assert engine.reserve(new, "p3-0").scheduled
    assert not engine.unreserve(old, "p3-0")  # a stale rollback frees nothing
    assert not engine.unreserve(new, "p3-1")  # nor one naming another node
    assert engine.placement(new.key) is not None
    assert engine.unreserve(new, "p3-0")
    assert not engine.unreserve(new, "p3-0")  # idempotent
    assert engine.placement(new.key) is None
    assert engine.reserve(old, "p3-0").scheduled  # the devices are free again
