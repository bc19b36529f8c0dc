"""The nvidia plugin, node side: find NVIDIA GPUs through NVML and hand a container the GPUs it was given.

Discovery asks NVML through the `nvidia-ml-py` package (import name `pynvml`), which is not a dependency of
kubegpu: it is imported when needed, and a host without it, without the driver, or where `nvmlInit` fails has no
NVIDIA inventory (logged once, never a crash). Install it with `pip install kubegpu[nvidia]` or `pip install
nvidia-ml-py`.

* **GPUs** are NVML's devices 0..count-1; the NVML index is the device id the allocation uses ("0", "1", ...),
  which is what `NVIDIA_VISIBLE_DEVICES` counts. Each has its model (`nvmlDeviceGetName`, e.g.
  `Tesla V100-SXM2-16GB`), total memory in bytes and attributes `uuid`, `minor` (the N of `/dev/nvidiaN`) and
  `pciBusId`.
* **Topology** from NVLink: for every GPU, the enabled links (`nvmlDeviceGetNvLinkState`) and what is at their far
  end (`nvmlDeviceGetNvLinkRemotePciInfo`, `nvmlDeviceGetNvLinkRemoteDeviceType` when NVML has it). When every GPU
  reaches an NVSwitch, the topology is `{"kind": "nvswitch"}` (all-to-all). Otherwise GPUs joined by NVLink form
  groups, and a group of more than two is split further by how close its GPUs sit on PCIe
  (`nvmlDeviceGetTopologyCommonAncestor`: same switch, same host bridge, same CPU): on a DGX-1 hybrid cube-mesh this
  gives `{"groups": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]}`, the format `topology.tree_from_inventory` reads. Without
  NVLink the topology is left out and the scheduler falls back to the instance-type catalog.

Health: a GPU is healthy while NVML still finds its UUID and, when the driver's device files are visible under the
host root (`dev/nvidiactl` exists), its `dev/nvidiaN` file exists.

Advertisement: `nvidia.com/gpu` = healthy GPUs; on a node configured for shares (`KUBEGPU_NVIDIA_SHARE_LIMITS` set)
GPUs x `KUBEGPU_NVIDIA_SPLIT_COUNT` (default 10, HAMi's `deviceSplitCount`), with `nvidia.com/gpucores` and
`nvidia.com/gpumem-percentage` = 100 x GPUs and `nvidia.com/gpumem` = their MiB (`share_capacity`: what the scheduler
side reads as the split count and the offered share resources). Labels as GPU Feature Discovery writes them, for the
healthy GPUs: `nvidia.com/gpu.product` (the first healthy GPU's model with spaces as `-`: `Tesla-V100-SXM2-16GB`),
`nvidia.com/gpu.count`, `nvidia.com/gpu.memory` (MiB). Device-plugin ids (`kubegpu device-plugin`): the GPU indexes
for `nvidia.com/gpu`; on a node configured for shares with a split count above 1, one id per share slot instead,
`<index>::<slot>` (`core.models.slot_id`: GPU 0 split 10 ways is `0::0` to `0::9`), so that the kubelet admits as
many share pods per GPU as the scheduler places there, as under HAMi's device plugin; Allocate turns them back into
the GPUs the allocation names. With `KUBEGPU_NVIDIA_SERVE_MIG=true` it serves the MIG devices too (instead of NVIDIA's
device plugin): per owned profile resource, the ids `GPU@start` the scheduler allocates, read from NVML's layout.

Owned (`kubegpu_device_owned`; the CRI shim removes these from every container not granted NVIDIA GPUs):
`NVIDIA_VISIBLE_DEVICES` (the NVIDIA container runtime hands a container the GPUs it names, `all` included), the GPU
device nodes `/dev/nvidiaN`, mounts under `/var/run/nvidia-container-devices` (the runtime's volume-mount form of the
same list), CDI names of kind `nvidia.com/gpu`, and the GPU share limits with what would lift them (`limits.py`:
`CUDA_DEVICE_SM_LIMIT*`, `CUDA_DEVICE_MEMORY_LIMIT*`, `CUDA_MPS_*`, HAMi-core's switches, the `/etc/ld.so.preload`,
`/overrideEnv`, `/usr/local/vgpu`, `/tmp/vgpulock` and MPS pipe and log mounts; a share container gets the
allocation's values back, with every variable HAMi-core reads that could lift its share written, so that the image's
own ENV, which the runtime ranks below the container config, cannot).
Not owned: `CUDA_VISIBLE_DEVICES` (it only narrows, inside the container, the GPUs the container already has; a
user's value in a GPU container is legitimate), the control devices and `NVIDIA_DRIVER_CAPABILITIES` (neither gives
access to a GPU).

Container edit (the CRI shim, after it verified the allocation):

* every `/dev/nvidiaN` entry (by container or host path) is removed, then `/dev/nvidiaN` is added for each GPU,
  where N is the GPU's minor number from NVML when NVML is available in the shim (looked up once per process),
  else its index; the control devices `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools` and `nvidia-modeset` are added
  when present under `dev_root` and not already there;
* env `NVIDIA_VISIBLE_DEVICES="0,1"` (GPU indexes), which also tells the NVIDIA container runtime hook what to mount;
* CDI names `nvidia.com/gpu=N` (the index names of `nvidia-ctk cdi generate`), replacing any other name of that
  kind (`nvidia.com/gpu=all`, UUID names) in the CDI device list and in `cdi.k8s.io/*` annotations;
* for MIG devices (`nvidia.com/mig-<profile>`, ids `GPU@start`), `mig_node.py`: their MIG UUIDs in
  `NVIDIA_VISIBLE_DEVICES`, CDI names `nvidia.com/gpu=GPU:MIG index`, the parent GPU's device node; discovery lists
  a MIG-enabled GPU's instances in its attribute `mig`, and the advertisement counts them per profile;
* for a share (the allocation's `shares` name `nvidia.com/gpucores` and memory), the env and mounts of the node's
  enforcement, HAMi-core or MPS (`limits.py`, chosen by `KUBEGPU_NVIDIA_SHARE_LIMITS`; on a HAMi-core node the
  container's shared-region directory `<pod uid>_<container>` is made empty on the host here, and removed by
  `kubegpu_device_forget_pods` once its pod is gone); a share the node cannot enforce or read fails the edit, so the
  container is refused. Whole GPUs get no limits.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
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
    slot_id,
)
from kubegpu.plugins.nvidia import COUNT_LABEL, MEMORY_LABEL, NAME, PRODUCT_LABEL, RESOURCE
from kubegpu.plugins.nvidia.limits import (
    OWNED_ENV_PREFIXES,
    OWNED_ENVS,
    OWNED_MOUNTS,
    ShareLimitError,
    limits,
    node_sharing,
    read_container_share,
    remove_gone_regions,
)
from kubegpu.plugins.nvidia.mig import LAYOUT_ATTRIBUTE, MIG_RESOURCES, format_layout
from kubegpu.plugins.nvidia.mig_node import (
    MIG_OWNED,
    MigDevice,
    device_key,
    mig_advertisement,
    mig_plugin_ids,
    profile_from_name,
    visible_devices,
)
from kubegpu.plugins.nvidia.sharing import CORES, MEMORY, MEMORY_PERCENT, SHARE_RESOURCES

__all__ = ["CDI_KIND", "NAME", "OWNED", "RESOURCES", "VISIBLE_ENV", "discover", "link_groups", "product_label"]


# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------

VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
CDI_KIND = "nvidia.com/gpu"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
RESOURCES = [RESOURCE, *SHARE_RESOURCES, *MIG_RESOURCES]
OWNED = DeviceOwnership(
    envs=tuple(sorted((VISIBLE_ENV, *OWNED_ENVS))),
    env_prefixes=OWNED_ENV_PREFIXES,
    # the MIG capability devices open a MIG instance to whoever also has its GPU: never from a pod's spec
    device_paths=(r"/dev/nvidia(0|[1-9][0-9]*)", r"/dev/nvidia-caps/.*"),
    mount_paths=(r"/var/run/nvidia-container-devices(/.*)?", *OWNED_MOUNTS),
    cdi_kinds=(CDI_KIND,),
)
MIB = 1024 * 1024
SERVE_MIG_ENV = "KUBEGPU_NVIDIA_SERVE_MIG"  # `kubegpu device-plugin` serves the MIG devices too ("true")
SPLIT_ENV = "KUBEGPU_NVIDIA_SPLIT_COUNT"  # shares per GPU on a node configured for shares (HAMi's deviceSplitCount)
DEFAULT_SPLIT = 10
MAX_SPLIT = 1000
LABEL_LIMIT = 63
FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
DEVICE_TYPE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
DEFAULT_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS of current drivers

_GPU_FILE = re.compile(r"nvidia(0|[1-9][0-9]*)")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

log = logging.getLogger(__name__)

# (the pynvml module it was read from, index -> minor number, index -> memory in bytes): one NVML session per shim
# process, not per container.
_gpu_cache: tuple[ModuleType, dict[int, int], dict[int, int]] | None = None
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_init_failures: set[str] = set()


# ----------------------------------------------------------------------------------------------------------
# Hook implementations
# ----------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return list(RESOURCES)


@hookimpl
def kubegpu_device_owned() -> DeviceOwnership:
    return OWNED


@hookimpl
def kubegpu_device_discover(host_root: Path) -> DeviceInventory | None:
    nvml = _load_nvml()
    if nvml is None:
        return None
    inventory: DeviceInventory | None = _with_nvml(nvml, discover, None)
    return inventory


@hookimpl
def kubegpu_device_health(host_root: Path, inventory: DeviceInventory) -> dict[str, bool]:
    nvml = _load_nvml()
    alive: set[str] = set()
    if nvml is not None:
        alive = _with_nvml(nvml, lambda n: _live_uuids(n, inventory), set())
    dev = host_root / "dev"
    files_visible = (dev / "nvidiactl").exists()
    health = {}
    for device in inventory.devices:
        uuid = str(device.attributes.get("uuid", ""))
        minor = device.attributes.get("minor", device.id)
        present = not files_visible or (dev / f"nvidia{minor}").exists()
        health[device.id] = uuid in alive and present
    return health


@hookimpl
def kubegpu_device_advertise(inventory: DeviceInventory) -> Advertisement:
    healthy = [d for d in inventory.devices if d.healthy]
    labels = {COUNT_LABEL: str(len(healthy))}
    if healthy and healthy[0].model:
        labels[PRODUCT_LABEL] = product_label(healthy[0].model)
    if healthy and healthy[0].memory:
        labels[MEMORY_LABEL] = str(healthy[0].memory // MIB)
    whole, mig_capacity, mig_labels = mig_advertisement(healthy)  # MIG-enabled GPUs count as their MIG devices
    capacity = share_capacity(whole, node_sharing().mode, os.environ.get(SPLIT_ENV))
    return Advertisement(capacity={**capacity, **mig_capacity}, labels={**labels, **mig_labels})


@hookimpl
def kubegpu_device_plugin_ids(inventory: DeviceInventory) -> dict[str, dict[str, bool]]:
    # MIG devices where the node asks for them (`KUBEGPU_NVIDIA_SERVE_MIG`); else NVIDIA's device plugin serves them
    migs = (
        mig_plugin_ids(inventory.devices) if os.environ.get(SERVE_MIG_ENV, "").strip().lower() in ("1", "true") else {}
    )
    gpus = [d for d in inventory.devices if LAYOUT_ATTRIBUTE not in d.attributes]
    split = split_count(os.environ.get(SPLIT_ENV)) if node_sharing().mode is not None else 0
    if split > 1:  # HAMi's accounting: one id per share slot, so that the kubelet admits `split` share pods per GPU
        return {RESOURCE: {slot_id(d.id, slot): d.healthy for d in gpus for slot in range(split)}, **migs}
    return {RESOURCE: {d.id: d.healthy for d in gpus}, **migs}


@hookimpl
def kubegpu_device_edit_container(allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path) -> bool | None:
    ids = allocation.resources.get(RESOURCE)
    migs = {r: devices for r, devices in allocation.resources.items() if r in MIG_OWNED and devices}
    if migs:
        if ids:
            raise ValueError("the allocation gives the container GPUs and MIG devices; it gets one or the other")
        return edit_mig(migs, edit, dev_root)
    if not ids:
        return None
    indexes = []
    for gpu in ids:
        if not (gpu.isascii() and gpu.isdigit()):
            raise ValueError(f"allocation names GPU {gpu!r}, which is not an NVIDIA GPU index (0, 1, ...)")
        indexes.append(int(gpu))
    indexes = sorted(set(indexes))
    try:
        share = read_container_share(allocation, [str(i) for i in indexes], lambda i: memory_totals().get(i))
        holder = f"{allocation.pod_uid}_{allocation.container}"
        envs, mounts = limits(share, node_sharing(), holder) if share is not None else ({}, [])
    except ShareLimitError as exc:
        raise ValueError(f"GPU share: {exc}") from None
    minors = minor_numbers()

    edit.devices = [d for d in edit.devices if not (_is_gpu_file(d.container_path) or _is_gpu_file(d.host_path))]
    for index in indexes:
        minor = minors.get(index, index)
        edit.devices.append(
            DeviceNode(host_path=str(dev_root / f"nvidia{minor}"), container_path=f"/dev/nvidia{minor}")
        )
    present = {d.container_path for d in edit.devices}
    for name in CONTROL_DEVICES:
        if f"/dev/{name}" not in present and (dev_root / name).exists():
            edit.devices.append(DeviceNode(host_path=str(dev_root / name), container_path=f"/dev/{name}"))
    edit.envs[VISIBLE_ENV] = ",".join(str(i) for i in indexes)
    edit.envs.update(envs)
    paths = {m.container_path for m in mounts}
    edit.mounts = [m for m in edit.mounts if m.container_path not in paths] + mounts
    edit.replace_cdi_devices(CDI_KIND, [f"{CDI_KIND}={i}" for i in indexes])
    return True


@hookimpl
def kubegpu_device_forget_pods(live_pods: frozenset[str]) -> int:
    # HAMi-core's region directories of the pods that are gone (`limits.remove_gone_regions`), within a bounded time.
    return remove_gone_regions(node_sharing(), live_pods)


# ----------------------------------------------------------------------------------------------------------
# NVML
# ----------------------------------------------------------------------------------------------------------


def _load_nvml() -> ModuleType | None:
    """The `pynvml` module, or None when nvidia-ml-py is not installed (a host without NVIDIA GPUs, usually)."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _with_nvml(nvml: ModuleType, work: Callable[[ModuleType], Any], default: Any) -> Any:
    """Run `work` inside nvmlInit/nvmlShutdown; an NVML failure (no driver, no GPU) gives `default`."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # Said once per reason: an advertiser on a host without the driver would otherwise repeat it every interval.
        message = str(exc)
        if message not in _init_failures:
            _init_failures.add(message)
            log.info("NVML is not usable, so no NVIDIA GPUs are found: %s", message)
        return default
    try:
        return work(nvml)
    except nvml.NVMLError as exc:
        log.warning("NVML failed while reading the GPUs: %s", exc)
        return default
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def discover(nvml: ModuleType) -> DeviceInventory | None:
    """The inventory NVML describes (call between nvmlInit and nvmlShutdown)."""
    count = nvml.nvmlDeviceGetCount()
    if count < 1:
        return None
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    buses = [_bus_id(nvml.nvmlDeviceGetPciInfo(h)) for h in handles]
    devices = []
    for index, handle in enumerate(handles):
        attributes: dict[str, Scalar] = {"uuid": _text(nvml.nvmlDeviceGetUUID(handle))}
        minor = _optional(nvml, "nvmlDeviceGetMinorNumber", handle)
        attributes["minor"] = minor if isinstance(minor, int) else index
        migs = mig_devices_of(nvml, index, handle)
        if migs is not None:
            attributes[LAYOUT_ATTRIBUTE] = format_layout([(m.profile, m.start) for m in migs])
        if buses[index]:
            attributes["pciBusId"] = buses[index]
        devices.append(
            DeviceInfo(
                id=str(index),
                model=_text(nvml.nvmlDeviceGetName(handle)).strip() or None,
                memory=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                attributes=attributes,
            )
        )
    topology = nvlink_topology(nvml, handles, buses)
    return DeviceInventory(plugin=NAME, devices=devices, topology=topology)


def nvlink_topology(nvml: ModuleType, handles: Sequence[Any], buses: Sequence[str]) -> dict[str, Any]:
    """The inventory topology from NVLink (and PCIe closeness inside NVLink groups); {} without NVLink."""
    gpu_of_bus = {bus: i for i, bus in enumerate(buses) if bus}
    max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", DEFAULT_MAX_LINKS))
    linked: set[tuple[int, int]] = set()
    on_switch: set[int] = set()
    for i, handle in enumerate(handles):
        for link in range(max_links):
            state = _optional(nvml, "nvmlDeviceGetNvLinkState", handle, link)
            if state != FEATURE_ENABLED:
                continue
            remote_type = _optional(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
            info = _optional(nvml, "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
            remote = gpu_of_bus.get(_bus_id(info)) if info is not None else None
            if remote_type == DEVICE_TYPE_SWITCH or (remote is None and info is not None and remote_type is None):
                on_switch.add(i)
            elif remote is not None and remote != i:
                linked.add((min(i, remote), max(i, remote)))
    count = len(handles)
    if count > 1 and len(on_switch) == count:
        return {"kind": "nvswitch"}
    switch = sorted(on_switch)
    linked |= {(a, b) for a in switch for b in switch if a < b}
    if not linked:
        return {}

    def ancestor(a: int, b: int) -> int | None:
        level = _optional(nvml, "nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b])
        return level if isinstance(level, int) else None

    return {"groups": link_groups(count, linked, ancestor)}


def link_groups(count: int, linked: Iterable[tuple[int, int]], ancestor: Callable[[int, int], int | None]) -> list[Any]:
    """Nested groups over GPUs 0..count-1: the NVLink-connected sets (two or more GPUs), each split by PCIe
    closeness where `ancestor(a, b)` (NVML's common-ancestor level: lower is closer) tells it."""
    pairs = {(min(a, b), max(a, b)) for a, b in linked}
    components = _components(list(range(count)), lambda a, b: (min(a, b), max(a, b)) in pairs)
    groups = [_refine(c, ancestor) for c in components if len(c) > 1]
    if len(components) == 1 and groups and isinstance(groups[0][0], list):
        return list(groups[0])  # one group of every GPU, split further: its parts are the root's groups
    return groups


def _refine(members: list[int], ancestor: Callable[[int, int], int | None]) -> Any:
    """Split `members` at the closest PCIe level that divides them, recursively; a lone GPU stays itself."""
    if len(members) == 1:
        return members[0]
    levels: dict[tuple[int, int], int] = {}
    for x, a in enumerate(members):
        for b in members[x + 1 :]:
            level = ancestor(a, b)
            if level is None:  # NVML cannot tell: keep the NVLink group whole
                return members
            levels[(a, b)] = level
    for threshold in sorted(set(levels.values()), reverse=True)[1:]:  # skip the level that joins them all

        def close(a: int, b: int, threshold: int = threshold) -> bool:
            return levels[(min(a, b), max(a, b))] <= threshold

        parts = _components(members, close)
        if len(parts) > 1:
            return [_refine(part, ancestor) for part in parts]
    return members


def _components(members: list[int], joined: Callable[[int, int], bool]) -> list[list[int]]:
    """The connected components of `members` under `joined`, each ascending, ordered by their lowest member."""
    left = list(members)
    found = []
    while left:
        stack, component = [left.pop(0)], []
        while stack:
            a = stack.pop()
            component.append(a)
            near = [b for b in left if joined(a, b)]
            left = [b for b in left if b not in near]
            stack.extend(near)
        found.append(sorted(component))
    return sorted(found)


def _live_uuids(nvml: ModuleType, inventory: DeviceInventory) -> set[str]:
    alive = set()
    for device in inventory.devices:
        uuid = str(device.attributes.get("uuid", ""))
        if uuid and _optional(nvml, "nvmlDeviceGetHandleByUUID", uuid) is not None:
            alive.add(uuid)
    return alive


def mig_devices_of(nvml: ModuleType, index: int, handle: Any) -> list[MigDevice] | None:
    """The MIG devices of GPU `index` (call between nvmlInit and nvmlShutdown), None when MIG is not enabled on it:
    NVML's MIG device handles, each with its profile (from its name), its GPU instance's placement start and UUID."""
    mode = _optional(nvml, "nvmlDeviceGetMigMode", handle)
    current = mode[0] if isinstance(mode, (tuple, list)) and mode else mode
    if current != MIG_ENABLED:
        return None
    found = []
    for slot in range(int(_optional(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0)):
        mig = _optional(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig is None:
            continue
        profile = profile_from_name(_text(_optional(nvml, "nvmlDeviceGetName", mig) or ""))
        instance_id = _optional(nvml, "nvmlDeviceGetGpuInstanceId", mig)
        instance = _optional(nvml, "nvmlDeviceGetGpuInstanceById", handle, instance_id)
        info = _optional(nvml, "nvmlGpuInstanceGetInfo", instance) if instance is not None else None
        start = getattr(getattr(info, "placement", None), "start", None)
        if profile is None or not isinstance(start, int):
            log.warning("GPU %d: MIG device %d left out: NVML gives no profile or placement", index, slot)
            continue
        found.append(MigDevice(index, profile, start, _text(nvml.nvmlDeviceGetUUID(mig)), slot))
    return sorted(found, key=lambda m: m.start)


def mig_devices() -> dict[str, MigDevice]:
    """Every MIG device of the node by `GPU@start`, {} without NVML. Read for every MIG container, never cached:
    the MIG manager may lay a GPU out anew at any time, and an instance made again has a new UUID."""
    nvml = _load_nvml()
    if nvml is None:
        return {}

    def read(n: ModuleType) -> dict[str, MigDevice]:
        listed: dict[str, MigDevice] = {}
        for index in range(n.nvmlDeviceGetCount()):
            for device in mig_devices_of(n, index, n.nvmlDeviceGetHandleByIndex(index)) or []:
                listed[device_key(device.gpu, device.start)] = device
        return listed

    found: dict[str, MigDevice] | None = _with_nvml(nvml, read, None)
    return found or {}


def edit_mig(resources: dict[str, list[str]], edit: ContainerEdit, dev_root: Path) -> bool:
    """Give a container its MIG devices (`mig_node`): their UUIDs in NVIDIA_VISIBLE_DEVICES, their CDI names, the
    parent GPUs' device nodes and the control devices. Raises `ValueError` when NVML does not list one of them."""
    devices, missing = visible_devices(resources, mig_devices())
    if missing:
        raise ValueError(missing)
    minors = minor_numbers()
    edit.devices = [d for d in edit.devices if not (_is_gpu_file(d.container_path) or _is_gpu_file(d.host_path))]
    for gpu in sorted({d.gpu for d in devices}):
        minor = minors.get(gpu, gpu)
        edit.devices.append(
            DeviceNode(host_path=str(dev_root / f"nvidia{minor}"), container_path=f"/dev/nvidia{minor}")
        )
    present = {d.container_path for d in edit.devices}
    for name in CONTROL_DEVICES:
        if f"/dev/{name}" not in present and (dev_root / name).exists():
            edit.devices.append(DeviceNode(host_path=str(dev_root / name), container_path=f"/dev/{name}"))
    edit.envs[VISIBLE_ENV] = ",".join(d.uuid for d in devices)
    edit.replace_cdi_devices(CDI_KIND, [f"{CDI_KIND}={d.gpu}:{d.index}" for d in devices])
    return True


def minor_numbers() -> dict[int, int]:
    """GPU index -> minor number from NVML, read once per process (and per pynvml module); {} without NVML."""
    return _node_gpus()[0]


def memory_totals() -> dict[int, int]:
    """GPU index -> memory in bytes from NVML, read with `minor_numbers`; {} without NVML."""
    return _node_gpus()[1]


def _node_gpus() -> tuple[dict[int, int], dict[int, int]]:
    global _gpu_cache
    nvml = _load_nvml()
    if nvml is None:
        return {}, {}
    if _gpu_cache is not None and _gpu_cache[0] is nvml:
        return _gpu_cache[1], _gpu_cache[2]

    def read(n: ModuleType) -> tuple[dict[int, int], dict[int, int]]:
        minors, memories = {}, {}
        for index in range(n.nvmlDeviceGetCount()):
            handle = n.nvmlDeviceGetHandleByIndex(index)
            minor = _optional(n, "nvmlDeviceGetMinorNumber", handle)
            if isinstance(minor, int):
                minors[index] = minor
            memory = _optional(n, "nvmlDeviceGetMemoryInfo", handle)
            if memory is not None and isinstance(getattr(memory, "total", None), int):
                memories[index] = memory.total
        return minors, memories

    found: tuple[dict[int, int], dict[int, int]] | None = _with_nvml(nvml, read, None)
    if found is None:
        return {}, {}
    _gpu_cache = (nvml, *found)
    return found


def _optional(nvml: ModuleType, function: str, *args: Any) -> Any:
    """`nvml.<function>(*args)`, or None when NVML does not support it here (an old driver or nvidia-ml-py, a GPU
    without NVLink)."""
    try:
        return getattr(nvml, function)(*args)
    except (nvml.NVMLError, AttributeError):
        return None


def _text(value: object) -> str:
    """NVML strings come as bytes from older nvidia-ml-py releases and as str from newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_id(info: object) -> str:
    """A PCI bus id normalised for comparison (`00000000:07:00.0` and `0000:07:00.0` are the same device)."""
    raw = _text(getattr(info, "busId", "") or "").strip().lower()
    parts = raw.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return raw
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return raw


# ----------------------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------------------


def product_label(model: str) -> str:
    """A model as GPU Feature Discovery writes `nvidia.com/gpu.product`: spaces (and anything a label value may
    not hold) as `-`, at most 63 characters, starting and ending alphanumeric."""
    value = _LABEL_UNSAFE.sub("-", model.strip())[:LABEL_LIMIT]
    return value.strip("-_.")


def share_capacity(healthy: Sequence[DeviceInfo], mode: str | None, split_text: str | None) -> dict[str, int]:
    """The extended resources of the healthy GPUs: `nvidia.com/gpu` = GPUs, or on a node configured for shares
    (`mode` set), as HAMi's device plugin counts them: `nvidia.com/gpu` = GPUs x the split count (`split_text`,
    default 10), `nvidia.com/gpucores` and `nvidia.com/gpumem-percentage` = 100 x GPUs and `nvidia.com/gpumem` = their
    MiB (when every GPU's memory is known), so that the kubelet's admission counts shares as the scheduler does."""
    count = len(healthy)
    split = split_count(split_text) if mode is not None else 0
    if not split:
        return {RESOURCE: count}
    capacity = {RESOURCE: count * split, CORES: 100 * count, MEMORY_PERCENT: 100 * count}
    if healthy and all(d.memory for d in healthy):
        capacity[MEMORY] = sum((d.memory or 0) // MIB for d in healthy)
    return capacity


def split_count(split_text: str | None) -> int:
    """Shares per GPU on a node configured for shares: `KUBEGPU_NVIDIA_SPLIT_COUNT` (`split_text`), default 10;
    0 (warned) when it is not a count from 1 to 1000: then shares are not advertised."""
    if split_text is None or not split_text.strip():
        return DEFAULT_SPLIT
    text = split_text.strip()
    if text.isascii() and text.isdigit() and len(text) <= 4 and 1 <= int(text) <= MAX_SPLIT:
        return int(text)
    log.warning("%s is %r, not a count from 1 to %d; shares are not advertised", SPLIT_ENV, text[:20], MAX_SPLIT)
    return 0


def _is_gpu_file(path: str) -> bool:
    """A GPU's device node, or a MIG capability device (which opens a MIG instance to whoever has its GPU)."""
    return _GPU_FILE.fullmatch(Path(path).name) is not None or Path(path).parent.name == "nvidia-caps"
