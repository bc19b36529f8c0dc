"""The NVIDIA plugin's node side, on a fake NVML: discovery (models, memory, NVLink and NVSwitch topology), health,
GPU Feature Discovery labels, the container edit, and the round trip of a discovered inventory through the scheduler.

The fake is a module object installed as `sys.modules["pynvml"]`, so the plugin runs its real NVML code path:
only the library underneath is made up.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from kubegpu.core.annotations import DEVICES_KEY, encode_devices
from kubegpu.core.models import ContainerAllocation, ContainerEdit, DeviceInventory, DeviceNode, NodeDevices
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.plugin_manager import make_plugin_manager as build_plugin_manager
from kubegpu.core.testing import FakeHost, make_node, make_pod
from kubegpu.plugins.nvidia import device, scheduler
from kubegpu.plugins.nvidia.topology import CATALOG, build_tree, tree_from_inventory
from kubegpu.scheduler.engine import Engine

GPU = "nvidia.com/gpu"
MIB = 1024 * 1024
V100 = "Tesla V100-SXM2-16GB"

# ------------------------------------------------------------------------------------------------------------
# A fake NVML
# ------------------------------------------------------------------------------------------------------------


@dataclass
class FakeGpu:
    name: str = V100
    memory: int = 16160 * MIB
    minor: int | None = None  # None: the index
    links: list[int | str] = field(default_factory=list)  # per NVLink: a GPU index, or a switch's bus id
    lost: bool = False
    mig: list[tuple[str, int]] | None = None  # MIG enabled: its instances as (profile, start slice), in NVML's order


def bus(index: int) -> str:
    return f"00000000:{0x10 + index:02X}:00.0"


def fake_nvml(
    gpus: Sequence[FakeGpu],
    *,
    ancestor: Callable[[int, int], int] | None = None,
    init_error: str | None = None,
    as_bytes: bool = False,
    remote_types: bool = False,
) -> ModuleType:
    """A `pynvml` module over `gpus`. Handles are GPU indexes; `ancestor` gives PCIe common-ancestor levels."""
    nvml = ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def text(value: str) -> str | bytes:
        return value.encode() if as_bytes else value

    def gpu(handle: int) -> FakeGpu:
        if not isinstance(handle, int) or not 0 <= handle < len(gpus):
            raise NVMLError("Invalid Argument")
        return gpus[handle]

    # MIG handles are ("mig", GPU, index), GPU instances ("gi", GPU, instance id = index + 1)
    def mig_handle(handle: int, index: int) -> tuple[str, int, int]:
        instances = gpu(handle).mig or []
        if not 0 <= index < len(instances):
            raise NVMLError("Not Found")
        return ("mig", handle, index)

    def name(handle: Any) -> str | bytes:
        if isinstance(handle, tuple):
            return text(f"{gpu(handle[1]).name} MIG {(gpu(handle[1]).mig or [])[handle[2]][0]}")
        return text(gpu(handle).name)

    def uuid(handle: Any) -> str | bytes:
        if isinstance(handle, tuple):
            return text(f"MIG-{handle[1]:04d}-{handle[2]:04d}")
        return text(f"GPU-{handle:08d}")

    def instance_info(instance: tuple[str, int, int]) -> Any:
        profile, start = (gpu(instance[1]).mig or [])[instance[2] - 1]
        size = {"1": 1, "2": 2, "3": 4, "4": 4, "7": 8}[profile[0]]
        return SimpleNamespace(id=instance[2], placement=SimpleNamespace(start=start, size=size))

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def by_uuid(uuid: str) -> int:
        for index, candidate in enumerate(gpus):
            if f"GPU-{index:08d}" == uuid:
                if candidate.lost:
                    raise NVMLError("GPU is lost")
                return index
        raise NVMLError("Not Found")

    def link_state(handle: int, link: int) -> int:
        if link >= len(gpu(handle).links):
            raise NVMLError("Not Supported")
        return 1

    def remote(handle: int, link: int) -> Any:
        link_state(handle, link)
        far = gpu(handle).links[link]
        return SimpleNamespace(busId=text(bus(far) if isinstance(far, int) else far))

    def remote_type(handle: int, link: int) -> int:
        return 0 if isinstance(gpu(handle).links[link], int) else 2

    def common_ancestor(a: int, b: int) -> int:
        if ancestor is None:
            raise NVMLError("Not Supported")
        return ancestor(a, b)

    functions: dict[str, Any] = {
        "NVMLError": NVMLError,
        "NVML_FEATURE_ENABLED": 1,
        "NVML_NVLINK_MAX_LINKS": 18,
        "nvmlInit": init,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: (gpu(i), i)[1],
        "nvmlDeviceGetHandleByUUID": by_uuid,
        "nvmlDeviceGetName": name,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=gpu(h).memory, free=gpu(h).memory, used=0),
        "nvmlDeviceGetUUID": uuid,
        "nvmlDeviceGetMigMode": lambda h: (1, 1) if gpu(h).mig is not None else (0, 0),
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7 if gpu(h).mig is not None else 0,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda m: m[2] + 1,
        "nvmlDeviceGetGpuInstanceById": lambda h, i: ("gi", (gpu(h), h)[1], i),
        "nvmlGpuInstanceGetInfo": instance_info,
        "nvmlDeviceGetMinorNumber": lambda h: h if gpu(h).minor is None else gpu(h).minor,
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=text((gpu(h), bus(h))[1])),
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": remote,
        "nvmlDeviceGetTopologyCommonAncestor": common_ancestor,
    }
    if remote_types:
        functions["nvmlDeviceGetNvLinkRemoteDeviceType"] = remote_type
    for name, value in functions.items():
        setattr(nvml, name, value)
    return nvml


# The DGX-1 (p3.16xlarge) V100 hybrid cube-mesh as `nvidia-smi topo -m` shows it: NV1 and NV2 links, each GPU
# linked to the three others of its quad and to one GPU of the other quad; GPU pairs share a PCIe switch, quads a
# CPU socket.
DGX1_LINKS = {
    0: {1: 1, 2: 1, 3: 2, 4: 2},
    1: {0: 1, 2: 2, 3: 1, 5: 2},
    2: {0: 1, 1: 2, 3: 2, 6: 1},
    3: {0: 2, 1: 1, 2: 2, 7: 1},
    4: {0: 2, 5: 1, 6: 1, 7: 2},
    5: {1: 2, 4: 1, 6: 2, 7: 1},
    6: {2: 1, 4: 1, 5: 2, 7: 2},
    7: {3: 1, 4: 2, 5: 1, 6: 2},
}


def dgx1_ancestor(a: int, b: int) -> int:
    return 10 if a // 2 == b // 2 else 40 if a // 4 == b // 4 else 50  # SINGLE, NODE, SYSTEM


def dgx1() -> list[FakeGpu]:
    return [FakeGpu(links=[g for g, n in DGX1_LINKS[i].items() for _ in range(n)]) for i in range(8)]


SWITCHES = range(4)


def hgx(count: int = 8) -> list[FakeGpu]:
    """Every GPU's links go to NVSwitches (bus ids that are no GPU's)."""
    return [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3", memory=81559 * MIB, links=[f"00000000:{0xA0 + s:02X}:00.0" for s in range(4)]
        )
        for _ in range(count)
    ]


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    manager: KubegpuPluginManager = make_plugin_manager("device", nvidia=device)
    return manager


@pytest.fixture
def use_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ModuleType]:
    def install(gpus: Sequence[FakeGpu], **options: Any) -> ModuleType:
        module = fake_nvml(gpus, **options)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def discover(pm: KubegpuPluginManager, root: Path) -> DeviceInventory | None:
    inventory: DeviceInventory | None = pm.call("nvidia", "kubegpu_device_discover", host_root=root)
    return inventory


def gpu_host(host: FakeHost, count: int) -> FakeHost:
    for name in ["nvidiactl", "nvidia-uvm", *[f"nvidia{i}" for i in range(count)]]:
        host.add_device_file(name)
    return host


# ------------------------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------------------------


def test_discovery_reads_models_memory_and_identities(
    pm: KubegpuPluginManager, use_nvml: Callable[..., ModuleType], fake_host_root: FakeHost
) -> None:
    use_nvml([FakeGpu(minor=1), FakeGpu(name="NVIDIA A10G", memory=23028 * MIB, minor=0)], as_bytes=True)

    inventory = discover(pm, fake_host_root.root)

    assert inventory is not None
    assert inventory.plugin == "nvidia"
    assert [(d.id, d.model, d.memory) for d in inventory.devices] == [
        ("0", V100, 16160 * MIB),
        ("1", "NVIDIA A10G", 23028 * MIB),
    ]
    assert inventory.devices[0].attributes == {"uuid": "GPU-00000000", "minor": 1, "pciBusId": "0000:10:00.0"}
    assert inventory.topology == {}  # no NVLink: the scheduler falls back to the instance-type catalog


@pytest.mark.parametrize(
    ("gpus", "options", "topology"),
    [
        pytest.param(dgx1(), {"ancestor": dgx1_ancestor}, {"groups": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]}, id="dgx1"),
        pytest.param(dgx1(), {}, {"groups": [list(range(8))]}, id="dgx1-without-pcie-levels"),
        pytest.param(hgx(), {}, {"kind": "nvswitch"}, id="nvswitch-by-bus-id"),
        pytest.param(hgx(), {"remote_types": True}, {"kind": "nvswitch"}, id="nvswitch-by-remote-type"),
        pytest.param(
            [FakeGpu(links=[1, 1]), FakeGpu(links=[0, 0]), FakeGpu(links=[3]), FakeGpu(links=[2])],
            {},
            {"groups": [[0, 1], [2, 3]]},
            id="nvlink-bridged-pairs",
        ),
        pytest.param(
            [FakeGpu(links=[1]), FakeGpu(links=[0]), FakeGpu(), FakeGpu()],
            {},
            {"groups": [[0, 1]]},
            id="one-pair-two-loners",
        ),
        pytest.param([FakeGpu(), FakeGpu()], {"ancestor": dgx1_ancestor}, {}, id="pcie-only"),
    ],
)
def test_nvlink_topology(
    pm: KubegpuPluginManager,
    use_nvml: Callable[..., ModuleType],
    fake_host_root: FakeHost,
    gpus: list[FakeGpu],
    options: dict[str, Any],
    topology: dict[str, Any],
) -> None:
    use_nvml(gpus, **options)

    inventory = discover(pm, fake_host_root.root)

    assert inventory is not None
    assert inventory.topology == topology


def test_the_discovered_dgx1_tree_is_the_catalog_cube_mesh(
    pm: KubegpuPluginManager, use_nvml: Callable[..., ModuleType], fake_host_root: FakeHost
) -> None:
    use_nvml(dgx1(), ancestor=dgx1_ancestor)
    inventory = discover(pm, fake_host_root.root)
    assert inventory is not None

    tree = tree_from_inventory(inventory.topology, [d.id for d in inventory.devices])
    entry = CATALOG["p3.16xlarge"]
    catalog = build_tree(entry.kind, entry.gpus, entry.groups)

    assert tree is not None
    assert [g.mask for g in tree.groups] == [g.mask for g in catalog.groups]


@pytest.mark.parametrize("setup", ["library-absent", "driver-absent", "no-gpus"])
def test_no_usable_nvml_means_no_inventory_not_a_crash(
    pm: KubegpuPluginManager,
    use_nvml: Callable[..., ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    fake_host_root: FakeHost,
    setup: str,
) -> None:
    if setup == "library-absent":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    elif setup == "driver-absent":
        use_nvml([FakeGpu()], init_error="NVML Shared Library Not Found")
    else:
        use_nvml([])

    assert discover(pm, fake_host_root.root) is None


# ------------------------------------------------------------------------------------------------------------
# Health and advertisement
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "unhealthy"),
    [
        pytest.param("nothing", [], id="all-well"),
        pytest.param("lose-gpu-2", ["2"], id="gpu-fell-off-the-bus"),
        pytest.param("remove-file-1", ["1"], id="device-file-gone"),
        pytest.param("no-device-files", [], id="dev-not-visible"),
    ],
)
def test_health_follows_nvml_and_the_device_files(
    pm: KubegpuPluginManager,
    use_nvml: Callable[..., ModuleType],
    fake_host_root: FakeHost,
    change: str,
    unhealthy: list[str],
) -> None:
    gpus = [FakeGpu() for _ in range(4)]
    use_nvml(gpus)
    host = fake_host_root if change == "no-device-files" else gpu_host(fake_host_root, 4)
    inventory = discover(pm, host.root)
    if change == "lose-gpu-2":
        gpus[2].lost = True
    elif change == "remove-file-1":
        host.remove("dev/nvidia1")

    health = pm.call("nvidia", "kubegpu_device_health", host_root=host.root, inventory=inventory)

    assert [d for d, ok in health.items() if not ok] == unhealthy


def test_advertisement_counts_healthy_gpus_with_gpu_feature_discovery_labels(
    pm: KubegpuPluginManager, use_nvml: Callable[..., ModuleType], fake_host_root: FakeHost
) -> None:
    use_nvml(dgx1(), ancestor=dgx1_ancestor)
    inventory = discover(pm, fake_host_root.root)
    assert inventory is not None
    inventory = inventory.model_copy(
        update={"devices": [d.model_copy(update={"healthy": d.id != "0"}) for d in inventory.devices]}
    )

    advertisement = pm.call("nvidia", "kubegpu_device_advertise", inventory=inventory)

    assert advertisement.capacity == {GPU: 7}
    assert advertisement.labels == {
        "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
        "nvidia.com/gpu.count": "7",
        "nvidia.com/gpu.memory": "16160",
    }


@pytest.mark.parametrize(
    ("model", "label"),
    [
        (V100, "Tesla-V100-SXM2-16GB"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        (" NVIDIA A100-SXM4-40GB (MIG) ", "NVIDIA-A100-SXM4-40GB-MIG"),
        ("X" * 80, "X" * 63),
    ],
)
def test_product_label_is_a_valid_label_value(model: str, label: str) -> None:
    assert device.product_label(model) == label


# ------------------------------------------------------------------------------------------------------------
# Container edit
# ------------------------------------------------------------------------------------------------------------


def vendor_edit() -> ContainerEdit:
    """What the kubelet sends after the NVIDIA device plugin gave the container GPU 0 (not ours)."""
    return ContainerEdit(
        devices=[
            DeviceNode(host_path="/dev/nvidiactl", container_path="/dev/nvidiactl"),
            DeviceNode(host_path="/dev/nvidia0", container_path="/dev/nvidia0"),
            DeviceNode(host_path="/dev/null", container_path="/dev/null"),
        ],
        envs={"NVIDIA_VISIBLE_DEVICES": "GPU-00000000", "PATH": "/bin"},
        cdi_devices=["nvidia.com/gpu=GPU-00000000", "aws.amazon.com/neuron=neuron0"],
        annotations={"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=GPU-00000000"},
    )


def edit_gpus(pm: KubegpuPluginManager, ids: list[str], edit: ContainerEdit, dev_root: Path) -> Any:
    allocation = ContainerAllocation(pod_uid="u", node="n", container="main", resources={GPU: ids})
    return pm.call("nvidia", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=dev_root)


@pytest.mark.parametrize(
    ("minors", "files"),
    [
        pytest.param(None, ["nvidia1", "nvidia3"], id="without-nvml-index-is-minor"),
        pytest.param([0, 1, 2, 3], ["nvidia1", "nvidia3"], id="nvml-minors-equal-indexes"),
        pytest.param([3, 2, 1, 0], ["nvidia2", "nvidia0"], id="nvml-minors-reversed"),
    ],
)
def test_the_container_gets_exactly_its_gpus(
    pm: KubegpuPluginManager,
    use_nvml: Callable[..., ModuleType],
    monkeypatch: pytest.MonkeyPatch,
    fake_host_root: FakeHost,
    minors: list[int] | None,
    files: list[str],
) -> None:
    if minors is None:
        monkeypatch.setitem(sys.modules, "pynvml", None)
    else:
        use_nvml([FakeGpu(minor=m) for m in minors])
    dev = gpu_host(fake_host_root, 4).root / "dev"
    edit = vendor_edit()

    assert edit_gpus(pm, ["3", "1"], edit, dev) is True

    assert [(d.host_path, d.container_path) for d in edit.devices] == [
        ("/dev/nvidiactl", "/dev/nvidiactl"),
        ("/dev/null", "/dev/null"),
        *[(str(dev / name), f"/dev/{name}") for name in files],
        (str(dev / "nvidia-uvm"), "/dev/nvidia-uvm"),
    ]
    assert edit.envs == {"NVIDIA_VISIBLE_DEVICES": "1,3", "PATH": "/bin"}
    assert edit.cdi_devices == ["aws.amazon.com/neuron=neuron0", "nvidia.com/gpu=1", "nvidia.com/gpu=3"]
    assert edit.annotations == {}


def test_a_container_without_gpus_is_left_alone(pm: KubegpuPluginManager, tmp_path: Path) -> None:
    edit = vendor_edit()

    allocation = ContainerAllocation(pod_uid="u", node="n", container="c", resources={"example.com/fpga": ["fpga0"]})
    assert (
        pm.call("nvidia", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path) is None
    )
    assert edit == vendor_edit()


def test_a_garbage_gpu_id_fails_the_edit_naming_the_plugin(pm: KubegpuPluginManager, tmp_path: Path) -> None:
    with pytest.raises(PluginHookError) as caught:
        edit_gpus(pm, ["GPU-1234"], ContainerEdit(), tmp_path)

    assert str(caught.value).startswith("plugin 'nvidia' failed in kubegpu_device_edit_container: ValueError:")
    assert "'GPU-1234'" in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "owned"),
    [
        pytest.param(("env", "NVIDIA_VISIBLE_DEVICES"), True, id="env-visible-devices"),
        pytest.param(("env", "CUDA_VISIBLE_DEVICES"), False, id="env-cuda-only-narrows"),
        pytest.param(("env", "NVIDIA_DRIVER_CAPABILITIES"), False, id="env-capabilities"),
        pytest.param(("device", "/dev/nvidia0"), True, id="gpu-0"),
        pytest.param(("device", "/dev/nvidia12"), True, id="gpu-12"),
        pytest.param(("device", "/dev/nvidiactl"), False, id="control-device"),
        pytest.param(("device", "/dev/nvidia-uvm"), False, id="uvm"),
        pytest.param(("mount", "/var/run/nvidia-container-devices/all"), True, id="volume-mount-list"),
        pytest.param(("mount", "/var/run/nvidia"), False, id="other-mount"),
        pytest.param(("cdi", "nvidia.com/gpu=all"), True, id="cdi-all"),
        pytest.param(("cdi", "nvidia.com/mig=0"), False, id="cdi-other-kind"),
        pytest.param(("device", "/dev/nvidia-caps/nvidia-cap12"), True, id="mig-capability"),
    ],
)
def test_the_plugin_owns_what_selects_gpus_and_nothing_else(
    pm: KubegpuPluginManager, entry: tuple[str, str], owned: bool
) -> None:
    ownership = pm.call("nvidia", "kubegpu_device_owned")
    kind, value = entry
    check = {
        "env": ownership.owns_env,
        "device": ownership.owns_device,
        "mount": ownership.owns_mount,
        "cdi": ownership.owns_cdi,
    }[kind]
    assert check(value) is owned


def test_removing_what_the_plugin_owns_then_editing_gives_exactly_the_allocated_gpus(
    pm: KubegpuPluginManager, monkeypatch: pytest.MonkeyPatch, fake_host_root: FakeHost
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    dev = gpu_host(fake_host_root, 4).root / "dev"
    edit = vendor_edit()

    removed = edit.remove_owned(pm.call("nvidia", "kubegpu_device_owned"), str(dev))
    assert removed == [
        "env NVIDIA_VISIBLE_DEVICES",
        "device /dev/nvidia0",
        "CDI device nvidia.com/gpu=GPU-00000000",
        "CDI device nvidia.com/gpu=GPU-00000000 (annotation cdi.k8s.io/nvidia-device-plugin_abc)",
    ]
    plain = vendor_edit()
    assert edit_gpus(pm, ["1"], edit, dev) is True
    assert edit_gpus(pm, ["1"], plain, dev) is True
    assert edit == plain


# ------------------------------------------------------------------------------------------------------------
# Round trip: what the node side finds is what the scheduler places on
# ------------------------------------------------------------------------------------------------------------


def test_a_discovered_cube_mesh_places_quads_and_avoids_a_lost_gpu(
    pm: KubegpuPluginManager,
    use_nvml: Callable[..., ModuleType],
    fake_host_root: FakeHost,
    make_plugin_manager: Callable[..., KubegpuPluginManager],
) -> None:
    gpus = dgx1()
    use_nvml(gpus, ancestor=dgx1_ancestor)
    host = gpu_host(fake_host_root, 8)
    inventory = discover(pm, host.root)
    assert inventory is not None
    gpus[1].lost = True
    health = pm.call("nvidia", "kubegpu_device_health", host_root=host.root, inventory=inventory)
    inventory = inventory.model_copy(
        update={"devices": [d.model_copy(update={"healthy": health[d.id]}) for d in inventory.devices]}
    )
    node = make_node(
        "p3-0",
        annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"nvidia": inventory}))},
        allocatable={"nvidia.com/gpu": 8},
    )
    engine = Engine(make_plugin_manager("scheduler", nvidia=scheduler))
    engine.add_node(node)

    quad = engine.schedule(make_pod("quad", {"main": {GPU: 4}}))
    pair = engine.schedule(make_pod("pair", {"main": {GPU: 2}}))
    rest = engine.schedule(make_pod("rest", {"main": {GPU: 2}}))

    assert quad.allocation is not None and quad.allocation.containers["main"][GPU] == ["4", "5", "6", "7"]
    assert pair.allocation is not None and pair.allocation.containers["main"][GPU] == ["2", "3"]
    assert not rest.scheduled, "GPU 1 is lost: only GPU 0 is left"


# ------------------------------------------------------------------------------------------------------------
# MIG
# ------------------------------------------------------------------------------------------------------------

A100 = "NVIDIA A100-SXM4-80GB"


def mig_node_gpus() -> list[FakeGpu]:
    """GPU 0 whole; GPU 1 in the balanced layout (NVML lists instances in creation order, not by slice); GPU 2
    as one 7g.80gb."""
    memory = 81920 * MIB
    return [
        FakeGpu(name=A100, memory=memory),
        FakeGpu(name=A100, memory=memory, mig=[("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]),
        FakeGpu(name=A100, memory=memory, mig=[("7g.80gb", 0)]),
    ]


def test_mig_gpus_are_discovered_and_advertised_as_gfd_mixed_strategy_has_them(
    pm: KubegpuPluginManager, use_nvml: Callable[..., ModuleType], fake_host_root: FakeHost
) -> None:
    use_nvml(mig_node_gpus())
    inventory = pm.call("nvidia", "kubegpu_device_discover", host_root=fake_host_root.root)
    assert [d.attributes.get("mig") for d in inventory.devices] == [
        None,
        "2g.20gb@0,1g.10gb@2,1g.10gb@3,3g.40gb@4",
        "7g.80gb@0",
    ]
    advertised = pm.call("nvidia", "kubegpu_device_advertise", inventory=inventory)
    assert advertised.capacity == {
        GPU: 1,  # only the GPU that is not MIG-enabled
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-2g.20gb": 1,
        "nvidia.com/mig-3g.40gb": 1,
        "nvidia.com/mig-7g.80gb": 1,
    }
    assert advertised.labels["nvidia.com/gpu.count"] == "3"  # GFD counts every GPU
    assert advertised.labels["nvidia.com/mig.strategy"] == "mixed"
    assert advertised.labels["nvidia.com/mig-1g.10gb.count"] == "2"
    assert pm.call("nvidia", "kubegpu_device_plugin_ids", inventory=inventory) == {GPU: {"0": True}}


def test_a_mig_allocation_from_the_scheduler_gives_the_container_its_mig_uuid_and_parent_gpu(
    pm: KubegpuPluginManager, use_nvml: Callable[..., ModuleType], fake_host_root: FakeHost
) -> None:
    use_nvml(mig_node_gpus())
    inventory = pm.call("nvidia", "kubegpu_device_discover", host_root=fake_host_root.root)
    annotation = encode_devices(NodeDevices(inventories={"nvidia": inventory}))
    engine = Engine(build_plugin_manager("scheduler", plugins=[("nvidia", scheduler)], autoload=False))
    capacity = pm.call("nvidia", "kubegpu_device_advertise", inventory=inventory).capacity
    engine.add_node(make_node("a100", annotations={DEVICES_KEY: annotation}, allocatable=capacity))
    decision = engine.schedule(make_pod("job", {"main": {"nvidia.com/mig-3g.40gb": 1}}))
    assert decision.scheduled and decision.allocation is not None
    assert decision.allocation.containers["main"] == {"nvidia.com/mig-3g.40gb": ["1@4"]}

    dev = gpu_host(fake_host_root, 3).root / "dev"
    edit = vendor_edit()
    edit.devices.append(
        DeviceNode(host_path=str(dev / "nvidia-caps/nvidia-cap99"), container_path="/dev/nvidia-caps/nvidia-cap99")
    )
    allocation = ContainerAllocation(
        pod_uid="u", node="a100", container="main", resources=decision.allocation.containers["main"]
    )
    assert pm.call("nvidia", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=dev)
    assert edit.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-0001-0000"  # GPU 1's first instance in NVML's order
    assert edit.cdi_devices == ["aws.amazon.com/neuron=neuron0", "nvidia.com/gpu=1:0"]
    paths = [d.container_path for d in edit.devices]
    assert "/dev/nvidia1" in paths and "/dev/nvidia0" not in paths and "/dev/nvidia2" not in paths
    assert not any(p.startswith("/dev/nvidia-caps/") for p in paths)  # the spec's capability device is gone


def test_a_mig_device_the_node_does_not_have_fails_the_edit(
    pm: KubegpuPluginManager, use_nvml: Callable[..., ModuleType], tmp_path: Path
) -> None:
    use_nvml(mig_node_gpus())
    for resources, reason in (
        ({"nvidia.com/mig-3g.40gb": ["2@4"]}, "MIG device 2@4 (nvidia.com/mig-3g.40gb) is not on this node"),
        ({"nvidia.com/mig-3g.40gb": ["2@0"]}, "MIG device 2@0 is a 7g.80gb here"),
        ({"nvidia.com/mig-3g.40gb": ["1@4"], GPU: ["0"]}, "GPUs and MIG devices"),
        ({"nvidia.com/mig-3g.40gb": ["all"]}, "which is not GPU@start"),
    ):
        allocation = ContainerAllocation(pod_uid="u", node="n", container="c", resources=resources)
        with pytest.raises(PluginHookError, match=re.escape(reason)):
            pm.call(
                "nvidia",
                "kubegpu_device_edit_container",
                allocation=allocation,
                edit=ContainerEdit(),
                dev_root=tmp_path,
            )
