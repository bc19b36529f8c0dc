"""MIG on the node: what a node with MIG-enabled GPUs advertises, and what a container granted MIG devices gets.

The scheduler side (`mig.py`) names each MIG device `<GPU index>@<start slice>` under its profile's resource
(`nvidia.com/mig-3g.40gb: ["1@4"]`). NVML (read by `device.py`) tells, for every MIG-enabled GPU, the instances it
holds: profile, start slice, MIG UUID and the MIG device's index on its GPU. From these:

* **Advertisement**, as NVIDIA's device plugin and GPU Feature Discovery have it under the mixed strategy:
  `nvidia.com/mig-<profile>` = that profile's devices on healthy GPUs, `nvidia.com/gpu` only the GPUs that are not
  MIG-enabled, labels `nvidia.com/mig.strategy: mixed` and `nvidia.com/mig-<profile>.count`. The inventory carries
  each MIG-enabled GPU's layout as its attribute `mig` (`3g.40gb@0,2g.20gb@4`), which the scheduler reads.
* **Container edit**: `NVIDIA_VISIBLE_DEVICES` = the MIG UUIDs (`MIG-...`, the form the NVIDIA container toolkit
  takes for MIG devices), CDI names `nvidia.com/gpu=<GPU>:<MIG index>` (the names `nvidia-ctk cdi generate` gives MIG
  devices), and the parent GPUs' device nodes `/dev/nvidiaN` with the control devices; the MIG capability devices
  (`/dev/nvidia-caps/...`) are the container toolkit's to add, as for every MIG container. A device the allocation
  names that NVML does not list on this node (its layout changed after scheduling) fails the edit, so the container
  is refused rather than given another instance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kubegpu.core.models import DeviceInfo
from kubegpu.plugins.nvidia.mig import (
    LAYOUT_ATTRIBUTE,
    MIG_RESOURCES,
    STRATEGY_LABEL,
    LayoutError,
    parse_layout,
    resource_of,
)

__all__ = [
    "MIG_OWNED",
    "MigDevice",
    "device_key",
    "mig_advertisement",
    "mig_plugin_ids",
    "parse_device",
    "visible_devices",
]

MIG_OWNED = frozenset(MIG_RESOURCES)
_DEVICE = re.compile(r"(0|[1-9][0-9]{0,3})@([0-7])")
_PROFILE_IN_NAME = re.compile(r"MIG ([1-7]g\.[0-9]{1,3}gb(?:\+me)?)\s*$")


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device as NVML lists it: its GPU index, profile, start slice, UUID and index on its GPU."""

    gpu: int
    profile: str
    start: int
    uuid: str
    index: int


def device_key(gpu: int, start: int) -> str:
    return f"{gpu}@{start}"


def parse_device(device: str) -> tuple[int, int]:
    """(GPU index, start slice) of an allocation's MIG device id; raises `ValueError` for anything else."""
    match = _DEVICE.fullmatch(device)
    if match is None:
        raise ValueError(f"allocation names MIG device {device[:40]!r}, which is not GPU@start (1@4)")
    return int(match.group(1)), int(match.group(2))


def profile_from_name(name: str) -> str | None:
    """`3g.40gb` from NVML's MIG device name (`NVIDIA A100-SXM4-80GB MIG 3g.40gb`), None when it has none."""
    match = _PROFILE_IN_NAME.search(name)
    return match.group(1) if match else None


def mig_plugin_ids(devices: Sequence[DeviceInfo]) -> dict[str, dict[str, bool]]:
    """For `kubegpu device-plugin` (when it serves MIG): per owned profile resource, the MIG devices of the
    MIG-enabled GPUs as the scheduler names them (`1@4`), healthy as their GPU is. A GPU whose layout cannot be read
    lists nothing; a profile kubegpu has no placement table for is left to whoever serves it."""
    ids: dict[str, dict[str, bool]] = {}
    for device in devices:
        text = device.attributes.get(LAYOUT_ATTRIBUTE)
        if text is None or not device.id.isdigit():
            continue
        try:
            layout = parse_layout(str(text))
        except LayoutError:
            continue
        for profile, start in layout:
            resource = resource_of(profile)
            if resource in MIG_OWNED:
                ids.setdefault(resource, {})[device_key(int(device.id), start)] = device.healthy
    return ids


def mig_advertisement(devices: Sequence[DeviceInfo]) -> tuple[list[DeviceInfo], dict[str, int], dict[str, str]]:
    """(the healthy GPUs that are not MIG-enabled, the MIG capacity, the MIG labels) of a node's healthy GPUs."""
    plain = [d for d in devices if LAYOUT_ATTRIBUTE not in d.attributes]
    counts: dict[str, int] = {}
    for device in devices:
        if LAYOUT_ATTRIBUTE not in device.attributes:
            continue
        try:
            layout = parse_layout(str(device.attributes[LAYOUT_ATTRIBUTE]))
        except ValueError:
            continue
        for profile, _ in layout:
            resource = resource_of(profile)
            if resource in MIG_OWNED:
                counts[resource] = counts.get(resource, 0) + 1
    if len(plain) == len(devices):
        return plain, {}, {}
    labels = {STRATEGY_LABEL: "mixed", **{f"{r}.count": str(n) for r, n in sorted(counts.items())}}
    return plain, counts, labels


def visible_devices(
    resources: Mapping[str, Sequence[str]], listed: Mapping[str, MigDevice]
) -> tuple[list[MigDevice], str | None]:
    """The MIG devices an allocation's MIG resources name, found in `listed` (NVML's, by `GPU@start`), or the reason
    one is missing or is of another profile than its resource."""
    found: list[MigDevice] = []
    for resource, ids in sorted(resources.items()):
        for device in ids:
            gpu, start = parse_device(device)
            known = listed.get(device_key(gpu, start))
            if known is None:
                return [], f"MIG device {device} ({resource}) is not on this node; its MIG layout changed?"
            if resource_of(known.profile) != resource:
                return [], f"MIG device {device} is a {known.profile} here, the allocation names {resource}"
            found.append(known)
    return found, None
