"""Which pods' device ids the advertiser publishes as kubegpu.io/foreign-devices (`podresources.foreign_devices`)."""

from __future__ import annotations

from typing import Any

import pytest

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord, encode_allocation
from kubegpu.crishim.podresources import foreign_devices

NEURON = "aws.amazon.com/neurondevice"
HELD = {"ns/a": {"main": {NEURON: ["2", "3"]}}}


def api_pod(name: str, ids: list[str] | None) -> dict[str, Any]:
    annotations = {}
    if ids is not None:
        record = AllocationRecord(version=1, node="n", podUID="u", containers={"main": {NEURON: ids}})
        annotations[ALLOCATION_KEY] = encode_allocation(record)
    return {"metadata": {"namespace": "ns", "name": name, "annotations": annotations}}


@pytest.mark.parametrize(
    ("pods", "published"),
    [
        ([api_pod("a", ["2", "3"])], {}),
        ([api_pod("a", ["3", "2"])], {}),
        ([api_pod("a", None)], HELD),
        ([api_pod("a", ["0", "1"])], HELD),
        ([], HELD),
        ([{"metadata": {"namespace": "ns", "name": "a", "annotations": {ALLOCATION_KEY: "{"}}}], HELD),
    ],
    ids=["placed-by-kubegpu", "same-ids-other-order", "no-allocation", "kubelet-chose-others", "not-listed", "junk"],
)
def test_only_pods_whose_claim_the_kubelet_did_not_follow_are_published(
    pods: list[dict[str, Any]], published: dict[str, Any]
) -> None:
    assert foreign_devices(HELD, pods) == published


def test_resources_kubegpu_does_not_schedule_can_be_left_out() -> None:
    held = {"ns/a": {"main": {NEURON: ["1"], "example.com/nic": ["vf0"]}}}
    assert foreign_devices(held, [], [NEURON]) == {"ns/a": {"main": {NEURON: ["1"]}}}
    assert foreign_devices(held, [], ["nvidia.com/gpu"]) == {}


def test_share_slots_the_kubelet_gave_are_compared_and_published_as_their_gpus() -> None:
    # Device-plugin mode on a node configured for shares: the kubelet holds slot 3 of GPU 0 for a placed share pod
    # (its allocation names GPU 0) and slots 1 and 2 of GPU 1 for a pod kubegpu did not place.
    gpu = "nvidia.com/gpu"
    held = {"ns/share": {"main": {gpu: ["0::3"]}}, "ns/tenant": {"main": {gpu: ["1::2", "1::1"]}}}
    record = AllocationRecord(version=1, node="n", podUID="u", containers={"main": {gpu: ["0"]}})
    share = {
        "metadata": {"namespace": "ns", "name": "share", "annotations": {ALLOCATION_KEY: encode_allocation(record)}}
    }
    assert foreign_devices(held, [share]) == {"ns/tenant": {"main": {gpu: ["1"]}}}
