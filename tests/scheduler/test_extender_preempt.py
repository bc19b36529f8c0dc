"""The extender's `/preempt` answers from the engine's own victim choice (`Engine.complete_victims`).

kube-scheduler proposes, per node, the victims that satisfy its own filters; kubegpu keeps a node only where those
victims, or those plus the engine's choice, leave a valid device set, and never names a pod of equal or higher
priority.
"""

from __future__ import annotations

from typing import Any

import orjson

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, node_manifest
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import ExtenderServer

from . import toy_plugin as toy
from .test_preemption import DEVICE, pod, pod_doc, trn1

KEY = b"k" * 32


def extender(*nodes: str) -> tuple[Engine, ExtenderServer]:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    for name in nodes:
        engine.add_node(node_info(trn1(name)))
    return engine, ExtenderServer(engine, None, None)  # type: ignore[arg-type]


def place(engine: Engine, name: str, devices: int, priority: int, node: str) -> str:
    request = pod(name, devices, priority, uid=f"uid-{name}")
    assert engine.reserve(request, node).scheduled
    return request.uid


def preempt(server: ExtenderServer, preemptor: dict[str, Any], proposals: dict[str, list[str]]) -> dict[str, Any]:
    body = {
        "Pod": preemptor,
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0} for node, uids in proposals.items()
        },
    }
    answer: dict[str, Any] = server.preempt(orjson.dumps(body))["NodeNameToMetaVictims"]
    return {node: sorted(p["UID"] for p in victims["Pods"]) for node, victims in answer.items()}


def test_victims_that_free_a_valid_set_are_kept_as_proposed() -> None:
    engine, server = extender("trn-0")
    uids = [place(engine, f"low-{i}", 4, 0, "trn-0") for i in range(4)]
    big = pod_doc("big", 16, priority=1000, uid="uid-big")
    assert preempt(server, big, {"trn-0": uids}) == {"trn-0": sorted(uids)}


def test_too_few_victims_give_way_to_the_engines_choice() -> None:
    """kube-scheduler counts devices, not sets: evicting one 4-device holder frees four devices, but an 8-device
    pod on a torus needs a whole half, so the engine answers the holders of one half."""
    engine, server = extender("trn-0")
    uids = [place(engine, f"low-{i}", 4, 0, "trn-0") for i in range(4)]
    eight = pod_doc("eight", 8, priority=1000, uid="uid-eight")
    answer = preempt(server, eight, {"trn-0": [uids[3]]})
    assert len(answer["trn-0"]) == 2 and uids[3] in answer["trn-0"]


def test_a_node_where_only_equal_or_higher_priority_pods_would_do_is_dropped() -> None:
    engine, server = extender("trn-0", "trn-1")
    place(engine, "vip", 16, 2000, "trn-0")
    low = place(engine, "low", 16, 0, "trn-1")
    big = pod_doc("big", 16, priority=1000, uid="uid-big")
    assert preempt(server, big, {"trn-0": [], "trn-1": [low]}) == {"trn-1": [low]}


def test_a_pod_its_plugin_refuses_before_any_node_gets_no_victims() -> None:
    """kube-scheduler before 1.21 reads no `FailedAndUnresolvableNodes`: a pod whose every node `/filter` refused as
    unresolvable (the plugin's PreFilter, `kubegpu_scheduler_validate`) still goes to preemption, and proposes
    victims wherever its own filters would pass. `/preempt` answers as `/filter` did: no node, so nobody is evicted
    for a pod that is refused again after. Before, a plugin whose fit does not repeat its PreFilter's refusal (as a
    third-party plugin's need not) had the proposal kept, and the low-priority pod was evicted for nothing."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("toy", toy)], autoload=False))
    engine.add_node(make_node("n", labels={"toy.example/cards": "1"}, allocatable={toy.RESOURCE: 1}))
    server = ExtenderServer(engine, None, None)  # type: ignore[arg-type]

    def card_pod(name: str, priority: int, **annotations: str) -> dict[str, Any]:
        container = {"name": "main", "resources": {"limits": {toy.RESOURCE: "1"}}}
        metadata = {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations}
        return {"kind": "Pod", "metadata": metadata, "spec": {"priority": priority, "containers": [container]}}

    assert engine.reserve(pod_request(card_pod("low", 0))[0], "n").scheduled
    refused = card_pod("refused", 1000, **{"toy.example/refuse": "yes"})
    answer = server.filter(orjson.dumps({"Pod": refused, "NodeNames": ["n"]}))
    assert answer["NodeNames"] == [] and "marked refuse" in answer["FailedAndUnresolvableNodes"]["n"]
    assert preempt(server, refused, {"n": ["uid-low"]}) == {}


def test_a_pod_proposed_for_cpu_on_a_gpu_the_preemptor_will_not_get_is_not_evicted() -> None:
    """kube-scheduler counts a GPU share as one of the node's `nvidia.com/gpu` (the share resources are
    `ignoredByScheduler`), so it proposes only the pod whose eviction frees the CPU the preemptor lacks: `x`, the
    lowest priority, whose 30 % share is on GPU 0, where the 50 % preemptor still would not fit. The engine's choice,
    `y` and `z` on GPU 1, frees the GPU and the CPU. Before, `x` was answered with them and evicted for nothing."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    gpu, cores, memory = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"
    labels = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "16384"}
    engine.add_node(make_node("n", labels=labels, allocatable={"cpu": 8, gpu: 20, cores: 200, memory: 200}))
    server = ExtenderServer(engine, None, None)  # type: ignore[arg-type]

    def share(name: str, percent: int, cpu: int, priority: int) -> dict[str, Any]:
        resources = {"limits": {gpu: "1", cores: str(percent), memory: str(percent)}, "requests": {"cpu": str(cpu)}}
        metadata = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
        return {
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"priority": priority, "containers": [{"name": "main", "resources": resources}]},
        }

    # GPU 0: a (60 %, priority 10) and x (30 %, priority 1); GPU 1: y, z and c (30 % each); CPU: 6 of 8 used
    for name, percent, cpu, priority, on in (
        ("a", 60, 1, 10, "0"),
        ("x", 30, 2, 1, "0"),
        ("y", 30, 1, 2, "1"),
        ("z", 30, 1, 3, "1"),
        ("c", 30, 1, 10, "1"),
    ):
        decision = engine.schedule(pod_request(share(name, percent, cpu, priority))[0])
        assert decision.allocation is not None and decision.allocation.containers["main"][gpu] == [on]
    urgent = share("urgent", 50, 3, 1000)
    assert preempt(server, urgent, {"n": ["uid-x"]}) == {"n": ["uid-y", "uid-z"]}
    for victim in ("y", "z"):
        assert engine.release(f"default/{victim}") is not None
    placed = engine.schedule(pod_request(urgent)[0])
    assert placed.allocation is not None and placed.allocation.containers["main"][gpu] == ["1"]


def test_the_share_a_preemption_freed_is_kept_for_the_pod_kube_scheduler_nominated() -> None:
    """Behind kube-scheduler the share resources are `ignoredByScheduler`, so its own filters, which count the
    nominated preemptor, let a batch share of lower priority through to the node whose victims just left; `/filter`
    let it on too, the 50 % the victims freed went to the batch pod, and the inference pod preempted again. Now
    the node is held for the nominated pod (its `status.nominatedNodeName`) until it binds, leaves, or the
    nomination is cleared, as kube-scheduler holds it for the resources it counts."""
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    gpu, cores, memory = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage"
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    engine.add_node(node_info(node_manifest("g", labels=labels, allocatable={gpu: 10, cores: 100, memory: 100})))
    server = ExtenderServer(engine, None, None)  # type: ignore[arg-type]
    server.mirror.on_pods("SYNC", [])

    def share(name: str, percent: int, priority: int, nominated: str | None = None) -> dict[str, Any]:
        container = {"name": "main", "resources": {"limits": {gpu: "1", cores: str(percent), memory: str(percent)}}}
        metadata = {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"}
        status = {"nominatedNodeName": nominated} if nominated else {}
        spec = {"priority": priority, "containers": [container]}
        return {"kind": "Pod", "metadata": metadata, "spec": spec, "status": status}

    def passes(pod: dict[str, Any]) -> bool:
        answer = server.filter(orjson.dumps({"Pod": pod, "NodeNames": ["g"]}))
        return bool(answer["NodeNames"] == ["g"])

    for i in range(3):
        assert engine.reserve(pod_request(share(f"b{i}", 30, i))[0], "g").scheduled
    infer, batch = share("infer", 50, 1000), share("batch", 40, 500)
    assert preempt(server, infer, {"g": []}) == {"g": ["uid-b0", "uid-b1"]}
    server.mirror.on_pods("ADDED", infer)
    for victim in ("b0", "b1"):
        assert engine.release(f"default/{victim}") is not None
    assert passes(batch)  # not nominated yet: the freed room is anyone's
    server.mirror.on_pods("MODIFIED", share("infer", 50, 1000, nominated="g"))  # kube-scheduler nominates it
    refused = server.filter(orjson.dumps({"Pod": batch, "NodeNames": ["g"]}))
    assert refused["NodeNames"] == [] and "nominated for a pending pod" in refused["FailedNodes"]["g"]
    assert passes(infer) and passes(share("vip", 40, 2000))  # the preemptor, and a pod above it, still pass
    server.mirror.on_pods("MODIFIED", share("infer", 50, 1000))  # the nomination cleared
    assert passes(batch)
    server.mirror.on_pods("MODIFIED", share("infer", 50, 1000, nominated="g"))
    assert not passes(batch)
    twin = share("twin", 50, 1000)  # the preemptor's shape and priority, not nominated: answers are per pod here
    assert not passes(twin) and passes(infer) and not passes(twin)
    server.mirror.on_pods("DELETED", share("infer", 50, 1000, nominated="g"))  # the preemptor gave up
    assert passes(batch)


def test_filter_lets_a_pod_beside_the_pod_kube_scheduler_nominated_once_its_victim_is_terminating() -> None:
    """A trn1 whose rows 0..2 each hold one device of a pod of priority 500 and row 3 one of `v` (priority 0).
    kube-scheduler preempted `v` for a 4-device pod and nominated it: while `v` runs, the pod can only have row 3
    once `v` is gone, and `/filter` keeps a 1-device pod of lower priority off (it would not know where the nominee
    goes). Once `v` is terminating (its deletionTimestamp, seen by the informer), the nominee's row is known to
    free up, and the 1-device pod passes: it is given a device of rows 0..2, beside the nominee."""
    engine, server = extender("trn-0")
    server.mirror.on_pods("SYNC", [])
    for name, priority in [
        ("x", 500),
        *[(f"f{i}", 0) for i in range(3)],
        ("y", 500),
        *[(f"g{i}", 0) for i in range(3)],
    ]:
        place(engine, name, 1, priority, "trn-0")
    for name, priority in [("z", 500), *[(f"h{i}", 0) for i in range(3)], ("v", 0)]:
        place(engine, name, 1, priority, "trn-0")
    for name in [f"{row}{i}" for row in "fgh" for i in range(3)]:
        assert engine.release(f"default/{name}") is not None
    assert engine.placement("default/v") is not None

    def passes(doc: dict[str, Any]) -> bool:
        answer = server.filter(orjson.dumps({"Pod": doc, "NodeNames": ["trn-0"]}))
        return bool(answer["NodeNames"] == ["trn-0"])

    small = pod_doc("small", 1, priority=10, uid="uid-small")
    assert passes(small)
    server.mirror.on_pods("ADDED", {**pod_doc("big", 4, priority=1000, uid="uid-big"), "status": {}})
    nominated = {**pod_doc("big", 4, priority=1000, uid="uid-big"), "status": {"nominatedNodeName": "trn-0"}}
    server.mirror.on_pods("MODIFIED", nominated)
    refused = server.filter(orjson.dumps({"Pod": small, "NodeNames": ["trn-0"]}))
    assert "nominated for a pending pod" in refused["FailedNodes"]["trn-0"]
    victim = pod_doc("v", 1, priority=0, uid="uid-v", deletionTimestamp="2026-01-01T00:00:00Z")
    victim["spec"]["nodeName"] = "trn-0"
    server.mirror.on_pods("MODIFIED", victim)  # kube-scheduler deleted it: terminating
    assert passes(small)
    decision = engine.reserve(pod("small", 1, 10, uid="uid-small"), "trn-0")  # the bind verb's re-check
    assert decision.allocation is not None and int(decision.allocation.containers["main"][DEVICE][0]) < 12
