"""`kubegpu advertise` against a real kube-apiserver, next to the real `kubegpu scheduler`.

The story an operator lives through: the advertiser publishes a trn1-like node's 16 Neuron devices from a fake host
root, the scheduler places a 16-device pod on them; a device disappears, the advertiser marks it unhealthy, and from
then on no pod gets it (16 devices no longer fit, 8 go to the half without it). The advertiser leaves an unchanged
Node alone, publishes capacity and GAS labels that the scheduler accepts, and needs no more rights than the example
RBAC grants.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.core.annotations import ALLOCATION_KEY, DEVICES_KEY, decode_allocation, decode_devices
from kubegpu.core.models import NodeDevices
from kubegpu.core.quantity import to_int
from kubegpu.core.testing import FakeHost
from kubegpu.kube.client import ApiError, KubeClient

from .cluster import Cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "examples" / "deploy" / "node"
DEVICE = "aws.amazon.com/neurondevice"
FENCE = "kubegpu.test/fence"


def advertise(cluster: Cluster, node: str, host: FakeHost, *extra: str, kubeconfig: Path | None = None) -> str:
    """One `--once` round of the advertiser as its own process; its log. Fails the test if the round failed."""
    # No neuron-ls and no NVML in the child: the fake host root is all it may see.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1"}
    env.pop("KUBEGPU_PLUGINS", None)
    env.pop("KUBEGPU_DISABLE_PLUGIN_AUTOLOAD", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubegpu.crishim.advertise",
            "--kubeconfig",
            str(kubeconfig or cluster.kubeconfig),
            "--node-name",
            node,
            "--host-root",
            str(host.root),
            "--once",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"the advertiser failed ({result.returncode}):\n{output}"
    return output


def node(cluster: Cluster, name: str) -> dict[str, Any]:
    document: dict[str, Any] = cluster.client.get(f"/api/v1/nodes/{name}")
    return document


def published(cluster: Cluster, name: str) -> NodeDevices:
    return decode_devices(node(cluster, name)["metadata"]["annotations"][DEVICES_KEY])


def trn_host(tmp_path: Path) -> FakeHost:
    host = FakeHost(tmp_path / "host")
    for d in range(16):
        host.add_device_file(f"neuron{d}")
    return host


def bound_devices(cluster: Cluster, namespace: str, pod: str, timeout: float = 30.0) -> list[str]:
    def placed() -> dict[str, Any] | None:
        found = next((p for p in cluster.pods(namespace) if p["metadata"]["name"] == pod), None)
        return found if found is not None and found["spec"].get("nodeName") else None

    bound = wait_for(placed, timeout, f"pod {pod} bound")
    record = decode_allocation(bound["metadata"]["annotations"][ALLOCATION_KEY])
    return [i for resources in record.containers.values() for ids in resources.values() for i in ids]


def test_a_removed_device_is_marked_unhealthy_and_no_new_pod_gets_it(
    cluster: Cluster, namespace: str, start_scheduler: Any, tmp_path: Path
) -> None:
    # No instance-type label: the annotation says what the devices are, and --update-capacity publishes how many the
    # kubelet may admit (without a vendor device plugin, nothing else would, and the scheduler places device pods
    # only where allocatable has the resource).
    cluster.create_ready_node("trn-adv")
    host = trn_host(tmp_path)
    advertise(cluster, "trn-adv", host, "--update-capacity")
    inventory = published(cluster, "trn-adv").inventories["neuron"]
    assert [d.id for d in inventory.devices] == [str(i) for i in range(16)]
    assert inventory.topology == {"kind": "torus", "rows": 4, "columns": 4}

    start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "all-16", {"main": {DEVICE: 16}}, scheduler="kubegpu")
    assert sorted(bound_devices(cluster, namespace, "all-16"), key=int) == [str(i) for i in range(16)]
    cluster.delete_pod(namespace, "all-16")

    host.remove("dev/neuron3")
    advertise(cluster, "trn-adv", host, "--update-capacity")
    devices = published(cluster, "trn-adv").inventories["neuron"].devices
    assert [d.id for d in devices if not d.healthy] == ["3"]
    assert len(devices) == 16, "the missing device stays listed, so the scheduler knows not to use it"

    # One watch stream delivers a node's changes in order: a pod that needs this label can only be placed once
    # the scheduler has seen the annotation written before it.
    cluster.client.patch("/api/v1/nodes/trn-adv", {"metadata": {"labels": {FENCE: "1"}}})
    cluster.create_pod(namespace, "again-16", {"main": {DEVICE: 16}}, scheduler="kubegpu", node_selector={FENCE: "1"})

    def insufficient() -> bool:
        return any(
            e["involvedObject"]["name"] == "again-16" and f"Insufficient {DEVICE}" in e["message"]
            for e in cluster.events(namespace)
        )

    wait_for(insufficient, 30, "a FailedScheduling event saying 16 devices no longer fit")
    cluster.create_pod(namespace, "half-8", {"main": {DEVICE: 8}}, scheduler="kubegpu", node_selector={FENCE: "1"})
    assert sorted(bound_devices(cluster, namespace, "half-8"), key=int) == [str(i) for i in range(8, 16)]
    again = next(p for p in cluster.pods(namespace) if p["metadata"]["name"] == "again-16")
    assert not again["spec"].get("nodeName")


def test_capacity_and_labels_are_published_once_and_an_unchanged_node_is_not_written(
    cluster: Cluster, namespace: str, start_scheduler: Any, tmp_path: Path
) -> None:
    cluster.create_ready_node("mixed-adv")
    host = trn_host(tmp_path)
    for card in range(2):
        host.write(f"sys/class/drm/card{card}/device/vendor", "0x8086\n")
        host.write(f"sys/class/drm/card{card}/lmem_total_bytes", f"{8 * 10**9}\n")

    first = advertise(cluster, "mixed-adv", host, "--update-capacity")
    written = node(cluster, "mixed-adv")
    advertise(cluster, "mixed-adv", host, "--update-capacity")
    unchanged = node(cluster, "mixed-adv")

    assert "node updated" in first and "node capacity updated" in first
    assert set(decode_devices(written["metadata"]["annotations"][DEVICES_KEY]).inventories) == {"neuron", "intel-gas"}
    capacity = written["status"]["capacity"]
    assert (capacity[DEVICE], capacity["gpu.intel.com/i915"]) == ("16", "2")
    assert to_int(capacity["gpu.intel.com/memory.max"]) == 16 * 10**9
    assert capacity["gpu.intel.com/tiles"] == "2"  # one tile each: these cards show no gt/ or tile directories
    assert written["status"]["allocatable"]["gpu.intel.com/i915"] == "2"
    assert written["metadata"]["labels"]["gpu.intel.com/cards"] == "card0.card1"
    assert unchanged["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]

    start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(
        namespace, "encode", {"main": {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "5G"}}, scheduler="kubegpu"
    )
    assert bound_devices(cluster, namespace, "encode")[0] in ("card0", "card1")


def apply(cluster: Cluster, documents: list[dict[str, Any]]) -> None:
    paths = {
        "Namespace": "/api/v1/namespaces",
        "ResourceQuota": "/api/v1/namespaces/{ns}/resourcequotas",
        "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    }
    for document in documents:
        path = paths[document["kind"]].format(ns=document["metadata"].get("namespace", ""))
        try:
            cluster.client.post(path, document)
        except ApiError as exc:
            if exc.status != 409:  # 409: created by an earlier test of this session
                raise


def service_account_kubeconfig(cluster: Cluster, name: str, path: Path) -> Path:
    token = cluster.client.post(
        f"/api/v1/namespaces/kube-system/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600},
        },
    )["status"]["token"]
    return cluster.write_kubeconfig(path, token)


def test_the_shipped_rbac_renews_the_advertisers_lease_and_reaches_no_kubelets_heartbeat(
    cluster: Cluster, tmp_path: Path
) -> None:
    apply(cluster, list(yaml.safe_load_all((DEPLOY / "advertiser-rbac.yaml").read_text())))
    args = yaml.safe_load((DEPLOY / "advertiser-daemonset.yaml").read_text())["spec"]["template"]["spec"]
    args = args["containers"][0]["args"]
    lease_args = [a for a in args if a.startswith("--lease-")]
    namespace = next((a.split("=", 1)[1] for a in lease_args if a.startswith("--lease-namespace=")), "kube-node-lease")
    kubeconfig = service_account_kubeconfig(cluster, "kubegpu-advertiser", tmp_path / "sa.kubeconfig")
    cluster.create_ready_node("trn-lease")
    heartbeats = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    try:  # the kubelet's own Lease, as every kubelet renews one
        cluster.client.post(heartbeats, {"metadata": {"name": "trn-lease"}, "spec": {"holderIdentity": "trn-lease"}})
    except ApiError as exc:
        if exc.status != 409:
            raise
    log = tmp_path / "advertiser.log"
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "kubegpu.crishim.advertise", "--kubeconfig", str(kubeconfig)]
    command += ["--node-name", "trn-lease", "--host-root", str(trn_host(tmp_path).root), *lease_args]
    command += ["--lease-renew-interval", "0.5s"]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/kubegpu-trn-lease"
        first = wait_for(lambda: cluster.client.get(path)["spec"]["renewTime"], 30, f"the advertiser's Lease {path}")
        wait_for(lambda: cluster.client.get(path)["spec"]["renewTime"] != first, 30, "the Lease renewed")
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert "forbidden" not in log.read_text().lower(), log.read_text()

    # The same identity may not touch a kubelet's heartbeat, nor create Leases where the kubelets keep theirs.
    advertiser = KubeClient.from_kubeconfig(str(kubeconfig))
    renewal = {"spec": {"holderIdentity": "trn-lease", "renewTime": "2020-01-01T00:00:00.000000Z"}}
    for write in (
        lambda: advertiser.patch(f"{heartbeats}/trn-lease", renewal),
        lambda: advertiser.get(f"{heartbeats}/trn-lease"),
        lambda: advertiser.post(heartbeats, {"metadata": {"name": "kubegpu-x"}, "spec": {"holderIdentity": "x"}}),
    ):
        with pytest.raises(ApiError) as refused:
            write()
        assert refused.value.status == 403, refused.value


def test_the_example_rbac_is_enough_and_the_daemonset_is_a_valid_object(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    apply(cluster, list(yaml.safe_load_all((DEPLOY / "advertiser-rbac.yaml").read_text())))
    daemonset = yaml.safe_load((DEPLOY / "advertiser-daemonset.yaml").read_text())
    apply(cluster, [daemonset])  # the API server validates the object; no controller runs it here
    cluster.client.delete("/apis/apps/v1/namespaces/kube-system/daemonsets/kubegpu-advertiser")
    token = cluster.client.post(
        "/api/v1/namespaces/kube-system/serviceaccounts/kubegpu-advertiser/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600},
        },
    )["status"]["token"]
    kubeconfig = cluster.write_kubeconfig(tmp_path / "sa.kubeconfig", token)
    cluster.create_ready_node("trn-rbac")

    output = advertise(cluster, "trn-rbac", trn_host(tmp_path), "--update-capacity", kubeconfig=kubeconfig)

    assert "forbidden" not in output.lower(), output
    assert node(cluster, "trn-rbac")["status"]["capacity"][DEVICE] == "16"
    assert len(published(cluster, "trn-rbac").inventories["neuron"].devices) == 16
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "kubegpu-advertiser"
    assert "--host-root=/host" in spec["containers"][0]["args"]


MIG_NVML = """
# A stand-in for nvidia-ml-py over one A100 80GB in MIG mode (the test host has no GPU): a 1g.10gb with media
# extensions at slice 0, three 1g.10gb and a 3g.40gb, as NVML names and places them.
from types import SimpleNamespace

LAYOUT = [("1g.10gb+me", 0), ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4)]


class NVMLError(Exception):
    pass


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetHandleByUUID(uuid): return 0
def nvmlDeviceGetMinorNumber(h): return 0
def nvmlDeviceGetPciInfo(h): return SimpleNamespace(busId="00000000:10:00.0")
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(total=81920 << 20)
def nvmlDeviceGetName(h): return "NVIDIA A100-SXM4-80GB" + (f" MIG {LAYOUT[h[1]][0]}" if isinstance(h, tuple) else "")
def nvmlDeviceGetUUID(h): return f"MIG-{h[1]}" if isinstance(h, tuple) else "GPU-0"
def nvmlDeviceGetMigMode(h): return (1, 1)
def nvmlDeviceGetMaxMigDeviceCount(h): return 7
def nvmlDeviceGetGpuInstanceId(m): return m[1]
def nvmlDeviceGetGpuInstanceById(h, i): return i
def nvmlGpuInstanceGetInfo(i): return SimpleNamespace(placement=SimpleNamespace(start=LAYOUT[i][1]))


def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
    if i >= len(LAYOUT):
        raise NVMLError("Not Found")
    return (h, i)
"""


def test_a_mig_instance_with_media_extensions_is_published_under_a_name_the_api_server_takes_and_placed(
    cluster: Cluster, namespace: str, start_scheduler: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML names the instance `1g.10gb+me`; a resource name has no `+`. Published as
    `nvidia.com/mig-1g.10gb+me`, the API server refused the advertiser's node patch (422 on the label
    `nvidia.com/mig-1g.10gb+me.count`: the node got neither its devices' annotation nor any capacity, the advertiser
    exited 1) and any pod asking it; as NVIDIA's device plugin names it, `nvidia.com/mig-1g.10gb.me`, it is published
    with its count label, and a pod asking it is given that very instance."""
    python = tmp_path / "python"
    python.mkdir()
    (python / "pynvml.py").write_text(MIG_NVML)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(python), os.environ.get("PYTHONPATH", "")]))
    cluster.create_ready_node("a100-mig")
    advertise(cluster, "a100-mig", FakeHost(tmp_path / "host"), "--update-capacity")
    written = node(cluster, "a100-mig")
    capacity = written["status"]["capacity"]
    assert {k: v for k, v in capacity.items() if k.startswith("nvidia.com/mig-")} == {
        "nvidia.com/mig-1g.10gb.me": "1",
        "nvidia.com/mig-1g.10gb": "3",
        "nvidia.com/mig-3g.40gb": "1",
    }
    assert written["metadata"]["labels"]["nvidia.com/mig-1g.10gb.me.count"] == "1"

    start_scheduler("kubegpu", "--no-leader-elect")
    cluster.create_pod(namespace, "transcode", {"main": {"nvidia.com/mig-1g.10gb.me": 1}}, scheduler="kubegpu")
    assert bound_devices(cluster, namespace, "transcode") == ["0@0"]  # the instance with the media engines


LOUD = """
from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import Advertisement, DeviceInfo, DeviceInventory


@hookimpl
def kubegpu_device_resources():
    return ["loud.example/card"]


@hookimpl
def kubegpu_device_discover(host_root):
    return DeviceInventory(plugin="loud", devices=[DeviceInfo(id="card0")])


@hookimpl
def kubegpu_device_advertise(inventory):
    # A vendor library's model name as a label value: spaces and parentheses, which the API server refuses.
    return Advertisement(capacity={"loud.example/card": 1}, labels={"loud.example/model": "Acme NPU (rev 2)"})
"""


def test_a_plugin_advertising_a_label_the_api_server_refuses_costs_no_other_plugins_inventory(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third-party node side advertises `loud.example/model: Acme NPU (rev 2)`: the advertiser's one patch of the
    Node (every plugin's inventory, labels) was refused by the API server, the round failed, and the node's Neuron
    devices were never published. Now that label is the plugin's wrong answer, logged naming it; the Neuron
    inventory and capacity are published, and nothing of the loud plugin's advertisement is."""
    site = tmp_path / "site"
    (site / "kubegpu_loud").mkdir(parents=True)
    (site / "kubegpu_loud" / "__init__.py").write_text(LOUD)
    (site / "kubegpu_loud-0.1.0.dist-info").mkdir()
    (site / "kubegpu_loud-0.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kubegpu-loud\nVersion: 0.1.0\n"
    )
    (site / "kubegpu_loud-0.1.0.dist-info" / "entry_points.txt").write_text("[kubegpu.device]\nloud = kubegpu_loud\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    cluster.create_ready_node("loud-adv")

    output = advertise(cluster, "loud-adv", trn_host(tmp_path), "--update-capacity")

    assert "plugin 'loud' failed in kubegpu_device_advertise: WrongAnswer: advertised the label" in output, output
    document = node(cluster, "loud-adv")
    assert [d.id for d in published(cluster, "loud-adv").inventories["neuron"].devices] == [str(i) for i in range(16)]
    assert document["status"]["capacity"][DEVICE] == "16"
    assert "loud.example/model" not in (document["metadata"].get("labels") or {})
    assert "loud.example/card" not in document["status"]["capacity"]


VERBOSE = """
from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import Advertisement, DeviceInfo, DeviceInventory


@hookimpl
def kubegpu_device_resources():
    return ["verbose.example/card"]


@hookimpl
def kubegpu_device_discover(host_root):
    # 300 devices with 1,000 characters of attributes each: some 330 KB of inventory.
    devices = [DeviceInfo(id=f"v{i}", attributes={"firmware": "f" * 1000}) for i in range(300)]
    return DeviceInventory(plugin="verbose", devices=devices)


@hookimpl
def kubegpu_device_advertise(inventory):
    return Advertisement(capacity={"verbose.example/card": 300})
"""


def test_an_inventory_too_large_for_the_node_costs_no_other_plugins_inventory(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third-party node side whose inventory alone is past the API server's 256 KiB for a Node's annotations:
    the advertiser's one patch was refused (`metadata.annotations: Too long`), the round failed, and the node's
    Neuron devices were never published. Now that inventory is left out, logged naming the plugin."""
    site = tmp_path / "site"
    (site / "kubegpu_verbose").mkdir(parents=True)
    (site / "kubegpu_verbose" / "__init__.py").write_text(VERBOSE)
    (site / "kubegpu_verbose-0.1.0.dist-info").mkdir()
    (site / "kubegpu_verbose-0.1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kubegpu-verbose\nVersion: 0.1.0\n"
    )
    (site / "kubegpu_verbose-0.1.0.dist-info" / "entry_points.txt").write_text(
        "[kubegpu.device]\nverbose = kubegpu_verbose\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    cluster.create_ready_node("verbose-adv")

    output = advertise(cluster, "verbose-adv", trn_host(tmp_path), "--update-capacity")

    assert "plugin 'verbose'" in output and "is not published" in output, output
    document = node(cluster, "verbose-adv")
    assert set(published(cluster, "verbose-adv").inventories) == {"neuron"}
    assert document["status"]["capacity"][DEVICE] == "16"
    assert "verbose.example/card" not in document["status"]["capacity"]
