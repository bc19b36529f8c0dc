"""The kubegpu image, built from the Dockerfile without a registry, runs `kubegpu scheduler` as a pod on a real kubelet.

`scripts/image.sh` makes a Debian bookworm base with mmdebstrap, builds the top-level Dockerfile on it with buildah
and exports an OCI archive (both cached under ~/.cache/kubegpu/image; `scripts/test.sh` runs it first and passes the
archive as KUBEGPU_IMAGE_OCI, otherwise this module runs it). The archive is imported into the test's containerd with
`ctr -n k8s.io image import`, exactly as the README says, and a real kubelet 1.20.2 (tests/integration/kubelet.py)
runs the pod template of the shipped Deployment (examples/deploy/scheduler/deployment.yaml) from it: the image
`kubegpu:VERSION` resolved as containerd resolves it, the allocation key from the Secret `kubegpu-allocation-key`,
the liveness and readiness probes on the metrics port. What a cluster's controllers would add is done by hand: the pod
is put on the node directly (no Deployment controller, no default scheduler), it uses the host network and reaches the
test API server on 127.0.0.1 through a kubeconfig in a hostPath volume, with `automountServiceAccountToken: false`
(no controller-manager mints ServiceAccount tokens here).

Then a Neuron pod naming that scheduler is bound by it, and its allocation verifies with the cluster's key and is a
torus row of the node, and the kubelet runs it. Nothing skips: when mmdebstrap or buildah cannot work here, the test
fails with the script's reason.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import importlib.metadata
import json
import os
import secrets
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubegpu.core.annotations import ALLOCATION_KEY, decode_allocation, verify_allocation

from .cluster import TOKEN, ApiError, Cluster, free_port, wait_for
from .containerd import Containerd, running_containerd
from .kubelet import Kubelet, pod, wait_running

REPO = Path(__file__).resolve().parents[2]
NODE = "kubegpu-image-0"
SCHEDULER = "kubegpu-from-image"
SYSTEM = "kube-system"
POD = "kubegpu-scheduler-image"
SECRET = "kubegpu-allocation-key"
NEURON = "aws.amazon.com/neurondevice"
TRN1_ROWS = [{str(i) for i in range(start, start + 4)} for start in (0, 4, 8, 12)]


def image_archive() -> Path:
    """The OCI archive of the kubegpu image: KUBEGPU_IMAGE_OCI (scripts/test.sh), or what scripts/image.sh builds."""
    configured = os.environ.get("KUBEGPU_IMAGE_OCI")
    if configured:
        path = Path(configured)
        assert path.is_file(), f"KUBEGPU_IMAGE_OCI={configured} is not a file: run scripts/image.sh"
        return path
    try:
        result = subprocess.run(
            [str(REPO / "scripts" / "image.sh")], capture_output=True, text=True, timeout=1200, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("scripts/image.sh did not finish in 20 minutes: the image could not be built here")
    if result.returncode != 0:
        pytest.fail(
            "scripts/image.sh could not build the kubegpu image with mmdebstrap and buildah here "
            f"(exit {result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        )
    path = Path(result.stdout.strip().splitlines()[-1])
    assert path.is_file(), f"scripts/image.sh printed {path}, which is not a file:\n{result.stdout[-2000:]}"
    return path


def archive_digests(archive: Path) -> tuple[str, str, str]:
    """(image name, manifest digest, config digest) of the one image in an OCI archive."""
    with tarfile.open(archive) as tar:

        def read(name: str) -> Any:
            member = tar.extractfile(name)
            assert member is not None, f"{name} missing from {archive}"
            return json.loads(member.read())

        index = read("index.json")
        (entry,) = index["manifests"]
        manifest = read("blobs/sha256/" + entry["digest"].split(":", 1)[1])
    name = entry.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
    return name, entry["digest"], manifest["config"]["digest"]


@pytest.fixture(scope="module")
def archive() -> Path:
    return image_archive()


@pytest.fixture(scope="module")
def node_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="kubegpu-img-"))
    # What the pod's non-root user (the image's 65532) reads through a hostPath: the kubeconfig, nothing secret else.
    (directory / "kubeconfig").mkdir()
    (directory / "kubeconfig").chmod(0o755)
    (directory / "out").mkdir()
    (directory / "out").chmod(0o777)
    (directory / "allocation.key").write_text(secrets.token_hex(32) + "\n")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd(archive: Path) -> Iterator[Containerd]:
    with running_containerd(cni_subnet="10.88.213.0/24") as runtime:
        # As the README says: `ctr -n k8s.io image import kubegpu-oci.tar` (the harness runs exactly that).
        runtime.import_image(archive)
        yield runtime


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster, containerd: Containerd) -> Iterator[Kubelet]:
    node = Kubelet(cluster, NODE, containerd.endpoint)
    try:
        node.start()
        cluster.client.patch(
            f"/api/v1/nodes/{NODE}", {"metadata": {"labels": {"node.kubernetes.io/instance-type": "trn1.32xlarge"}}}
        )
        cluster.client.patch(
            f"/api/v1/nodes/{NODE}/status",
            {"status": {"capacity": {NEURON: "16", "aws.amazon.com/neuron": "16"}}},
        )
        wait_for(
            lambda: cluster.client.get(f"/api/v1/nodes/{NODE}")["status"]["allocatable"].get(NEURON) == "16",
            30,
            "the node's Neuron devices allocatable",
        )
        yield node
    finally:
        node.close()


def scheduler_pod(kubeconfig_dir: Path, metrics_port: int) -> dict[str, Any]:
    """The shipped Deployment's pod template, as a Pod the test's kubelet runs (see the module docstring)."""
    deployment = yaml.safe_load((REPO / "examples" / "deploy" / "scheduler" / "deployment.yaml").read_text())
    template = copy.deepcopy(deployment["spec"]["template"])
    spec = template["spec"]
    (container,) = spec["containers"]
    version = importlib.metadata.version("kubegpu")
    assert container["image"] == f"kubegpu:{version}", "the manifests name the image scripts/image.sh builds"
    container["imagePullPolicy"] = "Never"
    args = [a for a in container["args"] if not a.startswith(("--scheduler-name=", "--metrics-address="))]
    container["args"] = [
        *args,
        f"--scheduler-name={SCHEDULER}",
        f"--lease-name={SCHEDULER}",
        f"--metrics-address=127.0.0.1:{metrics_port}",
        "--kubeconfig=/etc/kubegpu-kubeconfig/kubeconfig",
    ]
    # The probes name the port `metrics`; on the host network it is the host's port, so a free one.
    for port in container["ports"]:
        if port["name"] == "metrics":
            port["containerPort"] = metrics_port
    container["volumeMounts"].append({"name": "kubeconfig", "mountPath": "/etc/kubegpu-kubeconfig", "readOnly": True})
    spec["volumes"].append({"name": "kubeconfig", "hostPath": {"path": str(kubeconfig_dir), "type": "Directory"}})
    # The image's user (65532) reads the key Secret only through the pod's fsGroup: the shipped template must say so.
    assert spec.get("securityContext", {}).get("fsGroup") == 65532, spec.get("securityContext")
    spec.update(
        nodeName=NODE,
        hostNetwork=True,
        automountServiceAccountToken=False,
        terminationGracePeriodSeconds=0,
        tolerations=[{"operator": "Exists"}],
    )
    metadata = {"name": POD, "namespace": SYSTEM, **template["metadata"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


POD_LOGS = Path("/var/log/pods")


def container_log(found: dict[str, Any]) -> str:
    """What the kubelet recorded of a pod's containers (/var/log/pods: the API server cannot reach this kubelet)."""
    meta = found["metadata"]
    directory = POD_LOGS / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
    return "\n".join(path.read_text(errors="replace") for path in sorted(directory.glob("*/*.log")))


def remove_logs(found: dict[str, Any]) -> None:
    """The kubelet stops before it would clean up the logs of deleted pods: remove this pod's."""
    meta = found["metadata"]
    shutil.rmtree(POD_LOGS / f"{meta['namespace']}_{meta['name']}_{meta['uid']}", ignore_errors=True)


@pytest.fixture(scope="module")
def scheduler(cluster: Cluster, kubelet: Kubelet, node_dir: Path) -> Iterator[dict[str, Any]]:
    key = (node_dir / "allocation.key").read_bytes()
    cluster.write_kubeconfig(node_dir / "kubeconfig" / "kubeconfig", TOKEN).chmod(0o644)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": SYSTEM},
        "type": "Opaque",
        "data": {"key": base64.b64encode(key).decode()},
    }
    client = cluster.client
    with contextlib.suppress(ApiError):
        client.delete(f"/api/v1/namespaces/{SYSTEM}/secrets/{SECRET}")
    client.post(f"/api/v1/namespaces/{SYSTEM}/secrets", secret)
    manifest = scheduler_pod(node_dir / "kubeconfig", free_port())
    created: dict[str, Any] = client.post(f"/api/v1/namespaces/{SYSTEM}/pods", manifest)
    try:

        def ready() -> dict[str, Any] | None:
            found: dict[str, Any] = client.get(f"/api/v1/namespaces/{SYSTEM}/pods/{POD}")
            statuses = found["status"].get("containerStatuses") or []
            if any((s.get("state") or {}).get("terminated") or s.get("restartCount", 0) for s in statuses):
                raise AssertionError(f"the scheduler container exited:\n{container_log(found)[-3000:]}\n{statuses}")
            return found if statuses and all(s.get("ready") for s in statuses) else None

        try:
            found = wait_for(ready, 120, f"the scheduler pod {SYSTEM}/{POD} Ready (its readiness probe on /readyz)")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\ncontainer log:\n{container_log(created)[-3000:]}") from None
        yield found
    finally:
        for path in (f"pods/{POD}", f"secrets/{SECRET}"):
            with contextlib.suppress(ApiError):
                client.request("DELETE", f"/api/v1/namespaces/{SYSTEM}/{path}", params={"gracePeriodSeconds": 0})
        remove_logs(created)


def test_the_image_runs_kubegpu_scheduler_on_a_real_kubelet_and_it_binds_a_device_pod(
    cluster: Cluster, archive: Path, kubelet: Kubelet, scheduler: dict[str, Any], node_dir: Path
) -> None:
    name, manifest_digest, config_digest = archive_digests(archive)
    assert name == f"docker.io/library/kubegpu:{importlib.metadata.version('kubegpu')}"
    # The container runs the imported image, as the image's own user.
    (status,) = scheduler["status"]["containerStatuses"]
    assert status["image"] == name
    assert status["imageID"].endswith((config_digest.split(":")[1], manifest_digest.split(":")[1])), status

    space = cluster.create_namespace(f"image-{secrets.token_hex(3)}")
    try:
        manifest = pod(space, "trainer", {"main": {NEURON: 4}}, scheduler=SCHEDULER, out=node_dir / "out")
        cluster.client.post(f"/api/v1/namespaces/{space}/pods", manifest)

        def bound() -> dict[str, Any] | None:
            found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{space}/pods/trainer")
            return found if found["spec"].get("nodeName") else None

        try:
            found = wait_for(bound, 60, "the Neuron pod bound by the scheduler running from the image")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nscheduler log:\n{container_log(scheduler)[-3000:]}") from None
        assert found["spec"]["nodeName"] == NODE
        record = decode_allocation(found["metadata"]["annotations"][ALLOCATION_KEY])
        key = (node_dir / "allocation.key").read_bytes().rstrip(b"\r\n")
        assert verify_allocation(record, key), "the allocation is signed with the key from the Secret"
        assert record.node == NODE
        assert record.podUID == found["metadata"]["uid"]
        devices = set(record.containers["main"][NEURON])
        assert devices in TRN1_ROWS, f"{sorted(devices)} is not a row of the trn1.32xlarge torus"
        # The kubelet admits and runs the bound pod.
        wait_running(cluster, space, "trainer", timeout=60)
        log = container_log(scheduler)
        assert f"msg=bound pod={space}/trainer node={NODE}" in log, f"no bind in the scheduler's log:\n{log[-3000:]}"
    finally:
        for item in cluster.pods(space):
            cluster.delete_pod(space, item["metadata"]["name"])
            remove_logs(item)


def test_the_archive_holds_the_dockerfiles_final_stage_on_the_mmdebstrap_base(archive: Path) -> None:
    """Two layers (the base, the venv copied from the build stage), every blob present with its digest, the
    Dockerfile's user, PATH and command."""
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
            assert member is not None, f"{digest} missing from {archive}"
            data = member.read()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
            return data

        (entry,) = json.loads(tar.extractfile("index.json").read())["manifests"]  # type: ignore[union-attr]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            assert tar.getmember("blobs/sha256/" + layer["digest"].split(":", 1)[1]).size == layer["size"]
    assert len(manifest["layers"]) == 2, [h.get("created_by") for h in config.get("history", [])]
    assert config["config"]["User"] == "65532:65532"
    assert any(e.startswith("PATH=/opt/kubegpu/bin:") for e in config["config"]["Env"]), config["config"]["Env"]
    assert config["config"]["Cmd"] == ["kubegpu", "--help"]
