"""`kubegpu top`'s view of a cluster, fed with the objects the API server would list: which allocations it draws."""

from __future__ import annotations

from typing import Any

from kubegpu.core.annotations import ALLOCATION_KEY, encode_allocation, merge_allocations, sign_allocation
from kubegpu.core.models import PluginAllocation
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest, pod_manifest
from kubegpu.scheduler.report import report_json
from kubegpu.scheduler.top import ClusterView

KEY = b"k" * 32
TRN1 = {"node.kubernetes.io/instance-type": "trn1.32xlarge"}


def bound_pod(name: str, devices: list[str], *, key: bytes | None = KEY, node: str = "trn1-a") -> dict[str, Any]:
    pod = pod_manifest(name, {"main": {"aws.amazon.com/neurondevice": len(devices)}})
    pod["metadata"]["uid"] = f"uid-{name}"
    record = merge_allocations(
        node,
        f"uid-{name}",
        [PluginAllocation(plugin="neuron", containers={"main": {"aws.amazon.com/neurondevice": devices}})],
    )
    if key is not None:
        record = sign_allocation(record, key)
    pod["metadata"]["annotations"] = {ALLOCATION_KEY: encode_allocation(record)}
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def holders(view: ClusterView) -> dict[str, list[str]]:
    (node,) = report_json(view.report())["nodes"]
    return {c["id"]: c["holders"] for picture in node["devices"] for c in picture["cells"] if c["holders"]}


def view_of(pods: list[dict[str, Any]], key: bytes | None = KEY) -> ClusterView:
    view = ClusterView(make_plugin_manager("scheduler"), key)
    view.sync_pods(pods)  # pods before their node, as two informers may deliver them
    view.sync_nodes([node_manifest("trn1-a", labels=TRN1, allocatable={"aws.amazon.com/neurondevice": 16})])
    return view


def test_verified_allocations_are_drawn_and_forged_ones_are_listed_as_not_shown() -> None:
    view = view_of([bound_pod("good", ["0", "1", "2", "3"]), bound_pod("forged", ["4", "5", "6", "7"], key=b"x" * 32)])
    assert holders(view) == {str(i): ["default/good"] for i in range(4)}
    report = view.report()
    assert report.unverified == {}
    assert report.problems == ("default/forged: allocation not shown: its signature does not verify with the key file",)


def test_without_a_key_every_allocation_is_drawn_and_marked_unverified() -> None:
    view = view_of([bound_pod("unsigned", ["8", "9", "10", "11"], key=None)], key=None)
    assert holders(view) == {str(i): ["default/unsigned"] for i in range(8, 12)}
    assert set(view.report().unverified) == {"default/unsigned"}


def test_a_deleted_pod_frees_its_devices() -> None:
    pod = bound_pod("gone", ["0", "1", "2", "3"])
    view = view_of([pod])
    view.apply_pod("DELETED", pod)
    assert holders(view) == {}


def test_a_pending_pod_shows_its_latest_failed_scheduling_event_then_its_condition() -> None:
    view = view_of([])
    pod = pod_manifest("waits", {"main": {"aws.amazon.com/neurondevice": 7}}, scheduler_name="kubegpu")
    pod["metadata"]["uid"] = "uid-waits"
    view.apply_pod("ADDED", pod)
    assert view.report().pending[0].reason == "waiting for scheduler kubegpu (no FailedScheduling event yet)"
    pod["status"] = {"conditions": [{"type": "PodScheduled", "status": "False", "message": "from the condition"}]}
    view.apply_pod("MODIFIED", pod)
    assert view.report().pending[0].reason == "from the condition"
    for version, message in ((5, "newer"), (3, "older")):
        view.apply_event(
            "ADDED",
            {
                "metadata": {"resourceVersion": str(version)},
                "reason": "FailedScheduling",
                "message": message,
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "waits", "uid": "uid-waits"},
            },
        )
    assert view.report().pending[0].reason == "newer"
