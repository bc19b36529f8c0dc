"""The third-party plugin example (`examples/fpga`): a separate distribution that kubegpu uses with no change.

The first part tests the plugin in-process, the way a plugin author would, with kubegpu's testing kit: the
conformance suite in one line (`assert_conforms`), the scheduler-side driver (`SchedulerDriver`), the pytest fixtures
(`make_plugin_manager`, `fake_host_root`) and helpers (`make_node`, `make_pod`, `assert_allocation`). The example as
it was before the kit (`tests/fixtures/fpga_v0`, module-level hooks) still works unchanged. The last test is the story
of a user: in a fresh virtual environment `kubegpu plugins list` does not know `fpga`; after `pip install
examples/fpga` it does, and `kubegpu simulate` places FPGA pods by the plugin's rule.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from kubegpu.core.annotations import ALLOCATION_KEY, DEVICES_KEY, encode_devices
from kubegpu.core.models import (
    ContainerAllocation,
    ContainerEdit,
    DeviceInfo,
    DeviceInventory,
    DeviceNode,
    NodeDevices,
    PluginAllocation,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.core.scheduler_hooks import Headroom
from kubegpu.core.status import Code
from kubegpu.core.testing import (
    FakeHost,
    SchedulerDriver,
    assert_allocation,
    assert_conforms,
    make_node,
    make_pod,
    node_manifest,
    pod_manifest,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fpga"
FPGA = "example.com/fpga"
BITSTREAM = "example.com/fpga-bitstream"
LOADED = {"example.com/fpga.count": "4", "example.com/fpga.bitstream": "resnet50"}
BLANK = {"example.com/fpga.count": "4"}


@pytest.fixture(autouse=True)
def _kubegpu_loggers_enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A front-end run earlier in the session may have disabled kubegpu's loggers or raised their level."""
    for name in ("kubegpu", "kubegpu.plugins", "kubegpu.engine"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "disabled", False)
        monkeypatch.setattr(logger, "level", logging.NOTSET)


@pytest.fixture(scope="module")
def fpga() -> tuple[ModuleType, ModuleType]:
    """The example's scheduler and device modules, imported from the source tree (no installation needed)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        return importlib.import_module("kubegpu_fpga.scheduler"), importlib.import_module("kubegpu_fpga.device")


@pytest.fixture
def scheduler(
    fpga: tuple[ModuleType, ModuleType], make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> KubegpuPluginManager:
    return make_plugin_manager("scheduler", fpga=fpga[0])


@pytest.fixture
def device(
    fpga: tuple[ModuleType, ModuleType], make_plugin_manager: Callable[..., KubegpuPluginManager]
) -> KubegpuPluginManager:
    return make_plugin_manager("device", fpga=fpga[1])


def fpga_pod(name: str = "p", cards: int = 1, bitstream: str | None = None, **containers: int) -> Any:
    wanted = containers or {"main": cards}
    annotations = {BITSTREAM: bitstream} if bitstream is not None else {}
    return make_pod(name, {c: {FPGA: n} for c, n in wanted.items()}, annotations=annotations)


def build(manager: KubegpuPluginManager, labels: dict[str, str], **kwargs: Any) -> Any:
    state = SchedulerDriver(None, "fpga", manager=manager).build("fpga-0", labels=labels, **kwargs)
    assert state is not None
    return state


def place(manager: KubegpuPluginManager, state: Any, pod: Any) -> PluginAllocation:
    """What the engine does once it chose the node: allocate, then take."""
    return SchedulerDriver(None, "fpga", manager=manager).place(state, pod)


def test_the_example_conforms_to_what_kubegpu_assumes(fpga: tuple[ModuleType, ModuleType]) -> None:
    assert_conforms(scheduler=fpga[0].plugin, device=fpga[1].plugin, name="fpga")


@pytest.fixture(scope="module")
def fpga_v0() -> tuple[ModuleType, ModuleType]:
    """The example as it was before the kit: module-level hooks, a non-idempotent release."""
    fixtures = Path(__file__).parent / "fixtures"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        patch.syspath_prepend(str(fixtures))
        return importlib.import_module("fpga_v0.scheduler"), importlib.import_module("fpga_v0.device")


def test_the_example_written_before_the_kit_keeps_working_with_a_deprecation_warning(
    fpga_v0: tuple[ModuleType, ModuleType],
) -> None:
    from kubegpu.core.conformance import check_device, check_scheduler
    from kubegpu.core.plugin_manager import make_plugin_manager
    from kubegpu.scheduler.testing import simulate

    records = simulate(
        [
            node_manifest("fpga-0", labels=LOADED, allocatable={FPGA: 4}),
            pod_manifest("infer", {"main": {FPGA: 2}}, annotations={BITSTREAM: "resnet50"}),
            pod_manifest("translate", {"main": {FPGA: 1}}, annotations={BITSTREAM: "bert"}),
        ],
        plugins={"fpga": fpga_v0[0]},
    )
    assert (records[0]["event"], records[0]["devices"]) == ("scheduled", {"main": {FPGA: ["fpga0", "fpga1"]}})
    assert "FPGA bitstream 'bert'" in records[1]["reason"]

    allocations: list[Any] = []
    manager = make_plugin_manager("scheduler", plugins=[("fpga", fpga_v0[0])], autoload=False)
    failures = check_scheduler(fpga_v0[0], "fpga", manager=manager, collect=allocations)
    failures += check_device(fpga_v0[1], "fpga", allocations)
    assert {f.rule for f in failures} == {"take-release-restores"}, failures
    assert all("second release" in f.message for f in failures)
    assert any("deprecated since release became idempotent" in warning for warning in manager.warnings)


def cards(*ids: str) -> PluginAllocation:
    return PluginAllocation(plugin="fpga", containers={"main": {FPGA: list(ids)}})


# ------------------------------------------------------------------------------------------------------------
# Scheduler side
# ------------------------------------------------------------------------------------------------------------


def test_the_example_owns_its_resource_on_both_sides(
    scheduler: KubegpuPluginManager, device: KubegpuPluginManager
) -> None:
    assert scheduler.call("fpga", "kubegpu_scheduler_resources") == [FPGA]
    assert device.call("fpga", "kubegpu_device_resources") == [FPGA]
    assert scheduler.owner_of(FPGA) == device.owner_of(FPGA) == "fpga"


@pytest.mark.parametrize(
    ("labels", "cards"),
    [
        ({"example.com/fpga.count": "2"}, ["fpga0", "fpga1"]),
        ({"example.com/fpga.count": "0"}, None),
        ({"example.com/fpga.count": "two"}, None),
        ({}, None),
    ],
    ids=["two-cards", "zero", "not-a-count", "no-label"],
)
def test_a_node_gets_its_cards_from_the_count_label(
    scheduler: KubegpuPluginManager, labels: dict[str, str], cards: list[str] | None
) -> None:
    state = scheduler.call("fpga", "kubegpu_scheduler_build_node", node=make_node(labels=labels))

    assert (None if state is None else list(state.ids)) == cards


def test_an_advertised_inventory_wins_over_the_label_and_its_unhealthy_cards_are_never_given(
    scheduler: KubegpuPluginManager,
) -> None:
    inventory = DeviceInventory(
        plugin="fpga",
        devices=[DeviceInfo(id="fpga1"), DeviceInfo(id="fpga0", healthy=False), DeviceInfo(id="x")],
    )
    annotation = encode_devices(NodeDevices(inventories={"fpga": inventory}))
    state = build(scheduler, {"example.com/fpga.count": "8"}, annotations={DEVICES_KEY: annotation})

    assert list(state.ids) == ["fpga0", "fpga1"]
    assert scheduler.call("fpga", "kubegpu_scheduler_headroom", state=state) == Headroom(free={FPGA: 1})
    assert_allocation(place(scheduler, state, fpga_pod()), {"main": {FPGA: ["fpga1"]}})
    assert scheduler.call("fpga", "kubegpu_scheduler_fit", state=state, pod=fpga_pod()).code is Code.UNSCHEDULABLE


@pytest.mark.parametrize(
    ("labels", "pod", "code", "reason"),
    [
        (LOADED, fpga_pod(bitstream="resnet50"), Code.SUCCESS, ""),
        (LOADED, fpga_pod(), Code.SUCCESS, ""),
        (BLANK, fpga_pod(), Code.SUCCESS, ""),
        (
            LOADED,
            fpga_pod(bitstream="bert"),
            Code.UNRESOLVABLE,
            "node(s) didn't have FPGA bitstream 'bert' (annotation example.com/fpga-bitstream)",
        ),
        (
            BLANK,
            fpga_pod(bitstream="resnet50"),
            Code.UNRESOLVABLE,
            "node(s) didn't have FPGA bitstream 'resnet50' (annotation example.com/fpga-bitstream)",
        ),
        (
            LOADED,
            fpga_pod(cards=5),
            Code.UNRESOLVABLE,
            "node(s) had fewer than 5 healthy example.com/fpga cards",
        ),
        (
            LOADED,
            fpga_pod(a=3, b=2),
            Code.UNRESOLVABLE,
            "node(s) had fewer than 5 healthy example.com/fpga cards",
        ),
        (LOADED, make_pod(containers={"main": {"cpu": "1"}}), Code.SUCCESS, ""),
    ],
    ids=[
        "bitstream-matches",
        "no-bitstream-asked",
        "blank-node",
        "other-bitstream-loaded",
        "nothing-loaded",
        "more-cards-than-the-node-has",
        "containers-together-too-many",
        "no-fpga-requested",
    ],
)
def test_fit_follows_the_bitstream_rule_and_the_card_count(
    scheduler: KubegpuPluginManager, labels: dict[str, str], pod: Any, code: Code, reason: str
) -> None:
    status = scheduler.call("fpga", "kubegpu_scheduler_fit", state=build(scheduler, labels), pod=pod)

    assert (status.code, status.message) == (code, reason)
    assert status.plugin in (None, "fpga")


def test_cards_in_use_make_a_node_unschedulable_until_they_are_released(
    scheduler: KubegpuPluginManager,
) -> None:
    state = build(scheduler, LOADED)
    first = place(scheduler, state, fpga_pod("first", cards=3))

    status = scheduler.call("fpga", "kubegpu_scheduler_fit", state=state, pod=fpga_pod(cards=2))
    assert (status.code, status.message) == (Code.UNSCHEDULABLE, "Insufficient example.com/fpga")
    assert scheduler.call("fpga", "kubegpu_scheduler_allocate", state=state, pod=fpga_pod(cards=2)) is None

    assert scheduler.call(
        "fpga", "kubegpu_scheduler_release", state=state, pod_key="default/first", allocation=first
    ).ok
    assert scheduler.call("fpga", "kubegpu_scheduler_fit", state=state, pod=fpga_pod(cards=2)).ok


def test_containers_get_distinct_lowest_free_cards_and_the_bitstream_is_recorded(
    scheduler: KubegpuPluginManager,
) -> None:
    state = build(scheduler, LOADED)
    place(scheduler, state, fpga_pod("first"))

    allocation = place(scheduler, state, fpga_pod("second", a=2, b=1))

    assert_allocation(allocation, {"a": {FPGA: ["fpga1", "fpga2"]}, "b": {FPGA: ["fpga3"]}})
    assert allocation.fields == {"bitstream": "resnet50"}
    assert scheduler.call("fpga", "kubegpu_scheduler_headroom", state=state) == Headroom(
        free={FPGA: 0}, utilization=1.0
    )


def test_allocate_leaves_the_state_untouched(scheduler: KubegpuPluginManager) -> None:
    state = build(scheduler, BLANK)

    first = scheduler.call("fpga", "kubegpu_scheduler_allocate", state=state, pod=fpga_pod(cards=2))
    again = scheduler.call("fpga", "kubegpu_scheduler_allocate", state=state, pod=fpga_pod(cards=2))

    assert first == again
    assert first.fields == {}
    assert scheduler.call("fpga", "kubegpu_scheduler_headroom", state=state) == Headroom(free={FPGA: 4})


@pytest.mark.parametrize(
    ("labels", "pod", "score"),
    [
        (BLANK, fpga_pod(), 100.0),
        (LOADED, fpga_pod(), 50.0),
        (LOADED, fpga_pod(bitstream="resnet50"), 100.0),
    ],
    ids=["blank-node", "loaded-node-not-needed", "loaded-node-needed"],
)
def test_a_pod_without_a_bitstream_prefers_nodes_with_none_loaded(
    scheduler: KubegpuPluginManager, labels: dict[str, str], pod: Any, score: float
) -> None:
    assert scheduler.call("fpga", "kubegpu_scheduler_score", state=build(scheduler, labels), pod=pod) == score


@pytest.mark.parametrize(
    ("allocation", "message"),
    [
        (cards("fpga9"), "device fpga9 does not exist on this node"),
        (cards("fpga1", "fpga1"), "device fpga1 appears twice in the allocation"),
        (cards("fpga0"), "device fpga0 is already held by default/first"),
        (
            PluginAllocation(plugin="fpga", containers={"main": {"nvidia.com/gpu": ["0"]}}),
            "container main: resource nvidia.com/gpu is not scheduled by plugin fpga",
        ),
    ],
    ids=["unknown-card", "same-card-twice", "held-card", "foreign-resource"],
)
def test_take_refuses_a_bad_allocation_and_changes_nothing(
    scheduler: KubegpuPluginManager, allocation: PluginAllocation, message: str
) -> None:
    state = build(scheduler, BLANK)
    place(scheduler, state, fpga_pod("first"))

    status = scheduler.call("fpga", "kubegpu_scheduler_take", state=state, pod_key="ns/q", allocation=allocation)

    assert status.code is Code.ERROR
    assert status.message.startswith(message)
    assert scheduler.call("fpga", "kubegpu_scheduler_headroom", state=state).free == {FPGA: 3}


def test_release_leaves_alone_cards_the_pod_does_not_hold(scheduler: KubegpuPluginManager) -> None:
    state = build(scheduler, BLANK)
    held = place(scheduler, state, fpga_pod("first"))

    status = scheduler.call("fpga", "kubegpu_scheduler_release", state=state, pod_key="default/other", allocation=held)

    assert status.ok  # idempotent, as Kubernetes' Unreserve: another pod's release frees nothing
    assert scheduler.call("fpga", "kubegpu_scheduler_headroom", state=state).free == {FPGA: 3}


def test_describe_draws_each_card_and_its_holder(scheduler: KubegpuPluginManager) -> None:
    state = build(scheduler, BLANK)
    place(scheduler, state, fpga_pod("first", cards=2))

    [occupancy] = scheduler.call("fpga", "kubegpu_scheduler_describe", state=state)

    assert (occupancy.family, occupancy.total, occupancy.free, occupancy.largest_fit) == (FPGA, 4, 2, 2)
    assert [(c.id, c.holders, c.used) for c in occupancy.cells] == [
        ("fpga0", ["default/first"], 1.0),
        ("fpga1", ["default/first"], 1.0),
        ("fpga2", [], 0.0),
        ("fpga3", [], 0.0),
    ]


@pytest.mark.parametrize(
    ("bitstream", "refused"), [("resnet50", False), ("bert-large.v2", False), ("", True), ("a b", True)]
)
def test_validate_refuses_an_annotation_that_is_not_a_bitstream_name(
    scheduler: KubegpuPluginManager, bitstream: str, refused: bool
) -> None:
    status = scheduler.call("fpga", "kubegpu_scheduler_validate", pod=fpga_pod(bitstream=bitstream))

    if refused:
        assert status.code is Code.UNRESOLVABLE
        assert status.message.startswith("annotation example.com/fpga-bitstream must name a bitstream")
    else:
        assert status is None


# ------------------------------------------------------------------------------------------------------------
# Device side
# ------------------------------------------------------------------------------------------------------------


def test_discovery_finds_the_card_files_in_card_order(device: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    for name in ["fpga10", "fpga1", "fpga0", "nvidia0", "fpga"]:
        fake_host_root.add_device_file(name)

    inventory = device.call("fpga", "kubegpu_device_discover", host_root=fake_host_root.root)

    assert inventory.plugin == "fpga"
    assert [d.id for d in inventory.devices] == ["fpga0", "fpga1", "fpga10"]


def test_a_host_without_cards_has_no_inventory(device: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    fake_host_root.add_device_file("nvidia0")

    assert device.call("fpga", "kubegpu_device_discover", host_root=fake_host_root.root) is None


def test_a_card_whose_file_disappeared_is_unhealthy_and_not_advertised(
    device: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    fake_host_root.add_device_file("fpga0")
    fake_host_root.add_device_file("fpga1")
    inventory = device.call("fpga", "kubegpu_device_discover", host_root=fake_host_root.root)
    fake_host_root.remove("dev/fpga1")

    health = device.call("fpga", "kubegpu_device_health", host_root=fake_host_root.root, inventory=inventory)
    marked = inventory.model_copy(
        update={"devices": [d.model_copy(update={"healthy": health[d.id]}) for d in inventory.devices]}
    )
    advertisement = device.call("fpga", "kubegpu_device_advertise", inventory=marked)

    assert health == {"fpga0": True, "fpga1": False}
    assert advertisement.capacity == {FPGA: 1}
    assert advertisement.labels == {"example.com/fpga.count": "1"}


def test_a_container_gets_exactly_its_cards(device: KubegpuPluginManager, tmp_path: Path) -> None:
    allocation = ContainerAllocation(
        pod_uid="u",
        node="n",
        container="main",
        resources={FPGA: ["fpga1", "fpga2"]},
        fields={"bitstream": "bert"},
    )
    edit = ContainerEdit(
        devices=[
            DeviceNode(host_path="/dev/fpga0", container_path="/dev/fpga0"),
            DeviceNode(host_path="/dev/fpga2", container_path="/dev/fpga2"),
            DeviceNode(host_path="/dev/null", container_path="/dev/null"),
        ],
        cdi_devices=["example.com/fpga=fpga0", "nvidia.com/gpu=0"],
        envs={"PATH": "/bin"},
    )

    edited = device.call("fpga", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path)

    assert edited is True
    assert [(d.host_path, d.container_path) for d in edit.devices] == [
        ("/dev/fpga2", "/dev/fpga2"),
        ("/dev/null", "/dev/null"),
        (str(tmp_path / "fpga1"), "/dev/fpga1"),
    ]
    assert edit.envs == {"PATH": "/bin", "FPGA_VISIBLE_DEVICES": "fpga1,fpga2", "FPGA_BITSTREAM": "bert"}
    assert edit.cdi_devices == ["nvidia.com/gpu=0", "example.com/fpga=fpga1", "example.com/fpga=fpga2"]


def test_a_container_without_cards_is_left_alone(device: KubegpuPluginManager, tmp_path: Path) -> None:
    allocation = ContainerAllocation(pod_uid="u", node="n", container="main", resources={"nvidia.com/gpu": ["0"]})
    edit = ContainerEdit(devices=[DeviceNode(host_path="/dev/fpga0", container_path="/dev/fpga0")])

    assert (
        device.call("fpga", "kubegpu_device_edit_container", allocation=allocation, edit=edit, dev_root=tmp_path)
        is None
    )
    assert len(edit.devices) == 1


def test_a_garbage_card_id_fails_the_edit_with_an_error_naming_the_plugin(
    device: KubegpuPluginManager, tmp_path: Path
) -> None:
    allocation = ContainerAllocation(pod_uid="u", node="n", container="main", resources={FPGA: ["../sda"]})

    with pytest.raises(PluginHookError) as caught:
        device.call(
            "fpga",
            "kubegpu_device_edit_container",
            allocation=allocation,
            edit=ContainerEdit(),
            dev_root=tmp_path,
        )

    assert str(caught.value).startswith("plugin 'fpga' failed in kubegpu_device_edit_container: ValueError:")
    assert "'../sda'" in str(caught.value)


# ------------------------------------------------------------------------------------------------------------
# A user installs the distribution into a fresh virtual environment
# ------------------------------------------------------------------------------------------------------------


def _fresh_venv(path: Path) -> Path:
    """A plain virtual environment that sees the running environment's packages (kubegpu and its dependencies)
    through a `.pth` file, so that only the example distribution has to be installed, offline."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    Path(purelib, "_kubegpu_parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python


def _can_build_wheels_offline() -> bool:
    """setuptools builds wheels by itself from 70.1 on; older ones need the `wheel` package."""
    try:
        version = metadata.version("setuptools")
    except metadata.PackageNotFoundError:
        return False
    major, minor = (int(part) for part in [*version.split("."), "0"][:2])
    if (major, minor) >= (70, 1):
        return True
    try:
        metadata.version("wheel")
    except metadata.PackageNotFoundError:
        return False
    return True


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KUBEGPU_", "PYTHON"))}
    return subprocess.run(
        [str(python), *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _plugins(python: Path, cwd: Path) -> dict[str, Any]:
    result = _run(python, "-m", "kubegpu", "plugins", "list", "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)["plugins"]}


def _simulate(python: Path, cluster: Path, cwd: Path) -> dict[str, dict[str, Any]]:
    """`kubegpu simulate --json`: one JSON object per pod document, keyed here by `namespace/name`."""
    result = _run(python, "-m", "kubegpu", "simulate", str(cluster), "--json", cwd=cwd)
    text, decoder, records, position = result.stdout, json.JSONDecoder(), [], 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        value, position = decoder.raw_decode(text, position)
        records.extend(value if isinstance(value, list) else [value])
    assert records, f"kubegpu simulate printed no records (exit {result.returncode}): {result.stderr}"
    return {record["pod"]: record for record in records}


@pytest.mark.slow
def test_installing_the_example_distribution_adds_fpga_scheduling_with_no_change_to_kubegpu(
    tmp_path: Path,
) -> None:
    if any(d.metadata["Name"] == "kubegpu-fpga-example" for d in metadata.distributions()):
        pytest.fail(
            "kubegpu-fpga-example is already installed in the running environment, so its absence before the install "
            "cannot be shown: run the suite from the README's test command (a .venv without it)"
        )
    python = _fresh_venv(tmp_path / "venv")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump_all(
            [
                node_manifest("fpga-0", labels={**LOADED, "example.com/fpga.count": "2"}, allocatable={FPGA: 2}),
                node_manifest("cpu-0"),
                pod_manifest("infer", {"main": {FPGA: 1}}, annotations={BITSTREAM: "resnet50"}),
                pod_manifest("translate", {"main": {FPGA: 1}}, annotations={BITSTREAM: "bert"}),
            ]
        )
    )

    assert "fpga" not in _plugins(python, tmp_path)
    before = _simulate(python, cluster, tmp_path)
    assert FPGA not in before["default/infer"]["devices"].get("main", {})

    source = shutil.copytree(EXAMPLE, tmp_path / "fpga", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-input"]
    install += ["--disable-pip-version-check", "--quiet"]
    if _can_build_wheels_offline():
        install.append("--no-build-isolation")
    result = subprocess.run([*install, str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    row = _plugins(python, tmp_path)["fpga"]
    assert (row["distribution"], row["version"], row["resources"]) == (
        "kubegpu-fpga-example",
        "0.1.0",
        [FPGA],
    )
    assert "kubegpu_scheduler_fit" in row["hooks"]["scheduler"]
    assert "kubegpu_device_edit_container" in row["hooks"]["device"]

    after = _simulate(python, cluster, tmp_path)
    infer, translate = after["default/infer"], after["default/translate"]
    assert (infer["event"], infer["node"]) == ("scheduled", "fpga-0")
    assert infer["devices"] == {"main": {FPGA: ["fpga0"]}}
    assert json.loads(infer["annotations"][ALLOCATION_KEY])["plugins"] == {"fpga": {"bitstream": "resnet50"}}
    assert (translate["event"], translate["node"]) == ("unschedulable", None)
    assert "FPGA bitstream 'bert'" in translate["reason"]
    assert BITSTREAM in translate["reason"]


SPOT_RULES = Path(__file__).resolve().parent / "fixtures" / "spot_rules"


def labelled(manifest: dict[str, Any], **labels: str) -> dict[str, Any]:
    manifest["metadata"]["labels"] = labels
    return manifest


@pytest.mark.slow
def test_installing_a_distribution_adds_its_non_device_rules_to_kubegpu_simulate(tmp_path: Path) -> None:
    """`tests/fixtures/spot_rules` adds a filter, a score and a broken filter (`kubegpu_scheduler_rules`)."""
    python = _fresh_venv(tmp_path / "venv")
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(
        yaml.safe_dump_all(
            [
                node_manifest("spot-0", labels={"node.example.com/spot": "true"}),
                node_manifest("steady"),
                node_manifest("cheap", labels={"node.example.com/spot": "true", "node.example.com/cost": "low"}),
                labelled(pod_manifest("db", {"main": {"cpu": "1"}}), tier="critical"),
                pod_manifest("batch", {"main": {"cpu": "1"}}),
                labelled(pod_manifest("probe", {"main": {"cpu": "1"}}), probe="broken"),
            ]
        )
    )
    before = _simulate(python, cluster_file, tmp_path)
    assert before["default/probe"]["event"] == "scheduled"

    source = shutil.copytree(SPOT_RULES, tmp_path / "spot_rules", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-input"]
    install += ["--disable-pip-version-check", "--quiet"]
    if _can_build_wheels_offline():
        install.append("--no-build-isolation")
    result = subprocess.run([*install, str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr

    after = _simulate(python, cluster_file, tmp_path)
    assert (after["default/db"]["event"], after["default/db"]["node"]) == ("scheduled", "steady")
    assert (after["default/batch"]["event"], after["default/batch"]["node"]) == ("scheduled", "cheap")
    probe = after["default/probe"]
    assert probe["event"] == "unschedulable"
    assert "plugin 'spot' failed in rule Broken (filter)" in probe["reason"]
