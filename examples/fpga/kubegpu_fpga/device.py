"""The FPGA plugin, node side: find `/dev/fpga*`, advertise the healthy cards, give a container its cards.

Discovery reads only the host root it is given, so tests run it on a fake tree (`FakeHost.add_device_file`). A
card whose device file has disappeared since discovery is unhealthy and is not advertised. The plugin owns
`/dev/fpgaN`, `FPGA_VISIBLE_DEVICES` and CDI names of kind `example.com/fpga` (`kubegpu_device_owned`): the CRI shim
removes them from every container that was not allocated cards. When it creates a container that was, the plugin
removes any `/dev/fpga*` device entries that were not allocated to it (another device plugin may have added them),
then adds the allocated cards as device nodes, `FPGA_VISIBLE_DEVICES` and CDI names.
"""

from __future__ import annotations

from pathlib import Path

from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceInfo,
    DeviceInventory,
    DeviceNode,
    DeviceOwnership,
)
from kubegpu_fpga import COUNT_LABEL, NAME, RESOURCE, card_index

__all__ = ["CDI_KIND", "NAME", "OWNED", "RESOURCE", "VISIBLE_ENV", "discover_cards"]

# ------------------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------------------

MODEL = "example-fpga"
VISIBLE_ENV = "FPGA_VISIBLE_DEVICES"
BITSTREAM_ENV = "FPGA_BITSTREAM"
CDI_KIND = "example.com/fpga"
OWNED = DeviceOwnership(envs=(VISIBLE_ENV,), device_paths=(r"/dev/fpga(0|[1-9][0-9]*)",), cdi_kinds=(CDI_KIND,))


# ------------------------------------------------------------------------------------------------------------
# Hook implementations
# ------------------------------------------------------------------------------------------------------------


@hookimpl
def kubegpu_device_resources() -> list[str]:
    return [RESOURCE]


@hookimpl
def kubegpu_device_owned() -> DeviceOwnership:
    return OWNED


@hookimpl
def kubegpu_device_discover(host_root: Path) -> DeviceInventory | None:
    cards = discover_cards(host_root / "dev")
    if not cards:
        return None
    return DeviceInventory(plugin=NAME, devices=[DeviceInfo(id=card, model=MODEL) for card in cards])


@hookimpl
def kubegpu_device_health(host_root: Path, inventory: DeviceInventory) -> dict[str, bool]:
    return {device.id: (host_root / "dev" / device.id).exists() for device in inventory.devices}


@hookimpl
def kubegpu_device_advertise(inventory: DeviceInventory) -> Advertisement:
    healthy = len(inventory.healthy_ids())
    return Advertisement(capacity={RESOURCE: healthy}, labels={COUNT_LABEL: str(healthy)})


@hookimpl
def kubegpu_device_edit_container(allocation: ContainerAllocation, edit: ContainerEdit, dev_root: Path) -> bool | None:
    cards = allocation.resources.get(RESOURCE)
    if not cards:
        return None
    for card in cards:
        if card_index(card) is None:
            raise ValueError(f"allocation names {card!r}, which is not an FPGA card id (fpga0, fpga1, ...)")
    wanted = {f"/dev/{card}" for card in cards}
    edit.devices = [d for d in edit.devices if not _is_card_path(d.container_path) or d.container_path in wanted]
    present = {d.container_path for d in edit.devices}
    for card in cards:
        if f"/dev/{card}" not in present:
            edit.devices.append(DeviceNode(host_path=str(dev_root / card), container_path=f"/dev/{card}"))
    cdi_names = [f"{CDI_KIND}={card}" for card in cards]
    edit.cdi_devices = [name for name in edit.cdi_devices if not name.startswith(f"{CDI_KIND}=") or name in cdi_names]
    edit.cdi_devices.extend(name for name in cdi_names if name not in edit.cdi_devices)
    edit.envs[VISIBLE_ENV] = ",".join(cards)
    bitstream = allocation.fields.get("bitstream")
    if isinstance(bitstream, str):
        edit.envs[BITSTREAM_ENV] = bitstream
    return True


# ------------------------------------------------------------------------------------------------------------
# Pure helpers
# ------------------------------------------------------------------------------------------------------------


def discover_cards(dev: Path) -> list[str]:
    """The card device files in `dev` (`fpga0`, `fpga1`, ...), in card order."""
    if not dev.is_dir():
        return []
    found = [(index, path.name) for path in dev.iterdir() if (index := card_index(path.name)) is not None]
    return [name for _, name in sorted(found)]


def _is_card_path(container_path: str) -> bool:
    return container_path.startswith("/dev/") and card_index(container_path.removeprefix("/dev/")) is not None
