"""The advertiser without an API server: what it writes on a Node, round after round, as devices come and go.

A fake client holds one Node and applies merge patches to it the way the API server does, so each test reads as
what an operator would see on `kubectl get node -o yaml`: the `kubegpu.io/devices` annotation, capacity and labels,
and whether the Node was written at all.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core import process
from kubegpu.core.annotations import (
    DEVICES_KEY,
    FOREIGN_DEVICES_KEY,
    decode_devices,
    decode_foreign_devices,
    encode_devices,
)
from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import Advertisement, DeviceInfo, DeviceInventory, NodeDevices
from kubegpu.core.plugin_manager import KubegpuPluginManager, make_plugin_manager
from kubegpu.core.testing import FakeHost, node_manifest
from kubegpu.crishim import advertise
from kubegpu.crishim.advertise import Advertiser, RoundResult, add_advertise_parser, mark_missing, parse_interval
from kubegpu.kube.client import ApiError
from kubegpu.plugins.intel_gas import device as intel
from kubegpu.plugins.neuron import device as neuron

NODE = "trn-0"
TORUS = {"kind": "torus", "rows": 4, "columns": 4}


# ------------------------------------------------------------------------------------------------------------
# A fake API server holding one Node
# ------------------------------------------------------------------------------------------------------------


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKube:
    def __init__(self, node: dict[str, Any] | None) -> None:
        self.node = node
        if node is not None:
            node["metadata"]["resourceVersion"] = "1"
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.gets = 0
        self.on_get: Callable[[], None] | None = None

    def get(self, path: str) -> Any:
        self.gets += 1
        if self.on_get is not None:
            self.on_get()
        if self.node is None or path != f"/api/v1/nodes/{self.node['metadata']['name']}":
            raise ApiError(404, "NotFound", f'nodes "{path.rsplit("/", 1)[-1]}" not found')
        return copy.deepcopy(self.node)

    def patch(self, path: str, body: dict[str, Any], *, strategic: bool = False) -> Any:
        assert self.node is not None and not strategic
        self.patches.append((path, body))
        if path.endswith("/status"):
            assert set(body) == {"status"}, "the status subresource takes only status"
        else:
            assert set(body) == {"metadata"}, "the advertiser writes only metadata on the Node itself"
        merge(self.node, body)
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.node)

    # What an operator reads:

    def devices(self) -> NodeDevices:
        assert self.node is not None
        return decode_devices(self.node["metadata"]["annotations"][DEVICES_KEY])

    def unhealthy(self, plugin: str) -> list[str]:
        return [d.id for d in self.devices().inventories[plugin].devices if not d.healthy]


@pytest.fixture(autouse=True)
def no_neuron_ls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.fixture
def plugins(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    manager: KubegpuPluginManager = make_plugin_manager("device", neuron=neuron, **{"intel-gas": intel})
    return manager


def trn_host(host: FakeHost) -> FakeHost:
    for d in range(16):
        host.add_device_file(f"neuron{d}")
    return host


def add_intel_card(host: FakeHost, number: int) -> None:
    host.write(f"sys/class/drm/card{number}/device/vendor", "0x8086\n")
    host.write(f"sys/class/drm/card{number}/lmem_total_bytes", f"{8 * 10**9}\n")


def advertiser(kube: FakeKube, plugins: KubegpuPluginManager, host: FakeHost, **options: Any) -> Advertiser:
    return Advertiser(kube, plugins, NODE, host.root, **options)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------
# The annotation
# ------------------------------------------------------------------------------------------------------------


def test_the_first_round_publishes_the_inventory_and_an_unchanged_host_writes_nothing(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    runner = advertiser(kube, plugins, trn_host(fake_host_root))

    first = runner.run_once()
    second = runner.run_once()

    assert (first.ok, first.annotation, first.status, first.labels) == (True, True, False, False)
    inventory = kube.devices().inventories["neuron"]
    assert [d.id for d in inventory.devices] == [str(i) for i in range(16)]
    assert inventory.topology == TORUS
    assert set(kube.devices().inventories) == {"neuron"}, "no Intel cards on this host, so no intel-gas inventory"
    assert (second.ok, second.annotation) == (True, False)
    assert len(kube.patches) == 1
    assert kube.node is not None and kube.node["metadata"]["resourceVersion"] == "2"


def test_a_removed_device_stays_in_the_annotation_marked_unhealthy_and_the_torus_stays_a_torus(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    host = trn_host(fake_host_root)
    runner = advertiser(kube, plugins, host)
    runner.run_once()

    host.remove("dev/neuron15")  # the last id: the device count alone would now say 15, a ring
    result = runner.run_once()
    again = runner.run_once()

    assert result.annotation and not again.annotation
    inventory = kube.devices().inventories["neuron"]
    assert len(inventory.devices) == 16
    assert kube.unhealthy("neuron") == ["15"]
    assert inventory.topology == TORUS


def test_a_restarted_advertiser_keeps_the_devices_the_annotation_lists(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    host = trn_host(fake_host_root)
    advertiser(kube, plugins, host).run_once()
    host.remove("dev/neuron3")

    advertiser(kube, plugins, host).run_once()  # a new process: it knows only what the Node says

    assert kube.unhealthy("neuron") == ["3"]


def test_a_device_that_comes_back_is_healthy_again(plugins: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    kube = FakeKube(node_manifest(NODE))
    host = trn_host(fake_host_root)
    runner = advertiser(kube, plugins, host)
    runner.run_once()
    host.remove("dev/neuron7")
    runner.run_once()

    host.add_device_file("neuron7")
    runner.run_once()

    assert kube.unhealthy("neuron") == []


def test_a_host_that_lost_every_device_keeps_them_all_unhealthy(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    host = trn_host(fake_host_root)
    runner = advertiser(kube, plugins, host)
    runner.run_once()
    for d in range(16):
        host.remove(f"dev/neuron{d}")

    runner.run_once()

    assert len(kube.unhealthy("neuron")) == 16
    assert kube.devices().inventories["neuron"].topology == TORUS


def test_an_unreadable_annotation_is_replaced(plugins: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    kube = FakeKube(node_manifest(NODE, annotations={DEVICES_KEY: '{"version": 7}'}))

    result = advertiser(kube, plugins, trn_host(fake_host_root)).run_once()

    assert result.annotation
    assert len(kube.devices().inventories["neuron"].devices) == 16


class BrokenPlugin:
    """A third-party plugin whose discovery raises."""

    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return ["example.com/broken"]

    @hookimpl
    def kubegpu_device_discover(self, host_root: Path) -> DeviceInventory | None:
        raise OSError("permission denied: /dev/broken0")


def test_a_failing_plugin_is_logged_by_name_and_keeps_what_it_published(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    fake_host_root: FakeHost,
    caplog: pytest.LogCaptureFixture,
) -> None:
    earlier = DeviceInventory(plugin="broken", devices=[DeviceInfo(id="b0")])
    kube = FakeKube(
        node_manifest(NODE, annotations={DEVICES_KEY: encode_devices(NodeDevices(inventories={"broken": earlier}))})
    )
    plugins = make_plugin_manager("device", broken=BrokenPlugin(), neuron=neuron)

    with caplog.at_level(logging.ERROR, logger="kubegpu.advertise"):
        result = advertiser(kube, plugins, trn_host(fake_host_root)).run_once()

    assert result.ok
    assert kube.devices().inventories["broken"] == earlier
    assert len(kube.devices().inventories["neuron"].devices) == 16
    assert "plugin 'broken' failed in kubegpu_device_discover: OSError: permission denied" in caplog.text


class FlakyPlugin:
    """A plugin whose discovery works until `failing` is set; it advertises one label."""

    failing = False

    @hookimpl
    def kubegpu_device_resources(self) -> list[str]:
        return ["example.com/flaky"]

    @hookimpl
    def kubegpu_device_discover(self, host_root: Path) -> DeviceInventory | None:
        if self.failing:
            raise RuntimeError("driver busy")
        return DeviceInventory(plugin="flaky", devices=[DeviceInfo(id="f0")])

    @hookimpl
    def kubegpu_device_advertise(self, inventory: DeviceInventory) -> Advertisement:
        return Advertisement(capacity={"example.com/flaky": 1}, labels={"example.com/flaky.count": "1"})


def test_a_plugin_failing_later_keeps_its_labels_and_capacity(
    make_plugin_manager: Callable[..., KubegpuPluginManager], fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    flaky = FlakyPlugin()
    runner = advertiser(kube, make_plugin_manager("device", flaky=flaky), fake_host_root, update_capacity=True)
    runner.run_once()

    flaky.failing = True
    result = runner.run_once()

    assert result.ok and not (result.annotation or result.labels or result.status)
    assert kube.node is not None and kube.node["metadata"]["labels"] == {"example.com/flaky.count": "1"}
    assert kube.devices().inventories["flaky"].devices == [DeviceInfo(id="f0")]


def test_a_missing_node_fails_the_round(plugins: KubegpuPluginManager, fake_host_root: FakeHost) -> None:
    result = advertiser(FakeKube(None), plugins, trn_host(fake_host_root)).run_once()

    assert not result.ok
    assert result.error is not None and f"cannot read node {NODE}: 404 NotFound" in result.error


# ------------------------------------------------------------------------------------------------------------
# Capacity and labels (--update-capacity)
# ------------------------------------------------------------------------------------------------------------


def test_capacity_and_labels_follow_the_healthy_devices_and_are_written_only_when_they_change(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE, labels={"team": "ml"}))
    host = trn_host(fake_host_root)
    for card in range(2):
        add_intel_card(host, card)
    runner = advertiser(kube, plugins, host, update_capacity=True)

    first = runner.run_once()
    assert kube.node is not None
    status, labels = kube.node["status"], kube.node["metadata"]["labels"]
    assert (first.annotation, first.labels, first.status) == (True, True, True)
    assert status["capacity"]["aws.amazon.com/neurondevice"] == "16"
    assert status["allocatable"]["gpu.intel.com/i915"] == "2"
    assert status["allocatable"]["gpu.intel.com/memory.max"] == str(16 * 10**9)
    assert status["capacity"]["cpu"] == "96", "other capacity is left alone"
    assert labels == {"team": "ml", "gpu.intel.com/gpu-numbers": "0.1", "gpu.intel.com/cards": "card0.card1"}

    second = runner.run_once()
    assert (second.annotation, second.labels, second.status) == (False, False, False)

    host.remove("sys/class/drm/card0")
    host.remove("dev/neuron0")
    third = runner.run_once()
    assert (third.annotation, third.labels, third.status) == (True, True, True)
    assert kube.node["status"]["allocatable"]["gpu.intel.com/i915"] == "1"
    assert kube.node["status"]["capacity"]["aws.amazon.com/neuron"] == "15"
    assert kube.node["metadata"]["labels"]["gpu.intel.com/gpu-numbers"] == "1"


def test_a_continuation_label_no_longer_needed_is_removed(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    for card in range(40):
        add_intel_card(fake_host_root, card)
    runner = advertiser(kube, plugins, fake_host_root, update_capacity=True)
    runner.run_once()
    assert kube.node is not None and "gpu.intel.com/gpu-numbers2" in kube.node["metadata"]["labels"]

    for card in range(4, 40):
        fake_host_root.remove(f"sys/class/drm/card{card}")
    runner.run_once()

    labels = kube.node["metadata"]["labels"]
    assert "gpu.intel.com/gpu-numbers2" not in labels
    assert labels["gpu.intel.com/gpu-numbers"] == "0.1.2.3"
    assert labels["gpu.intel.com/cards"] == "card0.card1.card2.card3"


def test_without_update_capacity_only_the_annotation_is_written(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    add_intel_card(trn_host(fake_host_root), 0)

    advertiser(kube, plugins, fake_host_root).run_once()

    assert [path for path, _ in kube.patches] == [f"/api/v1/nodes/{NODE}"]
    assert kube.node is not None and "gpu.intel.com/i915" not in kube.node["status"]["capacity"]


# ------------------------------------------------------------------------------------------------------------
# Pure helpers
# ------------------------------------------------------------------------------------------------------------


def test_mark_missing_orders_devices_naturally_and_keeps_the_old_shape() -> None:
    previous = DeviceInventory(
        plugin="x",
        devices=[DeviceInfo(id=i) for i in ["card2", "card10", "card1"]],
        topology={"kind": "old"},
        attributes={"a": 1, "b": 1},
    )
    found = DeviceInventory(plugin="x", devices=[DeviceInfo(id="card10")], attributes={"b": 2})

    merged = mark_missing(found, previous)

    assert merged is not None
    assert [(d.id, d.healthy) for d in merged.devices] == [("card1", False), ("card2", False), ("card10", True)]
    assert merged.topology == {"kind": "old"}
    assert merged.attributes == {"a": 1, "b": 2}
    assert mark_missing(None, None) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20s", 20.0), ("1m", 60.0), ("500ms", 0.5), ("1m30s", 90.0), ("1h", 3600.0), ("2.5s", 2.5), ("15", 15.0)],
)
def test_parse_interval(text: str, seconds: float) -> None:
    assert parse_interval(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "20 s", "1d", "-5s", "0s", "5s5"])
def test_parse_interval_refuses_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_interval(text)


# ------------------------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., int]]:
    """`kubegpu advertise ARGS` with the fake client and only the neuron plugin; logging left to pytest."""
    monkeypatch.setattr(process, "configure_logging", lambda level: None)
    original = {signal.SIGTERM: signal.getsignal(signal.SIGTERM), signal.SIGINT: signal.getsignal(signal.SIGINT)}
    monkeypatch.setattr(
        "kubegpu.crishim.advertise.make_plugin_manager",
        lambda side: make_plugin_manager(side, plugins=[("neuron", neuron)], autoload=False),
    )

    def run(kube: FakeKube, *argv: str) -> int:
        parser = argparse.ArgumentParser(prog="kubegpu")
        add_advertise_parser(parser.add_subparsers())
        args = parser.parse_args(["advertise", *argv])
        return advertise.run(args, client_factory=lambda kubeconfig: kube)  # type: ignore[arg-type,return-value]

    yield run
    for sig, handler in original.items():
        signal.signal(sig, handler)


def test_once_publishes_and_exits_0_or_1_when_the_node_is_missing(
    command: Callable[..., int], fake_host_root: FakeHost
) -> None:
    kube = FakeKube(node_manifest(NODE))
    host = str(trn_host(fake_host_root).root)

    assert command(kube, "--node-name", NODE, "--host-root", host, "--once") == 0
    assert len(kube.devices().inventories["neuron"].devices) == 16
    assert command(FakeKube(None), "--node-name", NODE, "--host-root", host, "--once") == 1


def test_the_loop_runs_round_after_round_until_sigterm(command: Callable[..., int], fake_host_root: FakeHost) -> None:
    kube = FakeKube(node_manifest(NODE))
    host = trn_host(fake_host_root)

    def third_round_removes_a_device_and_the_fourth_is_the_last() -> None:
        if kube.gets == 3:
            host.remove("dev/neuron2")
        if kube.gets == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the advertiser: it finishes the round and exits

    kube.on_get = third_round_removes_a_device_and_the_fourth_is_the_last

    argv = ["--node-name", NODE, "--host-root", str(host.root), "--interval", "10ms", "--no-node-lease"]
    assert command(kube, *argv) == 0  # the node lease has its own tests (test_node_lease.py)
    assert kube.gets == 4
    assert kube.unhealthy("neuron") == ["2"]
    assert len(kube.patches) == 2, "one patch for the first inventory, one when the device went"


def test_round_result_is_ok_without_error() -> None:
    assert RoundResult().ok and not RoundResult(error="x").ok


# ------------------------------------------------------------------------------------------------------------
# The kubelet's PodResources: the ids of pods kubegpu did not place
# ------------------------------------------------------------------------------------------------------------


def test_a_tenants_allocation_annotation_of_odd_digits_is_published_as_foreign_not_a_crash(
    plugins: KubegpuPluginManager, fake_host_root: FakeHost, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A tenant may write its own pod's annotations: an allocation naming device `²` (a digit to `str.isdigit`, not to
    `int`) made the publication's natural sort raise out of the round, and the advertiser process died with it."""
    device = "aws.amazon.com/neurondevice"
    forged = json.dumps({"version": 1, "node": NODE, "podUID": "u", "containers": {"main": {device: ["²", "1"]}}})
    tenant = {"metadata": {"namespace": "tenant", "name": "odd", "annotations": {"kubegpu.io/allocation": forged}}}

    class Kube(FakeKube):
        def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
            return [tenant], "1"

    socket = tmp_path / "kubelet.sock"
    socket.touch()
    held = {"tenant/odd": {"main": {device: ["1", "0"]}}, "team/other": {"main": {device: ["²"]}}}
    monkeypatch.setattr(advertise.podresources, "list_pod_resources", lambda path, **_: held)
    kube = Kube(node_manifest(NODE))
    result = advertiser(kube, plugins, trn_host(fake_host_root), pod_resources=socket).run_once()
    assert result.ok, result.error
    assert kube.devices().inventories["neuron"].devices  # the round went on to publish the node's devices
    published = decode_foreign_devices(kube.node["metadata"]["annotations"][FOREIGN_DEVICES_KEY])  # type: ignore[index]
    assert {key: dict(pod) for key, pod in published.pods.items()} == {
        "tenant/odd": {"main": {device: ["0", "1"]}},
        "team/other": {"main": {device: ["²"]}},
    }


def test_a_device_id_of_odd_digits_is_ordered_as_text_not_a_crash() -> None:
    """A plugin's discovery (or the node's published inventory, read back as the previous round's) naming a device
    `²`: the natural order read it as a number and raised out of the round."""
    found = DeviceInventory(plugin="x", devices=[DeviceInfo(id=i) for i in ("10", "²", "card2", "2")])
    marked = mark_missing(found, None)
    assert marked is not None and [d.id for d in marked.devices] == ["2", "10", "card2", "²"]


class StrictKube(FakeKube):
    """Refuses a patch leaving the Node's annotations over 256 KiB, as the API server does (`metadata.annotations:
    Too long: must have at most 262144 bytes`)."""

    def patch(self, path: str, body: dict[str, Any], *, strategic: bool = False) -> Any:
        assert self.node is not None
        after = copy.deepcopy(self.node)
        merge(after, body)
        annotations = after["metadata"].get("annotations") or {}
        if sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items()) > 256 * 1024:
            raise ApiError(422, "Invalid", "metadata.annotations: Too long: must have at most 262144 bytes")
        return super().patch(path, body, strategic=strategic)


def test_an_inventory_too_large_for_the_node_costs_only_its_own_plugin(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    fake_host_root: FakeHost,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A third-party plugin discovers 300 devices, each with 1,000 characters of attributes (serials, firmware
    strings): the devices annotation came to some 330 KB, the API server refused the advertiser's one patch, and the
    node's Neuron devices were never published. Now that inventory (and its advertisement) is left out, logged
    naming the plugin and its size; the Neuron inventory and capacity are published."""

    class Verbose:
        @hookimpl
        def kubegpu_device_resources(self) -> list[str]:
            return ["verbose.example/card"]

        @hookimpl
        def kubegpu_device_discover(self) -> DeviceInventory:
            devices = [DeviceInfo(id=f"v{i}", attributes={"firmware": "f" * 1000}) for i in range(300)]
            return DeviceInventory(plugin="verbose", devices=devices)

        @hookimpl
        def kubegpu_device_advertise(self) -> Advertisement:
            return Advertisement(capacity={"verbose.example/card": 300})

    manager = make_plugin_manager("device", neuron=neuron, verbose=Verbose())
    kube = StrictKube(node_manifest(NODE, annotations={"other.example/note": "x" * 10_000}))

    result = advertiser(kube, manager, trn_host(fake_host_root), update_capacity=True).run_once()

    assert result.error is None
    assert set(kube.devices().inventories) == {"neuron"}
    assert kube.node is not None and kube.node["status"]["capacity"]["aws.amazon.com/neurondevice"] == "16"
    assert "verbose.example/card" not in kube.node["status"]["capacity"]
    assert any("plugin 'verbose'" in r.getMessage() and "is not published" in r.getMessage() for r in caplog.records)
