"""The Intel GPU plugin's node side: cards from a fake sysfs, health, GAS labels and capacity, the container edit,
and the round trip of a discovered inventory through the scheduler."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import (
    Advertisement,
    ContainerAllocation,
    ContainerEdit,
    DeviceInventory,
    DeviceNode,
    NodeDevices,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.testing import FakeHost, make_node, make_pod
from kubegpu.plugins.intel_gas import device, scheduler
from kubegpu.plugins.intel_gas.cards import cards_from_labels
from kubegpu.scheduler.engine import Engine

I915 = "gpu.intel.com/i915"
MEMORY = "gpu.intel.com/memory.max"
MILLICORES = "gpu.intel.com/millicores"
TILES = "gpu.intel.com/tiles"
GIB = 1024**3
DRM = "sys/class/drm"


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    manager: KubegpuPluginManager = make_plugin_manager("device", **{"intel-gas": device})
    return manager


def add_card(
    host: FakeHost,
    number: int,
    *,
    vendor: str = "0x8086",
    pci: str | None = None,
    memory: int | None = 16 * GIB,
    driver: str = "i915",
    render: bool = True,
) -> None:
    """A DRM card as the kernel shows it: `cardN/device` (a link to the PCI device when `pci` is given)."""
    card = f"{DRM}/card{number}"
    if pci is not None:
        host.write(f"sys/devices/pci0000:00/{pci}/vendor", vendor + "\n")
        host.symlink(f"{card}/device", f"../../../devices/pci0000:00/{pci}")
        base = f"sys/devices/pci0000:00/{pci}"
    else:
        host.write(f"{card}/device/vendor", vendor + "\n")
        base = f"{card}/device"
    host.write(f"{base}/device", "0x56C0\n")
    host.write(f"sys/bus/pci/drivers/{driver}/bind", "")
    host.symlink(f"{base}/driver", f"../../../bus/pci/drivers/{driver}")
    if render:
        host.write(f"{base}/drm/renderD{128 + number}/dev", "226:128\n")
    if memory is not None:
        host.write(f"{card}/lmem_total_bytes", f"{memory}\n")


def discover(pm: KubegpuPluginManager, host: FakeHost) -> DeviceInventory | None:
    inventory: DeviceInventory | None = pm.call("intel-gas", "kubegpu_device_discover", host_root=host.root)
    return inventory


def with_health(pm: KubegpuPluginManager, host: FakeHost, inventory: DeviceInventory) -> DeviceInventory:
    health = pm.call("intel-gas", "kubegpu_device_health", host_root=host.root, inventory=inventory)
    devices = [d.model_copy(update={"healthy": health[d.id]}) for d in inventory.devices]
    return inventory.model_copy(update={"devices": devices})


# ------------------------------------------------------------------------------------------------------------
# Discovery and health
# ------------------------------------------------------------------------------------------------------------


def test_discovery_finds_the_intel_cards_and_nothing_else(pm: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    host = fake_host_root
    add_card(host, 0, pci="0000:03:00.0")
    add_card(host, 1, memory=None, driver="xe", render=False)
    add_card(host, 2, vendor="0x1002")  # an AMD card
    host.write(f"{DRM}/card0-DP-1/status", "connected\n")  # a connector, not a card
    host.write(f"{DRM}/renderD128/dev", "226:128\n")  # a render node, not a card
    host.write(f"{DRM}/card3/uevent", "")  # a card without a device link
    host.write(f"{DRM}/version", "drm 1.1.0\n")

    inventory = discover(pm, host)

    assert inventory is not None
    assert inventory.plugin == "intel-gas"
    assert inventory.topology == {}
    card0, card1 = inventory.devices
    assert (card0.id, card0.model, card0.memory) == ("card0", "0x56c0", 16 * GIB)
    assert card0.attributes == {"render": "renderD128", "driver": "i915", "pciAddress": "0000:03:00.0", "tiles": 1}
    assert (card1.id, card1.memory, card1.attributes) == ("card1", None, {"driver": "xe", "tiles": 1})


def test_cards_are_in_card_order(pm: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    for number in (10, 2, 1):
        add_card(fake_host_root, number)

    inventory = discover(pm, fake_host_root)

    assert inventory is not None
    assert [d.id for d in inventory.devices] == ["card1", "card2", "card10"]


@pytest.mark.parametrize("setup", ["nothing", "only-amd"])
def test_a_host_without_intel_cards_has_no_inventory(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, setup: str
) -> None:
    if setup == "only-amd":
        add_card(fake_host_root, 0, vendor="0x1002")

    assert discover(pm, fake_host_root) is None


def test_a_card_whose_sysfs_directory_is_gone_is_unhealthy_and_not_advertised(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    for number in range(3):
        add_card(fake_host_root, number)
    inventory = discover(pm, fake_host_root)
    assert inventory is not None
    fake_host_root.remove(f"{DRM}/card1")

    marked = with_health(pm, fake_host_root, inventory)
    advertisement = pm.call("intel-gas", "kubegpu_device_advertise", inventory=marked)

    assert [d.healthy for d in marked.devices] == [True, False, True]
    assert advertisement.capacity == {I915: 2, MILLICORES: 2000, TILES: 2, MEMORY: 32 * GIB}
    assert advertisement.labels == {"gpu.intel.com/gpu-numbers": "0.2", "gpu.intel.com/cards": "card0.card2"}


def test_xe_cards_are_advertised_as_xe_and_memory_only_when_every_card_says(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    add_card(fake_host_root, 0, driver="xe")
    add_card(fake_host_root, 1, driver="xe", memory=None)

    advertisement = pm.call("intel-gas", "kubegpu_device_advertise", inventory=discover(pm, fake_host_root))

    assert advertisement.capacity == {"gpu.intel.com/xe": 2, MILLICORES: 2000, TILES: 2}


def test_tiles_are_counted_as_intels_labeler_counts_them_and_advertised_for_the_healthy_cards(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    """A Data Center GPU Max card shows two tiles: `gt/gt0`, `gt/gt1` under i915, `device/tile0`, `device/tile1`
    under xe. Without `gpu.intel.com/tiles` capacity a pod asking tiles was refused on every node the advertiser
    served (NFD makes the resource from the labeler's label, which such a node may not run)."""
    host = fake_host_root
    add_card(host, 0)
    for gt in ("gt0", "gt1"):
        host.write(f"{DRM}/card0/gt/{gt}/id", f"{gt[2]}\n")
    host.write(f"{DRM}/card0/gt/gtx", "")  # not a tile
    add_card(host, 1, driver="xe")
    for tile in ("tile0", "tile1"):
        host.write(f"{DRM}/card1/device/{tile}/gt0/id", "0\n")
    add_card(host, 2)  # no gt directory: one tile
    add_card(host, 3)
    for gt in range(80):  # more than any card has: held to 64
        host.write(f"{DRM}/card3/gt/gt{gt}/id", f"{gt}\n")
    inventory = discover(pm, host)
    assert inventory is not None
    assert [d.attributes["tiles"] for d in inventory.devices] == [2, 2, 1, 64]
    host.remove(f"{DRM}/card3")

    advertisement = pm.call("intel-gas", "kubegpu_device_advertise", inventory=with_health(pm, host, inventory))

    assert advertisement.capacity[TILES] == 5  # the lost card's tiles are not offered


def test_many_cards_continue_the_gpu_numbers_label_as_gas_reads_it(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    for number in range(40):
        add_card(fake_host_root, number, render=False)

    advertisement: Advertisement = pm.call(
        "intel-gas", "kubegpu_device_advertise", inventory=discover(pm, fake_host_root)
    )

    labels = advertisement.labels
    assert set(labels) == {"gpu.intel.com/gpu-numbers", "gpu.intel.com/gpu-numbers2"}  # `cards` would be too long
    assert all(len(v) <= 63 and v[-1].isdigit() for v in labels.values())
    assert labels["gpu.intel.com/gpu-numbers2"].startswith("Z")
    assert cards_from_labels(labels) == [f"card{i}" for i in range(40)]


@pytest.mark.parametrize("length", [0, 1, 62, 63, 64, 130, 200])
def test_split_label_round_trips(length: int) -> None:
    value = ".".join(str(i) for i in range(200))[:length].rstrip(".")

    labels = device.split_label("x", value)

    assert "".join(v.removeprefix("Z") if k != "x" else v for k, v in labels.items()) == value
    assert all(len(v) <= 63 for v in labels.values())


# ------------------------------------------------------------------------------------------------------------
# Container edit
# ------------------------------------------------------------------------------------------------------------


def vendor_edit() -> ContainerEdit:
    """What the kubelet sends after the Intel GPU device plugin gave the container card0."""
    return ContainerEdit(
        devices=[
            DeviceNode(host_path="/dev/dri/card0", container_path="/dev/dri/card0"),
            DeviceNode(host_path="/dev/dri/renderD128", container_path="/dev/dri/renderD128"),
            DeviceNode(host_path="/dev/null", container_path="/dev/null"),
            DeviceNode(host_path="/dev/snd/card0", container_path="/dev/snd/card0"),
        ],
        envs={"PATH": "/bin"},
        cdi_devices=["intel.com/gpu=card0", "nvidia.com/gpu=0"],
        annotations={"cdi.k8s.io/intel": "intel.com/gpu=card0"},
    )


def dev_root(tmp_path: Path, *, by_path: bool) -> Path:
    """A /dev with two cards; with `by_path`, card1's render node is renderD130 (as the links say)."""
    root = tmp_path / "dev"
    (root / "dri").mkdir(parents=True)
    for name in ("card0", "card1", "renderD128", "renderD129", "renderD130"):
        (root / "dri" / name).write_bytes(b"")
    if by_path:
        (root / "dri" / "by-path").mkdir()
        for slot, card, render in (("0000:03:00.0", "card0", "renderD128"), ("0000:04:00.0", "card1", "renderD130")):
            (root / "dri" / "by-path" / f"pci-{slot}-card").symlink_to(f"../{card}")
            (root / "dri" / "by-path" / f"pci-{slot}-render").symlink_to(f"../{render}")
    return root


@pytest.mark.parametrize(("by_path", "render"), [(True, "renderD130"), (False, "renderD129")])
def test_the_container_gets_exactly_its_card_and_render_node(
    pm: KubegpuPluginManager, tmp_path: Path, by_path: bool, render: str
) -> None:
    root = dev_root(tmp_path, by_path=by_path)
    edit = vendor_edit()
    allocation = ContainerAllocation(
        pod_uid="u",
        node="n",
        container="encode",
        resources={I915: ["card1"], MEMORY: ["card1"]},
        shares={MEMORY: {"card1": 5 * 10**9}},
    )

    assert pm.call("intel-gas", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=root)

    assert [(d.host_path, d.container_path) for d in edit.devices] == [
        ("/dev/null", "/dev/null"),
        ("/dev/snd/card0", "/dev/snd/card0"),
        (str(root / "dri" / "card1"), "/dev/dri/card1"),
        (str(root / "dri" / render), f"/dev/dri/{render}"),
    ]
    assert edit.envs == {"PATH": "/bin", "KUBEGPU_INTEL_CARDS": "card1"}
    assert edit.cdi_devices == ["nvidia.com/gpu=0", "intel.com/gpu=card1"]
    assert edit.annotations == {}


def test_the_plugin_owns_the_drm_nodes_its_env_and_cdi_names_but_not_other_cards(pm: KubegpuPluginManager) -> None:
    edit = vendor_edit()
    edit.envs["KUBEGPU_INTEL_CARDS"] = "card0,card1"

    removed = edit.remove_owned(pm.call("intel-gas", "kubegpu_device_owned"))

    assert removed == [
        "env KUBEGPU_INTEL_CARDS",
        "device /dev/dri/card0",
        "device /dev/dri/renderD128",
        "CDI device intel.com/gpu=card0",
        "CDI device intel.com/gpu=card0 (annotation cdi.k8s.io/intel)",
    ]
    assert [d.container_path for d in edit.devices] == ["/dev/null", "/dev/snd/card0"]  # a sound card is not a GPU
    assert edit.cdi_devices == ["nvidia.com/gpu=0"]


def test_a_render_node_is_added_only_when_it_exists(pm: KubegpuPluginManager, tmp_path: Path) -> None:
    root = tmp_path / "dev"
    (root / "dri").mkdir(parents=True)
    edit = ContainerEdit()
    allocation = ContainerAllocation(pod_uid="u", node="n", container="c", resources={I915: ["card2", "card0"]})

    pm.call("intel-gas", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=root)

    assert [d.container_path for d in edit.devices] == ["/dev/dri/card0", "/dev/dri/card2"]
    assert edit.envs["KUBEGPU_INTEL_CARDS"] == "card0,card2"


def test_a_container_without_intel_resources_is_left_alone(pm: KubegpuPluginManager, tmp_path: Path) -> None:
    edit = vendor_edit()
    allocation = ContainerAllocation(pod_uid="u", node="n", container="c", resources={"nvidia.com/gpu": ["0"]})

    assert (
        pm.call("intel-gas", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path)
        is None
    )
    assert edit == vendor_edit()


def test_a_garbage_card_name_fails_the_edit_naming_the_plugin(pm: KubegpuPluginManager, tmp_path: Path) -> None:
    allocation = ContainerAllocation(pod_uid="u", node="n", container="c", resources={I915: ["../../sda"]})

    with pytest.raises(PluginHookError) as caught:
        pm.call(
            "intel-gas", "kubegpu_device_edit_container", allocation=allocation, edit=ContainerEdit(), dev_root=tmp_path
        )

    assert str(caught.value).startswith("plugin 'intel-gas' failed in kubegpu_device_edit_container: ValueError:")
    assert "'../../sda'" in str(caught.value)


# ------------------------------------------------------------------------------------------------------------
# Round trip: what the node side finds is what the scheduler places on
# ------------------------------------------------------------------------------------------------------------


def advertised(
    pm: KubegpuPluginManager,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    inventory: DeviceInventory,
    name: str,
) -> Engine:
    """An engine with one node advertised as the advertiser would advertise the inventory (annotation, capacity,
    labels)."""
    advertisement: Advertisement = pm.call("intel-gas", "kubegpu_device_advertise", inventory=inventory)
    node = make_node(
        name,
        labels=advertisement.labels,
        annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"intel-gas": inventory}))},
        allocatable=advertisement.capacity,
    )
    engine = Engine(make_plugin_manager("scheduler", **{"intel-gas": scheduler}))
    engine.add_node(node)
    return engine


def scheduled_cards(
    pm: KubegpuPluginManager,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    inventory: DeviceInventory,
    pods: int,
) -> list[str | None]:
    """Schedule `pods` pods each asking for one card and 5 GB of its memory on the node the inventory makes (see
    `advertised`); the card each got, None when unschedulable."""
    engine = advertised(pm, make_plugin_manager, inventory, "intel-0")
    got: list[str | None] = []
    for i in range(pods):
        decision = engine.schedule(make_pod(f"p{i}", {"main": {I915: 1, MEMORY: "5G"}}))
        got.append(decision.allocation.containers["main"][I915][0] if decision.allocation else None)
    return got


def test_a_discovered_inventory_schedules_one_pod_per_card(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    for number in range(2):
        add_card(fake_host_root, number, memory=8 * 10**9)
    inventory = with_health(pm, fake_host_root, discover(pm, fake_host_root))  # type: ignore[arg-type]

    assert sorted(scheduled_cards(pm, make_plugin_manager, inventory, 2), key=str) == ["card0", "card1"]
    assert scheduled_cards(pm, make_plugin_manager, inventory, 3)[2] is None


def test_cards_of_unequal_memory_each_hold_their_own(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    """A 16 GB and a 4 GB card advertise 20 GB: split evenly (GAS's rule) each looked like 10 GB, and an 8 GB
    container was placed on the 4 GB card. The inventory says each card's memory, and each card holds its own."""
    add_card(fake_host_root, 0, memory=16 * 10**9)
    add_card(fake_host_root, 1, memory=4 * 10**9)
    inventory = with_health(pm, fake_host_root, discover(pm, fake_host_root))  # type: ignore[arg-type]
    advertisement: Advertisement = pm.call("intel-gas", "kubegpu_device_advertise", inventory=inventory)
    assert advertisement.capacity[MEMORY] == 20 * 10**9
    engine = advertised(pm, make_plugin_manager, inventory, "flex-0")

    def place(name: str, memory: str, **annotations: str) -> tuple[str | None, str | None]:
        pod = make_pod(name, {"main": {I915: 1, MEMORY: memory}}, annotations=annotations)
        decision = engine.schedule(pod)
        return decision.annotations.get("gas-container-cards"), decision.reason

    assert place("big", "20G") == (
        None, "0/1 nodes are available: 1 Not enough GPU-resources for deployment: will not fit "
        "(gpu.intel.com/memory.max: needs 20G on each of 1 card(s); the largest card of this node has 16G).",
    )  # fmt: skip
    assert (
        "(gpu.intel.com/memory.max: needs 8G on each of 1 card(s); the cards this pod may use here have at most 4G)"
        in (place("allowed", "8G", **{"gas-allow": "card1"})[1] or "")
    )
    assert place("ten", "10G")[0] == "card0"
    cards, reason = place("eight", "8G")  # card0's one container slot is taken; card1 has 4G
    assert cards is None and reason is not None and "needs 8G on each of 1 card(s)" in reason, reason
    assert place("three", "3G")[0] == "card1"


def test_a_pod_asking_tiles_gets_its_own_on_a_node_the_advertiser_serves(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    for number in range(2):
        add_card(fake_host_root, number)
        for gt in ("gt0", "gt1"):
            fake_host_root.write(f"{DRM}/card{number}/gt/{gt}/id", f"{gt[2]}\n")
    inventory = with_health(pm, fake_host_root, discover(pm, fake_host_root))  # type: ignore[arg-type]
    engine = advertised(pm, make_plugin_manager, inventory, "max-0")

    one = engine.schedule(make_pod("one", {"main": {I915: 1, TILES: 1}}))
    three = engine.schedule(make_pod("three", {"main": {I915: 1, TILES: 3}}))

    assert one.annotations.get("gas-container-tiles") in ("card0:gt0", "card1:gt0"), one.reason
    assert three.allocation is None and three.reason is not None and "gpu.intel.com/tiles" in three.reason


def test_an_unhealthy_card_leaves_the_healthy_one_schedulable(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    for number in range(2):
        add_card(fake_host_root, number, memory=8 * 10**9)
    inventory = discover(pm, fake_host_root)
    assert inventory is not None
    fake_host_root.remove(f"{DRM}/card0")
    inventory = with_health(pm, fake_host_root, inventory)

    assert scheduled_cards(pm, make_plugin_manager, inventory, 2) == ["card1", None]


def test_a_card_whose_tiles_cannot_be_read_offers_no_tiles_and_its_whole_cards_still_serve(
    pm: KubegpuPluginManager,
    fake_host_root: FakeHost,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two Max cards of two tiles; card0's `gt` directory cannot be read (here a link to itself: the kernel answers
    ELOOP, as sysfs may answer EACCES or EIO). Counted as one tile, card0 shifted card1's FLAT numbers in a container
    seeing both: card1's gt0 was masked as `1`, which is card0's gt1 (T207). The node offers no tiles until card0
    reads, saying why once; pods asking whole cards still get them."""
    for number in range(2):
        add_card(fake_host_root, number)
        for gt in ("gt0", "gt1"):
            fake_host_root.write(f"{DRM}/card{number}/gt/{gt}/id", f"{gt[2]}\n")
    fake_host_root.remove(f"{DRM}/card0/gt")
    fake_host_root.symlink(f"{DRM}/card0/gt", "gt")
    inventory = with_health(pm, fake_host_root, discover(pm, fake_host_root))  # type: ignore[arg-type]

    assert "tiles" not in inventory.devices[0].attributes
    assert "sys/class/drm/card0/gt cannot be read" in str(inventory.devices[0].attributes["tilesUnknown"])
    with caplog.at_level("WARNING", logger="kubegpu.plugins.intel_gas.device"):
        engine = advertised(pm, make_plugin_manager, inventory, "max-0")
        again = pm.call("intel-gas", "kubegpu_device_advertise", inventory=inventory)  # every interval: said once
    assert again.capacity == {I915: 2, MILLICORES: 2000, TILES: 0, MEMORY: 32 * GIB}
    said = [r.getMessage() for r in caplog.records if "tiles of card0" in r.getMessage()]
    assert len(said) == 1 and "gpu.intel.com/tiles = 0" in said[0], said

    tile = engine.schedule(make_pod("tile", {"main": {I915: 1, TILES: 1}}))
    whole = engine.schedule(make_pod("whole", {"main": {I915: 2}}))

    assert tile.allocation is None, tile.annotations
    assert whole.allocation is not None, whole.reason

    # Where the node's tiles come from NFD (the labeler's count), the scheduler reads the inventory all the same.
    nfd = make_node(
        "max-1",
        annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"intel-gas": inventory}))},
        allocatable={I915: 2, TILES: 4},
    )
    engine = Engine(make_plugin_manager("scheduler", **{"intel-gas": scheduler}))
    engine.add_node(nfd)
    assert engine.schedule(make_pod("tile", {"main": {I915: 1, TILES: 1}})).allocation is None
    assert engine.schedule(make_pod("whole", {"main": {I915: 2}})).allocation is not None
