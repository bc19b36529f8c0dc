"""A real containerd for the CRI shim's tests and benchmark, and helpers to play the kubelet against it.

`running_containerd()` starts Debian's containerd (1.6) with its own config, root, state and socket under a fresh
temporary directory, so it never meets a system containerd, and imports the busybox image that
`scripts/containerd-env.sh` builds (no image can be pulled here) into the CRI namespace `k8s.io`. The CRI plugin is
set up as this kind of VM needs it: `restrict_oom_score_adj = true` (RunPodSandbox fails without it), the busybox
image as the sandbox ("pause") image, and no CNI: pods use the host network (`host_network_sandbox`). Teardown stops
and removes every pod sandbox, stops containerd, and ends the runc shims it left, by process id.

Anything missing (binaries, root, the image tar) fails with a message that says what to run; nothing is skipped.

`start_shim_process()` runs the real `kubegpu crishim` command, `fpga_plugin_path()` makes the example FPGA plugin
visible to such a process through its entry points without installing anything, and `Cri` is the CRI client that
plays the kubelet. The end-to-end test with the real scheduler combines them: start the API server (`cluster.py`),
`kubegpu scheduler` with the same key file, this containerd, and `start_shim_process(..., kubeconfig=...)`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from cri_api.v1 import api_pb2, api_pb2_grpc

__all__ = [
    "IMAGE",
    "Containerd",
    "Cri",
    "HarnessError",
    "ShimProcess",
    "container_config",
    "derived_image",
    "fpga_plugin_path",
    "host_network_sandbox",
    "image_tar",
    "make_char_devices",
    "running_containerd",
    "start_shim_process",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("KUBEGPU_BUSYBOX_IMAGE_NAME", "docker.io/kubegpu/busybox:1")
BINARIES = ("containerd", "ctr", "runc")
SETUP_HINT = (
    "run ./scripts/containerd-env.sh (as root: it installs containerd, runc, busybox-static and builds the image)"
)

T = TypeVar("T")


class HarnessError(RuntimeError):
    """The test environment could not be started; the message says what is missing and how to get it."""


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def image_tar() -> Path:
    """The OCI image layout tar built by scripts/containerd-env.sh."""
    override = os.environ.get("KUBEGPU_BUSYBOX_OCI")
    if override:
        path = Path(override)
    else:
        cache = Path(os.environ.get("KUBEGPU_CONTAINERD_CACHE", Path.home() / ".cache" / "kubegpu" / "containerd"))
        path = cache / "busybox-oci.tar"
    if not path.is_file():
        raise HarnessError(f"the busybox image tar {path} does not exist: {SETUP_HINT}")
    return path


def _require_environment() -> dict[str, str]:
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        raise HarnessError(f"{', '.join(missing)} not found on PATH: {SETUP_HINT}")
    if os.geteuid() != 0:
        raise HarnessError("containerd and runc need root to create containers; run the integration tests as root")
    return {b: str(shutil.which(b)) for b in BINARIES}


def _config(base: Path, runc: str, cni_bin: str | None = None) -> str:
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""\
version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{base}/containerd.sock"

[ttrpc]
  address = "{base}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"

{cri}
  sandbox_image = "{IMAGE}"
  # RunPodSandbox fails in this kind of VM without it.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin or f"{base}/cni/bin"}"
    conf_dir = "{base}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{base}/runc"
"""


class Cri:
    """A CRI v1 client on one endpoint: the kubelet's side of the conversation."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.channel = grpc.insecure_channel(
            endpoint,
            options=[
                ("grpc.max_receive_message_length", 16 * 1024 * 1024),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 500),
            ],
        )
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        self.images = api_pb2_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def version(self, timeout: float = 5.0) -> api_pb2.VersionResponse:
        return self.runtime.Version(api_pb2.VersionRequest(), timeout=timeout)

    def run_pod(self, config: api_pb2.PodSandboxConfig, timeout: float = 30.0) -> str:
        response = self.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=timeout)
        sandbox_id: str = response.pod_sandbox_id
        return sandbox_id

    def create(
        self, sandbox_id: str, config: api_pb2.ContainerConfig, sandbox: api_pb2.PodSandboxConfig, timeout: float = 30.0
    ) -> str:
        request = api_pb2.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox)
        container_id: str = self.runtime.CreateContainer(request, timeout=timeout).container_id
        return container_id

    def start(self, container_id: str, timeout: float = 30.0) -> None:
        self.runtime.StartContainer(api_pb2.StartContainerRequest(container_id=container_id), timeout=timeout)

    def exec(self, container_id: str, *cmd: str, timeout: float = 10.0) -> str:
        request = api_pb2.ExecSyncRequest(container_id=container_id, cmd=list(cmd), timeout=int(timeout))
        response = self.runtime.ExecSync(request, timeout=timeout + 5)
        if response.exit_code != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {response.exit_code}: {response.stderr.decode()}")
        output: str = response.stdout.decode()
        return output

    def containers(self, sandbox_id: str | None = None) -> list[api_pb2.Container]:
        selector = api_pb2.ContainerFilter(pod_sandbox_id=sandbox_id) if sandbox_id else None
        return list(self.runtime.ListContainers(api_pb2.ListContainersRequest(filter=selector), timeout=10).containers)

    def remove_pod(self, sandbox_id: str) -> None:
        self.runtime.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=30)
        self.runtime.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=30)


def host_network_sandbox(
    name: str,
    uid: str,
    *,
    log_directory: Path,
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
) -> api_pb2.PodSandboxConfig:
    """A pod sandbox on the host network (no CNI needed), as the kubelet builds it from a pod."""
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
        log_directory=str(log_directory),
        annotations=dict(annotations or {}),
        labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.uid": uid},
        linux=api_pb2.LinuxPodSandboxConfig(
            security_context=api_pb2.LinuxSandboxSecurityContext(
                namespace_options=api_pb2.NamespaceOption(network=api_pb2.NamespaceMode.NODE)
            )
        ),
    )


def container_config(
    name: str,
    command: Sequence[str] = ("sleep", "3600"),
    *,
    attempt: int = 0,
    envs: Mapping[str, str] | None = None,
    devices: Sequence[tuple[str, str]] = (),
    annotations: Mapping[str, str] | None = None,
) -> api_pb2.ContainerConfig:
    """A busybox container config; `devices` are (host path, container path) entries a device plugin would add."""
    return api_pb2.ContainerConfig(
        metadata=api_pb2.ContainerMetadata(name=name, attempt=attempt),
        image=api_pb2.ImageSpec(image=IMAGE),
        command=list(command),
        envs=[api_pb2.KeyValue(key=k, value=v) for k, v in (envs or {}).items()],
        devices=[api_pb2.Device(host_path=h, container_path=c, permissions="rw") for h, c in devices],
        annotations=dict(annotations or {}),
        labels={"io.kubernetes.container.name": name},
        log_path=f"{name}-{attempt}.log",
    )


def derived_image(
    base: Path, out: Path, name: str, *, env: Mapping[str, str], files: Mapping[str, bytes] | None = None
) -> Path:
    """An OCI image layout tar of the busybox image `base` with `env` added to its config's `Env` and a layer of
    `files` (paths relative to the root), named `name`: what a tenant's image brings beside the pod spec."""

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    with tarfile.open(base) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    (entry,) = json.loads(blobs["index.json"])["manifests"]
    manifest = json.loads(blobs[f"blobs/sha256/{entry['digest'].split(':', 1)[1]}"])
    config = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'].split(':', 1)[1]}"])
    config["config"]["Env"] = [*config["config"].get("Env", []), *(f"{k}={v}" for k, v in env.items())]
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        made: set[str] = set()
        for path, data in (files or {}).items():
            parts = path.split("/")
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in made:
                    made.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
                    layer.addfile(info)
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            layer.addfile(info, io.BytesIO(data))
    layer_bytes = layer_buffer.getvalue()
    config["rootfs"]["diff_ids"].append(digest(layer_bytes))
    config_bytes = json.dumps(config, sort_keys=True).encode()
    manifest["config"] = {**manifest["config"], "digest": digest(config_bytes), "size": len(config_bytes)}
    manifest["layers"].append(
        {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer_bytes), "size": len(layer_bytes)}
    )
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    annotations = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}
    index = {
        "schemaVersion": 2,
        "manifests": [
            {**entry, "digest": digest(manifest_bytes), "size": len(manifest_bytes), "annotations": annotations}
        ],
    }
    blobs["index.json"] = json.dumps(index, sort_keys=True).encode()
    for blob in (layer_bytes, config_bytes, manifest_bytes):
        blobs[f"blobs/sha256/{digest(blob).split(':', 1)[1]}"] = blob
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, data in sorted(blobs.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return out


def make_char_devices(dev_root: Path, names: Sequence[str], major: int = 1, minor: int = 3) -> list[Path]:
    """Character device files under a fake dev root (by default like /dev/null: 1,3) that containers may open."""
    dev_root.mkdir(parents=True, exist_ok=True)
    made = []
    for name in names:
        path = dev_root / name
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(major, minor))
        made.append(path)
    return made


@dataclass
class Containerd:
    """One containerd process with its own directories; restartable on the same state."""

    base: Path
    binaries: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    started: int = 0
    logs: list[Path] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 30.0) -> None:
        if self.process is not None and self.process.poll() is None:
            raise HarnessError("containerd is already running")
        self.started += 1
        log = self.base / f"containerd-{self.started}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [self.binaries["containerd"], "--config", str(self.base / "config.toml")],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        cri = Cri(self.endpoint)
        try:

            def ready() -> bool:
                if self.process is not None and self.process.poll() is not None:
                    raise HarnessError(f"containerd exited with {self.process.returncode}: {self.log_tail()}")
                return bool(cri.runtime.Status(api_pb2.StatusRequest(), timeout=2).status.conditions)

            wait_until(ready, timeout, f"containerd to answer CRI Status on {self.socket} (log: {log})")
        finally:
            cri.close()

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def import_image(self, tar: Path) -> None:
        result = subprocess.run(
            [self.binaries["ctr"], "--address", str(self.socket), "-n", "k8s.io", "image", "import", str(tar)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise HarnessError(f"ctr image import {tar} failed: {result.stderr.strip() or result.stdout.strip()}")

    def log_tail(self, lines: int = 20) -> str:
        if not self.logs:
            return ""
        return "\n".join(self.logs[-1].read_text(errors="replace").splitlines()[-lines:])

    def remove_all_pods(self) -> None:
        cri = Cri(self.endpoint)
        try:
            for sandbox in cri.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=10).items:
                with contextlib.suppress(grpc.RpcError):
                    cri.remove_pod(sandbox.id)
        finally:
            cri.close()


def _our_shims(socket: Path) -> list[int]:
    """Process ids of the runc shims that this containerd started (they outlive containerd by design)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv:
            pids.append(int(entry.name))
    return pids


def _unmount_below(base: Path) -> None:
    mounts = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == str(base) or point.startswith(f"{base}/"):
                mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


CNI_BIN = Path("/usr/lib/cni")


def _cni_config(bridge: str, subnet: str) -> str:
    """One bridge network with host-local addresses on a private /24: what makes the CRI report NetworkReady (and a
    kubelet's node Ready). Pods on the host network never use it; the bridge exists only once a pod joins it."""
    plugins = [
        {
            "type": "bridge",
            "bridge": bridge,
            "isGateway": True,
            "ipMasq": False,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]},
        },
        {"type": "loopback"},
    ]
    return json.dumps({"cniVersion": "0.4.0", "name": "kubegpu-test", "plugins": plugins})


@contextlib.contextmanager
def running_containerd(image: Path | None = None, *, cni_subnet: str | None = None) -> Iterator[Containerd]:
    """A started containerd with the busybox image imported; everything it made is removed afterwards.

    `cni_subnet` (a private /24 such as `10.88.77.0/24`): a CNI bridge network from Debian's plugins under
    /usr/lib/cni, as a kubelet needs for its node to be Ready; its bridge is deleted afterwards."""
    binaries = _require_environment()
    tar = image or image_tar()
    # A short path: unix socket paths are limited to 108 bytes, and containerd puts sockets under its state dir.
    base = Path(tempfile.mkdtemp(prefix="kubegpu-ctrd-"))
    for sub in ("root", "state", "opt", "runc", "cni/bin", "cni/conf"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    bridge = f"kgpu{base.name[-6:]}".replace("_", "0")[:15]
    if cni_subnet is not None:
        if not (CNI_BIN / "bridge").exists():
            raise HarnessError(f"{CNI_BIN}/bridge is missing: {SETUP_HINT} (it installs containernetworking-plugins)")
        (base / "cni" / "conf" / "10-kubegpu.conflist").write_text(_cni_config(bridge, cni_subnet))
    cni_bin = str(CNI_BIN) if cni_subnet is not None else None
    (base / "config.toml").write_text(_config(base, binaries["runc"], cni_bin))
    runtime = Containerd(base, binaries)
    try:
        runtime.start()
        runtime.import_image(tar)
        yield runtime
    finally:
        try:
            if runtime.process is not None and runtime.process.poll() is None:
                runtime.remove_all_pods()
        finally:
            runtime.stop()
            for pid in _our_shims(runtime.socket):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _unmount_below(base)
            shutil.rmtree(base, ignore_errors=True)
            if cni_subnet is not None and Path(f"/sys/class/net/{bridge}").exists():
                subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)


def fpga_plugin_path(directory: Path) -> list[Path]:
    """PYTHONPATH entries that make examples/fpga an installed plugin distribution for a child process.

    A `.dist-info` folder with the example's entry points is all `importlib.metadata` needs; nothing is installed.
    """
    dist_info = directory / "kubegpu_fpga_example-0.1.0.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: kubegpu-fpga-example\nVersion: 0.1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[kubegpu.device]\nfpga = kubegpu_fpga.device\n\n[kubegpu.scheduler]\nfpga = kubegpu_fpga.scheduler\n"
    )
    return [directory, REPO / "examples" / "fpga"]


class ShimProcess:
    """A `kubegpu crishim` child process."""

    def __init__(self, args: list[str], socket: Path, log: Path, env: Mapping[str, str]) -> None:
        self.socket = socket
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kubegpu.crishim.shim", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
            )

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        cri = Cri(self.endpoint)
        try:

            def answers() -> bool:
                if self.process.poll() is not None:
                    raise HarnessError(f"kubegpu crishim exited with {self.process.returncode}:\n{self.output()}")
                return bool(cri.version(timeout=2).runtime_name)

            wait_until(answers, timeout, f"kubegpu crishim to answer on {self.socket} (log: {self.log})")
        finally:
            cri.close()

    def terminate(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=timeout)
        return self.process.returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def start_shim_process(
    *,
    socket: Path,
    runtime_endpoint: str,
    node_name: str,
    key_file: Path,
    dev_root: Path,
    log: Path,
    kubeconfig: Path | None = None,
    python_path: Sequence[Path] = (),
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> ShimProcess:
    """Start the real `kubegpu crishim` command and wait until it answers CRI Version through to the runtime."""
    args = [
        "--listen",
        f"unix://{socket}",
        "--runtime-endpoint",
        runtime_endpoint,
        "--node-name",
        node_name,
        "--allocation-key-file",
        str(key_file),
        "--dev-root",
        str(dev_root),
        *extra,
    ]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig)]
    environment: dict[str, Any] = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if python_path:
        existing = environment.get("PYTHONPATH")
        environment["PYTHONPATH"] = os.pathsep.join([*map(str, python_path), *([existing] if existing else [])])
    shim = ShimProcess(args, socket, log, environment)
    try:
        shim.wait_ready()
    except BaseException:
        shim.kill()
        raise
    return shim
