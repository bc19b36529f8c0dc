"""The neuron plugin, node side: find Neuron devices on a host and hand a container the ones it was given.

Discovery reads only the host root it is given (`/` in production, a fake tree in tests):

* **Devices** are the device files `dev/neuron0`, `dev/neuron1`, ...; the number in the name is the device id the
  allocation uses ("0", "1", ...). A host without them has no Neuron inventory.
* **Details**, all optional, from the Neuron driver's sysfs directory
  `sys/devices/virtual/neuron_device/neuronN/` (`core_count`, `connected_devices`,
  `info/architecture/instance_type`, `info/architecture/device_name`) and from `neuron-ls --json-output` when that
  tool is on PATH (a JSON list of `{"neuron_device", "nc_count", "memory_size", "connected_to", "bdf"}`). Its
  absence, failure or odd output is normal and only costs details.
* **Instance type** from the driver's `instance_type`, else the DMI product name
  (`sys/devices/virtual/dmi/id/product_name`, which on EC2 Nitro instances is the instance type). A type in the
  scheduler's catalog (`topology.CATALOG`) gives the topology and NeuronCores per device.
* **Topology**: the catalog's for a known instance type; otherwise a 4x4 torus when the node has 16 device ids and
  the links (from neuron-ls or sysfs) do not say the devices form a ring (each linked to at most two others, as on
  inf1.24xlarge); otherwise a ring. The device count is the highest device id + 1, so a missing device file in the
  middle does not change the shape (and the advertiser keeps the last topology while devices are missing).

The inventory: devices `{"id": "N", "cores", "memory", "model", "attributes": {"bdf", "connectedTo"}}`,
`topology` `{"kind": "torus", "rows": 4, "columns": 4}` or `{"kind": "ring"}`, `attributes`
`{"instanceType": ...}` when known; the scheduler side (`scheduler.node_shape`) reads exactly these fields.

Health: a device whose file has disappeared is unhealthy. Advertisement: `aws.amazon.com/neuron` and
`aws.amazon.com/neurondevice` = healthy devices, `aws.amazon.com/neuroncore` = their cores (when the core count is
known); no labels. Device-plugin ids (`kubegpu device-plugin`): the device ids for both device resources, and for
`aws.amazon.com/neuroncore` the core ids `device * cores + n`, the numbering the scheduler allocates cores in.

Owned (`kubegpu_device_owned`; the CRI shim removes these from every container not granted Neuron devices):
`AWS_NEURON_VISIBLE_DEVICES` and `NEURON_RT_VISIBLE_CORES` (the Neuron OCI hook and runtime hand a container the
devices and cores they name), the device nodes `/dev/neuronN` and CDI names of kind `aws.amazon.com/neuron`.

Container edit (the CRI shim, after it verified the allocation):

* whole devices (`aws.amazon.com/neuron`, `aws.amazon.com/neurondevice`): the device ids as listed;
  NeuronCores (`aws.amazon.com/neuroncore`): the devices the cores live on, core // `coresPerDevice` (a field of
  the allocation's `plugins.neuron`);
* every device entry whose container or host path is a `/dev/neuronN` file is removed (a vendor device plugin may
  have added others), then `/dev/neuronN` is added for each device, from `dev_root/neuronN`, at the same path in
  the container (the Neuron runtime expects the host's numbering);
* env `AWS_NEURON_VISIBLE_DEVICES="2,3"` for whole devices, `NEURON_RT_VISIBLE_CORES="0-8"` for cores (a range
  when contiguous, else a comma list); the variable of the other kind is removed, because a value left by a vendor
  device plugin would name devices the container does not have;
* CDI names `aws.amazon.com/neuron=neuronN`, replacing any other name of that kind in the CDI device list and in
  `cdi.k8s.io/*` annotations.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceInfo,
    DeviceInventory,
    DeviceNode,
    DeviceOwnership,
    Scalar,
)
from kubegpu.plugins.neuron import NAME, NEURON, NEURONCORE, NEURONDEVICE, RESOURCES
from kubegpu.plugins.neuron import topology as topo

__all__ = [
    "CDI_KIND",
    "NAME",
    "OWNED",
    "RESOURCES",
    "VISIBLE_CORES_ENV",
    "VISIBLE_DEVICES_ENV",
    "core_ranges",
    "discover",
    "parse_neuron_ls",
]


# ------------------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------------------

VISIBLE_DEVICES_ENV = "AWS_NEURON_VISIBLE_DEVICES"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
CDI_KIND = "aws.amazon.com/neuron"
OWNED = DeviceOwnership(
    envs=(VISIBLE_DEVICES_ENV, VISIBLE_CORES_ENV),
    device_paths=(r"/dev/neuron(0|[1-9][0-9]*)",),
    cdi_kinds=(CDI_KIND,),
)
NEURON_LS = "neuron-ls"
NEURON_LS_TIMEOUT = 10.0
SYSFS_DEVICES = Path("sys/devices/virtual/neuron_device")
DMI_PRODUCT = Path("sys/devices/virtual/dmi/id/product_name")
TORUS_DEVICES = 16
MODELS = {
    "inf1": "Inferentia",
    "inf2": "Inferentia2",
    "trn1": "Trainium",
    "trn1n": "Trainium",
    "trn2": "Trainium2",
    "trn2u": "Trainium2",
}

_DEVICE_FILE = re.compile(r"neuron(0|[1-9][0-9]*)")
_INSTANCE_TYPE = re.compile(r"(inf|trn)[0-9]+[a-z]*\.[0-9a-z]+")

log = logging.getLogger(__name__)


@dataclass
class _Details:
    """What sysfs and neuron-ls add to a device file: all optional."""

    cores: int | None = None
    memory: int | None = None
    model: str | None = None
    bdf: str | None = None
    connected: list[int] | None = None
    instance_type: str | None = None
    extra: dict[str, Scalar] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------------------
# Hook implementations
# ------------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return list(RESOURCES)


@hookimpl
def kubegpu_device_owned() -> DeviceOwnership:
    return OWNED


@hookimpl
def kubegpu_device_discover(host_root: Path) -> DeviceInventory | None:
    return discover(host_root, neuron_ls=_run_neuron_ls())


@hookimpl
def kubegpu_device_health(host_root: Path, inventory: DeviceInventory) -> dict[str, bool]:
    return {d.id: (host_root / "dev" / f"neuron{d.id}").exists() for d in inventory.devices}


@hookimpl
def kubegpu_device_advertise(inventory: DeviceInventory) -> Advertisement:
    healthy = [d for d in inventory.devices if d.healthy]
    capacity = {NEURON: len(healthy), NEURONDEVICE: len(healthy)}
    if all(d.cores for d in inventory.devices):
        capacity[NEURONCORE] = sum(d.cores or 0 for d in healthy)
    return Advertisement(capacity=capacity)


@hookimpl
def kubegpu_device_plugin_ids(inventory: DeviceInventory) -> dict[str, dict[str, bool]]:
    devices = {d.id: d.healthy for d in inventory.devices}
    ids = {NEURON: devices, NEURONDEVICE: dict(devices)}
    if inventory.devices and all(d.cores for d in inventory.devices):
        ids[NEURONCORE] = {
            str(int(d.id) * (d.cores or 0) + core): d.healthy for d in inventory.devices for core in range(d.cores or 0)
        }
    return ids


@hookimpl
def kubegpu_device_edit_container(allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path) -> bool | None:
    whole = [*allocation.resources.get(NEURON, []), *allocation.resources.get(NEURONDEVICE, [])]
    cores = allocation.resources.get(NEURONCORE, [])
    if not whole and not cores:
        return None
    device_ids = {_number(d, "device") for d in whole}
    core_ids = sorted({_number(c, "core") for c in cores})
    if core_ids:
        per_device = allocation.fields.get("coresPerDevice")
        if not isinstance(per_device, int) or isinstance(per_device, bool) or per_device < 1:
            raise ValueError(
                f"the allocation gives NeuronCores but plugins.neuron.coresPerDevice is {per_device!r}, "
                "not a positive integer"
            )
        device_ids |= {core // per_device for core in core_ids}
    devices = sorted(device_ids)

    edit.devices = [d for d in edit.devices if not (_is_neuron_path(d.container_path) or _is_neuron_path(d.host_path))]
    edit.devices.extend(
        DeviceNode(host_path=str(dev_root / f"neuron{d}"), container_path=f"/dev/neuron{d}") for d in devices
    )
    if whole:
        edit.envs[VISIBLE_DEVICES_ENV] = ",".join(str(d) for d in sorted({_number(d, "device") for d in whole}))
    else:
        edit.envs.pop(VISIBLE_DEVICES_ENV, None)
    if core_ids:
        edit.envs[VISIBLE_CORES_ENV] = core_ranges(core_ids)
    else:
        edit.envs.pop(VISIBLE_CORES_ENV, None)
    edit.replace_cdi_devices(CDI_KIND, [f"{CDI_KIND}=neuron{d}" for d in devices])
    return True


# ------------------------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------------------------


def discover(host_root: Path, *, neuron_ls: object = None) -> DeviceInventory | None:
    """The inventory of the Neuron devices under `host_root`, given `neuron-ls --json-output`'s parsed output."""
    ids = device_files(host_root / "dev")
    if not ids:
        return None
    tool = parse_neuron_ls(neuron_ls)
    sysfs = {d: _sysfs_details(host_root / SYSFS_DEVICES / f"neuron{d}") for d in ids}
    instance_type = next((s.instance_type for s in sysfs.values() if s.instance_type), None) or _dmi_type(host_root)
    catalog = topo.CATALOG.get(instance_type) if instance_type else None
    family = instance_type.split(".")[0] if instance_type else None

    devices = []
    links: dict[int, list[int]] = {}
    for d in ids:
        found, extra = sysfs[d], tool.get(d, _Details())
        cores = extra.cores or found.cores or (catalog.cores_per_device if catalog else None)
        connected = extra.connected if extra.connected is not None else found.connected
        if connected is not None:
            links[d] = connected
        attributes: dict[str, Scalar] = {}
        if extra.bdf:
            attributes["bdf"] = extra.bdf
        if connected:
            attributes["connectedTo"] = ",".join(str(c) for c in connected)
        devices.append(
            DeviceInfo(
                id=str(d),
                model=found.model or (MODELS.get(family) if family else None),
                memory=extra.memory,
                cores=cores,
                attributes=attributes,
            )
        )
    topology = infer_topology(max(ids) + 1, catalog, links)
    attributes = {"instanceType": instance_type} if instance_type else {}
    return DeviceInventory(plugin=NAME, devices=devices, topology=topology, attributes=attributes)


def device_files(dev: Path) -> list[int]:
    """The ids of the `neuronN` files in `dev`, ascending."""
    if not dev.is_dir():
        return []
    return sorted(int(m.group(1)) for p in dev.iterdir() if (m := _DEVICE_FILE.fullmatch(p.name)))


def infer_topology(count: int, catalog: topo.InstanceShape | None, links: Mapping[int, list[int]]) -> dict[str, Any]:
    """The `topology` of the inventory; see the module docstring for the rule."""
    if catalog is not None and count <= catalog.devices:
        if catalog.kind == "torus":
            return {"kind": "torus", "rows": catalog.rows, "columns": catalog.columns}
        return {"kind": "ring"}
    ring_links = bool(links) and max(len(set(c)) for c in links.values()) <= 2
    if count == TORUS_DEVICES and not ring_links:
        return {"kind": "torus", "rows": 4, "columns": 4}
    return {"kind": "ring"}


def parse_neuron_ls(document: object) -> dict[int, _Details]:
    """Device id -> details from `neuron-ls --json-output` (a list of devices, or an object holding one under
    `neuron_devices`); entries or fields of an unexpected shape are skipped."""
    if isinstance(document, dict):
        document = document.get("neuron_devices")
    if not isinstance(document, list):
        return {}
    found: dict[int, _Details] = {}
    for entry in document:
        if not isinstance(entry, dict):
            continue
        device = _int(entry.get("neuron_device"))
        if device is None:
            continue
        connected = entry.get("connected_to")
        found[device] = _Details(
            cores=_positive(entry.get("nc_count")),
            memory=_positive(entry.get("memory_size")),
            bdf=entry["bdf"] if isinstance(entry.get("bdf"), str) else None,
            connected=[c for c in (_int(x) for x in connected) if c is not None]
            if isinstance(connected, list)
            else None,
        )
    return found


def _run_neuron_ls() -> object:
    """`neuron-ls --json-output` parsed, or None when the tool is absent or fails (both normal)."""
    path = shutil.which(NEURON_LS)
    if path is None:
        return None
    try:
        result = subprocess.run(
            [path, "--json-output"], capture_output=True, text=True, timeout=NEURON_LS_TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("neuron-ls could not run: %s", exc)
        return None
    if result.returncode != 0:
        log.warning("neuron-ls exited with %d: %s", result.returncode, result.stderr.strip()[-300:])
        return None
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        log.warning("neuron-ls printed no JSON (%s); its details are ignored", exc.msg)
        return None


def _sysfs_details(directory: Path) -> _Details:
    details = _Details()
    details.cores = _positive(_read(directory / "core_count"))
    connected = _read(directory / "connected_devices")
    if connected is not None:
        details.connected = [int(p) for p in re.split(r"[\s,]+", connected) if p.isdigit()]
    details.model = _read(directory / "info" / "architecture" / "device_name") or None
    details.instance_type = _instance_type(_read(directory / "info" / "architecture" / "instance_type"))
    return details


def _dmi_type(host_root: Path) -> str | None:
    return _instance_type(_read(host_root / DMI_PRODUCT))


def _instance_type(text: str | None) -> str | None:
    """An EC2 Neuron instance type (`trn1.32xlarge`), or None for anything else (a product name of another box)."""
    if not text:
        return None
    text = text.strip().lower()
    return text if _INSTANCE_TYPE.fullmatch(text) else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _positive(value: object) -> int | None:
    number = _int(value)
    return number if number is not None and number > 0 else None


# ------------------------------------------------------------------------------------------------------------
# Container edit helpers
# ------------------------------------------------------------------------------------------------------------


def core_ranges(cores: Iterable[int]) -> str:
    """`NEURON_RT_VISIBLE_CORES` for a core set: `0-8` when contiguous, else a comma list (`0,2,5`)."""
    ordered = sorted(set(cores))
    if not ordered:
        return ""
    if len(ordered) > 1 and ordered[-1] - ordered[0] + 1 == len(ordered):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(c) for c in ordered)


def _number(value: str, what: str) -> int:
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"allocation names {what} {value!r}, which is not a Neuron {what} id (0, 1, ...)")
    return int(value)


def _is_neuron_path(path: str) -> bool:
    return _DEVICE_FILE.fullmatch(Path(path).name) is not None
