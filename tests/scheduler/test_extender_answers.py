"""The extender remembers its filter and prioritize answers per pod shape and redoes only the nodes the engine
reports as changed. Whatever happens between two calls (pods placed or deleted, nodes added, replaced or removed),
its answers must equal those of an extender that remembers nothing, asking the engine afresh."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.core.manifests import pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, node_manifest, pod_manifest
from kubegpu.plugins.intel_gas import scheduler as intel
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.engine import cache as engine_cache
from kubegpu.scheduler.extender import UNKNOWN_NODE, ExtenderServer

from .test_properties import NODE_KINDS, SHAPES

KEY = b"k" * 32


def make_extender(engine: Engine) -> ExtenderServer:
    # filter and prioritize touch only the engine and the mirror's lock; no API client is needed.
    return ExtenderServer(engine, None, None)  # type: ignore[arg-type]


def body(pod: dict[str, Any], names: list[str]) -> bytes:
    return orjson.dumps({"Pod": pod, "NodeNames": names})


def answers(extender: ExtenderServer, pod: dict[str, Any], names: list[str]) -> tuple[Any, Any]:
    filtered = extender.filter(body(pod, names))
    scores = orjson.loads(orjson.dumps(extender.prioritize(body(pod, names))))
    return filtered, scores


def fresh_answers(engine: Engine, pod: dict[str, Any], names: list[str]) -> tuple[Any, Any]:
    for record in engine.nodes.values():  # no memo at all: every node is asked again
        record.last_check, record.last_score = {}, None
    return answers(make_extender(engine), pod, names)


def shaped_pod(serial: int, shape: int) -> dict[str, Any]:
    manifest = pod_manifest(f"p{serial}", {"main": SHAPES[shape]}, namespace="ns")
    manifest["metadata"].update(uid=f"uid-{serial}", resourceVersion=str(serial))
    return manifest


operations = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.integers(0, len(SHAPES) - 1)),
        st.tuples(st.just("place"), st.integers(0, len(SHAPES) - 1)),
        st.tuples(st.just("delete"), st.integers(0, 1000)),
        st.tuples(st.just("add-node"), st.sampled_from(sorted(NODE_KINDS))),
        st.tuples(st.just("remove-node"), st.integers(0, 1000)),
        st.tuples(st.just("cordon"), st.integers(0, 1000)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(sorted(NODE_KINDS)), min_size=1, max_size=5), ops=operations)
def test_remembered_answers_equal_fresh_ones(kinds: list[str], ops: list[tuple[str, Any]]) -> None:
    pm = make_plugin_manager(
        "scheduler", plugins=[("neuron", neuron), ("intel-gas", intel), ("nvidia", nvidia)], autoload=False
    )
    engine = Engine(pm, signing_key=KEY)
    for i, kind in enumerate(kinds):
        engine.add_node(make_node(f"{kind}-{i}", **NODE_KINDS[kind]))
    extender = make_extender(engine)
    live: list[str] = []
    for serial, (op, arg) in enumerate(ops):
        names = [*engine.nodes, "ghost-node"]
        if op == "ask":
            pod = shaped_pod(serial, arg)
            assert answers(extender, pod, names) == fresh_answers(engine, pod, names)
        elif op == "place":
            pod = shaped_pod(serial, arg)
            filtered, scores = answers(extender, pod, names)
            assert (filtered, scores) == fresh_answers(engine, pod, names)
            if filtered["NodeNames"]:
                # kube-scheduler's choice: the highest score, a host missing from the list counting as 0.
                given = {s["Host"]: s["Score"] for s in scores}
                assert 0 not in given.values() and set(given) <= set(filtered["NodeNames"])
                best = max(filtered["NodeNames"], key=lambda name: given.get(name, 0))
                assert engine.reserve(pod_request(pod)[0], best).scheduled
                live.append(f"ns/p{serial}")
        elif op == "delete" and live:
            engine.release(live.pop(arg % len(live)))
        elif op == "add-node":
            engine.add_node(make_node(f"{arg}-{serial}", **NODE_KINDS[arg]))
        elif op == "remove-node" and engine.nodes:
            gone = engine.remove_node(sorted(engine.nodes)[arg % len(engine.nodes)])
            live = [key for key in live if key not in gone]
        elif op == "cordon" and engine.nodes:
            record = engine.nodes[sorted(engine.nodes)[arg % len(engine.nodes)]]
            engine.add_node(dataclasses.replace(record.info, unschedulable=not record.info.unschedulable))
    # And after everything, every shape once more.
    names = [*engine.nodes, "ghost-node"]
    for shape in range(len(SHAPES)):
        pod = shaped_pod(10_000 + shape, shape)
        assert answers(extender, pod, names) == fresh_answers(engine, pod, names)


def test_a_full_node_leaves_the_remembered_answer() -> None:
    """The case kube-scheduler produces all day: the same shape asked again after a bind filled a node."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    gpu = NODE_KINDS["p3"]
    for i in range(3):
        engine.add_node(make_node(f"p3-{i}", **gpu))
    extender = make_extender(engine)
    names = ["p3-0", "p3-1", "p3-2"]
    pod = shaped_pod(1, SHAPES.index({"nvidia.com/gpu": 4}))
    assert extender.filter(body(pod, names))["NodeNames"] == names
    for serial in (2, 3):
        assert engine.reserve(pod_request(shaped_pod(serial, SHAPES.index({"nvidia.com/gpu": 4})))[0], "p3-1").scheduled
    filtered = extender.filter(body(pod, names))
    assert filtered["NodeNames"] == ["p3-0", "p3-2"]
    assert filtered["FailedNodes"] == {"p3-1": "Insufficient nvidia.com/gpu"}
    scores = {s["Host"]: s["Score"] for s in orjson.loads(orjson.dumps(extender.prioritize(body(pod, names))))}
    assert "p3-1" not in scores  # a 0 is left out: kube-scheduler counts a missing host as 0


def test_the_change_log_forgets_old_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_cache, "MAX_CHANGES", 8)
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    engine.add_node(make_node("a", **NODE_KINDS["p3"]))
    start = engine.generation
    engine.add_node(make_node("b", **NODE_KINDS["p3"]))
    assert engine.changed_since(start) == {"b"}
    assert engine.changed_since(engine.generation) == set()
    for i in range(20):
        engine.add_node(make_node(f"n{i}", **NODE_KINDS["p3"]))
    assert engine.changed_since(start) is None  # too long ago: the caller must start over
    assert engine.changed_since(engine.generation - 1) == {"n19"}


def test_the_informers_parse_of_a_pending_pod_is_used_only_at_the_same_version() -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    engine.add_node(make_node("p3-0", **NODE_KINDS["p3"]))
    extender = make_extender(engine)
    two = shaped_pod(1, SHAPES.index({"nvidia.com/gpu": 2}))
    # The informer saw this pod at version 1 asking for 16 GPUs (more than any node has).
    sixteen = pod_manifest("p1", {"main": {"nvidia.com/gpu": 16}}, namespace="ns")
    sixteen["metadata"].update(uid="uid-1", resourceVersion="1")
    extender.unbound.pods["ns/p1"] = ("1", pod_request(sixteen)[0])
    # Same UID and version: the informer's parse stands for the document (they are the same object in a cluster).
    assert extender.filter(body(two, ["p3-0"]))["NodeNames"] == []
    # A newer version of the pod than the informer's: the document is read.
    two["metadata"]["resourceVersion"] = "2"
    assert extender.filter(body(two, ["p3-0"]))["NodeNames"] == ["p3-0"]


def gpu_engine(nodes: int) -> Engine:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    for i in range(nodes):
        engine.add_node(make_node(f"p3-{i}", **NODE_KINDS["p3"]))
    return engine


def test_nodes_a_caller_invents_are_refused_and_never_reach_the_engine() -> None:
    """Finding 3 of issue 10: a full `Nodes` list added the nodes kubegpu's informer did not know to the engine, for
    good (an invented node could then be bound to). Only the informer adds nodes; the caller's copies are refused."""
    engine = gpu_engine(1)
    extender = make_extender(engine)
    pod = shaped_pod(1, SHAPES.index({"nvidia.com/gpu": 4}))
    known = node_manifest("p3-0", **NODE_KINDS["p3"])  # type: ignore[arg-type]
    invented = node_manifest("invented", **NODE_KINDS["p3"])  # type: ignore[arg-type]
    args = orjson.dumps({"Pod": pod, "Nodes": {"items": [known, invented]}})
    filtered = extender.filter(args)
    assert [item["metadata"]["name"] for item in filtered["Nodes"]["items"]] == ["p3-0"]
    assert filtered["FailedNodes"] == {"invented": UNKNOWN_NODE}
    assert filtered["FailedAndUnresolvableNodes"] == {"invented": UNKNOWN_NODE}
    assert "invented" not in {s["Host"] for s in orjson.loads(orjson.dumps(extender.prioritize(args)))}
    assert set(engine.nodes) == {"p3-0"}


def test_remembered_answers_hold_only_nodes_the_engine_knows() -> None:
    """Finding 5 of issue 10: every name a caller sent stayed in the per-shape answers, so a caller could grow them
    without bound. Unknown names are answered afresh each time and never kept."""
    engine = gpu_engine(3)
    extender = make_extender(engine)
    for serial, shape in enumerate(range(len(SHAPES))):
        names = ["p3-0", "p3-1", "p3-2", *(f"ghost-{serial}-{i}" for i in range(500))]
        filtered = extender.filter(body(shaped_pod(serial, shape), names))
        assert all(filtered["FailedNodes"][f"ghost-{serial}-{i}"] == UNKNOWN_NODE for i in range(500))
        extender.prioritize(body(shaped_pod(serial, shape), names))
    engine.remove_node("p3-2")
    extender.filter(body(shaped_pod(99, 0), ["p3-0", "p3-1", "p3-2"]))
    for answers_of_shape in extender._answers.values():
        remembered = (
            answers_of_shape.passing
            | answers_of_shape.failing.keys()
            | answers_of_shape.unresolvable
            | answers_of_shape.scored.keys()
            | answers_of_shape.unscored
        )
        assert remembered <= set(engine.nodes), remembered - set(engine.nodes)


def test_settling_a_node_class_answers_as_each_node_would_alone() -> None:
    """`Engine.filter_nodes` asks one node of a class that cannot take the pod and answers for the others; each
    answer equals the node's own (`filter_node` on a fresh engine), and only nodes of that class are settled."""
    names = [f"trn1-{i}" for i in range(3)] + [f"inf2-{i}" for i in range(2)]

    def cluster() -> Engine:
        engine = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False), signing_key=KEY)
        for name in names:
            engine.add_node(make_node(name, **NODE_KINDS[name.split("-")[0]]))
        return engine

    engine = cluster()
    seven = pod_request(pod_manifest("p", {"main": {"aws.amazon.com/neurondevice": 7}}, namespace="ns"))[0]
    asked: list[str] = []
    check = engine.check

    def counted(record: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(record.name)
        return check(record, *args, **kwargs)

    engine.check = counted  # type: ignore[method-assign]
    settled = engine.filter_nodes(seven, names)
    engine.check = check  # type: ignore[method-assign]
    fresh = cluster()  # the oracle: each node asked on its own, nothing remembered
    alone = {name: fresh.filter_node(name, seven) for name in names}
    assert {n: (s.code, s.message) for n, s in settled.items()} == {n: (s.code, s.message) for n, s in alone.items()}
    assert asked.count("trn1-0") == 1 and "trn1-1" not in asked and "trn1-2" not in asked, asked
