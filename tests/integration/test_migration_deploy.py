"""The deploy files as a user applies them: every overlay of `examples/deploy/kustomize` rendered by kubectl 1.20's
kustomize (Debian's kubernetes-client, the version of the API server here) after the documented secret steps, and
accepted by the real API server in a server-side dry run; the patched static kube-scheduler pod too."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3
import yaml

from kubegpu.kube.client import ApiError

from .cluster import Cluster, free_port, wait_for
from .test_scheduler import ROOT, bound

DEPLOY = ROOT / "examples" / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "kustomize" / "overlays").iterdir() if p.is_dir())
KUBECTL_CACHE = Path(os.environ.get("KUBEGPU_K8S_CACHE", Path.home() / ".cache" / "kubegpu")) / "kubectl-1.20.2"


def kubectl() -> str:
    """kubectl 1.20 (scripts/test.sh extracts Debian's kubernetes-client into the cache); KUBEGPU_KUBECTL overrides."""
    path = os.environ.get("KUBEGPU_KUBECTL") or str(KUBECTL_CACHE / "kubectl")
    if not Path(path).is_file():
        pytest.fail(f"kubectl 1.20 is missing at {path}: ./scripts/test.sh extracts it (Debian's kubernetes-client)")
    return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/deploy after the steps the guides give: the allocation key, make-certs.sh's certificates,
    and the client-CA bundle of the aggregated route (here the extender's CA alone)."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, root)
    (root / "kustomize" / "base" / "allocation.key").write_text(os.urandom(32).hex() + "\n")
    certs = root / "extender" / "certs"
    subprocess.run(["sh", str(root / "extender" / "make-certs.sh"), str(certs)], check=True, capture_output=True)
    shutil.copy(certs / "ca.crt", root / "kustomize" / "overlays" / "nvidia-gpu-scheduler" / "client-ca.crt")
    return root


def render(tree: Path, overlay: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(tree / "kustomize" / "overlays" / overlay)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def dry_run(cluster: Cluster, manifest: str, *, server_side: bool = True) -> str:
    apply = ["apply", "--server-side", "--dry-run=server"] if server_side else ["apply", "--dry-run=server"]
    done = subprocess.run(
        [kubectl(), f"--kubeconfig={cluster.kubeconfig}", *apply, "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def apply(cluster: Cluster, manifest: str) -> None:
    done = subprocess.run(
        [kubectl(), f"--kubeconfig={cluster.kubeconfig}", "apply", "--server-side", "-f", "-"],
        input=manifest,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def workloads(documents: list[dict[str, object]]) -> list[dict]:  # type: ignore[type-arg]
    return [d for d in documents if d["kind"] in ("Deployment", "DaemonSet")]  # type: ignore[misc]


EXPECTED = {
    "custom-scheduler": {"Deployment/kubegpu-scheduler", "ServiceAccount/kubegpu-scheduler"},
    "extender-second-profile": {"Deployment/kubegpu-extender", "Deployment/my-scheduler", "ServiceAccount/my-scheduler",
                                "Role/my-scheduler-leader-election", "Secret/kubegpu-extender-client"},
    "extender-patched-default": {"Deployment/kubegpu-extender", "Secret/kubegpu-extender-tls"},
    "extender-ha": {"Deployment/my-scheduler", "ClusterRoleBinding/my-scheduler-as-kubegpu-extender",
                    "Role/my-scheduler-leader-election", "Secret/kubegpu-extender-tls",
                    "Secret/kubegpu-extender-client"},
    "nvidia-gpu-scheduler": {"Deployment/kubegpu-extender", "APIService/v1.nvidia-gpu-scheduler"},
    "node-shim": {"DaemonSet/kubegpu-advertiser"},
    "node-device-plugin": {"DaemonSet/kubegpu-device-plugin", "DaemonSet/kubegpu-advertiser"},
    "advertiser": {"DaemonSet/kubegpu-advertiser", "ClusterRole/kubegpu-advertiser", "Namespace/kubegpu-node-lease",
                   "Role/kubegpu-advertiser-lease", "ResourceQuota/kubegpu-node-leases"},
}  # fmt: skip


def test_every_mode_has_an_overlay() -> None:
    assert set(OVERLAYS) == set(EXPECTED)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_with_kubectl_1_20_and_the_api_server_accepts_it(
    overlay: str, tree: Path, cluster: Cluster
) -> None:
    documents = render(tree, overlay)
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in documents}  # type: ignore[index]
    assert EXPECTED[overlay] <= names, names
    assert "Secret/kubegpu-allocation-key" in names  # the base's key, from the file the guide has you create
    assert "CustomResourceDefinition/podgroups.scheduling.x-k8s.io" in names  # gangs, in either scheduler mode
    for workload in workloads(documents):
        spec = workload["spec"]["template"]["spec"]
        for container in spec["containers"]:
            assert container.get("resources", {}).get("requests"), (overlay, workload["metadata"]["name"])
            if container["image"].startswith("kubegpu:"):
                assert container["image"] == "kubegpu:0.1.0"
        if workload["kind"] == "Deployment":  # DaemonSets serve no HTTP to probe
            assert all("livenessProbe" in c and "readinessProbe" in c for c in spec["containers"]), workload
        if spec.get("hostNetwork"):
            assert spec.get("dnsPolicy") == "ClusterFirstWithHostNet"
    assert "REPLACE-WITH-RANDOM-BYTES" not in yaml.safe_dump_all(documents)
    # kube-apiserver 1.20 cannot server-side apply an APIService (its aggregator has no field manager: the request
    # panics), so that one object is applied the client-side way, still validated by the server in a dry run.
    aggregated = [d for d in documents if d["kind"] == "APIService"]
    rest = [d for d in documents if d["kind"] != "APIService"]
    # A dry run creates no Namespace, so the objects to go in one the overlay ships would be refused: apply those first.
    namespaces = [d for d in rest if d["kind"] == "Namespace"]
    if namespaces:
        apply(cluster, yaml.safe_dump_all(namespaces))
    output = dry_run(cluster, yaml.safe_dump_all(rest))
    assert "(server dry run)" in output and output.count("serverside-applied") == len(rest), output
    if aggregated:
        output = dry_run(cluster, yaml.safe_dump_all(aggregated), server_side=False)
        assert "apiservice.apiregistration.k8s.io/v1.nvidia-gpu-scheduler created (server dry run)" in output


def test_a_rollout_of_the_extender_never_runs_two_at_once(tree: Path) -> None:
    """Each extender keeps its own device ledger, so two at once behind the Service give the same devices twice:
    two extenders on the real API server, each asked to bind an 8-GPU pod to the same 8-GPU node at the same
    moment, both bound, every GPU held by both pods. The default RollingUpdate starts the new pod before stopping the
    old one at every rollout (a changed flag, a new image, `kubectl rollout restart`); every overlay's extender must
    be replaced, never doubled."""
    for overlay in OVERLAYS:
        for document in render(tree, overlay):
            if document["kind"] == "Deployment" and document["metadata"]["name"] == "kubegpu-extender":  # type: ignore[index]
                spec = document["spec"]
                assert spec["replicas"] == 1, overlay  # type: ignore[index]
                assert (spec.get("strategy") or {}).get("type") == "Recreate", (overlay, spec.get("strategy"))  # type: ignore[union-attr]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_and_config_map_a_pod_mounts_is_rendered_in_its_namespace(overlay: str, tree: Path) -> None:
    """A pod mounts Secrets and ConfigMaps of its own namespace; one rendered without a namespace lands wherever the
    user's kubectl context points (`default`), and the pod waits in ContainerCreating for a volume it never gets.
    The extender's TLS and client-CA Secrets came out so in every extender overlay (the server-side dry run above
    takes them into `default` without a word)."""
    documents = render(tree, overlay)
    present = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in documents}  # type: ignore[index,union-attr]
    for workload in workloads(documents):
        namespace = workload["metadata"]["namespace"]
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            for kind, field, name_key in (("Secret", "secret", "secretName"), ("ConfigMap", "configMap", "name")):
                if field in volume:
                    wanted = (kind, namespace, volume[field][name_key])
                    assert wanted in present, (overlay, workload["metadata"]["name"], wanted)


def test_the_second_profile_manages_every_kubegpu_resource(tree: Path) -> None:
    documents = render(tree, "extender-second-profile")
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["config.yaml"])  # type: ignore[index]
    (extender,) = config["extenders"]
    managed = {r["name"] for r in extender["managedResources"]}
    assert {
        "gpu.intel.com/xe",
        "gpu.intel.com/millicores",
        "gpu.intel.com/tiles",
        "gpu.intel.com/i915",
        "aws.amazon.com/neuroncore",
    } <= managed
    # as the default kube-scheduler's configuration manages them (it lacked the GPU share resources, so HAMi's share
    # pods were refused by kube-scheduler's own NodeResourcesFit on every HAMi node)
    patched = yaml.safe_load((tree / "extender" / "scheduler-config.yaml").read_text())["extenders"][0]
    assert extender["managedResources"] == patched["managedResources"]
    assert config["profiles"] == [{"schedulerName": "my-scheduler"}]
    assert extender["tlsConfig"]["certFile"] == "/etc/kubegpu/extender/tls.crt"


def test_the_apiservice_trusts_the_extenders_ca(tree: Path) -> None:
    documents = render(tree, "nvidia-gpu-scheduler")
    service = next(d for d in documents if d["kind"] == "APIService")
    import base64

    ca = base64.b64decode(service["spec"]["caBundle"])  # type: ignore[index]
    assert ca == (tree / "extender" / "certs" / "ca.crt").read_bytes()
    assert service["spec"]["service"] == {"name": "kubegpu-extender", "namespace": "kube-system", "port": 8888}  # type: ignore[index]


KUBEADM_SCHEDULER = """
apiVersion: v1
kind: Pod
metadata: {name: kube-scheduler, namespace: kube-system, labels: {component: kube-scheduler, tier: control-plane}}
spec:
  hostNetwork: true
  priorityClassName: system-node-critical
  containers:
  - name: kube-scheduler
    image: registry.k8s.io/kube-scheduler:v1.20.2
    command: [kube-scheduler, --kubeconfig=/etc/kubernetes/scheduler.conf, --leader-elect=true]
    volumeMounts:
    - {name: kubeconfig, mountPath: /etc/kubernetes/scheduler.conf, readOnly: true}
  volumes:
  - name: kubeconfig
    hostPath: {path: /etc/kubernetes/scheduler.conf, type: FileOrCreate}
"""


def test_the_patched_static_kube_scheduler_resolves_the_extender_and_is_valid(tree: Path, cluster: Cluster) -> None:
    static = tree / "kube-scheduler.yaml"
    static.write_text(KUBEADM_SCHEDULER)
    patch = (tree / "kustomize" / "overlays" / "extender-patched-default" / "kube-scheduler.patch.yaml").read_text()
    done = subprocess.run(
        [kubectl(), "patch", "--local", "-o", "yaml", "-f", str(static), "--type", "strategic", "-p", patch],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    pod = yaml.safe_load(done.stdout)
    spec = pod["spec"]
    assert spec["hostNetwork"] and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    (container,) = spec["containers"]
    assert "--config=/etc/kubernetes/kubegpu-scheduler.yaml" in container["command"]
    assert {v["name"] for v in spec["volumes"]} == {"kubeconfig", "kubegpu-config", "kubegpu-extender-client"}
    assert "(server dry run)" in dry_run(cluster, yaml.safe_dump(pod))


def test_the_advertisers_and_the_schedulers_name_the_same_lease_namespace(tree: Path) -> None:
    """The advertiser writes Leases only where its Role lets it, and the scheduler side watches that namespace."""
    advertiser = next(d for d in render(tree, "advertiser") if d["kind"] == "DaemonSet")
    role = next(d for d in render(tree, "advertiser") if d["kind"] == "Role")
    (written,) = [a.split("=", 1)[1] for a in advertiser["spec"]["template"]["spec"]["containers"][0]["args"]
                  if a.startswith("--lease-namespace=")]  # type: ignore[index]  # fmt: skip
    assert role["metadata"]["namespace"] == written != "kube-node-lease"  # type: ignore[index]
    for overlay, name in (("custom-scheduler", "kubegpu-scheduler"), ("extender-second-profile", "kubegpu-extender")):
        deployment = next(
            d for d in render(tree, overlay) if d["kind"] == "Deployment" and d["metadata"]["name"] == name
        )  # type: ignore[index]
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
        assert f"--node-lease-namespace={written}" in args, (overlay, args)


def test_the_admission_policies_render_with_kubectl_1_20(tree: Path) -> None:
    """Rendered like the overlays (1.20 cannot serve the kinds: tests/crishim/test_admission_policy.py checks them)."""
    done = subprocess.run([kubectl(), "kustomize", str(tree / "admission")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout) if d]
    assert kinds.count("ValidatingAdmissionPolicy") == 3 and kinds.count("ValidatingAdmissionPolicyBinding") == 3


def test_the_ha_overlay_runs_an_extender_beside_each_kube_scheduler(tree: Path) -> None:
    """extender-ha: two my-scheduler pods, each a kube-scheduler calling the extender in its own pod; no standalone
    extender for both to reach; the configuration of extender-second-profile but for the extender's address."""
    documents = render(tree, "extender-ha")
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in documents}  # type: ignore[index]
    assert not names & {"Deployment/kubegpu-extender", "Service/kubegpu-extender"}, names
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}  # type: ignore[index]
    containers = {c["name"]: c for c in spec["template"]["spec"]["containers"]}  # type: ignore[index]
    assert set(containers) == {"kube-scheduler", "extender"}
    assert "--client-ca=/etc/kubegpu/client-ca/ca.crt" in containers["extender"]["args"]
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    (extender,) = yaml.safe_load(config_map["data"]["config.yaml"])["extenders"]  # type: ignore[index]
    assert extender["urlPrefix"] == "https://127.0.0.1:8888"
    assert extender["tlsConfig"]["serverName"] == "kubegpu-extender.kube-system.svc"  # make-certs.sh's default name
    second = next(d for d in render(tree, "extender-second-profile") if d["kind"] == "ConfigMap")
    (theirs,) = yaml.safe_load(second["data"]["config.yaml"])["extenders"]  # type: ignore[index]
    assert extender["managedResources"] == theirs["managedResources"]


def test_two_my_scheduler_pods_of_the_ha_overlay_fail_over_without_giving_a_device_twice(
    tree: Path, cluster: Cluster, namespace: str, key_file: Path, tmp_path: Path
) -> None:
    """The pods of extender-ha as processes: each a kube-scheduler 1.20.2 with the overlay's configuration, under
    my-scheduler's ServiceAccount and the overlay's RBAC (its Lease included), calling over TLS with client
    certificates the extender beside it, which runs under that ServiceAccount too. The first pair leads and binds;
    it is killed (its node lost); the other kube-scheduler takes the Lease and binds through its own extender,
    whose warm ledger already holds the first pair's devices: no GPU given twice."""
    from .test_extender import Process
    from .test_scheduler import P3, devices_by_node

    documents = render(tree, "extender-ha")
    rbac = [d for d in documents if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                                   "RoleBinding")]  # fmt: skip
    apply(cluster, yaml.safe_dump_all(rbac))
    token = cluster.client.post(
        "/api/v1/namespaces/kube-system/serviceaccounts/my-scheduler/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]
    kubeconfig = cluster.write_kubeconfig(tmp_path / "my-scheduler.kubeconfig", token)
    certs = tree / "extender" / "certs"
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (sidecar,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"]  # type: ignore[index]
    files = {"--allocation-key-file": key_file, "--tls-cert": certs / "tls.crt", "--tls-key": certs / "tls.key",
             "--client-ca": certs / "ca.crt"}  # fmt: skip
    config_map = next(d for d in documents if d["kind"] == "ConfigMap")
    shipped = yaml.safe_load(config_map["data"]["config.yaml"])  # type: ignore[index]

    probes: list[str] = []

    def start_pair(name: str) -> tuple[Process, Process]:
        port = free_port()
        probes.append(f"https://127.0.0.1:{port}/readyz")  # the overlay's readinessProbe: HTTPS, no certificate
        args = []
        for arg in sidecar["args"]:
            flag = arg.split("=", 1)[0]
            if flag == "--listen":
                arg = f"--listen=127.0.0.1:{port}"
            elif flag in files:
                arg = f"{flag}={files[flag]}"
            elif flag == "--node-lease-namespace":
                continue  # no advertiser renews node Leases here
            args.append(arg)
        extender = Process([sys.executable, "-m", "kubegpu", "extender", f"--kubeconfig={kubeconfig}", *args],
                           tmp_path / f"extender-{name}.log")  # fmt: skip
        config = copy.deepcopy(shipped)
        config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
        config["leaderElection"].update(leaseDuration="4s", renewDeadline="3s", retryPeriod="1s")
        config["healthzBindAddress"] = f"127.0.0.1:{free_port()}"
        config["metricsBindAddress"] = f"127.0.0.1:{free_port()}"
        (entry,) = config["extenders"]
        entry["urlPrefix"] = f"https://127.0.0.1:{port}"
        entry["tlsConfig"].update(caFile=str(certs / "ca.crt"), certFile=str(certs / "client.crt"),
                                  keyFile=str(certs / "client.key"))  # fmt: skip
        path = tmp_path / f"kube-scheduler-{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        scheduler = Process(
            [str(cluster.bin / "kube-scheduler"), f"--config={path}", "--port=0", f"--secure-port={free_port()}",
             "--bind-address=127.0.0.1", f"--cert-dir={tmp_path / f'certs-{name}'}",
             "--authentication-tolerate-lookup-failure", "-v=2"],
            tmp_path / f"kube-scheduler-{name}.log",
        )  # fmt: skip
        return scheduler, extender

    http = urllib3.PoolManager(cert_reqs="CERT_NONE")

    def ready() -> bool:
        return all(http.request("GET", url, timeout=1.0, retries=False).status == 200 for url in probes)

    def lease_holder() -> str | None:
        try:
            lease = cluster.client.get("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/my-scheduler")
        except ApiError:
            return None
        return lease["spec"].get("holderIdentity") or None

    cluster.create_ready_node("p3-ha", labels=P3, allocatable={"nvidia.com/gpu": 8})
    gpus = {"main": {"nvidia.com/gpu": 2}}
    started: list[Process] = []
    try:
        first = start_pair("a")
        started += first
        wait_for(lease_holder, 60, "the first kube-scheduler to take the Lease my-scheduler")
        second = start_pair("b")
        started += second
        wait_for(ready, 60, "both pods ready, as a rollout waits for them")  # a starting extender: test_extender_http
        for name in ("gpu-0", "gpu-1"):
            cluster.create_pod(namespace, name, gpus, scheduler="my-scheduler")
        wait_for(lambda: {"gpu-0", "gpu-1"} <= set(bound(cluster, namespace)), 60, "the first pods bound")
        assert f"{namespace}/gpu-0" in first[1].output() and f"{namespace}/gpu-0" not in second[1].output()
        for process in first:  # the leader's node is lost
            process.process.kill()
            process.process.wait(10)
        for name in ("gpu-2", "gpu-3"):
            cluster.create_pod(namespace, name, gpus, scheduler="my-scheduler")
        placed = wait_for(
            lambda: (b := bound(cluster, namespace)) and len(b) == 4 and b, 90, "the pods bound after the failover"
        )
        assert f"{namespace}/gpu-2" in second[1].output(), "bound through the standing-by extender"
    except AssertionError as exc:
        logs = "\n---\n".join(p.output()[-2000:] for p in started)
        raise AssertionError(f"{exc}\n{logs}") from None
    finally:
        for process in started:
            process.stop()
    held = devices_by_node(placed)["p3-ha"]
    assert sorted(held) == [f"nvidia.com:{i}" for i in range(8)] and set(held.values()) == {1}, held


def test_the_nvidia_overlay_applies_client_side_whole_as_the_guide_says_for_1_20(tree: Path, cluster: Cluster) -> None:
    # docs/migrating-from-nvidia-gpu-scheduler.md: on 1.20 `kubectl apply -f nvidia.yaml`, every object client-side
    # (a server-side apply of its APIService fails there).
    documents = render(tree, "nvidia-gpu-scheduler")
    output = dry_run(cluster, yaml.safe_dump_all(documents), server_side=False)
    assert output.count("(server dry run)") == len(documents), output
