"""A real kubelet (1.20.2, built by `scripts/k8s-binaries.sh` beside kube-apiserver) for the node-side tests.

`Kubelet` runs the binary with its own root, certificate and log directories under a temporary directory, on free
loopback ports, against the test API server (`cluster.py`) and a CRI endpoint: a test's containerd directly, or the
`kubegpu crishim` in front of it. The configuration is the one verified on this kind of machine (REFERENCE.md §2):
cgroupfs without QoS cgroups or node-allocatable enforcement, no swap check, no eviction, anonymous AlwaysAllow
authentication on loopback only, no iptables chains. `start()` waits until the Node is registered and Ready and then
removes the taints it registered with (no node controller runs here). Pods for it use the host network, skip the
service-account token and never pull (`pod()`); the image is the busybox one `containerd.py` imports.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from kubegpu.kube.client import ApiError

from .cluster import Cluster, binary_dir, free_port, wait_for
from .containerd import IMAGE

__all__ = ["POD_IMAGE", "Kubelet", "kubelet_binary", "pod", "read_output", "wait_running"]

POD_IMAGE = IMAGE.removeprefix("docker.io/")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
CHECKPOINT = "kubelet_internal_checkpoint"


def kubelet_binary() -> Path:
    path = binary_dir() / "kubelet"
    if not path.exists():
        raise AssertionError(f"{path} is missing: run scripts/k8s-binaries.sh (it builds the kubelet too)")
    return path


class Kubelet:
    """One kubelet process for node `name`, restartable on the same root directory."""

    def __init__(self, cluster: Cluster, name: str, runtime_endpoint: str) -> None:
        self.cluster = cluster
        self.name = name
        self.runtime_endpoint = runtime_endpoint
        # Short: the device plugin and pod-resources sockets live under the root directory.
        self.base = Path(tempfile.mkdtemp(prefix="kubegpu-kl-"))
        self.root = self.base / "root"
        self.port, self.healthz_port = free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def device_plugin_dir(self) -> Path:
        # Kubelet 1.20 serves its Registration socket there whatever --root-dir says: one such kubelet at a time.
        return DEVICE_PLUGIN_DIR

    @property
    def pod_resources_socket(self) -> Path:
        return self.root / "pod-resources" / "kubelet.sock"

    @property
    def log(self) -> Path:
        return self.base / f"kubelet-{self.starts}.log"

    def _write_config(self) -> Path:
        config = self.base / "config.yaml"
        config.write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n"
            "kind: KubeletConfiguration\n"
            "address: 127.0.0.1\n"
            f"port: {self.port}\n"
            "healthzBindAddress: 127.0.0.1\n"
            f"healthzPort: {self.healthz_port}\n"
            "readOnlyPort: 0\n"
            "cgroupDriver: cgroupfs\n"
            "cgroupsPerQOS: false\n"
            "enforceNodeAllocatable: []\n"
            "failSwapOn: false\n"
            "evictionHard: {}\n"
            "makeIPTablesUtilChains: false\n"
            "serializeImagePulls: false\n"
            "nodeStatusUpdateFrequency: 2s\n"
            "syncFrequency: 5s\n"
            "fileCheckFrequency: 5s\n"
            "authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n"
            "authorization:\n  mode: AlwaysAllow\n"
        )
        return config

    def start(self, timeout: float = 90.0) -> None:
        if self.process is not None and self.process.poll() is None:
            raise AssertionError("the kubelet is already running")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.starts == 0:
            # The device manager's checkpoint in the shared directory names the resources an earlier kubelet's device
            # plugins registered: a new node must not inherit them (it would count them as present, with 0 devices).
            (DEVICE_PLUGIN_DIR / CHECKPOINT).unlink(missing_ok=True)
        config = self._write_config()
        self.starts += 1
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    str(kubelet_binary()),
                    f"--config={config}",
                    "--container-runtime=remote",
                    f"--container-runtime-endpoint={self.runtime_endpoint}",
                    "--runtime-request-timeout=2m",
                    f"--root-dir={self.root}",
                    f"--cert-dir={self.base / 'pki'}",
                    f"--kubeconfig={self.cluster.kubeconfig}",
                    f"--hostname-override={self.name}",
                    "--node-ip=127.0.0.1",
                    "--v=2",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._ready, timeout, f"node {self.name} registered and Ready by its kubelet (log: {self.log})")
        with contextlib.suppress(ApiError):
            self.cluster.client.patch(f"/api/v1/nodes/{self.name}", {"spec": {"taints": None}})

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"the kubelet exited with {self.process.returncode}:\n{tail}")
        node = self.cluster.client.get(f"/api/v1/nodes/{self.name}")
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def output(self) -> str:
        return "\n".join(
            (self.base / f"kubelet-{n}.log").read_text(errors="replace") for n in range(1, self.starts + 1)
        )

    def close(self) -> None:
        """Stop the kubelet and remove its directories (the containers it ran go with the test's containerd)."""
        self.stop()
        (DEVICE_PLUGIN_DIR / CHECKPOINT).unlink(missing_ok=True)
        with contextlib.suppress(ApiError):
            self.cluster.client.delete(f"/api/v1/nodes/{self.name}")
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(f"{self.base}/"):
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(self.base, ignore_errors=True)


def pod(
    namespace: str,
    name: str,
    containers: dict[str, dict[str, str | int]],
    *,
    scheduler: str,
    out: Path,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    command: str = "{ ls /dev; ls /dev/dri 2>/dev/null; } > /out/$C.devices; env > /out/$C.env; sleep 3600",
) -> dict[str, Any]:
    """A busybox pod on the host network whose containers write their `/dev` (and `/dev/dri`) entries and env to
    `out/POD.CONTAINER.devices` and `.env`."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists"}],
        "volumes": [{"name": "out", "hostPath": {"path": str(out), "type": "Directory"}}],
        "containers": [
            {
                "name": c,
                "image": POD_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
                "env": [{"name": "C", "value": f"{name}.{c}"}],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                "resources": {"limits": {k: str(v) for k, v in limits.items()}},
            }
            for c, limits in containers.items()
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def wait_running(cluster: Cluster, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        found: dict[str, Any] = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return found if (found.get("status") or {}).get("phase") == "Running" else None

    result: dict[str, Any] = wait_for(running, timeout, f"pod {namespace}/{name} Running")
    return result


def read_output(out: Path, pod_name: str, container: str, timeout: float = 30.0) -> tuple[list[str], dict[str, str]]:
    """The `/dev` entries and the env a container of `pod()` wrote."""
    devices_file, env_file = out / f"{pod_name}.{container}.devices", out / f"{pod_name}.{container}.env"
    wait_for(lambda: env_file.exists() and env_file.stat().st_size > 0, timeout, f"{env_file} written")
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return devices_file.read_text().split(), env
