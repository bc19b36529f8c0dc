"""Neuron init containers: a check asking more Neuron devices or cores than its pod's app containers.

Kubernetes counts the larger of the two for the pod, and the kubelet gives the init container the app containers'
devices first, then the rest of its pod's (`kubegpu.core.annotations.init_devices`). The init container runs on all
of them, so together they must be one valid set, as the Neuron scheduler extension's users expect of every container:
contiguous on a ring, an aligned row, half or whole torus on trn1. These tests place such pods through the simulator
(the engine names what the init container is given) and through the plugin on fragmented nodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubegpu.cli import main
from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, init_devices
from kubegpu.core.manifests import pod_request
from kubegpu.core.models import PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.status import Code
from kubegpu.core.testing import make_node, node_manifest, pod_manifest
from kubegpu.plugins.neuron import scheduler
from kubegpu.plugins.neuron import topology as topo

DEVICE = "aws.amazon.com/neurondevice"
NEURON = "aws.amazon.com/neuron"
CORE = "aws.amazon.com/neuroncore"
TYPE_LABEL = "node.kubernetes.io/instance-type"


def checked_pod(name: str, init: dict[str, int], app: dict[str, int], **kwargs: Any) -> dict[str, Any]:
    document = pod_manifest(name, {"main": app}, **kwargs)
    document["spec"]["initContainers"] = [
        {"name": "check", "image": "check", "resources": {"limits": {k: str(v) for k, v in init.items()}}}
    ]
    return document


def request(document: dict[str, Any]) -> PodRequest:
    parsed, _ = pod_request(document)
    return parsed


def ints(ids: list[str]) -> list[int]:
    return sorted(int(i) for i in ids)


def contiguous(ids: list[int]) -> bool:
    return ids == list(range(ids[0], ids[0] + len(ids)))


def checked_row(
    documents: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], Any, list[int]]:
    """`kubegpu simulate` of one trn1 and a pod whose `check` init container asks a row of 4 before its `main` of 1:
    the event, the allocation, and the check's row (4 devices, aligned, contiguous, holding main's device)."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    assert main(["simulate", "--json", str(path)]) == 0
    (event,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert event["event"] == "scheduled", event["reason"]
    record = decode_allocation(event["annotations"][ALLOCATION_KEY])
    row = ints(record.init["check"][DEVICE])
    assert len(row) == 4 and row[0] % 4 == 0 and contiguous(row)
    assert set(ints(record.containers["main"][DEVICE])) <= set(row)
    return event, record, row


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", neuron=scheduler)


def place(pm: KubegpuPluginManager, instance_type: str, held: dict[str, list[str]], pod: PodRequest) -> Any:
    """The allocation of `pod` on a node of `instance_type` where `held` (resource -> ids) is taken by another pod."""
    state = pm.call("neuron", "kubegpu_scheduler_build_node", node=make_node("n", labels={TYPE_LABEL: instance_type}))
    for resource, ids in held.items():
        other = PluginAllocation(plugin="neuron", containers={"other": {resource: ids}})
        assert pm.call("neuron", "kubegpu_scheduler_take", state=state, pod_key=f"x/{resource}", allocation=other).ok
    status = pm.call("neuron", "kubegpu_scheduler_fit", state=state, pod=pod)
    allocation = pm.call("neuron", "kubegpu_scheduler_allocate", state=state, pod=pod)
    return status, allocation


def test_a_torus_row_checked_before_a_one_device_trainer_is_placed_and_the_check_gets_the_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """trn1.32xlarge: an init container checking a row of 4 devices before a trainer of 1. The pod holds 4; the
    check is given all 4 (the trainer's among them) and they are an aligned row. It used to be refused with
    `... does not support requests for device: 3`, a count nobody asked: the 3 the check holds beyond the trainer's
    one were placed as a request of their own."""
    documents = [
        node_manifest("trn1-a", labels={TYPE_LABEL: "trn1.32xlarge"}, allocatable={DEVICE: 16, CORE: 32}),
        checked_pod("checked", {DEVICE: 4}, {DEVICE: 1}),
    ]
    event, _, row = checked_row(documents, tmp_path, capsys)
    assert event["annotations"]["NEURON_DEVS"] == ",".join(str(d) for d in row)


@pytest.mark.parametrize(
    ("instance_type", "held", "init", "app", "valid"),
    [
        # A lone free device at 0 and a free run 5-11: the trainer's one used to take device 0 and the check's other
        # three 5-7 or 9-11, so the check ran on 0 and three devices it has no link to.
        ("inf2.48xlarge", {NEURON: ["1", "2", "3", "4"]}, {NEURON: 4}, {NEURON: 1}, "run"),
        # Cores: a check of 6 cores before a server of 1 on a ring with a lone free core at 0.
        ("inf2.48xlarge", {CORE: ["1", "2", "3"]}, {CORE: 6}, {CORE: 1}, "run"),
        # trn1 cores: 8 cores (devices 0-3, a row) checked before a server of 2 on one device.
        ("trn1.32xlarge", {CORE: ["0"]}, {CORE: 8}, {CORE: 2}, "row"),
    ],
    ids=["ring-devices", "ring-cores", "torus-cores"],
)
def test_what_a_check_is_given_is_one_valid_set_on_a_fragmented_node(
    pm: KubegpuPluginManager,
    instance_type: str,
    held: dict[str, list[str]],
    init: dict[str, int],
    app: dict[str, int],
    valid: str,
) -> None:
    (resource,) = init
    status, allocation = place(pm, instance_type, held, request(checked_pod("checked", init, app)))
    assert status.ok, status.message
    mine = allocation.containers["main"][resource]
    given = ints([i for resources in allocation.containers.values() for i in resources[resource]])
    assert len(given) == init[resource] and set(ints(mine)) <= set(given)
    assert contiguous(given), f"the check would run on {given}"
    assert contiguous(ints(mine))
    if valid == "row":  # 8 cores of trn1 (2 per device) on 4 devices: a whole aligned row
        assert given[0] % 8 == 0


def test_a_check_of_a_count_the_torus_does_not_take_is_refused_with_the_count_it_asked(
    pm: KubegpuPluginManager,
) -> None:
    status, _ = place(pm, "trn1.32xlarge", {}, request(checked_pod("checked", {DEVICE: 6}, {DEVICE: 1})))
    assert not status.ok
    assert status.message == (
        "Instance type trn1.32xlarge does not support requests for device: 6. "
        "Please request a different number of devices."
    )


def test_a_sidecar_running_beside_the_check_keeps_its_own_device_and_the_check_gets_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """trn1.32xlarge: a monitoring sidecar of 1 device started before a check of 4, then a trainer of 1. The pod
    holds 5 (the check's 4 while the sidecar keeps its own); each container asks a count the torus takes, and the
    check is given 4 devices other than the sidecar's. It was refused with `... device: 5`: the pod's 5 were
    placed as one set."""
    document = checked_pod("side", {DEVICE: 4}, {DEVICE: 1})
    sidecar = {"name": "monitor", "image": "m", "restartPolicy": "Always", "resources": {"limits": {DEVICE: "1"}}}
    document["spec"]["initContainers"].insert(0, sidecar)
    documents = [
        node_manifest("trn1-a", labels={TYPE_LABEL: "trn1.32xlarge"}, allocatable={DEVICE: 16, CORE: 32}),
        document,
    ]
    _, record, row = checked_row(documents, tmp_path, capsys)
    (monitor,) = ints(record.containers["monitor"][DEVICE])
    assert monitor not in row


def test_app_core_windows_that_fit_in_no_set_of_the_checks_count_are_refused_saying_so(
    pm: KubegpuPluginManager,
) -> None:
    """trn1 cores: a check of 14 before a server of 8. A window of 14 cores on 8 devices is cores 1-14 (or 17-30),
    and a server of 8 needs a row's 8 cores whole (0-7, 8-15, ...), which no such window holds: the check would run
    across devices no valid set joins. Refused on every node, saying what to change."""
    status, allocation = place(pm, "trn1.32xlarge", {}, request(checked_pod("checked", {CORE: 14}, {CORE: 8})))
    assert allocation is None and status.code is Code.UNRESOLVABLE, status
    assert status.message == (
        "init container check is given its pod's 14 aws.amazon.com/neuroncore, which must be one valid set, and no "
        "valid set of 14 holds valid sets of 8 for the other containers; change their counts"
    )


def test_a_check_asking_less_than_its_pod_that_the_kubelet_would_give_no_valid_set_is_refused_naming_it(
    pm: KubegpuPluginManager,
) -> None:
    """inf2.48xlarge (a ring of 12): a check of 3 before a loader of 1 and a trainer of 4. The kubelet gives the check
    the loader's device, then the trainer's first two. With device 1 taken the loader went to device 0 and the trainer
    to 2-5, and the check ran on 0, 2 and 3, no contiguous set; now that node refuses it, naming the check and what
    it would be given. On an empty ring the loader and the trainer are neighbours and the check gets 0-2."""
    document = checked_pod("checked", {DEVICE: 3}, {DEVICE: 1})
    document["spec"]["containers"].append({"name": "trainer", "image": "t", "resources": {"limits": {DEVICE: "4"}}})
    pod = request(document)
    status, allocation = place(pm, "inf2.48xlarge", {DEVICE: ["1"]}, pod)
    assert allocation is None and status.code is Code.UNSCHEDULABLE, status
    assert status.message.startswith(f"init container check would be given {DEVICE} 0,2,3 of its pod's"), status
    assert "no valid set of 3; change its count" in status.message
    status, allocation = place(pm, "inf2.48xlarge", {}, pod)
    assert status.ok and allocation is not None
    given, _ = init_devices(allocation.containers, {}, pod.init_steps)
    assert ints(given["check"][DEVICE]) == [0, 1, 2]


def test_a_second_check_of_a_count_the_torus_does_not_take_is_refused_naming_it(pm: KubegpuPluginManager) -> None:
    """trn1.32xlarge: a check of 4 (a row) and then one of 3 before a trainer of 1. The second is given 3 of the
    row, which no container may ask on a torus; it was placed and ran on them."""
    document = checked_pod("checked", {DEVICE: 4}, {DEVICE: 1})
    document["spec"]["initContainers"].append({"name": "again", "image": "a", "resources": {"limits": {DEVICE: "3"}}})
    status, allocation = place(pm, "trn1.32xlarge", {}, request(document))
    assert allocation is None and status.code is Code.UNRESOLVABLE, status
    assert status.message == (
        "init container again: Instance type trn1.32xlarge does not support requests for device: 3. "
        "Please request a different number of devices."
    )


def _neuron_containers(draw: st.DrawFn, resource: str, sizes: list[int]) -> dict[str, Any]:
    document = pod_manifest(
        "p", {f"app{i}": {resource: draw(st.sampled_from(sizes))} for i in range(draw(st.integers(1, 3)))}
    )
    inits = []
    for i in range(draw(st.integers(1, 3))):
        container: dict[str, Any] = {"name": f"init{i}", "image": "i"}
        container["resources"] = {"limits": {resource: str(draw(st.sampled_from(sizes)))}}
        if draw(st.booleans()):
            container["restartPolicy"] = "Always"  # a sidecar
        inits.append(container)
    document["spec"]["initContainers"] = inits
    return document


@st.composite
def neuron_pods(draw: st.DrawFn) -> dict[str, Any]:
    resource = draw(st.sampled_from([DEVICE, CORE]))
    return _neuron_containers(draw, resource, [1, 2, 3, 4, 8, 16] if resource == DEVICE else [1, 2, 4, 6, 8, 16])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    instance_type=st.sampled_from(["trn1.32xlarge", "inf2.48xlarge", "inf1.24xlarge"]),
    taken=st.sets(st.integers(0, 15), max_size=5),
    document=neuron_pods(),
)
def test_every_container_of_a_generated_pod_runs_on_a_valid_set_of_its_count(
    pm: KubegpuPluginManager, instance_type: str, taken: set[int], document: dict[str, Any]
) -> None:
    """Whatever the pod (app containers, sidecars, init containers of any size and order), each container runs on a
    valid set of its own count, init containers on what the kubelet gives them of their pod's (`init_devices`), and
    the pod holds distinct ids of the node's, none taken by another pod."""
    state = pm.call("neuron", "kubegpu_scheduler_build_node", node=make_node("n", labels={TYPE_LABEL: instance_type}))
    t, k = state.topology, state.cores_per_device
    held = sorted(d for d in taken if d < t.devices)
    pod = request(document)
    if held:
        other = PluginAllocation(plugin="neuron", containers={"other": {DEVICE: [str(d) for d in held]}})
        assert pm.call("neuron", "kubegpu_scheduler_take", state=state, pod_key="x/o", allocation=other).ok
    if not pm.call("neuron", "kubegpu_scheduler_fit", state=state, pod=pod).ok:
        return
    allocation = pm.call("neuron", "kubegpu_scheduler_allocate", state=state, pod=pod)

    def valid(resource: str, ids: list[str]) -> bool:
        mask = sum(1 << int(i) for i in ids)
        if resource == CORE:
            return any(mask == topo.interval(start, len(ids)) for start in range(t.devices * k)) and bool(
                scheduler._valid_sets(state, True, mask, len(ids))
            )
        return mask in topo.valid_sets(t, len(ids))

    holders = {c.name for c in pod.containers if c.init}
    held_by_pod: list[int] = []  # the pod's ids, in devices (a core counts its device's core slot)
    for container, resources in allocation.containers.items():
        for resource, ids in resources.items():
            assert container in holders or valid(resource, ids), (container, ids)
            held_by_pod += [
                int(i) if resource == CORE else int(i) * k + c for i in ids for c in range(1 if resource == CORE else k)
            ]
    assert len(held_by_pod) == len(set(held_by_pod)) <= t.devices * k, "no id twice, never more than the node"
    assert not {i // k for i in held_by_pod} & set(held), "nothing another pod holds"
    given, _ = init_devices(allocation.containers, {}, pod.init_steps)
    for step in pod.init_steps:
        for resource, count in step.resources.items():
            assert len(given[step.name][resource]) == count
            assert valid(resource, given[step.name][resource]), (step.name, given[step.name][resource])
