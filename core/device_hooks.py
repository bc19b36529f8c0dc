"""`Device`: the node-side hook specification.

A device plugin finds its devices on a host, describes them for advertisement, and turns the scheduler's allocation
into edits of a container's configuration. The advertiser (`kubegpu advertise`), the CRI shim (`kubegpu crishim`) and
the Kubernetes device plugin (`kubegpu device-plugin`) call these hooks. Every hook gets paths (`host_root`,
`dev_root`) instead of assuming `/`, so tests run the real discovery code on a fake host root. Hooks are listed in the
order they are called; every hook uses the same docstring layout: summary, Args, Returns, Called by.

Dispatch, as on the scheduler side: kubegpu never broadcasts a hook. Registration and discovery hooks are called for
every plugin, one at a time; every other hook for the plugin that discovered the inventory or owns the allocated
resources only. Answers are checked against each hook's contract (`kubegpu.core.answers`); a wrong answer is
reported like an exception, naming the plugin and the hook. `Device` is the same contract as a `typing.Protocol`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import pluggy

from kubegpu.core.models import Advertisement, ContainerAllocation, ContainerEdit, DeviceInventory, DeviceOwnership

__all__ = ["PROJECT", "Device", "hookimpl", "hookspec"]

PROJECT = "kubegpu.device"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_device_resources() -> list[str]:
    """Name the extended resources whose allocations this plugin applies to containers.

    Args:
        (none)

    Returns:
        Resource names; a name ending in `/*` claims a prefix. They match the plugin's scheduler side.

    Called by:
        the plugin manager once at start-up, to route each allocated resource to exactly one plugin; every plugin.
    """
    raise NotImplementedError


@hookspec
def kubegpu_device_owned() -> DeviceOwnership | None:
    """Declare the env variables, device paths, mount paths and CDI kinds that select this plugin's devices.

    Args:
        (none)

    Returns:
        A `DeviceOwnership`: only entries that make a runtime hand a container devices belong in it (env that merely
        narrows what the container already has does not). None: the plugin owns nothing, and the shim cannot keep
        its devices out of containers that were not allocated them.

    Called by:
        the CRI shim once at start-up; every plugin. On every CreateContainer it removes what each plugin owns from
        the container (a container without an allocation, a container the allocation does not name, and the other
        plugins' entries in a container that does get devices), then calls `kubegpu_device_edit_container` of the
        plugins whose devices the container was granted, which add back exactly those.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Discovery and advertisement
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_device_discover(host_root: Path) -> DeviceInventory | None:
    """Find this plugin's devices on the host.

    Args:
        host_root: the host's root directory (`/` in production, a fake tree in tests); device files are under
            `host_root / "dev"`, sysfs under `host_root / "sys"`.

    Returns:
        The inventory, or None when the host has none of these devices (or the vendor library is absent).

    Called by:
        the advertiser and `kubegpu device-plugin` at every interval; every plugin.
    """
    raise NotImplementedError


@hookspec
def kubegpu_device_health(host_root: Path, inventory: DeviceInventory) -> dict[str, bool] | None:
    """Check the health of previously discovered devices (optional).

    Args:
        host_root: as for discovery.
        inventory: this plugin's inventory from the last discovery.

    Returns:
        Device id -> healthy, for the devices the plugin could check; None when the plugin has no health check.

    Called by:
        the advertiser and `kubegpu device-plugin` after discovery, before they publish; the plugin that discovered
        the inventory only.
    """
    raise NotImplementedError


@hookspec
def kubegpu_device_advertise(inventory: DeviceInventory) -> Advertisement | None:
    """Describe the inventory as node capacity and labels.

    Args:
        inventory: this plugin's inventory (unhealthy devices marked).

    Returns:
        Extended-resource capacity (healthy devices only) and node labels; None to advertise nothing but the
        `kubegpu.io/devices` annotation.

    Called by:
        the advertiser when it patches the node; the plugin that discovered the inventory only.
    """
    raise NotImplementedError


@hookspec
def kubegpu_device_plugin_ids(inventory: DeviceInventory) -> dict[str, dict[str, bool]] | None:
    """Name, per resource, the device ids a Kubernetes device plugin tells the kubelet about.

    Args:
        inventory: this plugin's inventory (unhealthy devices marked).

    Returns:
        Resource name -> {device id: healthy}, with the ids the scheduler side allocates for that resource (so the
        kubelet can be asked to choose exactly the scheduler's ids); only resources that are counted in whole ids
        belong here (not per-card amounts such as memory). A device that several containers share may be named
        once per share slot instead (`core.models.slot_id(device, slot)`, `0::3`): the kubelet then admits one
        container per slot, and `kubegpu device-plugin` turns the slots back into the device. None: nothing of this
        plugin goes through the kubelet's device manager.

    Called by:
        `kubegpu device-plugin` after discovery and health, at start-up and every interval, for ListAndWatch; the
        plugin that discovered the inventory only.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Container creation
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_device_edit_container(allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path) -> bool | None:
    """Apply one container's allocation to its configuration, in place.

    Args:
        allocation: this plugin's resources, device ids, shares and fields for the container, from an allocation
            whose signature, node and pod UID the shim has already verified.
        edit: the container's devices, env, mounts, CDI device names and annotations as the kubelet sent them,
            less every entry an installed plugin owns (`kubegpu_device_owned`). The plugin removes anything else of
            its kind that is not allocated, then adds the allocated device nodes, env (`NVIDIA_VISIBLE_DEVICES`,
            ...), mounts and CDI names.
        dev_root: where the host's device files are (`/dev` in production).

    Returns:
        True when the plugin edited the container; None when the allocation is not its own. For an allocation of
        resources the plugin owns, anything but True is a wrong answer, and the container is refused rather than
        created without its devices.

    Called by:
        the CRI shim on CreateContainer, and `kubegpu device-plugin` on the kubelet's Allocate; the plugin owning
        the allocated resources only. Init containers too: a classic init container's `allocation` holds the ids
        the allocation's `init` names for it, which the containers after it may be given again.
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# Pod removal
# ---------------------------------------------------------------------------------------------------------------


@hookspec
def kubegpu_device_forget_pods(live_pods: frozenset[str]) -> int | None:
    """Remove what this plugin keeps on the host for pods that are no longer on the node (optional).

    Args:
        live_pods: the UIDs of every pod the node still has (any sandbox of it listed by the runtime, ready or not;
            in device-plugin mode every pod the API server lists on the node). Whatever the plugin keeps for a pod
            whose UID is not here may go; nothing of a pod whose UID is here may. No container of a pod outside the
            set is being created while the hook runs: the caller holds the same lock as container creation.

    Returns:
        How many pods' leftovers were removed (0 when none); None when the plugin keeps nothing per pod. The call
        must return within a few seconds: what is left over is removed at the next call.

    Called by:
        the CRI shim after each RemovePodSandbox, and `kubegpu device-plugin` at every interval; every plugin, one at
        a time (one plugin's failure is logged and costs only that plugin).
    """
    raise NotImplementedError


# ---------------------------------------------------------------------------------------------------------------
# The same contract as a Protocol
# ---------------------------------------------------------------------------------------------------------------


class Device(Protocol):
    """The node-side hooks as a `typing.Protocol`, for a plugin written as a class and for type checkers."""

    def kubegpu_device_resources(self) -> list[str]: ...

    def kubegpu_device_owned(self) -> DeviceOwnership | None: ...

    def kubegpu_device_discover(self, host_root: Path) -> DeviceInventory | None: ...

    def kubegpu_device_health(self, host_root: Path, inventory: DeviceInventory) -> dict[str, bool] | None: ...

    def kubegpu_device_advertise(self, inventory: DeviceInventory) -> Advertisement | None: ...

    def kubegpu_device_plugin_ids(self, inventory: DeviceInventory) -> dict[str, dict[str, bool]] | None: ...

    def kubegpu_device_edit_container(
        self, allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path
    ) -> bool | None: ...

    def kubegpu_device_forget_pods(self, live_pods: frozenset[str]) -> int | None: ...
