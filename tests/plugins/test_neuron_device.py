"""The Neuron plugin's node side: discovery on fake host roots, health, advertisement, the container edit, and the
round trip of a discovered inventory through the scheduler."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import (
    ContainerAllocation,
    ContainerEdit,
    DeviceInfo,
    DeviceInventory,
    DeviceNode,
    NodeDevices,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.testing import FakeHost, make_node, make_pod
from kubegpu.plugins.neuron import device, scheduler
from kubegpu.scheduler.engine import Engine

NEURON = "aws.amazon.com/neuron"
DEVICE = "aws.amazon.com/neurondevice"
CORE = "aws.amazon.com/neuroncore"
TORUS = {"kind": "torus", "rows": 4, "columns": 4}
RING = {"kind": "ring"}
SYSFS = "sys/devices/virtual/neuron_device"


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager], monkeypatch: pytest.MonkeyPatch) -> Any:
    # A machine running these tests may have neuron-ls installed; the tests decide what it prints.
    monkeypatch.setenv("PATH", "/nonexistent")
    return make_plugin_manager("device", neuron=device)


def host_with(host: FakeHost, count: int, *, product: str | None = None, skip: tuple[int, ...] = ()) -> FakeHost:
    for d in range(count):
        if d not in skip:
            host.add_device_file(f"neuron{d}")
    if product is not None:
        host.write("sys/devices/virtual/dmi/id/product_name", product + "\n")
    return host


def discover(pm: KubegpuPluginManager, host: FakeHost) -> DeviceInventory | None:
    inventory: DeviceInventory | None = pm.call("neuron", "kubegpu_device_discover", host_root=host.root)
    return inventory


def edit_with(pm: KubegpuPluginManager, resources: dict[str, list[str]], edit: ContainerEdit, **fields: Any) -> Any:
    allocation = ContainerAllocation(pod_uid="u", node="n", container="main", resources=resources, fields=fields)
    return pm.call("neuron", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=Path("/dev"))


# ------------------------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "product", "sysfs", "topology", "cores", "instance_type", "model"),
    [
        pytest.param(16, "trn1.32xlarge", {}, TORUS, 2, "trn1.32xlarge", "Trainium", id="trn1-from-dmi"),
        pytest.param(16, "trn2.48xlarge", {}, TORUS, 4, "trn2.48xlarge", "Trainium2", id="trn2-logical-cores"),
        pytest.param(16, "trn2u.48xlarge", {}, TORUS, 4, "trn2u.48xlarge", "Trainium2", id="trn2u-ultraserver-member"),
        pytest.param(1, "trn2.3xlarge", {}, RING, 4, "trn2.3xlarge", "Trainium2", id="trn2-one-device"),
        pytest.param(16, None, {}, TORUS, None, None, None, id="16-devices-unknown-type-torus"),
        pytest.param(16, "inf1.24xlarge", {}, RING, 4, "inf1.24xlarge", "Inferentia", id="inf1-24xlarge-is-a-ring"),
        pytest.param(
            16,
            None,
            {"connected_devices": "1, 15"},
            RING,
            None,
            None,
            None,
            id="16-devices-linked-as-a-ring",
        ),
        pytest.param(
            12,
            "Standard PC (i440FX + PIIX, 1996)",
            {"info/architecture/instance_type": "inf2.48xlarge", "core_count": "2"},
            RING,
            2,
            "inf2.48xlarge",
            "Inferentia2",
            id="inf2-from-the-driver",
        ),
        pytest.param(4, None, {}, RING, None, None, None, id="4-devices-unknown-type-ring"),
    ],
)
def test_discovery_finds_devices_cores_and_topology(
    pm: KubegpuPluginManager,
    fake_host_root: FakeHost,
    count: int,
    product: str | None,
    sysfs: dict[str, str],
    topology: dict[str, Any],
    cores: int | None,
    instance_type: str | None,
    model: str | None,
) -> None:
    host = host_with(fake_host_root, count, product=product)
    for relative, text in sysfs.items():
        host.write(f"{SYSFS}/neuron0/{relative}", text)

    inventory = discover(pm, host)

    assert inventory is not None
    assert inventory.plugin == "neuron"
    assert [d.id for d in inventory.devices] == [str(i) for i in range(count)]
    assert inventory.topology == topology
    assert {d.cores for d in inventory.devices} == {cores}
    assert {d.model for d in inventory.devices} == {model}
    assert inventory.attributes == ({"instanceType": instance_type} if instance_type else {})
    assert all(d.healthy for d in inventory.devices)


def test_other_files_are_not_devices_and_a_host_without_devices_has_no_inventory(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    for name in ["neuron", "neuron01", "neuron_x", "nvidia0", "neuronA"]:
        fake_host_root.add_device_file(name)

    assert discover(pm, fake_host_root) is None


def test_a_missing_device_file_in_the_middle_keeps_the_node_shape(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    inventory = discover(pm, host_with(fake_host_root, 16, skip=(3,)))

    assert inventory is not None
    assert [d.id for d in inventory.devices] == [str(i) for i in range(16) if i != 3]
    assert inventory.topology == TORUS


def write_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """Put an executable `neuron-ls` on PATH that runs `body` (a shell script)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    script = tools / "neuron-ls"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin")


NEURON_LS = [
    {
        "neuron_device": d,
        "bdf": f"0000:{0x10 + d:02x}:1e.0",
        "cpu_affinity": "0-7",
        "numa_node": "-1",
        "connected_to": [(d - 1) % 4, (d + 1) % 4],
        "nc_count": 2,
        "memory_size": 34359738368,
        "neuroncore_ids": [2 * d, 2 * d + 1],
        "neuron_processes": [],
    }
    for d in range(4)
]


def test_neuron_ls_adds_cores_memory_and_links(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "neuron-ls.json"
    output.write_text(json.dumps(NEURON_LS))
    write_tool(tmp_path, monkeypatch, f'[ "$1" = --json-output ] && cat "{output}"\n')

    inventory = discover(pm, host_with(fake_host_root, 4))

    assert inventory is not None
    first = inventory.devices[0]
    assert (first.cores, first.memory) == (2, 32 * 1024**3)
    assert first.attributes == {"bdf": "0000:10:1e.0", "connectedTo": "3,1"}
    assert inventory.topology == RING


@pytest.mark.parametrize(
    "body",
    [
        pytest.param('echo "level=fatal msg=\\"failed to discover Neuron devices\\"" >&2; exit 1\n', id="fails"),
        pytest.param("echo not json\n", id="garbage"),
        pytest.param('echo \'[{"neuron_device": "x"}, 3, {"nc_count": 2}]\'\n', id="odd-entries"),
        pytest.param("echo '{\"unexpected\": true}'\n", id="odd-document"),
    ],
)
def test_a_failing_or_odd_neuron_ls_costs_only_details(
    pm: KubegpuPluginManager,
    fake_host_root: FakeHost,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    body: str,
) -> None:
    write_tool(tmp_path, monkeypatch, body)

    inventory = discover(pm, host_with(fake_host_root, 16, product="trn1.32xlarge"))

    assert inventory is not None
    assert len(inventory.devices) == 16
    assert inventory.topology == TORUS
    assert inventory.devices[0].cores == 2  # from the catalog


def test_neuron_ls_details_in_an_object_document_are_read() -> None:
    parsed = device.parse_neuron_ls({"neuron_devices": [{"neuron_device": 1, "nc_count": 8, "connected_to": None}]})

    assert parsed[1].cores == 8
    assert parsed[1].connected is None


# ------------------------------------------------------------------------------------------------------------
# Health and advertisement
# ------------------------------------------------------------------------------------------------------------


def test_a_device_whose_file_disappeared_is_unhealthy_and_not_advertised(
    pm: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    host = host_with(fake_host_root, 16, product="trn1.32xlarge")
    inventory = discover(pm, host)
    assert inventory is not None
    host.remove("dev/neuron5")

    health = pm.call("neuron", "kubegpu_device_health", host_root=host.root, inventory=inventory)
    marked = inventory.model_copy(
        update={"devices": [d.model_copy(update={"healthy": health[d.id]}) for d in inventory.devices]}
    )
    advertisement = pm.call("neuron", "kubegpu_device_advertise", inventory=marked)

    assert [d for d, ok in health.items() if not ok] == ["5"]
    assert advertisement.capacity == {NEURON: 15, DEVICE: 15, CORE: 30}
    assert advertisement.labels == {}


def test_cores_are_not_advertised_when_unknown(pm: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    inventory = discover(pm, host_with(fake_host_root, 4))

    advertisement = pm.call("neuron", "kubegpu_device_advertise", inventory=inventory)

    assert advertisement.capacity == {NEURON: 4, DEVICE: 4}


# ------------------------------------------------------------------------------------------------------------
# Container edit
# ------------------------------------------------------------------------------------------------------------


def vendor_edit() -> ContainerEdit:
    """What the kubelet sends after the Neuron device plugin allocated devices 0 and 1 (not ours)."""
    return ContainerEdit(
        devices=[
            DeviceNode(host_path="/dev/neuron0", container_path="/dev/neuron0"),
            DeviceNode(host_path="/dev/null", container_path="/dev/null"),
            DeviceNode(host_path="/dev/neuron1", container_path="/dev/neuron1"),
        ],
        envs={"AWS_NEURON_VISIBLE_DEVICES": "0,1", "PATH": "/bin"},
        cdi_devices=["aws.amazon.com/neuron=neuron0", "example.com/fpga=fpga0"],
        annotations={"cdi.k8s.io/neuron-device-plugin": "aws.amazon.com/neuron=neuron1", "team": "ml"},
    )


@pytest.mark.parametrize(
    ("resources", "fields", "devices", "env"),
    [
        pytest.param(
            {DEVICE: ["2", "3"]},
            {"coresPerDevice": 2},
            [2, 3],
            {"AWS_NEURON_VISIBLE_DEVICES": "2,3"},
            id="whole-devices",
        ),
        pytest.param({NEURON: ["15"]}, {}, [15], {"AWS_NEURON_VISIBLE_DEVICES": "15"}, id="legacy-resource-name"),
        pytest.param(
            {CORE: [str(c) for c in range(9)]},
            {"coresPerDevice": 4},
            [0, 1, 2],
            {"NEURON_RT_VISIBLE_CORES": "0-8"},
            id="seed-nine-cores-on-three-devices",
        ),
        pytest.param(
            {CORE: ["5", "1"]},
            {"coresPerDevice": 2},
            [0, 2],
            {"NEURON_RT_VISIBLE_CORES": "1,5"},
            id="cores-not-contiguous",
        ),
    ],
)
def test_the_container_gets_exactly_its_devices(
    pm: KubegpuPluginManager,
    resources: dict[str, list[str]],
    fields: dict[str, Any],
    devices: list[int],
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    edit = vendor_edit()
    allocation = ContainerAllocation(pod_uid="u", node="n", container="main", resources=resources, fields=fields)

    edited = pm.call("neuron", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path)

    assert edited is True
    assert [(d.host_path, d.container_path) for d in edit.devices] == [
        ("/dev/null", "/dev/null"),
        *[(str(tmp_path / f"neuron{d}"), f"/dev/neuron{d}") for d in devices],
    ]
    assert edit.envs == {"PATH": "/bin", **env}
    assert edit.cdi_devices == ["example.com/fpga=fpga0", *[f"aws.amazon.com/neuron=neuron{d}" for d in devices]]
    assert edit.annotations == {"team": "ml"}


def test_the_plugin_owns_its_env_device_files_and_cdi_names(pm: KubegpuPluginManager) -> None:
    ownership = pm.call("neuron", "kubegpu_device_owned")
    assert ownership.envs == ("AWS_NEURON_VISIBLE_DEVICES", "NEURON_RT_VISIBLE_CORES")
    stripped = vendor_edit()
    assert stripped.remove_owned(ownership) == [
        "env AWS_NEURON_VISIBLE_DEVICES",
        "device /dev/neuron0",
        "device /dev/neuron1",
        "CDI device aws.amazon.com/neuron=neuron0",
        "CDI device aws.amazon.com/neuron=neuron1 (annotation cdi.k8s.io/neuron-device-plugin)",
    ]
    assert stripped.envs == {"PATH": "/bin"}
    assert stripped.cdi_devices == ["example.com/fpga=fpga0"]
    assert stripped.annotations == {"team": "ml"}


def test_a_container_without_neuron_resources_is_left_alone(pm: KubegpuPluginManager) -> None:
    edit = vendor_edit()

    assert edit_with(pm, {"nvidia.com/gpu": ["0"]}, edit) is None
    assert edit == vendor_edit()


@pytest.mark.parametrize(
    ("resources", "fields", "message"),
    [
        pytest.param({DEVICE: ["../sda"]}, {}, "not a Neuron device id", id="garbage-device"),
        pytest.param({CORE: ["1"]}, {}, "coresPerDevice is None", id="cores-without-cores-per-device"),
        pytest.param({CORE: ["1"]}, {"coresPerDevice": 0}, "coresPerDevice is 0", id="zero-cores-per-device"),
    ],
)
def test_an_unusable_allocation_fails_the_edit_naming_the_plugin(
    pm: KubegpuPluginManager, resources: dict[str, list[str]], fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(PluginHookError) as caught:
        edit_with(pm, resources, ContainerEdit(), **fields)

    assert str(caught.value).startswith("plugin 'neuron' failed in kubegpu_device_edit_container: ValueError:")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("cores", "expected"),
    [([0], "0"), ([3, 1, 2], "1-3"), ([0, 2], "0,2"), ([4, 4, 5], "4-5"), ([], "")],
)
def test_core_ranges(cores: list[int], expected: str) -> None:
    assert device.core_ranges(cores) == expected


# ------------------------------------------------------------------------------------------------------------
# Round trip: what the node side finds is what the scheduler places on
# ------------------------------------------------------------------------------------------------------------


def test_a_discovered_inventory_schedules_on_the_torus_and_avoids_an_unhealthy_device(
    pm: KubegpuPluginManager, fake_host_root: FakeHost, make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> None:
    host = host_with(fake_host_root, 16)
    inventory = discover(pm, host)
    assert inventory is not None
    host.remove("dev/neuron3")
    health = pm.call("neuron", "kubegpu_device_health", host_root=host.root, inventory=inventory)
    inventory = inventory.model_copy(
        update={"devices": [d.model_copy(update={"healthy": health[d.id]}) for d in inventory.devices]}
    )
    annotation = encode_devices(NodeDevices(inventories={"neuron": inventory}))
    node = make_node("trn-0", annotations={DEVICES_KEY: annotation}, allocatable={DEVICE: 16})
    engine = Engine(make_plugin_manager("scheduler", neuron=scheduler))
    engine.add_node(node)

    shape = scheduler.node_shape(node)
    all16 = engine.schedule(make_pod("all", {"main": {DEVICE: 16}}))
    seven = engine.schedule(make_pod("seven", {"main": {DEVICE: 7}}))
    half = engine.schedule(make_pod("half", {"main": {DEVICE: 8}}))

    assert shape is not None and shape[0].kind == "torus" and shape[0].devices == 16
    assert not all16.scheduled
    assert "does not support requests for device: 7" in (seven.reason or "")
    assert half.scheduled and half.allocation is not None
    assert half.allocation.containers["main"][DEVICE] == [str(i) for i in range(8, 16)]


def test_a_running_pod_keeps_its_devices_when_one_of_them_turns_unhealthy(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
) -> None:
    def node(unhealthy: tuple[int, ...]) -> Any:
        devices = [DeviceInfo(id=str(i), healthy=i not in unhealthy) for i in range(16)]
        inventory = DeviceInventory(plugin="neuron", devices=devices, topology=TORUS)
        return make_node(
            "trn-0",
            annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"neuron": inventory}))},
            allocatable={DEVICE: 16},
        )

    engine = Engine(make_plugin_manager("scheduler", neuron=scheduler))
    engine.add_node(node(()))
    assert engine.schedule(make_pod("all", {"main": {DEVICE: 16}})).scheduled
    engine.add_node(node((3,)))  # the advertiser marked device 3 unhealthy while "all" runs

    assert not engine.schedule(make_pod("half", {"main": {DEVICE: 8}})).scheduled
