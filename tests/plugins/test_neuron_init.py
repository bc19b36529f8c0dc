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

from kubegpu.cli import main
from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation
from kubegpu.core.manifests import pod_request
from kubegpu.core.models import PluginAllocation, PodRequest
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.status import Code
from kubegpu.core.testing import make_node, node_manifest, pod_manifest
from kubegpu.plugins.neuron import scheduler

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
