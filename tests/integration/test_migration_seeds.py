"""Each seed system's own documented example, replayed on kubegpu in that system's deployment style, against the real
kube-apiserver and kube-scheduler 1.20.2: what a user switching over sees happen (docs/migrating-from-*.md).

* GAS (seed 001): two 8 GB cards, three 5 GB pods; the extender started with GAS's own flags, kube-scheduler
  configured with GAS's scheduler policy (verbs `scheduler/filter`, `scheduler/bind`, `ignorable: true`).
* The Neuron extension (seed 002): the `neuroncore: 9` pod with `schedulerName: my-scheduler`, a second
  kube-scheduler profile configured from the shipped overlay; the filter decision is in the extender's log.
* nvidia-gpu-scheduler (seed 004): a `gpu.model` pod through the seed's `.../apis/nvidia-gpu-scheduler/v1/schedule`
  urlPrefix, while a client watches `gpupods` on the seed's path.
* KubeGPU (seed 003): the custom scheduler with a minimum GPU memory.
* HAMi: its README's `gpu-pod` (`nvidia.com/gpu: 1`, `gpumem: 3000`, `gpucores: 30`) on a node as HAMi's device
  plugin leaves it (only `nvidia.com/gpu` listed), through kube-scheduler configured as each shipped extender mode
  configures it; a pod asking HAMi's `nvidia.com/priority` is refused with kubegpu's reason; pods naming GPU types
  (`nvidia.com/use-gputype`, `nouse-gputype`) land on those types, and one naming a GPU UUID is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import urllib3
import yaml

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation

from .cluster import Cluster, config_flag, free_port, wait_for
from .test_extender import Process, make_certs, tls_client
from .test_scheduler import HAMI_GPU, ROOT, bound, wait_bound

OVERLAYS = ROOT / "examples" / "deploy" / "kustomize" / "overlays"
EXTENDER_CONFIGS = {
    # the default kube-scheduler patched to call the extender (extender-patched-default)
    "patched-default": ROOT / "examples" / "deploy" / "extender" / "scheduler-config.yaml",
    # the second kube-scheduler `my-scheduler` (extender-second-profile, EKS)
    "second-profile": OVERLAYS / "extender-second-profile" / "my-scheduler.yaml",
}
GIB = 1024**3


def start_extender(cluster: Cluster, key_file: Path, tmp_path: Path, *args: str) -> tuple[Process, int]:
    port = free_port()
    command = [sys.executable, "-m", "kubegpu", "extender", "--kubeconfig", str(cluster.kubeconfig),
               "--allocation-key-file", str(key_file), *[a.replace("{port}", str(port)) for a in args]]  # fmt: skip
    extender = Process(command, tmp_path / "extender.log")
    return extender, port


def wait_ready(url: str, client: urllib3.PoolManager) -> None:
    wait_for(lambda: client.request("GET", f"{url}/readyz", timeout=1.0).status == 200, 30, "the extender's sync")


def start_kube_scheduler(cluster: Cluster, tmp_path: Path, config: dict[str, Any]) -> Process:
    path = tmp_path / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    return Process(
        [str(cluster.bin / "kube-scheduler"), config_flag(path), "--port=0", f"--secure-port={free_port()}",
         "--bind-address=127.0.0.1", f"--cert-dir={tmp_path / 'ks-certs'}", "--authentication-tolerate-lookup-failure",
         "-v=2"],
        tmp_path / "kube-scheduler.log",
    )  # fmt: skip


def scheduler_config(cluster: Cluster, profile: str, extender: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(cluster.kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": profile}],
        "extenders": [extender],
    }


def guide_yaml(guide: Path, kind: str) -> dict[str, Any]:
    """The YAML block of `guide` whose document is of `kind`, as a user copies it."""
    text = guide.read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    documents = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict) and d.get("kind") == kind]
    assert len(documents) == 1, f"{guide.name}: {len(documents)} YAML blocks of kind {kind}"
    return documents[0]


@pytest.fixture
def processes() -> Any:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


def events_of(cluster: Cluster, namespace: str, pod: str) -> list[str]:
    return [e["message"] for e in cluster.events(namespace) if e["involvedObject"]["name"] == pod]


def test_gas_two_8g_cards_take_two_5g_pods_and_refuse_the_third(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    # GAS's flags as its deployment passes them (`--v=4` too); its certificate, key and CA from make-certs.sh.
    certs = make_certs(tmp_path / "certs")
    extender, port = start_extender(
        cluster, key_file, tmp_path, "--port", "{port}", f"--cert={certs / 'tls.crt'}",
        f"--key={certs / 'tls.key'}", f"--cacert={certs / 'ca.crt'}", "--v=4", "-enableAllowlist", "-enableDenylist",
    )  # fmt: skip
    processes.append(extender)
    url = f"https://127.0.0.1:{port}"
    wait_ready(url, urllib3.PoolManager(cert_reqs="CERT_NONE"))
    # GAS's scheduler policy (seed 001), with kubegpu's address and make-certs.sh's client certificate.
    policy = {
        "kind": "Policy", "apiVersion": "v1",
        "extenders": [{
            "urlPrefix": url, "apiVersion": "v1", "filterVerb": "scheduler/filter", "bindVerb": "scheduler/bind",
            "weight": 1, "enableHttps": True, "ignorable": True, "nodeCacheCapable": True,
            "managedResources": [{"name": "gpu.intel.com/i915", "ignoredByScheduler": False}],
            "tlsConfig": {"insecure": False, "certFile": str(certs / "client.crt"),
                          "keyFile": str(certs / "client.key"), "caFile": str(certs / "ca.crt")},
        }],
    }  # fmt: skip
    (tmp_path / "policy.cfg").write_text(json.dumps(policy))
    cluster.create_ready_node(
        "gas-node", labels={"gpu.intel.com/cards": "card0.card1"},
        allocatable={"gpu.intel.com/i915": 8, "gpu.intel.com/memory.max": "16G"},  # 4 shares a card
    )  # fmt: skip
    # GAS's configure-scheduler.sh style: the policy file on kube-scheduler's command line (kube-scheduler 1.20).
    scheduler = Process(
        [str(cluster.bin / "kube-scheduler"), f"--kubeconfig={cluster.kubeconfig}", "--leader-elect=false",
         f"--policy-config-file={tmp_path / 'policy.cfg'}", "--use-legacy-policy-config=true",
         "--scheduler-name=gas-scheduler", "--port=0", f"--secure-port={free_port()}", "--bind-address=127.0.0.1",
         f"--cert-dir={tmp_path / 'ks-certs'}", "--authentication-tolerate-lookup-failure", "-v=2"],
        tmp_path / "kube-scheduler.log",
    )  # fmt: skip
    processes.append(scheduler)
    five_gb = {"main": {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "5G"}}
    for i in range(3):
        cluster.create_pod(namespace, f"demo-{i}", five_gb, scheduler="gas-scheduler")
    try:
        placed = wait_bound(cluster, namespace, 2, timeout=45)
    except AssertionError:
        raise AssertionError(f"{extender.output()[-3000:]}\n---\n{scheduler.output()[-3000:]}") from None
    cards = sorted(p["metadata"]["annotations"]["gas-container-cards"] for p in placed.values())
    assert cards == ["card0", "card1"]
    assert all(p["metadata"]["annotations"]["gas-ts"].isdigit() for p in placed.values())
    (pending,) = {"demo-0", "demo-1", "demo-2"} - set(placed)
    message = wait_for(
        lambda: next((m for m in events_of(cluster, namespace, pending) if "will not fit" in m), None),
        30, "the third pod's FailedScheduling event with GAS's reason",
    )  # fmt: skip
    assert "Not enough GPU-resources for deployment: will not fit" in message and "needs 5G" in message, message
    assert len(wait_bound(cluster, namespace, 2)) == 2


def shipped_extender_config(cluster: Cluster, which: str, url: str) -> dict[str, Any]:
    """A shipped kube-scheduler configuration (a file, or the ConfigMap in a manifest) pointed at `url` over HTTP."""
    documents = list(yaml.safe_load_all(EXTENDER_CONFIGS[which].read_text()))
    config_map = next((d for d in documents if d["kind"] == "ConfigMap"), None)
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"]) if config_map else documents[0]
    (entry,) = config["extenders"]
    entry.update(urlPrefix=url, enableHTTPS=False)
    entry.pop("tlsConfig")
    config.update(clientConnection={"kubeconfig": str(cluster.kubeconfig)}, leaderElection={"leaderElect": False})
    return config


def extender_behind_shipped_config(
    cluster: Cluster, which: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> tuple[dict[str, Any], str]:
    """`kubegpu extender` started over plain HTTP and ready, and the shipped configuration `which` pointed at it,
    with the scheduler name of its one profile."""
    extender, port = start_extender(
        cluster, key_file, tmp_path, "--listen", "127.0.0.1:{port}", "--insecure-no-client-auth"
    )
    processes.append(extender)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, urllib3.PoolManager())
    config = shipped_extender_config(cluster, which, url)
    (profile,) = (p["schedulerName"] for p in config["profiles"])
    return config, profile


@pytest.mark.parametrize("which", sorted(EXTENDER_CONFIGS))
def test_hamis_share_pod_is_placed_and_its_task_priority_refused_through_each_shipped_extender_config(
    which: str, cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """The second profile managed `nvidia.com/gpu` alone: kube-scheduler's own NodeResourcesFit refused HAMi's pod
    on every HAMi node (`Insufficient nvidia.com/gpucores, ... nvidia.com/gpumem`). And `nvidia.com/priority`
    read `Insufficient nvidia.com/priority` (1) or ran at the low priority (0, which every check lets through)."""
    config, profile = extender_behind_shipped_config(cluster, which, key_file, tmp_path, processes)
    cluster.create_ready_node("hami-node", labels=HAMI_GPU, allocatable={"nvidia.com/gpu": 10})
    scheduler = start_kube_scheduler(cluster, tmp_path, config)
    processes.append(scheduler)
    hami = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}  # HAMi's README's gpu-pod
    cluster.create_pod(namespace, "gpu-pod", {"ubuntu-container": hami}, scheduler=profile)
    try:
        pod = wait_bound(cluster, namespace, 1, timeout=45)["gpu-pod"]
    except AssertionError:
        raise AssertionError(f"{events_of(cluster, namespace, 'gpu-pod')}\n{scheduler.output()[-3000:]}") from None
    record = decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY])
    assert record.shares["ubuntu-container"] == {
        "nvidia.com/gpu": {"0": 1}, "nvidia.com/gpucores": {"0": 30}, "nvidia.com/gpumem": {"0": 3000}
    }  # fmt: skip
    for name, priority in (("high", 0), ("low", 1)):
        cluster.create_pod(namespace, name, {"main": {**hami, "nvidia.com/priority": priority}}, scheduler=profile)
    for name in ("high", "low"):
        message = wait_for(
            lambda name=name: next((m for m in events_of(cluster, namespace, name) if "priority" in m), None),
            45, f"{name}'s FailedScheduling event",
        )  # fmt: skip
        assert "remove nvidia.com/priority from the container" in message, message
    assert set(wait_bound(cluster, namespace, 1)) == {"gpu-pod"}


def test_hamis_gpu_type_annotations_pick_the_node_and_a_gpu_uuid_is_refused_through_the_extender(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """A tenant's HAMi pods naming GPU types (`nvidia.com/use-gputype`, `nouse-gputype`) land on those types only, on
    nodes as HAMi's device plugin and GFD label them, behind kube-scheduler as the shipped configuration sets it up.
    Before, kubegpu read neither annotation: binpack put the `use-gputype: A100` pod on the fuller T4 node; and a pod
    choosing its GPU by UUID (`nvidia.com/use-gpuuuid`) was bound to whichever GPU the policy chose."""
    config, profile = extender_behind_shipped_config(cluster, "patched-default", key_file, tmp_path, processes)
    for name, product in (("hami-t4", "Tesla-T4"), ("hami-a100", "NVIDIA-A100-SXM4-80GB")):
        labels = {**HAMI_GPU, "nvidia.com/gpu.product": product}
        cluster.create_ready_node(name, labels=labels, allocatable={"nvidia.com/gpu": 10})
    scheduler = start_kube_scheduler(cluster, tmp_path, config)
    processes.append(scheduler)
    share = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 10}
    pods = {
        "on-t4": {"nvidia.com/use-gputype": "T4"},  # first: makes hami-t4 the fuller node, binpack's choice
        "a100": {"nvidia.com/use-gputype": "A100"},
        "not-t4": {"nvidia.com/nouse-gputype": "Tesla T4"},
    }
    for name, asked in pods.items():
        cluster.create_pod(namespace, name, {"main": share}, scheduler=profile, annotations=asked)
        try:
            wait_for(lambda name=name: name in bound(cluster, namespace), 45, f"{name} bound")
        except AssertionError:
            raise AssertionError(f"{events_of(cluster, namespace, name)}\n{scheduler.output()[-3000:]}") from None
    placed = {name: pod["spec"]["nodeName"] for name, pod in bound(cluster, namespace).items()}
    assert placed == {"on-t4": "hami-t4", "a100": "hami-a100", "not-t4": "hami-a100"}
    refused = {
        "v100": ({"nvidia.com/use-gputype": "V100"}, 'have no GPU of type "V100" (nvidia.com/use-gputype)'),
        "pinned": ({"nvidia.com/use-gpuuuid": "GPU-0"}, "remove nvidia.com/use-gpuuuid"),
    }
    for name, (asked, _) in refused.items():
        cluster.create_pod(namespace, name, {"main": share}, scheduler=profile, annotations=asked)
    for name, (_, wanted) in refused.items():

        def said(name: str = name, wanted: str = wanted) -> str | None:
            return next((m for m in events_of(cluster, namespace, name) if wanted in m), None)

        assert wait_for(said, 45, f"{name}'s FailedScheduling event saying {wanted!r}")
    assert set(bound(cluster, namespace)) == set(pods)


def test_hami_nodes_without_gfd_are_read_from_hamis_registration_through_the_extender(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """Nodes as HAMi's device plugin leaves them without GPU Feature Discovery: `nvidia.com/gpu` = GPUs x 10 and
    `hami.io/node-nvidia-register` (the older entries on a T4 node, the newer JSON on an A100 node whose GPU 0 is
    unhealthy). kubegpu read each as one whole GPU per share slot: the share was refused (`node(s) offer whole GPUs
    only`), the type pick failed (no model known) and the whole-GPU pod was given GPUs 0-2, one of them unhealthy."""
    config, profile = extender_behind_shipped_config(cluster, "patched-default", key_file, tmp_path, processes)
    t4 = "".join(f"GPU-{i}-t4,10,15360,100,NVIDIA-Tesla T4,0,true:" for i in range(2))
    a100 = [{"id": "GPU-0-a100", "count": 10, "devmem": 81920, "devcore": 100, "type": "NVIDIA-NVIDIA A100-SXM4-80GB"}]
    a100 += [{**a100[0], "id": f"GPU-{i}-a100", "index": i, "health": True} for i in range(1, 4)]
    for name, register, gpus in (("hami-t4", t4, 2), ("hami-a100", json.dumps(a100), 3)):
        annotations = {"hami.io/node-nvidia-register": register, "hami.io/node-handshake": "Reported now"}
        cluster.create_ready_node(name, annotations=annotations, allocatable={"nvidia.com/gpu": gpus * 10})
    scheduler = start_kube_scheduler(cluster, tmp_path, config)
    processes.append(scheduler)
    share = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000, "nvidia.com/gpucores": 10}
    pods = {
        "share-a100": ({"main": share}, {"nvidia.com/use-gputype": "A100"}),
        "whole-a100": ({"main": {"nvidia.com/gpu": 2}}, {"nvidia.com/use-gputype": "A100"}),
        "share-t4": ({"main": share}, {"nvidia.com/use-gputype": "T4"}),
    }
    for name, (containers, asked) in pods.items():
        cluster.create_pod(namespace, name, containers, scheduler=profile, annotations=asked)
        try:
            wait_for(lambda name=name: name in bound(cluster, namespace), 45, f"{name} bound")
        except AssertionError:
            raise AssertionError(f"{events_of(cluster, namespace, name)}\n{scheduler.output()[-3000:]}") from None
    placed = bound(cluster, namespace)
    assert {name: pod["spec"]["nodeName"] for name, pod in placed.items()} == {
        "share-a100": "hami-a100", "whole-a100": "hami-a100", "share-t4": "hami-t4"
    }  # fmt: skip
    given = {
        name: decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY]).containers["main"]["nvidia.com/gpu"]
        for name, pod in placed.items()
    }
    assert set(given["whole-a100"]) <= {"1", "2", "3"} and given["share-a100"][0] in {"1", "2", "3"}, given
    assert not set(given["whole-a100"]) & set(given["share-a100"]), given
    cluster.create_pod(namespace, "gi", {"main": {**share, "nvidia.com/gpumem": "1Gi"}}, scheduler=profile)

    def said() -> str | None:
        return next((m for m in events_of(cluster, namespace, "gi") if "write 1024 for 1 GiB" in m), None)

    assert wait_for(said, 45, "gi's FailedScheduling event hinting at MiB")


@pytest.mark.parametrize("which", sorted(EXTENDER_CONFIGS))
def test_gas_tiles_pod_without_i915_is_refused_with_kubegpus_reason_through_each_shipped_extender_config(
    which: str, cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """GAS's tile request asks `gpu.intel.com/tiles` beside `i915`; a pod that leaves `i915` out is refused by kubegpu
    (its default), naming the fix. The shipped configurations did not list `tiles` in `managedResources`, so
    kube-scheduler never asked kubegpu about it and bound it on node totals, where it got no card."""
    config, profile = extender_behind_shipped_config(cluster, which, key_file, tmp_path, processes)
    cluster.create_ready_node(
        "max-node", labels={"gpu.intel.com/gpu-numbers": "0.1"},
        allocatable={"gpu.intel.com/i915": 2, "gpu.intel.com/tiles": 4, "gpu.intel.com/memory.max": "128G"},
    )  # fmt: skip
    scheduler = start_kube_scheduler(cluster, tmp_path, config)
    processes.append(scheduler)
    cluster.create_pod(namespace, "tiles-only", {"main": {"gpu.intel.com/tiles": 1}}, scheduler=profile)
    cluster.create_pod(
        namespace, "tiles", {"main": {"gpu.intel.com/i915": 1, "gpu.intel.com/tiles": 2}}, scheduler=profile
    )
    try:
        placed = wait_for(lambda: (b := bound(cluster, namespace)) and "tiles" in b and b, 45, "the tiles pod bound")
    except AssertionError:
        raise AssertionError(f"{events_of(cluster, namespace, 'tiles')}\n{scheduler.output()[-3000:]}") from None
    record = decode_allocation(placed["tiles"]["metadata"]["annotations"][ALLOCATION_KEY])
    assert record.shares["main"]["gpu.intel.com/tiles"] == {"card0": 2}
    message = wait_for(
        lambda: next((m for m in events_of(cluster, namespace, "tiles-only") if "i915" in m), None),
        45, "the tiles-only pod's FailedScheduling event with kubegpu's reason",
    )  # fmt: skip
    assert "must also request gpu.intel.com/i915" in message, message
    assert set(wait_bound(cluster, namespace, 1)) == {"tiles"}


@pytest.mark.parametrize("which", sorted(EXTENDER_CONFIGS))
def test_gas_one_tile_pods_share_a_two_tile_card_tile_by_tile_through_each_shipped_extender_config(
    which: str, cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """GAS's tile request on a node of two Data Center GPU Max cards (2 tiles each), three 1-tile pods allowed card0
    only (`gas-allow`): two are bound with a tile each, named in `gas-container-tiles` for Intel's GPU plugin and in
    the signed allocation for kubegpu's node side; the third is refused naming the card (the node's totals still have
    2 tiles free, so kube-scheduler alone would bind it). kubegpu picked no tile: both pods were bound without
    `gas-container-tiles` and saw the whole card."""
    config, profile = extender_behind_shipped_config(cluster, which, key_file, tmp_path, processes)
    cluster.create_ready_node(
        "max-node", labels={"gpu.intel.com/gpu-numbers": "0.1"},
        allocatable={"gpu.intel.com/i915": 8, "gpu.intel.com/tiles": 4},
    )  # fmt: skip
    scheduler = start_kube_scheduler(cluster, tmp_path, config)
    processes.append(scheduler)
    for i in range(3):
        tile = {"gpu.intel.com/i915": 1, "gpu.intel.com/tiles": 1}
        cluster.create_pod(
            namespace, f"tile-{i}", {"main": tile}, scheduler=profile, annotations={"gas-allow": "card0"}
        )
    try:
        placed = wait_bound(cluster, namespace, 2, timeout=45)
    except AssertionError:
        raise AssertionError(f"{events_of(cluster, namespace, 'tile-0')}\n{scheduler.output()[-3000:]}") from None
    tiles = sorted(p["metadata"]["annotations"]["gas-container-tiles"] for p in placed.values())
    assert tiles == ["card0:gt0", "card0:gt1"]
    signed = sorted(
        decode_allocation(p["metadata"]["annotations"][ALLOCATION_KEY]).plugins["intel-gas"]["tiles"]["main"]["card0"]
        for p in placed.values()
    )
    assert signed == [[0], [1]]
    (pending,) = {"tile-0", "tile-1", "tile-2"} - set(placed)
    message = wait_for(
        lambda: next((m for m in events_of(cluster, namespace, pending) if "tile" in m), None),
        45, "the third pod's FailedScheduling event naming the card",
    )  # fmt: skip
    assert "gpu.intel.com/tiles: needs 1 on each of 1 card(s); card0 has no free tile" in message, message
    assert len(wait_bound(cluster, namespace, 2)) == 2


def test_gas_node_losing_a_card_keeps_placing_on_the_others(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    """The Intel labeler stops listing card0 (`gpu-numbers` 0.1 -> 1) and the device plugin's totals halve while a pod
    holds a share of card0. GAS goes on placing on card1; kubegpu refused every new pod on the node ("pod ... runs
    on devices this node no longer lists as it did (card0 is not an Intel GPU card of this node)") until the pod on
    the lost card ended."""
    extender, port = start_extender(
        cluster, key_file, tmp_path, "--listen", "127.0.0.1:{port}", "--insecure-no-client-auth"
    )
    processes.append(extender)
    url = f"http://127.0.0.1:{port}"
    http = urllib3.PoolManager()
    wait_ready(url, http)
    config = shipped_extender_config(cluster, "patched-default", url)
    (profile,) = (p["schedulerName"] for p in config["profiles"])
    cluster.create_ready_node(
        "gas-node", labels={"gpu.intel.com/gpu-numbers": "0.1"},
        allocatable={"gpu.intel.com/i915": 8, "gpu.intel.com/memory.max": "16G"},
    )  # fmt: skip
    processes.append(start_kube_scheduler(cluster, tmp_path, config))
    two_gb = {"main": {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "2G"}}
    for card in ("card0", "card1"):
        cluster.create_pod(namespace, f"on-{card}", two_gb, scheduler=profile, annotations={"gas-allow": card})
    wait_bound(cluster, namespace, 2, timeout=45)

    cluster.client.patch("/api/v1/nodes/gas-node", {"metadata": {"labels": {"gpu.intel.com/gpu-numbers": "1"}}})
    halved = {"gpu.intel.com/i915": "4", "gpu.intel.com/memory.max": "8G"}
    cluster.client.patch("/api/v1/nodes/gas-node/status", {"status": {"capacity": halved, "allocatable": halved}})

    def cards_seen() -> list[str]:
        nodes = orjson.loads(http.request("GET", f"{url}/apis/kubegpu/v1/nodes").data)["items"]
        node = next((n for n in nodes if n["name"] == "gas-node"), None)
        return [cell["id"] for cell in node["devices"][0]["cells"]] if node else []

    wait_for(lambda: cards_seen() == ["card1"], 30, "the extender's view of gas-node without card0")
    cluster.create_pod(namespace, "new", {"main": {"gpu.intel.com/i915": 1, "gpu.intel.com/memory.max": "4G"}},
                       scheduler=profile)  # fmt: skip
    try:
        placed = wait_for(lambda: (b := bound(cluster, namespace)) and "new" in b and b, 45, "the new pod bound")
    except AssertionError:
        raise AssertionError(f"{events_of(cluster, namespace, 'new')}\n{extender.output()[-3000:]}") from None
    assert placed["new"]["metadata"]["annotations"]["gas-container-cards"] == "card1"


def test_neuron_seed_pod_with_my_scheduler_gets_cores_0_to_8_and_the_decision_is_logged(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    extender, port = start_extender(
        cluster, key_file, tmp_path, "--listen", "127.0.0.1:{port}", "--insecure-no-client-auth"
    )
    processes.append(extender)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, urllib3.PoolManager())
    # The second profile exactly as the shipped overlay configures it, pointed at this extender.
    manifest = (OVERLAYS / "extender-second-profile" / "my-scheduler.yaml").read_text()
    config_map = next(d for d in yaml.safe_load_all(manifest) if d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    (entry,) = config["extenders"]
    entry.update(urlPrefix=url, enableHTTPS=False)
    entry.pop("tlsConfig")
    config.update(clientConnection={"kubeconfig": str(cluster.kubeconfig)}, leaderElection={"leaderElect": False})
    assert config["profiles"] == [{"schedulerName": "my-scheduler"}]
    cluster.create_ready_node(
        "ip-192-168-2-25.ec2.internal", labels={"node.kubernetes.io/instance-type": "inf1.6xlarge"},
        allocatable={"aws.amazon.com/neuroncore": 16, "aws.amazon.com/neurondevice": 4},
    )  # fmt: skip
    processes.append(start_kube_scheduler(cluster, tmp_path, config))
    # Seed 002's pod, as written there.
    cluster.client.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nrt-test-5038"},
         "spec": {"restartPolicy": "Never", "schedulerName": "my-scheduler", "containers": [{
             "name": "nrt-test-5038", "command": ["sleep", "1"], "image": "busybox",
             "resources": {"limits": {"cpu": "4", "memory": "4Gi", "aws.amazon.com/neuroncore": "9"},
                           "requests": {"cpu": "1", "memory": "1Gi"}}}]}},
    )  # fmt: skip
    pod = wait_bound(cluster, namespace, 1, timeout=45)["nrt-test-5038"]
    assert pod["spec"]["nodeName"] == "ip-192-168-2-25.ec2.internal"
    record = decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY])
    assert record.containers["nrt-test-5038"]["aws.amazon.com/neuroncore"] == [str(i) for i in range(9)]
    # The extension's own annotation of the cores it chose, which a stock Neuron device plugin exports at Allocate.
    assert pod["metadata"]["annotations"]["NEURON_CORES"] == "0,1,2,3,4,5,6,7,8"
    # A tenant's pod naming the seed pod's cores in that annotation itself gets it replaced by the cores it was given
    # (kubegpu wrote none for cores, so a stock device plugin exported the tenant's pick: cores held twice).
    cluster.client.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tenant", "annotations": {"NEURON_CORES": "0,1"}},
         "spec": {"schedulerName": "my-scheduler", "containers": [{
             "name": "main", "image": "busybox", "resources": {"limits": {"aws.amazon.com/neuroncore": "2"}}}]}},
    )  # fmt: skip
    tenant = wait_bound(cluster, namespace, 2, timeout=45)["tenant"]
    cores = decode_allocation(tenant["metadata"]["annotations"][ALLOCATION_KEY]).containers["main"]
    assert tenant["metadata"]["annotations"]["NEURON_CORES"] == ",".join(cores["aws.amazon.com/neuroncore"])
    assert not {"0", "1"} & set(cores["aws.amazon.com/neuroncore"])
    # The Neuron extension's verify step: `kubectl logs` of the extender shows the filter and the bind.
    log = wait_for(lambda: (text := extender.output()) and "msg=bound" in text and text, 10, "the bind log line")
    filtered = next(line for line in log.splitlines() if "msg=filter" in line and "nrt-test-5038" in line)
    assert f"pod={namespace}/nrt-test-5038" in filtered and "passed=ip-192-168-2-25.ec2.internal" in filtered
    bound_line = next(line for line in log.splitlines() if "msg=bound" in line)
    assert "node=ip-192-168-2-25.ec2.internal" in bound_line and "0" in bound_line.split("devices=", 1)[1]


def test_nvidia_gpu_scheduler_model_pod_is_watched_on_gpupods(
    cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path, processes: list[Process]
) -> None:
    certs = make_certs(tmp_path / "certs")
    extender, port = start_extender(
        cluster, key_file, tmp_path, "--listen", "127.0.0.1:{port}", "--policy", "free-model-gpus",
        "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"), "--client-ca", str(certs / "ca.crt"),
    )  # fmt: skip
    processes.append(extender)
    base = f"https://127.0.0.1:{port}"
    client = tls_client(certs, certs / "ca.crt")
    wait_ready(base, client)
    for name, product in (("v100-node", "Tesla-V100-SXM2-16GB"), ("a100-node", "NVIDIA-A100-SXM4-40GB")):
        cluster.create_ready_node(
            name, labels={"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "8"},
            allocatable={"nvidia.com/gpu": 8},
        )  # fmt: skip
    watch = client.request(
        "GET", f"{base}/apis/nvidia-gpu-scheduler/v1/gpupods?watch=true", preload_content=False, timeout=40
    )
    assert watch.status == 200
    # The guide's kube-scheduler file as written (seed 004's entry, its spellings fixed), with this cluster's
    # kubeconfig, the extender's address in its urlPrefix and make-certs.sh's files in its tlsConfig.
    config = guide_yaml(ROOT / "docs" / "migrating-from-nvidia-gpu-scheduler.md", "KubeSchedulerConfiguration")
    config["clientConnection"]["kubeconfig"] = str(cluster.kubeconfig)
    config["leaderElection"] = {"leaderElect": False}
    (entry,) = config["extenders"]
    assert entry["urlPrefix"].startswith("https://<kube-apiserver>:6443/apis/nvidia-gpu-scheduler/v1/schedule")
    entry["urlPrefix"] = entry["urlPrefix"].replace("https://<kube-apiserver>:6443", base)
    entry["tlsConfig"] = {"caFile": str(certs / "ca.crt"), "certFile": str(certs / "client.crt"),
                          "keyFile": str(certs / "client.key")}  # fmt: skip
    processes.append(start_kube_scheduler(cluster, tmp_path, config))
    cluster.create_pod(
        namespace, "cuda-job", {"main": {"nvidia.com/gpu": 2}}, scheduler="default-scheduler",
        annotations={"nvidia-gpu-scheduler/gpu.model": " nvidia-a100-sxm4-40gb "},
    )  # fmt: skip
    buffer = b""
    for chunk in watch.stream(1024):
        buffer += chunk
        if b"cuda-job" in buffer and b"\n" in buffer.split(b"cuda-job", 1)[1]:
            break
    watch.release_conn()
    event = next(json.loads(line) for line in buffer.splitlines() if b"cuda-job" in line)
    assert event["type"] == "ADDED" and event["object"]["kind"] == "GpuPod"
    assert event["object"]["node"] == "a100-node"
    assert [g["model"] for g in event["object"]["gpus"]] == ["NVIDIA-A100-SXM4-40GB"] * 2
    assert wait_bound(cluster, namespace, 1)["cuda-job"]["spec"]["nodeName"] == "a100-node"
    nodes = orjson.loads(client.request("GET", f"{base}/apis/nvidia-gpu-scheduler/v1/gpunodes").data)["items"]
    a100 = next(n for n in nodes if n["name"] == "a100-node")
    assert a100["models"] == {"NVIDIA-A100-SXM4-40GB": {"total": 8, "free": 6}}


def test_kubegpu_custom_scheduler_honours_a_minimum_gpu_memory(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    for name, memory_mib in (("small-gpus", 16160), ("large-gpus", 32510)):
        cluster.create_ready_node(
            name, labels={"nvidia.com/gpu.product": "Tesla-V100-SXM2", "nvidia.com/gpu.count": "4",
                          "nvidia.com/gpu.memory": str(memory_mib)},
            allocatable={"nvidia.com/gpu": 4},
        )  # fmt: skip
    scheduler = start_scheduler("kubegpu-scheduler", "--no-leader-elect")
    # The guide's pod as written (a V100-32GB reports 32510 MiB), created as `kubectl apply -f` creates it.
    pod = guide_yaml(ROOT / "docs" / "migrating-from-kubegpu.md", "Pod")
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    cluster.create_pod(
        namespace, "too-big", {"main": {"nvidia.com/gpu": 1}}, scheduler="kubegpu-scheduler",
        annotations={"kubegpu.io/gpu-memory": "40Gi"},
    )  # fmt: skip
    try:
        pod = wait_bound(cluster, namespace, 1, timeout=30)["big-model"]
    except AssertionError:
        raise AssertionError(scheduler.output()[-3000:]) from None
    assert pod["spec"]["nodeName"] == "large-gpus"
    record = decode_allocation(pod["metadata"]["annotations"][ALLOCATION_KEY])
    assert len(record.containers["main"]["nvidia.com/gpu"]) == 2
    message = wait_for(
        lambda: next((m for m in events_of(cluster, namespace, "too-big") if "40Gi" in m), None),
        30, "too-big's FailedScheduling event",
    )  # fmt: skip
    # The guide's wording of the refusal.
    assert message == "0/2 nodes are available: 2 node(s) have no GPU with at least 40Gi of memory.", message


def test_kubegpu_pods_running_from_before_the_switch_keep_their_gpus_and_pending_ones_are_told_what_to_write(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    # A 4-GPU node where Microsoft KubeGPU bound a job to 3 GPUs: its annotation (DLWorkspace's quoting) names them;
    # the pod lists no nvidia.com/gpu, as KubeGPU's pods did, and keeps running across the switch.
    cluster.create_ready_node(
        "kubegpu-node", labels={"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB", "nvidia.com/gpu.count": "4"},
        allocatable={"nvidia.com/gpu": 4},
    )  # fmt: skip
    given = {
        (where := f"alpha/grpresource/gpugrp1/0/gpugrp0/{i // 2}/gpu/{i}/cards"): where
        for i in range(3)
    }  # fmt: skip
    info = {"podname": "old-job", "nodename": "kubegpu-node",
            "runningcontainer": {"main": {"requests": {"alpha.gpu/numgpu": 3}, "allocatefrom": given}}}  # fmt: skip
    old = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "old-job", "annotations": {"pod.alpha/DeviceInformation": "'" + json.dumps(info) + "'"}},
        "spec": {"nodeName": "kubegpu-node", "containers": [{"name": "main", "image": "busybox"}]},
    }  # fmt: skip
    cluster.client.post(f"/api/v1/namespaces/{namespace}/pods", old)
    scheduler = start_scheduler("kubegpu-scheduler", "--no-leader-elect")
    for name in ("new-0", "new-1"):
        cluster.create_pod(namespace, name, {"main": {"nvidia.com/gpu": 1}}, scheduler="kubegpu-scheduler")
    # A job still written for KubeGPU: its GPUs asked only in the annotation.
    cluster.create_pod(
        namespace, "kubegpu-style", {"main": {}}, scheduler="kubegpu-scheduler",
        annotations={"pod.alpha/DeviceInformation": json.dumps(
            {"runningcontainer": {"main": {"requests": {"alpha.gpu/numgpu": 2}}}})},
    )  # fmt: skip
    try:
        placed = wait_bound(cluster, namespace, 2, timeout=30)
    except AssertionError:
        raise AssertionError(scheduler.output()[-3000:]) from None
    refused = wait_for(
        lambda: next((m for m in events_of(cluster, namespace, "kubegpu-style") if "KubeGPU" in m), None),
        30, "the KubeGPU-style pod's FailedScheduling event",
    )  # fmt: skip
    assert "set resources.limits nvidia.com/gpu: 2 on the container" in refused, refused
    message = wait_for(
        lambda: next(
            (m for p in ("new-0", "new-1") for m in events_of(cluster, namespace, p) if "nodes are available" in m),
            None,
        ),
        30, "the second new pod's FailedScheduling event",
    )  # fmt: skip
    # Only the one GPU KubeGPU did not give is free: one new pod gets it, the other waits.
    assert "old-job" in placed and len({"new-0", "new-1"} & set(placed)) == 1, placed
    assert len({"new-0", "new-1"} & set(bound(cluster, namespace))) == 1, message
    assert message.startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu"), message
    assert "kubegpu-style" not in bound(cluster, namespace)


def test_kubegpu_pods_of_another_scheduler_log_nothing_and_ours_annotated_while_waiting_leave_the_queue(
    cluster: Cluster, namespace: str, start_scheduler: Any
) -> None:
    # KubeGPU's own scheduler still runs beside kubegpu for the jobs written for it: each status update of such a
    # pod logged "pod ignored" at error level in kubegpu's log. And `job`, waiting for a GPU, is annotated for
    # KubeGPU (a GPU for its sidecar, which kubegpu cannot read) before one frees up: it stayed queued as it read
    # before, and was bound, with a GPU for `main` alone, once a node came.
    scheduler = start_scheduler("kubegpu-annotated", "--no-leader-elect")
    asks = json.dumps({"runningcontainer": {"side": {"requests": {"alpha.gpu/numgpu": 1}}}})
    annotation = "pod.alpha/DeviceInformation"
    legacy: dict[str, dict[str, str | int]] = {"main": {}, "side": {}}
    cluster.create_pod(namespace, "theirs", legacy, scheduler="kubegpu-legacy", annotations={annotation: asks})
    containers: dict[str, dict[str, str | int]] = {"main": {"nvidia.com/gpu": 1}, "side": {}}
    cluster.create_pod(namespace, "job", containers, scheduler="kubegpu-annotated")
    wait_for(lambda: any("nodes are available" in m for m in events_of(cluster, namespace, "job")), 30, "job waits")
    for round_ in range(3):
        patch = {"metadata": {"labels": {"round": str(round_)}}}
        cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/theirs", patch)
    cluster.client.patch(f"/api/v1/namespaces/{namespace}/pods/job", {"metadata": {"annotations": {annotation: asks}}})
    refused = wait_for(
        lambda: next((m for m in events_of(cluster, namespace, "job") if "KubeGPU" in m), None),
        30, "job told it cannot be read",
    )  # fmt: skip
    assert "asks 1 GPU(s) for container side" in refused, refused
    gpus = {"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB", "nvidia.com/gpu.count": "2"}
    cluster.create_ready_node("annotated-node", labels=gpus, allocatable={"nvidia.com/gpu": 2})
    cluster.create_pod(namespace, "after", {"main": {"nvidia.com/gpu": 1}}, scheduler="kubegpu-annotated")

    def settled() -> bool:
        """`after` bound, and nothing waits in the scheduler's queues (or `job` is bound)."""
        placed = bound(cluster, namespace)
        if "job" in placed:
            return True
        text = urllib3.request("GET", f"http://127.0.0.1:{scheduler.metrics_port}/metrics").data.decode()
        waiting = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("kubegpu_scheduler_pending_pods{") and "gated" not in line
        )
        return "after" in placed and waiting == 0

    wait_for(settled, 30, "after bound and the queues empty")
    assert set(bound(cluster, namespace)) == {"after"}, "job was placed from what it read before"
    assert "theirs" not in scheduler.output(), scheduler.output()[-3000:]
