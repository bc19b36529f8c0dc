"""A node held for a nominated preemptor keeps only the room the preemptor needs (`Filtering._nominee_refusal`).

While a preemptor waits for its victims' grace period (a training job checkpointing for minutes), a pod of equal or
lower priority lands beside it where it leaves the preemptor a valid place once the victims are gone: kube-scheduler's
second filter pass with the nominee counted as running, and, for devices, the plugin's own books: the set the pod
would be given must not be the one the preemptor needs (a torus block, a ring window, a GPU with room for a share,
an 80 GiB GPU). A pod refused for it is told that the node is held for a preemptor and what it would lack.
"""

from __future__ import annotations

import dataclasses

import pytest

from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, node_manifest
from kubegpu.plugins.neuron import scheduler as neuron
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.podgroups import HOSTNAME

from .test_preemption import DEVICE, trn1
from .test_preemption import pod as neuron_pod

GPU = "nvidia.com/gpu"
HELD = "nominated for a pending pod of equal or higher priority"


def short_of(resource: str) -> str:
    return f"would not have {resource} left for it beside this pod"


def neuron_engine(*, ring: bool) -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    e.add_node(node_info(node_manifest("n", allocatable={DEVICE: 16}) if ring else trn1("n")))
    return e


def place(e: Engine, *pods: tuple[str, int, int]) -> None:
    for name, devices, priority in pods:
        decision = e.schedule(neuron_pod(name, devices, priority))
        assert decision.scheduled, (name, decision.reason)


def devices_of(e: Engine, name: str, resource: str = DEVICE) -> list[str]:
    allocation = e.pods[f"default/{name}"].allocation
    assert allocation is not None
    return allocation.containers["main"][resource]


def preempt_and_nominate(e: Engine, preemptor: PodRequest, victims: tuple[str, ...]) -> None:
    """The custom scheduler's preemption: the victims chosen, deleted (terminating, still holding their devices
    through their grace period), the preemptor nominated."""
    assert not e.decide(preemptor).scheduled
    preemption = e.preempt(preemptor)
    assert preemption.victims == victims
    assert preemption.node is not None
    for key in victims:
        e.mark_leaving(key)
    e.nominate(preemptor, preemption.node)


def test_on_a_torus_a_pod_lands_beside_a_preemptor_but_not_in_the_block_it_needs() -> None:
    """trn1's 4x4 torus: `v` (one device of the second 8-block) is all that keeps an 8-device preemptor off; while it
    terminates, one free device is left beyond the preemptor's 8 and what is in use, but the set a 1-device pod would
    get (next to `v`) is in the block the preemptor needs: refused, naming the hold."""
    e = neuron_engine(ring=False)
    place(e, ("x", 4, 500), ("filler", 4, 0), ("v", 1, 0))
    e.release("default/filler")
    assert devices_of(e, "v") == ["8"]
    big = neuron_pod("big", 8, 1000)
    preempt_and_nominate(e, big, ("default/v",))
    refused = e.schedule(neuron_pod("small", 1, 10))
    assert not refused.scheduled
    assert HELD in (refused.reason or "") and short_of(DEVICE) in (refused.reason or "")
    e.release("default/v")  # its grace period over
    assert devices_of_decision(e, big) == [str(i) for i in range(8, 16)]


def test_on_a_torus_single_device_pods_land_in_the_rows_a_preemptor_leaves() -> None:
    """Each row holds one device of a pod of priority 500 but the last, where `v` keeps a 4-device preemptor off.
    Before, the node refused every pod of lower priority while `v` terminated; now the 1-device pods the rows
    0..2 have room for land there, and the preemptor still gets row 3."""
    e = neuron_engine(ring=False)
    fillers = [(f"f{i}", 1, 0) for i in range(9)]
    place(e, ("x", 1, 500), *fillers[:3], ("y", 1, 500), *fillers[3:6], ("z", 1, 500), *fillers[6:], ("v", 1, 0))
    for name, _, _ in fillers:
        e.release(f"default/{name}")
    assert devices_of(e, "v") == ["12"]
    row = neuron_pod("row", 4, 1000)
    preempt_and_nominate(e, row, ("default/v",))
    for i in range(3):
        assert e.schedule(neuron_pod(f"small-{i}", 1, 10)).scheduled
        assert int(devices_of(e, f"small-{i}")[0]) < 12
    e.release("default/v")
    assert devices_of_decision(e, row) == ["12", "13", "14", "15"]


def test_on_a_ring_a_pod_lands_where_the_preemptors_window_stays_whole() -> None:
    """A 16-device ring (an unknown instance type): no free run of 5 for the preemptor until `v` (6-7) goes, then
    4..10. A 2-device pod gets 4-5 and leaves it 6..10; a 3-device pod would get 8-10, the middle of its window."""
    e = neuron_engine(ring=True)
    place(e, ("x", 4, 500), ("f1", 2, 0), ("v", 2, 0), ("f2", 3, 0), ("w", 2, 500), ("f3", 3, 0))
    for name in ("f1", "f2", "f3"):
        e.release(f"default/{name}")
    assert devices_of(e, "v") == ["6", "7"]
    nominee = neuron_pod("nominee", 5, 1000)
    preempt_and_nominate(e, nominee, ("default/v",))
    refused = e.schedule(neuron_pod("three", 3, 10))
    assert not refused.scheduled and short_of(DEVICE) in (refused.reason or "")
    assert e.schedule(neuron_pod("two", 2, 10)).scheduled
    assert devices_of(e, "two") == ["4", "5"]
    e.release("default/v")
    assert devices_of_decision(e, nominee) == ["6", "7", "8", "9", "10"]


def devices_of_decision(e: Engine, pod: PodRequest, resource: str = DEVICE) -> list[str]:
    decision = e.schedule(pod)
    assert decision.scheduled, decision.reason
    assert decision.allocation is not None
    return decision.allocation.containers["main"][resource]


def gpu_node() -> Engine:
    """8 GPUs, 6 of 40 GiB and 2 of 80 GiB (6, 7), 8 cpus."""
    info = make_node("g", allocatable={GPU: 8, "pods": 110}, cpu="8")
    gpus = [DeviceInfo(id=str(i), model="A100", memory=(80 if i >= 6 else 40) << 30) for i in range(8)]
    info = dataclasses.replace(info, inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=gpus)})
    e = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    e.add_node(info)
    return e


def gpu_pod(name: str, gpus: int, priority: int, *, memory: str | None = None, cpu: str | None = None) -> PodRequest:
    resources: dict[str, str] = {GPU: str(gpus)}
    container: dict[str, object] = {"name": "main", "resources": {"limits": resources}}
    if cpu is not None:
        container["resources"] = {"limits": resources, "requests": {"cpu": cpu, GPU: str(gpus)}}
    annotations = {"kubegpu.io/gpu-memory": memory} if memory else {}
    doc = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {"priority": priority, "containers": [container]},
    }
    return pod_request(doc)[0]


def test_a_gpu_preemptor_keeps_the_80_gib_gpu_it_needs_not_the_node() -> None:
    """The preemptor needs one 80 GiB GPU (6 and 7); `v` (priority 0) holds GPU 6 and terminates for minutes. A
    2-GPU pod of lower priority lands on the 40 GiB GPUs free beside it; once GPU 7 is free too, a pod asking one
    80 GiB GPU takes it (GPU 6 stays the preemptor's), but one asking both would leave the preemptor none once `v`
    is gone: refused, naming the hold, though the count (7 of 8 GPUs) has room."""
    e = gpu_node()
    for name, gpus, priority, memory in (("fill", 6, 500, None), ("v", 1, 0, "80Gi"), ("keep", 1, 500, "80Gi")):
        decision = e.schedule(gpu_pod(name, gpus, priority, memory=memory))
        assert decision.scheduled, decision.reason
    assert devices_of(e, "v", GPU) == ["6"]
    e.release("default/fill")
    e.schedule(gpu_pod("busy", 2, 500))  # 4 GPUs of 40 GiB free, the 80 GiB ones held
    preemptor = gpu_pod("vip", 1, 1000, memory="80Gi")
    preempt_and_nominate(e, preemptor, ("default/v",))
    assert e.schedule(gpu_pod("beside", 2, 10)).scheduled
    assert set(devices_of(e, "beside", GPU)) <= {str(i) for i in range(6)}
    e.release("default/keep")  # GPU 7 free: a lower pod asking 80 GiB takes it, GPU 6 stays the preemptor's
    assert e.schedule(gpu_pod("big-memory", 1, 10, memory="80Gi")).scheduled
    assert devices_of(e, "big-memory", GPU) == ["7"]
    e.release("default/big-memory")
    e.release("default/v")  # gone: GPU 6 free too; the preemptor has not bound yet
    refused = e.schedule(gpu_pod("greedy", 2, 10, memory="80Gi"))
    assert not refused.scheduled and HELD in (refused.reason or "") and short_of(GPU) in (refused.reason or "")
    assert devices_of_decision(e, preemptor, GPU) == ["6"]


def test_a_pod_that_would_leave_the_preemptor_too_few_gpus_by_count_is_refused_naming_the_hold() -> None:
    """kube-scheduler's own pass: the preemptor counted on top of what is in use, its victims still counted. 8 GPUs,
    4 in use, a 1-GPU preemptor nominated: a 2-GPU pod fits beside it (7 of 8), a 4-GPU pod would not (9)."""
    e = gpu_node()
    assert e.schedule(gpu_pod("busy", 4, 500)).scheduled
    preemptor = gpu_pod("vip", 1, 1000)
    e.nominate(preemptor, "g")
    refused = e.schedule(gpu_pod("four", 4, 10))
    assert not refused.scheduled and f"1 node(s) were {HELD}" in (refused.reason or "")
    assert short_of(GPU) in (refused.reason or "")
    assert e.schedule(gpu_pod("two", 2, 10)).scheduled
    assert e.schedule(preemptor).scheduled


def test_the_victims_still_count_as_kube_scheduler_counts_them() -> None:
    """`v` (3 GPUs) terminates for a 2-GPU preemptor; one GPU is free. Once `v` is gone the preemptor would have 3
    and a 1-GPU pod taking the free one now would cost it nothing, but kube-scheduler counts the nominee on top of
    what is in use, victims included (7 + 2 + 1 of 8), and so does the engine: refused until the preemptor binds."""
    e = gpu_node()
    assert e.schedule(gpu_pod("busy", 4, 500)).scheduled
    assert e.schedule(gpu_pod("v", 3, 0)).scheduled
    preemptor = gpu_pod("vip", 2, 1000)
    preempt_and_nominate(e, preemptor, ("default/v",))
    refused = e.schedule(gpu_pod("one", 1, 10))
    assert not refused.scheduled and short_of(GPU) in (refused.reason or "")
    e.release("default/v")
    assert e.schedule(preemptor).scheduled
    assert e.schedule(gpu_pod("one", 1, 10)).scheduled


@pytest.mark.parametrize("priority", [1000, 2000])
def test_a_pod_of_equal_or_higher_priority_than_the_preemptor(priority: int) -> None:
    """A pod of the preemptor's priority is held off as a lower one is (kube-scheduler counts nominees of the pod's
    priority or higher); one above it is not held off at all."""
    e = gpu_node()
    assert e.schedule(gpu_pod("busy", 4, 500)).scheduled
    e.nominate(gpu_pod("vip", 4, 1000), "g")
    decision = e.schedule(gpu_pod("other", 2, priority))
    assert decision.scheduled is (priority > 1000)


def test_a_node_held_for_a_preempting_gang_still_refuses_every_lower_pod() -> None:
    """A gang's hold stays whole-node: which members go to which node of its domain is decided when it is placed."""
    e = gpu_node()
    e.nominate_gang("default/train", 1000, HOSTNAME, "g")
    refused = e.schedule(gpu_pod("small", 1, 10))
    assert not refused.scheduled and HELD in (refused.reason or "")


def test_what_ifs_teach_the_learned_mix_nothing() -> None:
    """The neuron plugin learns the sizes pods come in from each take (`SizeMix`), and the fragmentation score
    reads that mix. The what-ifs take too: the filter on a held node (the pod's set, then each nominee's), a
    preemption's search (each candidate victim put back) and a Node update (every pod held again on the new
    record). Each counted as a placement: a burst of pending pods checked against a held node counted the
    preemptor's size once per check, and the mix drifted toward whatever sat where the what-ifs ran. Only pods
    placed count."""
    from kubegpu.core.kit import MIX_KEY

    e = neuron_engine(ring=False)
    place(e, ("x", 4, 500), ("filler", 4, 0), ("v", 1, 0))
    e.release("default/filler")
    mix = e._shared["neuron"][MIX_KEY]

    def learned() -> tuple[float, dict[int, float]]:
        return mix.total, dict(mix.weights)  # type: ignore[attr-defined]

    before = learned()
    preempt_and_nominate(e, neuron_pod("big", 8, 1000), ("default/v",))  # a preemption's search puts pods back
    for i in range(20):  # pods checked against the held node, each through the nominee what-if
        e.decide(neuron_pod(f"small-{i}", 1, 10))
    e.add_node(node_info(trn1("n")))  # the Node updated: every pod held again on its new record
    assert learned() == before
    place(e, ("late", 4, 2000))  # a placement still teaches
    assert learned() != before


def test_a_node_updated_while_its_preemptor_waits_stays_held() -> None:
    """A Node update (a label, its allocatable, the advertiser's annotation) builds the node's record again: the
    hold for the preemptor waiting there went with the old record, and a lower pod took the room its victim was
    freeing, so the preemptor had to preempt again."""
    e = neuron_engine(ring=False)
    place(e, ("x", 4, 500), ("filler", 4, 0), ("v", 1, 0))
    e.release("default/filler")
    preempt_and_nominate(e, neuron_pod("big", 8, 1000), ("default/v",))
    e.add_node(node_info(trn1("n")))
    refused = e.schedule(neuron_pod("small", 4, 10))
    assert not refused.scheduled and HELD in (refused.reason or "")


def test_a_nomination_to_a_node_not_known_yet_holds_it_once_it_comes() -> None:
    """Behind kube-scheduler, a pod's nominatedNodeName may name a node the extender's informer has not shown yet:
    the hold was dropped for good, and the node, once known, was open to every lower pod."""
    e = Engine(make_plugin_manager("scheduler", plugins=[("neuron", neuron)], autoload=False))
    e.nominate(neuron_pod("big", 16, 1000), "n")
    e.add_node(node_info(trn1("n")))
    refused = e.schedule(neuron_pod("small", 1, 10))
    assert not refused.scheduled and HELD in (refused.reason or "")
    e.unnominate("default/big")
    assert e.schedule(neuron_pod("small", 1, 10)).scheduled


# -- the cluster-wide rules count the nominee on its node (kube-scheduler's first filter pass) ----------------------


def cpu_engine(*names: str, cpu: str = "4") -> Engine:
    e = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    for name in names:
        e.add_node(node_info(node_manifest(name, labels={HOSTNAME: name}, cpu=cpu)))
    return e


def cpu_pod(name: str, priority: int, *, app: str, cpu: str = "1", **spec: object) -> PodRequest:
    doc = {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {"app": app}},
        "spec": {
            "priority": priority,
            "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
            **spec,
        },
    }
    return pod_request(doc)[0]


def anti_affinity(app: str) -> dict[str, object]:
    term = {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": HOSTNAME}
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


@pytest.mark.parametrize(
    ("nominee_spec", "pod_spec", "said"),
    [
        ({}, anti_affinity("vip"), "this pod's anti-affinity rules select it"),
        (anti_affinity("batch"), {}, "its anti-affinity rules select this pod"),
    ],
    ids=["the-pods-anti-affinity-selects-the-nominee", "the-nominees-anti-affinity-selects-the-pod"],
)
def test_anti_affinity_either_way_keeps_a_pod_off_the_node_a_preemptor_waits_for(
    nominee_spec: dict[str, object], pod_spec: dict[str, object], said: str
) -> None:
    """The node has the cpu for both, so the resources let the lower pod on; but once the preemptor binds there,
    the pair breaks a required anti-affinity term, and the preemptor (or the pod) would be refused its node and
    preempt again. kube-scheduler counts the nominee as placed for every filter: the pod is refused, told why,
    while a pod without the term lands beside the preemptor."""
    e = cpu_engine("n")
    vip = cpu_pod("vip", 1000, app="vip", **nominee_spec)
    e.nominate(vip, "n")
    refused = e.schedule(cpu_pod("batch", 10, app="batch", **pod_spec))
    assert not refused.scheduled
    held = f"1 node(s) were {HELD} that is preempting pods there"
    assert refused.reason == f"0/1 nodes are available: {held}, and {said}."
    assert e.schedule(cpu_pod("web", 10, app="web")).scheduled
    assert e.schedule(vip).scheduled
    e.unnominate("default/vip")
    e.release("default/vip")
    assert e.schedule(cpu_pod("batch", 10, app="batch", **pod_spec)).scheduled


def test_a_pod_of_higher_priority_than_the_nominee_ignores_its_anti_affinity() -> None:
    """Only nominees of the pod's priority or higher are counted (kube-scheduler's `addNominatedPods`)."""
    e = cpu_engine("n")
    e.nominate(cpu_pod("vip", 1000, app="vip"), "n")
    assert e.schedule(cpu_pod("urgent", 2000, app="urgent", **anti_affinity("vip"))).scheduled


def test_topology_spread_counts_the_nominee_in_its_nodes_domain() -> None:
    """`a` is held for a preemptor of the spread's app; `b` is full. Counting the preemptor on `a`, a pod of the
    same app would make `a` two ahead of `b` (maxSkew 1): refused, naming the hold, where before it landed there
    and the preemptor, once bound, broke the spread it is counted in."""
    e = cpu_engine("a", "b")
    assert e.schedule(cpu_pod("filler", 0, app="other", cpu="4", nodeName="b")).scheduled
    e.nominate(cpu_pod("vip", 1000, app="web"), "a")
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": HOSTNAME,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    }
    refused = e.schedule(cpu_pod("web-1", 10, app="web", **spread))
    assert not refused.scheduled
    assert "1 node(s) were " + HELD + " that is preempting pods there, and this pod's topology spread constraints" in (
        refused.reason or ""
    )
    assert e.schedule(cpu_pod("other-1", 10, app="other", **spread)).scheduled  # its own app is not the nominee's


# -- preemption on a node held for another preemptor (kube-scheduler's dry run filters with the nominated pods) ---


@pytest.mark.parametrize(("cpu", "victims"), [("4", ("default/low",)), ("7", None)], ids=["fits-beside", "would-not"])
def test_a_preemptor_preempts_beside_a_nominee_of_higher_priority_counting_it(
    cpu: str, victims: tuple[str, ...] | None
) -> None:
    """8 cpus: `low` (priority 0) runs on 6, and the node is held for `vip` (priority 1000, 2 cpus). `mid` (500)
    needs 4: evicting `low` leaves room for both, so kube-scheduler preempts there; before, a node held for a
    nominee of higher priority was no candidate at all, and `mid` was told no node would fit. Needing 7, evicting
    `low` would still leave `mid` short beside `vip`: no candidate, rather than evicting `low` for a node that
    would then refuse `mid` for the hold."""
    e = cpu_engine("n", cpu="8")
    assert e.schedule(cpu_pod("low", 0, app="low", cpu="6")).scheduled
    vip = cpu_pod("vip", 1000, app="vip", cpu="2")
    e.nominate(vip, "n")
    mid = cpu_pod("mid", 500, app="mid", cpu=cpu)
    assert not e.decide(mid).scheduled
    preemption = e.preempt(mid)
    assert preemption.victims == (victims or ())
    assert preemption.node == ("n" if victims else None)
    if victims:
        e.release("default/low")
        assert e.schedule(mid).scheduled
        assert e.schedule(vip).scheduled


def test_a_preemptor_takes_the_node_of_a_nominee_of_lower_priority_which_loses_its_hold() -> None:
    """One trn1: `mid` (priority 100) preempted `a` there and waits for it; `b` (500) holds the other 8 devices.
    `top` (1000) needs all 16: the node is its only place, `mid` is not counted against it (kube-scheduler counts
    only nominees of its priority or higher), its victims are the pods running there, and `mid` loses its hold,
    to be tried again (and nominated elsewhere, where it may preempt)."""
    e = neuron_engine(ring=False)
    place(e, ("a", 8, 10), ("b", 8, 500))
    mid = neuron_pod("mid", 8, 100)
    preempt_and_nominate(e, mid, ("default/a",))
    top = neuron_pod("top", 16, 1000)
    preemption = e.preempt(top)
    assert preemption.node == "n" and set(preemption.victims) == {"default/a", "default/b"}
    e.nominate(top, "n")
    assert e.displace_nominees(top.priority, "n") == (mid,)
    assert e.nominated_node(mid.key) is None and e.nominees("n") == {top.key: 1000}
    assert not e.awaits_victims(mid.key, {"default/a"})
    for key in preemption.victims:
        e.release(key)
    assert devices_of_decision(e, top) == [str(i) for i in range(16)]
