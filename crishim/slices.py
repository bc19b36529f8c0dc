"""The advertiser's DRA side: a node's devices published as `ResourceSlice`s (`resource.k8s.io/v1`) where the API
server serves them, kept current round by round.

One slice per kubegpu plugin with devices on the node, named `<node>-<plugin>`, of the plugin's driver
(`DRIVERS`: `neuron.kubegpu.io`, `nvidia.kubegpu.io`, `gpu.intel.kubegpu.io`; a third party's plugin
`<plugin>.kubegpu.io`), its pool named after the node, owned by the Node (the garbage collector removes it with its
node) and labelled `kubegpu.io/node` so the advertiser finds its own slices again. Each healthy device is one slice
device named `<kind>-<index>` (its position in the plugin's inventory), with the attributes the scheduler's topology
rules read (`kubegpu.scheduler.dra`): `index`, `model`, `id` (the plugin's device id), for Neuron `topology`
(`ring`/`torus`), `rows`, `columns`, `deviceCount` and `cores`, for NVIDIA `gpuCount` and `nvlinkGroup` (the dotted
path of the NVLink group the GPU lies in, from the plugin's own group tree); and its memory as capacity. An unhealthy
device is left out, as upstream drivers leave them out.

`slices_for` is pure (an inventory in, documents out); `SlicePublisher.publish` asks discovery whether the server
serves `resource.k8s.io/v1`, then creates, replaces (with the pool's generation moved on, so a scheduler reading both
generations at once uses only the new one) or deletes what differs, and touches nothing that is already right.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubegpu.core.models import DeviceInventory, NodeDevices
from kubegpu.kube.client import ApiError, KubeClient
from kubegpu.kube.discovery import discover
from kubegpu.plugins.nvidia import topology as nvidia_topology

__all__ = ["DRIVERS", "NODE_LABEL", "SlicePublisher", "slices_for"]

log = logging.getLogger("kubegpu.advertise")

GROUP = "resource.k8s.io"
VERSION = "v1"
PATH = f"/apis/{GROUP}/{VERSION}/resourceslices"
NODE_LABEL = "kubegpu.io/node"
DRIVERS = {"neuron": "neuron.kubegpu.io", "nvidia": "nvidia.kubegpu.io", "intel-gas": "gpu.intel.kubegpu.io"}
KINDS = {"neuron": "neuron", "nvidia": "gpu", "intel-gas": "card"}
MAX_STRING = 64  # an attribute string's upstream bound
MAX_DEVICES = 128  # devices per slice, upstream's bound


def driver_of(plugin: str) -> str:
    return DRIVERS.get(plugin, f"{plugin.lower().replace('_', '-')}.kubegpu.io")


def _nvlink_paths(inventory: DeviceInventory) -> dict[int, str]:
    """Each GPU position's NVLink group path in the plugin's own group tree ("0.1": the second group inside the
    first); empty when the inventory describes no tree."""
    ids = [d.id for d in inventory.devices]
    try:
        tree = nvidia_topology.tree_from_inventory(inventory.topology, ids) if ids else None
    except nvidia_topology.TopologyError:
        return {}
    if tree is None:
        return {}
    paths: dict[int, str] = {}

    def walk(group: nvidia_topology.Group, path: tuple[int, ...]) -> None:
        groups = [child for child in group.children if child.children]
        for child in group.children:
            if not child.children:
                paths[child.low] = ".".join(map(str, path))
        for number, child in enumerate(groups):
            walk(child, (*path, number))

    walk(tree.root, ())
    return paths


def _device(plugin: str, inventory: DeviceInventory, index: int, paths: Mapping[int, str]) -> dict[str, Any]:
    device = inventory.devices[index]
    attributes: dict[str, Any] = {"index": {"int": index}}
    if device.model and len(device.model) <= MAX_STRING:
        attributes["model"] = {"string": device.model}
    if len(device.id) <= MAX_STRING:
        attributes["id"] = {"string": device.id}
    count = len(inventory.devices)
    if plugin == "neuron":
        kind = str(inventory.topology.get("kind", "ring"))
        attributes["topology"] = {"string": kind if kind in ("ring", "torus") else "ring"}
        attributes["deviceCount"] = {"int": count}
        if kind == "torus":
            attributes["rows"] = {"int": int(inventory.topology.get("rows", 0))}
            attributes["columns"] = {"int": int(inventory.topology.get("columns", 0))}
        if device.cores is not None:
            attributes["cores"] = {"int": device.cores}
    elif plugin == "nvidia":
        attributes["gpuCount"] = {"int": count}
        if index in paths:
            attributes["nvlinkGroup"] = {"string": paths[index]}
    found: dict[str, Any] = {"name": f"{KINDS.get(plugin, 'device')}-{index}", "attributes": attributes}
    if device.memory is not None:
        found["capacity"] = {"memory": {"value": str(device.memory)}}
    return found


def slices_for(node: str, node_uid: str, devices: NodeDevices) -> dict[str, dict[str, Any]]:
    """The ResourceSlices that publish `devices` (slice name -> document; `pool.generation` 0, set when written)."""
    found: dict[str, dict[str, Any]] = {}
    for plugin, inventory in sorted(devices.inventories.items()):
        paths = _nvlink_paths(inventory) if plugin == "nvidia" else {}
        listed = [_device(plugin, inventory, i, paths) for i, device in enumerate(inventory.devices) if device.healthy][
            :MAX_DEVICES
        ]
        if not listed:
            continue
        name = f"{node}-{plugin.lower().replace('_', '-')}"
        found[name] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "labels": {NODE_LABEL: node},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}],
            },
            "spec": {
                "driver": driver_of(plugin),
                "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                "nodeName": node,
                "devices": listed,
            },
        }
    return found


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A slice's spec without its pool generation (which moves on with every change)."""
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    return {**spec, "pool": pool}


class SlicePublisher:
    """Keeps one node's ResourceSlices equal to its devices, where `resource.k8s.io/v1` is served."""

    def __init__(self, client: KubeClient, node: str) -> None:
        self.client = client
        self.node = node
        self.served: bool | None = None  # unknown until discovery answers

    def publish(self, node_uid: str, devices: NodeDevices) -> int:
        """Create, replace or delete what differs; the number of writes. Raises `ApiError` on a failed call."""
        if not self.served:
            self.served = discover(self.client, GROUP, [VERSION]) is not None
            if not self.served:
                return 0
        wanted = slices_for(self.node, node_uid, devices)
        existing, _ = self.client.list(PATH, labelSelector=f"{NODE_LABEL}={self.node}")
        writes = 0
        for document in existing:
            name = (document.get("metadata") or {}).get("name", "")
            if name not in wanted:
                try:
                    self.client.delete(f"{PATH}/{name}")
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                writes += 1
        current = {(d.get("metadata") or {}).get("name", ""): d for d in existing}
        for name, document in wanted.items():
            old = current.get(name)
            if old is None:
                self.client.post(PATH, document)
                writes += 1
                log.info("resource slice created", extra={"node": self.node, "reason": name})
                continue
            spec = old.get("spec") or {}
            if _comparable(spec) == _comparable(document["spec"]):
                continue
            generation = int((spec.get("pool") or {}).get("generation", 0)) + 1
            document["spec"]["pool"]["generation"] = generation
            document["metadata"]["resourceVersion"] = (old.get("metadata") or {}).get("resourceVersion")
            self.client.put(f"{PATH}/{name}", document)
            writes += 1
            log.info("resource slice updated", extra={"node": self.node, "reason": name})
        return writes
