"""Benchmark: CRI calls through `kubegpu crishim` vs straight to containerd, side by side in one run.

A real containerd with runc (the harness in tests/integration/containerd.py; needs scripts/containerd-env.sh) and the
real `kubegpu crishim` command in its own process, with the example FPGA plugin found through its entry points. A
Python CRI client plays the kubelet and alternates between the two sockets call by call, so both paths see the same
machine load:

1. CreateContainer + StartContainer of a busybox container, in a pod whose signed allocation gives the container one
   card: through the shim the allocation is verified and the plugin adds the device node and env; straight to
   containerd the same request goes unedited. Each container is stopped and removed afterwards (not timed).
   Goal: through the shim at most 1.05 times the direct p50.
2. ListContainers and ListPodSandbox with `--containers` containers present (pure pass-through).
   Goal: at most 1.2 times the direct p50.
3. The floor of any proxy written in Python: the same List calls through a byte relay that does nothing but copy
   bytes between the two unix sockets (uvloop protocols, no HTTP/2 parsing, nothing verified), measured in the same
   alternation. No Python proxy can pass calls through faster than this relay.

4. A container without devices, with `--sandboxes` pod sandboxes on the node: the shim looks its sandbox up in the
   runtime (its recorded allocation, in case the pod's annotations lost it). Side by side, the lookup as one
   ListPodSandbox of every sandbox (what the shim did before) and as one ListPodSandbox filtered by the sandbox's id
   (what it does), then the shim's whole in-process cost for such a container.

For each it prints p50 and p99 of both paths, their ratio, and the latency the shim adds (p50 and p99 differences).

    .venv/bin/python benchmarks/crishim_bench.py [--creates 100] [--calls 2000] [--containers 20] [--sandboxes 30]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples" / "fpga"))

from cri_api.v1 import api_pb2  # noqa: E402
from integration.containerd import (  # noqa: E402
    Cri,
    container_config,
    fpga_plugin_path,
    host_network_sandbox,
    make_char_devices,
    running_containerd,
    start_shim_process,
)

from kubegpu.core.manifests import pod_request  # noqa: E402
from kubegpu.core.plugin_manager import make_plugin_manager  # noqa: E402
from kubegpu.core.testing import make_node, pod_manifest  # noqa: E402
from kubegpu.crishim.shim import ContainerEditor, RuntimeSandboxes, RuntimeVersions, SandboxSource  # noqa: E402
from kubegpu.scheduler.engine import Engine  # noqa: E402

NODE = "bench-node"
LIST_CONTAINERS = api_pb2.ListContainersRequest()
FPGA = "example.com/fpga"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(name: str, direct: list[float], shim: list[float], goal: float, path: str = "shim") -> bool:
    d50, d99 = percentile(direct, 0.5), percentile(direct, 0.99)
    s50, s99 = percentile(shim, 0.5), percentile(shim, 0.99)
    ratio = s50 / d50
    # Samples were taken in pairs, one path right after the other: the median of the differences is robust to drift.
    paired = statistics.median(b - a for a, b in zip(direct, shim, strict=True))
    verdict = "meets" if ratio <= goal else "MISSES"
    print(
        f"{name:<34} direct p50 {d50 * 1e3:8.3f} ms p99 {d99 * 1e3:8.3f} ms | {path} p50 {s50 * 1e3:8.3f} ms "
        f"p99 {s99 * 1e3:8.3f} ms | ratio {ratio:5.2f} ({verdict} goal <= {goal}) | added p50 "
        f"{(s50 - d50) * 1e3:+.3f} ms p99 {(s99 - d99) * 1e3:+.3f} ms, paired median {paired * 1e3:+.3f} ms "
        f"(n={len(direct)}+{len(shim)})"
    )
    return ratio <= goal


def signed_allocation(key: bytes, uid: str) -> dict[str, str]:
    """The annotations the kubegpu scheduler writes for a pod whose container `main` gets one card."""
    import kubegpu_fpga.scheduler as fpga_scheduler

    engine = Engine(
        make_plugin_manager("scheduler", plugins=[("fpga", fpga_scheduler)], autoload=False), signing_key=key
    )
    engine.add_node(make_node(NODE, labels={"example.com/fpga.count": "4"}, allocatable={FPGA: 4}))
    manifest = pod_manifest("bench", {"main": {FPGA: 1}})
    manifest["metadata"]["uid"] = uid
    decision = engine.schedule(pod_request(manifest)[0])
    assert decision.scheduled, decision.reason
    return dict(decision.annotations)


def make_editor(key: bytes, dev: Path, sandboxes: SandboxSource | None = None) -> ContainerEditor:
    """The shim's CreateContainer logic in-process, with the FPGA plugin: what `kubegpu crishim` runs per request
    (with `sandboxes`, also its reading of the runtime's sandboxes and the check that no device is held twice)."""
    import kubegpu_fpga.device as fpga_device

    plugins = make_plugin_manager("device", plugins=[("fpga", fpga_device)], autoload=False)
    return ContainerEditor(plugins, node=NODE, key=key, dev_root=dev, sandboxes=sandboxes)


def bench_create_start(
    direct: Cri, shim: Cri, editor: ContainerEditor, logs: Path, creates: int
) -> tuple[list[float], list[float]]:
    """Create+start through the shim, and straight to containerd with the request as the shim would forward it
    (the card's device node and env already in it), so that both containers are the same and only the path differs."""
    uid = f"uid-bench-{secrets.token_hex(4)}"
    clients = {"direct": direct, "shim": shim}
    sandbox = host_network_sandbox("bench", uid, annotations=signed_allocation(editor.key, uid), log_directory=logs)
    # The same pod twice: a second sandbox attempt, as after a sandbox restart, so that the names do not clash.
    sandboxes = {"direct": sandbox, "shim": api_pb2.PodSandboxConfig()}
    sandboxes["shim"].CopyFrom(sandbox)
    sandboxes["shim"].metadata.attempt = 1
    pods = {path: clients[path].run_pod(config) for path, config in sandboxes.items()}
    times: dict[str, list[float]] = {"direct": [], "shim": []}
    try:
        for attempt in range(creates + 2):
            order = ("direct", "shim") if attempt % 2 == 0 else ("shim", "direct")
            made = []
            for path in order:
                cri, pod = clients[path], pods[path]
                # Container names are reserved per pod identity, not per sandbox: distinct attempts for the two paths.
                config = container_config("main", attempt=2 * attempt + (path == "shim"))
                if path == "direct":
                    request = api_pb2.CreateContainerRequest(config=config, sandbox_config=sandbox)
                    edited = editor.create_container(request.SerializeToString())
                    config = api_pb2.CreateContainerRequest.FromString(edited).config
                started = time.perf_counter()
                container_id = cri.create(pod, config, sandboxes[path])
                cri.start(container_id)
                elapsed = time.perf_counter() - started
                if attempt >= 2:  # the first two warm up both paths
                    times[path].append(elapsed)
                made.append(container_id)
            # Removed after both were timed, so that neither path pays for the other's teardown.
            for container_id in made:
                direct.runtime.StopContainer(api_pb2.StopContainerRequest(container_id=container_id, timeout=0))
                direct.runtime.RemoveContainer(api_pb2.RemoveContainerRequest(container_id=container_id))
        # The shim really edited its containers: a last one shows the card.
        container_id = shim.create(pods["shim"], container_config("main", attempt=2 * creates + 10), sandboxes["shim"])
        shim.start(container_id)
        assert "fpga0" in shim.exec(container_id, "ls", "/dev").split(), "the shim did not add the allocated card"
    finally:
        for pod in pods.values():
            direct.remove_pod(pod)
    return times["direct"], times["shim"]


def editor_cost(
    editor: ContainerEditor,
    logs: Path,
    rounds: int = 2000,
    label: str = "  of which the edit itself",
    what: str = "decode, verify, plugin, encode; in-process, no I/O",
) -> None:
    """The shim's own work per CreateContainer (decode, verify, plugin edit, encode), without any I/O."""
    uid = "uid-cost"
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id="x",
        config=container_config("main"),
        sandbox_config=host_network_sandbox(
            "cost", uid, annotations=signed_allocation(editor.key, uid), log_directory=logs
        ),
    ).SerializeToString()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        editor.create_container(request)
        times.append(time.perf_counter() - started)
    print(f"{label:<34} p50 {percentile(times, 0.5) * 1e3:.3f} ms p99 {percentile(times, 0.99) * 1e3:.3f} ms ({what})")


def bench_plain_container(direct: Cri, key: bytes, work: Path, sandboxes: int, rounds: int) -> None:
    """Item 4: the runtime lookup a container without devices costs, with `sandboxes` sandboxes on the node."""
    made = [
        direct.run_pod(host_network_sandbox(f"plain-{i}", f"uid-plain-{i}", log_directory=work))
        for i in range(sandboxes)
    ]
    runtime = RuntimeSandboxes(RuntimeVersions(direct.channel))
    own = made[len(made) // 2]

    def every(_: Cri) -> object:  # before: every sandbox listed, this one picked out
        return next(s for s in runtime.sandboxes() if s.id == own)

    def one(_: Cri) -> object:  # now: the runtime asked for this one
        return runtime.sandbox(own)

    listing, lookup = bench_calls(every, [direct], rounds)[0], bench_calls(one, [direct], rounds)[0]
    report(f"  sandbox lookup ({len(runtime.sandboxes())} sandboxes)", listing, lookup, goal=1.0, path="by id")
    editor = make_editor(key, work / "dev", sandboxes=runtime)
    sandbox = host_network_sandbox("plain", "uid-plain", log_directory=work)
    request = api_pb2.CreateContainerRequest(
        pod_sandbox_id=own, config=container_config("main"), sandbox_config=sandbox
    ).SerializeToString()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        editor.create_container(request)
        times.append(time.perf_counter() - started)
    print(
        f"{'  a container without devices':<34} p50 {percentile(times, 0.5) * 1e3:.3f} ms "
        f"p99 {percentile(times, 0.99) * 1e3:.3f} ms (the shim's whole work, in-process, with the runtime's view)"
    )
    for sandbox_id in made:
        direct.remove_pod(sandbox_id)


class ByteRelay:
    """Copies bytes between a client's unix socket and the runtime's, in both directions, and does nothing else."""

    def __init__(self, listen: Path, upstream: Path) -> None:
        import asyncio

        from kubegpu.kube.client import new_event_loop

        self.loop = new_event_loop()
        self.loop_name = type(self.loop).__module__.split(".")[0]
        relay = self

        class Side(asyncio.Protocol):
            def __init__(self) -> None:
                self.transport: asyncio.Transport | None = None
                self.peer: Side | None = None
                self.early: list[bytes] = []

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport  # type: ignore[assignment]

            def data_received(self, data: bytes) -> None:
                if self.peer is not None and self.peer.transport is not None:
                    self.peer.transport.write(data)
                else:
                    self.early.append(data)

            def connection_lost(self, exc: Exception | None) -> None:
                if self.peer is not None and self.peer.transport is not None:
                    self.peer.transport.close()

        class Downstream(Side):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(transport)
                relay.loop.create_task(self.connect())

            async def connect(self) -> None:
                _, up = await relay.loop.create_unix_connection(Side, str(upstream))
                up.peer, self.peer = self, up
                for data in self.early:
                    up.transport.write(data)  # type: ignore[union-attr]
                self.early.clear()

        self.server = self.loop.run_until_complete(self.loop.create_unix_server(Downstream, str(listen)))
        threading.Thread(target=self.loop.run_forever, name="byte-relay", daemon=True).start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


def bench_calls(call: Callable[[Cri], object], clients: list[Cri], calls: int) -> list[list[float]]:
    """Each call on every client in turn, the order rotating, so all paths see the same machine load."""
    for _ in range(200):
        for client in clients:
            call(client)
    times: list[list[float]] = [[] for _ in clients]
    for i in range(calls):
        for step in range(len(clients)):
            which = (i + step) % len(clients)
            started = time.perf_counter()
            call(clients[which])
            times[which].append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=100, help="containers created and started per path")
    parser.add_argument("--calls", type=int, default=2000, help="List calls per path")
    parser.add_argument("--containers", type=int, default=20, help="containers present during the List calls")
    parser.add_argument("--sandboxes", type=int, default=30, help="pod sandboxes present for item 4")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kubegpu-bench-"))
    key = secrets.token_hex(32).encode()
    (work / "key").write_bytes(key + b"\n")
    make_char_devices(work / "dev", ["fpga0", "fpga1", "fpga2", "fpga3"])
    ok = True
    try:
        with running_containerd() as containerd:
            process = start_shim_process(
                socket=work / "cri.sock",
                runtime_endpoint=containerd.endpoint,
                node_name=NODE,
                key_file=work / "key",
                dev_root=work / "dev",
                log=work / "crishim.log",
                python_path=fpga_plugin_path(work / "site"),
                extra=["--log-level", "warning"],
            )
            direct, shim = Cri(containerd.endpoint), Cri(f"unix://{work / 'cri.sock'}")
            editor = make_editor(key, work / "dev")
            try:
                version = direct.version().runtime_version
                print(f"containerd {version}, shim pid {process.process.pid}, {os.cpu_count()} CPUs")
                ok &= report(
                    "CreateContainer+StartContainer",
                    *bench_create_start(direct, shim, editor, work, args.creates),
                    goal=1.05,
                )
                editor_cost(editor, work)
                sandbox = host_network_sandbox("filler", "uid-filler", log_directory=work)
                filler = direct.run_pod(sandbox)
                for i in range(args.containers):
                    direct.create(filler, container_config(f"c{i}"), sandbox)
                present = len(direct.containers())
                editor_cost(
                    make_editor(key, work / "dev", sandboxes=RuntimeSandboxes(RuntimeVersions(direct.channel))),
                    work,
                    rounds=500,
                    label="  the edit with the runtime's view",
                    what="plus one ListPodSandbox and the exclusivity check, in-process",
                )
                print(f"\nA container without devices ({args.sandboxes} more sandboxes on the node):")
                bench_plain_container(direct, key, work, args.sandboxes, rounds=min(args.calls, 500))
                relay = ByteRelay(work / "relay.sock", containerd.socket)
                floor = Cri(f"unix://{work / 'relay.sock'}")
                calls: list[tuple[str, Callable[[Cri], object]]] = [
                    (f"ListContainers ({present} containers)", lambda c: c.runtime.ListContainers(LIST_CONTAINERS)),
                    ("ListPodSandbox", lambda c: c.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest())),
                    ("Version", lambda c: c.runtime.Version(api_pb2.VersionRequest())),
                ]
                floors = []
                for name, call in calls:
                    through_direct, through_shim, through_relay = bench_calls(call, [direct, shim, floor], args.calls)
                    ok &= report(name, through_direct, through_shim, goal=1.2)
                    floors.append((name, through_direct, through_relay))
                print(f"\nThe floor of a Python proxy: a byte relay ({relay.loop_name} protocols, no parsing):")
                for name, through_direct, through_relay in floors:
                    report(f"  {name}", through_direct, through_relay, goal=1.2, path="relay")
                floor.close()
                relay.close()
            finally:
                direct.close()
                shim.close()
                code = process.terminate()
                if code != 0:
                    print(f"kubegpu crishim exited with {code}:\n{process.output()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("all goals met" if ok else "some goals missed (see MISSES above)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
