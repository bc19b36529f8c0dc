"""`kubegpu device-plugin` whose `--node-name` is not confirmed as this host's, with a real kubelet 1.20 (T217, T222).

The Node named is the kubelet's own, and reports this kernel's boot ID, but the machine ID read under `--host-root`
is not the one the kubelet reports (a containerized device plugin reading its image's `/etc/machine-id`): the device
plugin believes no listing of the node's pods, so the kubelet's Allocate is refused and the pod fails admission. The
kubelet writes the refusal into the pod's status, where its tenant reads it: it says what to change, and quotes no
machine ID, the host's being one no container here can read."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import test_kubelet_deviceplugin as dp
from .cluster import Cluster, wait_for
from .kubelet import Kubelet, pod
from .test_kubelet_deviceplugin import NEURON, NODE, DevicePluginProcess, capacity

# That module's fixtures, each made again for this module: its fake host root, its containerd and kubelet.
host, containerd, kubelet = dp.host, dp.containerd, dp.kubelet


@pytest.fixture(scope="module")
def space(cluster: Cluster) -> Iterator[str]:
    name = cluster.create_namespace(f"dpn-{secrets.token_hex(3)}")
    yield name
    for item in cluster.pods(name):
        cluster.delete_pod(name, item["metadata"]["name"])


def test_a_pod_refused_while_the_node_is_unconfirmed_is_told_why_without_the_hosts_machine_id(
    cluster: Cluster, kubelet: Kubelet, host: Path, space: str
) -> None:
    info = cluster.client.get(f"/api/v1/nodes/{NODE}")["status"]["nodeInfo"]
    assert info.get("machineID") and info.get("bootID"), info  # what the kubelet reports of its host
    read_here = "0" * 32  # not the kubelet's: the device plugin's own image's, say
    (host / "etc").mkdir(exist_ok=True)
    (host / "etc" / "machine-id").write_text(read_here + "\n")
    plugin = DevicePluginProcess(host, kubelet, cluster, interval="1s")
    try:
        wait_for(lambda: capacity(cluster).get(NEURON) == "16", 60, "neurondevice capacity")
        manifest = pod(space, "refused", {"main": {NEURON: 1}}, scheduler="none", out=host / "out", node=NODE)
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)

        def failed() -> dict[str, Any] | None:
            found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{space}/pods/refused")
            return found if found["status"].get("phase") == "Failed" else None

        try:
            status = wait_for(failed, 60, "the pod to fail admission")["status"]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{plugin.output()[-3000:]}") from None
        message = status.get("message", "")
        assert info["machineID"] not in message and read_here not in message, message
        assert f"--node-name {NODE!r} names a node whose kubelet runs on another host" in message, status
        assert f"its machine ID (status.nodeInfo.machineID) is not this host's ({host}/etc/machine-id)" in message
        assert "--host-root to where the host's / is" in message
    finally:
        plugin.stop()
        (host / "etc" / "machine-id").unlink()
