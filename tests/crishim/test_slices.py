"""The advertiser's ResourceSlices (`kubegpu.crishim.slices`): what it publishes for each plugin's inventory, that the
scheduler's DRA allocator reads them back into kubegpu's topology rules, and that it writes only what changed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kubegpu.core import dra
from kubegpu.core.manifests import node_info, pod_request
from kubegpu.core.models import DeviceInfo, DeviceInventory, NodeDevices
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import node_manifest
from kubegpu.crishim.slices import PATH, SlicePublisher, slices_for
from kubegpu.kube.client import ApiError
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.testing import claim_pod, claim_spec, device_class, exactly, template


def neuron_torus(unhealthy: tuple[int, ...] = ()) -> DeviceInventory:
    devices = [
        DeviceInfo(id=str(i), model="trainium", memory=32 << 30, cores=2, healthy=i not in unhealthy) for i in range(16)
    ]
    return DeviceInventory(plugin="neuron", devices=devices, topology={"kind": "torus", "rows": 4, "columns": 4})


def allocate(documents: dict[str, dict[str, Any]], driver: str, *counts: int) -> list[list[str]]:
    """Pods asking `counts` devices of the driver, one after another, on an engine fed the published slices."""
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    engine.add_node(node_info(node_manifest("node-1")))
    found = dra.device_class(device_class("all", f'device.driver == "{driver}"'))
    engine.set_device_class(found.name, found)
    for document in documents.values():
        piece = dra.resource_slice(document)
        engine.set_resource_slice(piece.name, piece)
    chosen = []
    for i, count in enumerate(counts):
        made = dra.resource_claim_template(template(f"t{i}", claim_spec(exactly("d", "all", count))))
        engine.set_resource_claim_template(made.namespace, made.name, made)
        decision = engine.schedule(pod_request(claim_pod(f"p{i}", templates={"dev": f"t{i}"}))[0])
        assert decision.scheduled, decision.reason
        chosen.append([r["device"] for r in decision.claims["dev"]["allocation"]["devices"]["results"]])
    return chosen


def test_a_neuron_torus_is_published_with_what_the_torus_rule_reads_and_allocated_by_it() -> None:
    published = slices_for("node-1", "uid-1", NodeDevices(inventories={"neuron": neuron_torus(unhealthy=(5,))}))
    (document,) = published.values()
    assert document["metadata"]["name"] == "node-1-neuron"
    assert document["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1"}
    ]
    spec = document["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == ("neuron.kubegpu.io", "node-1", "node-1")
    assert "neuron-5" not in [d["name"] for d in spec["devices"]]  # unhealthy: left out
    assert spec["devices"][0] == {
        "name": "neuron-0",
        "attributes": {
            "index": {"int": 0},
            "model": {"string": "trainium"},
            "id": {"string": "0"},
            "topology": {"string": "torus"},
            "deviceCount": {"int": 16},
            "rows": {"int": 4},
            "columns": {"int": 4},
            "cores": {"int": 2},
        },
        "capacity": {"memory": {"value": str(32 << 30)}},
    }
    # A row, then a half: never the row that lost device 5, never 7 devices of no torus shape.
    assert allocate(published, "neuron.kubegpu.io", 4, 8) == [
        ["neuron-0", "neuron-1", "neuron-2", "neuron-3"],
        [f"neuron-{i}" for i in range(8, 16)],
    ]


@pytest.mark.parametrize(
    ("topology", "paths", "pair"),
    [
        pytest.param(
            {"groups": [["GPU-0", "GPU-1"], ["GPU-2", "GPU-3"]]},
            ["0", "0", "1", "1"],
            ["gpu-2", "gpu-3"],
            id="two-pairs",
        ),
        pytest.param({"kind": "nvswitch"}, ["", "", "", ""], ["gpu-1", "gpu-2"], id="nvswitch"),
    ],
)
def test_nvidia_gpus_carry_their_nvlink_group_and_a_pair_stays_in_one(
    topology: dict[str, Any], paths: list[str], pair: list[str]
) -> None:
    gpus = [DeviceInfo(id=f"GPU-{i}", model="Tesla-V100-SXM2-16GB", memory=16 << 30) for i in range(4)]
    inventory = DeviceInventory(plugin="nvidia", devices=gpus, topology=topology)
    published = slices_for("node-1", "uid-1", NodeDevices(inventories={"nvidia": inventory}))
    devices = published["node-1-nvidia"]["spec"]["devices"]
    assert [d["attributes"].get("nvlinkGroup", {}).get("string", "") for d in devices] == paths
    assert allocate(published, "nvidia.kubegpu.io", 1, 2) == [["gpu-0"], pair]


class FakeServer:
    """An API server that serves (or not) resource.k8s.io/v1 ResourceSlices, recording every write."""

    def __init__(self, served: bool = True) -> None:
        self.served = served
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.version = 0

    def get(self, path: str) -> Any:
        if path == "/apis/resource.k8s.io" and self.served:
            return {
                "kind": "APIGroup",
                "name": "resource.k8s.io",
                "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
            }
        raise ApiError(404, "NotFound", path)

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        assert path == PATH and params == {"labelSelector": "kubegpu.io/node=node-1"}
        return [copy.deepcopy(d) for d in self.slices.values()], str(self.version)

    def _stored(self, document: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(document)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.slices[stored["metadata"]["name"]] = stored
        return stored

    def post(self, path: str, body: dict[str, Any]) -> Any:
        self.writes.append(("create", body["metadata"]["name"]))
        return self._stored(body)

    def put(self, path: str, body: dict[str, Any]) -> Any:
        name = path.rsplit("/", 1)[-1]
        assert body["metadata"]["resourceVersion"] == self.slices[name]["metadata"]["resourceVersion"]
        self.writes.append(("replace", name))
        return self._stored(body)

    def delete(self, path: str) -> Any:
        name = path.rsplit("/", 1)[-1]
        self.writes.append(("delete", name))
        return self.slices.pop(name)


def test_the_publisher_writes_only_what_changed_and_moves_the_pool_generation_on() -> None:
    server = FakeServer()
    publisher = SlicePublisher(server, "node-1")  # type: ignore[arg-type]
    healthy = NodeDevices(inventories={"neuron": neuron_torus()})
    assert publisher.publish("uid-1", healthy) == 1
    assert publisher.publish("uid-1", healthy) == 0  # unchanged: nothing written
    assert publisher.publish("uid-1", NodeDevices(inventories={"neuron": neuron_torus(unhealthy=(3,))})) == 1
    stored = server.slices["node-1-neuron"]["spec"]
    assert stored["pool"]["generation"] == 1 and len(stored["devices"]) == 15
    assert publisher.publish("uid-1", NodeDevices()) == 1  # the plugin's devices are gone
    assert server.writes == [("create", "node-1-neuron"), ("replace", "node-1-neuron"), ("delete", "node-1-neuron")]


def test_where_the_api_is_not_served_nothing_is_written() -> None:
    server = FakeServer(served=False)
    publisher = SlicePublisher(server, "node-1")  # type: ignore[arg-type]
    assert publisher.publish("uid-1", NodeDevices(inventories={"neuron": neuron_torus()})) == 0
    assert server.writes == []
