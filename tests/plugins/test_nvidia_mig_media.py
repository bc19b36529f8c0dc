"""MIG instances with media extensions (`1g.10gb+me`, `2g.12gb+me` on the A30) under the names Kubernetes has for
them. NVML names the profile `1g.10gb+me`; a resource name has no `+`, so NVIDIA's device plugin advertises it as
`nvidia.com/mig-1g.10gb.me` and GPU Feature Discovery labels `nvidia.com/mig-1g.10gb.me.count`. kubegpu owned,
advertised and served `nvidia.com/mig-1g.10gb+me`: the API server refused the node's capacity and labels
(`kubegpu advertise --update-capacity` on any node with such an instance published nothing), the kubelet a device
plugin registering it, and a tenant's pod asking it; the pod asking the real name was counted by kube-scheduler's
rules alone, beside books that held the instance under a name nobody could ask."""

from __future__ import annotations

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.manifests import _valid_label_key
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, make_pod
from kubegpu.plugins.nvidia import mig
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.plugins.nvidia.mig_node import MigDevice, mig_advertisement, mig_plugin_ids, visible_devices
from kubegpu.scheduler.engine import Engine

MEDIA = "nvidia.com/mig-1g.10gb.me"  # as NVIDIA's device plugin advertises the 1g.10gb+me instance
LAYOUT = "1g.10gb+me@0,1g.10gb@1,1g.10gb@2,1g.10gb@3,3g.40gb@4"
A100_80 = "NVIDIA A100-SXM4-80GB"


def a100(layout: str = LAYOUT) -> DeviceInfo:
    return DeviceInfo(id="0", model=A100_80, memory=81920 << 20, attributes={mig.LAYOUT_ATTRIBUTE: layout})


def test_every_mig_resource_and_label_kubegpu_names_is_one_kubernetes_accepts() -> None:
    assert MEDIA in mig.MIG_RESOURCES and "nvidia.com/mig-2g.12gb.me" in mig.MIG_RESOURCES
    assert [r for r in mig.MIG_RESOURCES if not _valid_label_key(r)] == []
    _, capacity, labels = mig_advertisement([a100()])
    assert capacity == {MEDIA: 1, "nvidia.com/mig-1g.10gb": 3, "nvidia.com/mig-3g.40gb": 1}
    assert labels[f"{MEDIA}.count"] == "1"
    assert [key for key in (*capacity, *labels) if not _valid_label_key(key)] == []
    assert mig_plugin_ids([a100()])[MEDIA] == {"0@0": True}  # what `kubegpu device-plugin` registers


def test_a_pod_asking_a_media_extension_instance_by_its_resource_name_gets_it_and_the_next_is_refused() -> None:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    inventory = encode_devices(NodeDevices(inventories={"nvidia": DeviceInventory(plugin="nvidia", devices=[a100()])}))
    _, capacity, _ = mig_advertisement([a100()])
    engine.add_node(make_node("a100", annotations={DEVICES_KEY: inventory}, allocatable=capacity))

    first = engine.schedule(make_pod("video", {"main": {MEDIA: 1}}))
    assert first.scheduled and first.allocation is not None
    assert first.allocation.containers["main"] == {MEDIA: ["0@0"]}  # the instance with the media engines
    second = engine.schedule(make_pod("video-2", {"main": {MEDIA: 1}}))
    assert not second.scheduled
    assert second.reason == f"0/1 nodes are available: 1 Insufficient {MEDIA}."

    # On the node: the allocation's resource names the instance NVML lists as a 1g.10gb+me.
    listed = {"0@0": MigDevice(0, "1g.10gb+me", 0, "MIG-0-0", 0)}
    found, missing = visible_devices({MEDIA: ["0@0"]}, listed)
    assert missing is None and [d.uuid for d in found] == ["MIG-0-0"]


def test_gfd_labels_of_a_media_extension_instance_put_it_in_the_books() -> None:
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        f"{MEDIA}.count": "1",
        "nvidia.com/mig-1g.10gb.count": "6",
    }
    books = mig.books_from_labels("a100", labels, {MEDIA: 1, "nvidia.com/mig-1g.10gb": 6})
    assert books is not None
    assert books.free_counts() == {MEDIA: 1, "nvidia.com/mig-1g.10gb": 6}
    assert sorted(i.profile for i in books.devices.values()).count("1g.10gb+me") == 1
