"""Node-side testing helpers for plugin authors (they need the CRI shim, so they live here, not in core).

* `apply_allocation(manager, allocation, container=...)` signs an allocation with a throwaway key, puts it on a pod
  sandbox as the kubelet would, sends a CreateContainer request through the shim's own editor
  (`ContainerEditor.create_container`: verification, removal of every plugin's owned entries, the owning plugins'
  edits, written back into the protobuf) and returns the container config that would reach the runtime, as a
  `ContainerEdit`. A refusal raises `AllocationRefused` with the message the kubelet would see.
* `advertise(manager, host_root, node=...)` runs the advertiser's collection (discovery, health, advertisement)
  on a fake host root and returns the Node manifest it would publish: the `kubegpu.io/devices` annotation, the
  capacity and allocatable counts and the labels, ready for `kubegpu.core.testing.make_node` or `simulate`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cri_api.v1 import api_pb2

from kubegpu.core.annotations import (
    ALLOCATION_KEY,
    DEVICES_KEY,
    encode_allocation,
    encode_devices,
    merge_allocations,
    sign_allocation,
)
from kubegpu.core.models import ContainerEdit, PluginAllocation
from kubegpu.core.plugin_manager import KubegpuPluginManager
from kubegpu.core.testing import node_manifest
from kubegpu.crishim.advertise import Advertiser
from kubegpu.crishim.shim import ContainerEditor, edit_from_config
from kubegpu.crishim.verify import AllocationRefused

__all__ = ["AllocationRefused", "advertise", "apply_allocation"]

KEY = b"kubegpu-testing-key-0123456789abcdef"


def apply_allocation(
    manager: KubegpuPluginManager,
    allocations: PluginAllocation | Iterable[PluginAllocation],
    *,
    container: str = "main",
    config: ContainerEdit | None = None,
    node: str = "node-0",
    pod: tuple[str, str, str] = ("default", "pod-0", "uid-0"),
    dev_root: Path = Path("/dev"),
) -> ContainerEdit:
    """The container config the runtime would get for `container` of a pod holding `allocations` (signed here),
    starting from `config` as the kubelet sent it (default: empty)."""
    parts = [allocations] if isinstance(allocations, PluginAllocation) else list(allocations)
    namespace, name, uid = pod
    record = sign_allocation(merge_allocations(node, uid, parts).model_copy(update={"issued": 1}), KEY)
    start = config or ContainerEdit()
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id="sandbox-0",
        config=api_pb2.ContainerConfig(
            metadata=api_pb2.ContainerMetadata(name=container),
            devices=[
                api_pb2.Device(host_path=d.host_path, container_path=d.container_path, permissions=d.permissions)
                for d in start.devices
            ],
            envs=[api_pb2.KeyValue(key=k, value=v) for k, v in start.envs.items()],
            mounts=[
                api_pb2.Mount(host_path=m.host_path, container_path=m.container_path, readonly=m.readonly)
                for m in start.mounts
            ],
            CDI_devices=[api_pb2.CDIDevice(name=n) for n in start.cdi_devices],
            annotations=start.annotations,
        ),
        sandbox_config=api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(name=name, namespace=namespace, uid=uid),
            annotations={ALLOCATION_KEY: encode_allocation(record)},
        ),
    )
    editor = ContainerEditor(manager, node=node, key=KEY, dev_root=dev_root)
    edited = api_pb2.CreateContainerRequest.FromString(editor.create_container(request.SerializeToString()))
    return edit_from_config(edited.config)


def advertise(
    manager: KubegpuPluginManager, host_root: Path, *, node: str = "node-0", **manifest: Any
) -> dict[str, Any]:
    """The Node manifest a node with this host root has once `kubegpu advertise --update-capacity` ran on it:
    `node_manifest(node, **manifest)` plus the devices annotation, each plugin's labels and extended resources."""
    # collect() reads the host only; the API client is never used.
    advertiser = Advertiser(None, manager, node, host_root, update_capacity=True)  # type: ignore[arg-type]
    devices, advertisements = advertiser.collect(None)
    labels = dict(manifest.pop("labels", {}) or {})
    allocatable: dict[str, str | int] = dict(manifest.pop("allocatable", {}) or {})
    annotations = dict(manifest.pop("annotations", {}) or {})
    for advertisement in advertisements.values():
        labels.update(advertisement.labels)
        allocatable.update(advertisement.capacity)
    if devices.inventories:
        annotations[DEVICES_KEY] = encode_devices(devices)
    return node_manifest(node, labels=labels, allocatable=allocatable, annotations=annotations, **manifest)
