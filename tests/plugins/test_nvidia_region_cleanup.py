"""HAMi-core's region directories go when their pod goes (T140).

Each share container on a HAMi-core node has a directory of the host, `<KUBEGPU_HAMI_CORE_DIR>/containers/<pod
uid>_<container>`, holding whatever the container's code wrote there, counted in no pod's ephemeral storage. They were
left when the pod ended, so a node running many short share pods filled its disk. Now the node side tells each plugin
the pods still on the node (`kubegpu_device_forget_pods`): the CRI shim after each RemovePodSandbox, the device-plugin
mode at every interval; the nvidia plugin removes the directories of the others, never one of a live pod, nor one of a
pod whose container is being created.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from cri_api.v1 import api_pb2, api_pb2_grpc

from kubegpu.core.annotations import ALLOCATION_KEY, encode_allocation, merge_allocations, sign_allocation
from kubegpu.core.device_hooks import hookimpl
from kubegpu.core.models import PluginAllocation
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError
from kubegpu.crishim import shim as shim_module
from kubegpu.crishim.deviceplugin import DevicePluginService, PendingPods
from kubegpu.crishim.shim import ContainerEditor, Sandbox, start_shim
from kubegpu.plugins.nvidia import device, limits

from .regions import swept

GPU, CORES, MEM = "nvidia.com/gpu", "nvidia.com/gpucores", "nvidia.com/gpumem"
KEY = b"node-and-scheduler-share-this"
NODE = "gpu-node-0"


@pytest.fixture
def hami(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A HAMi-core node: its directory a temporary one, never the host's."""
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)
    directory = tmp_path / "vgpu"
    directory.mkdir()
    monkeypatch.setenv(limits.MODE_ENV, "hami-core")
    monkeypatch.setenv(limits.HAMI_DIR_ENV, str(directory))
    return directory


@pytest.fixture
def no_sweeper(monkeypatch: pytest.MonkeyPatch) -> None:
    """No sweeper thread: the test sweeps what is set aside itself (`limits.sweep_set_aside`), call by call."""
    monkeypatch.setattr(limits, "_wake_sweeper", lambda parent: None)


@pytest.fixture
def pm(make_plugin_manager: Callable[..., KubegpuPluginManager]) -> KubegpuPluginManager:
    manager: KubegpuPluginManager = make_plugin_manager("device", nvidia=device)
    return manager


def region(hami: Path, uid: str, container: str = "main") -> Path:
    return hami / "containers" / f"{uid}_{container}"


def signed(uid: str) -> str:
    share = {GPU: {"0": 1}, CORES: {"0": 30}, MEM: {"0": 4096}}
    part = PluginAllocation(
        plugin="nvidia",
        containers={"main": {GPU: ["0"], CORES: ["0"], MEM: ["0"]}},
        shares={"main": share},
    )
    return encode_allocation(sign_allocation(merge_allocations(NODE, uid, [part]), KEY))


def sandbox_config(uid: str) -> api_pb2.PodSandboxConfig:
    return api_pb2.PodSandboxConfig(
        metadata=api_pb2.PodSandboxMetadata(name=f"pod-{uid}", namespace="team-a", uid=uid),
        annotations={ALLOCATION_KEY: signed(uid)},
    )


def create_request(sandbox_id: str, uid: str) -> api_pb2.CreateContainerRequest:
    return api_pb2.CreateContainerRequest(
        pod_sandbox_id=sandbox_id,
        config=api_pb2.ContainerConfig(metadata=api_pb2.ContainerMetadata(name="main")),
        sandbox_config=sandbox_config(uid),
    )


# ---------------------------------------------------------------------------------------------------------------
# Through the shim, in front of a runtime that keeps its sandboxes
# ---------------------------------------------------------------------------------------------------------------


class SandboxRuntime(api_pb2_grpc.RuntimeServiceServicer):
    """Runs, lists and removes pod sandboxes as a runtime does; creates containers without looking at them."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, api_pb2.PodSandboxConfig] = {}

    def RunPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.RunPodSandboxResponse:
        sandbox_id = f"sandbox-{len(self.sandboxes) + 1}-{request.config.metadata.uid}"
        self.sandboxes[sandbox_id] = request.config
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=sandbox_id)

    def Version(self, request: Any, context: grpc.ServicerContext) -> api_pb2.VersionResponse:
        return api_pb2.VersionResponse(version="0.1.0", runtime_name="sandboxes", runtime_api_version="v1")

    def StopPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.StopPodSandboxResponse:
        return api_pb2.StopPodSandboxResponse()  # stopped, still listed: its pod is still the node's

    def RemovePodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.RemovePodSandboxResponse:
        self.sandboxes.pop(request.pod_sandbox_id, None)
        return api_pb2.RemovePodSandboxResponse()

    def ListPodSandbox(self, request: Any, context: grpc.ServicerContext) -> api_pb2.ListPodSandboxResponse:
        return api_pb2.ListPodSandboxResponse(
            items=[
                api_pb2.PodSandbox(
                    id=sandbox_id,
                    metadata=config.metadata,
                    state=api_pb2.PodSandboxState.SANDBOX_READY,
                    annotations=config.annotations,
                )
                for sandbox_id, config in list(self.sandboxes.items())
            ]
        )

    def CreateContainer(self, request: Any, context: grpc.ServicerContext) -> api_pb2.CreateContainerResponse:
        return api_pb2.CreateContainerResponse(container_id=f"c-{request.pod_sandbox_id}")


@pytest.fixture
def kubelet(pm: KubegpuPluginManager, hami: Path) -> Iterator[api_pb2_grpc.RuntimeServiceStub]:
    """The kubelet's end of a shim in front of `SandboxRuntime`."""
    with shim_before(SandboxRuntime(), pm, hami) as stub:
        yield stub


@contextlib.contextmanager
def shim_before(
    sandboxes: SandboxRuntime, pm: KubegpuPluginManager, hami: Path
) -> Iterator[api_pb2_grpc.RuntimeServiceStub]:
    """A shim started in front of `sandboxes`, and the kubelet's end of it."""
    sockets = Path(tempfile.mkdtemp(prefix="kubegpu-regions-"))
    runtime = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_RuntimeServiceServicer_to_server(sandboxes, runtime)
    runtime.add_insecure_port(f"unix://{sockets / 'runtime.sock'}")
    runtime.start()
    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=hami)
    shim = start_shim(f"unix://{sockets / 'shim.sock'}", f"unix://{sockets / 'runtime.sock'}", editor, workers=4)
    channel = grpc.insecure_channel(f"unix://{shim.socket}")
    try:
        yield api_pb2_grpc.RuntimeServiceStub(channel)
    finally:
        channel.close()
        shim.stop(0)
        runtime.stop(0).wait()
        shutil.rmtree(sockets, ignore_errors=True)


def test_a_share_pods_region_directory_goes_when_its_sandbox_is_removed(
    kubelet: api_pb2_grpc.RuntimeServiceStub, hami: Path
) -> None:
    """Two share pods run on a HAMi-core node; the first ends (its sandbox stopped and removed by the kubelet). Its
    region directory, with what its container wrote there, was left on the host for good; now it goes, and the
    other pod's stays with its region."""
    sandboxes = {}
    for uid in ("uid-ended", "uid-running"):
        sandboxes[uid] = kubelet.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=sandbox_config(uid))).pod_sandbox_id
        kubelet.CreateContainer(create_request(sandboxes[uid], uid), timeout=10)
        (region(hami, uid) / "cudevshr.cache").write_bytes(b"x" * 4096)  # HAMi-core's region, and anything else
    (region(hami, "uid-ended") / "checkpoints").mkdir()

    kubelet.StopPodSandbox(api_pb2.StopPodSandboxRequest(pod_sandbox_id=sandboxes["uid-ended"]), timeout=10)
    kubelet.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandboxes["uid-ended"]), timeout=10)

    assert not region(hami, "uid-ended").exists(), "the ended pod's region directory was left on the host"
    assert swept(hami) == ["uid-running_main"]  # what its container wrote there too
    assert (region(hami, "uid-running") / "cudevshr.cache").read_bytes() == b"x" * 4096


def test_a_gone_pods_huge_region_tree_holds_up_no_other_pods_creation(
    kubelet: api_pb2_grpc.RuntimeServiceStub, hami: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant's share container leaves thousands of files in its region directory on a slow disk (1 ms a file,
    3 s in all), and its pod ends. The removal ran in RemovePodSandbox under the shim's creation lock, for up to 2 s
    a call, so the kubelet's creation of every other pod's container on the node waited behind it, call after call,
    until the tree was gone (T145). Now the tree is set aside in one rename and a sweeper removes it, holding no
    lock: the kubelet's calls answer at once while it goes."""
    sandboxes = {}
    for uid in ("uid-ended", "uid-next"):
        sandboxes[uid] = kubelet.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=sandbox_config(uid))).pod_sandbox_id
    kubelet.CreateContainer(create_request(sandboxes["uid-ended"], "uid-ended"), timeout=10)
    for i in range(3000):
        os.close(os.open(region(hami, "uid-ended") / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    real_unlink = os.unlink

    def slow_unlink(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.001)
        real_unlink(*args, **kwargs)

    monkeypatch.setattr(limits.os, "unlink", slow_unlink)

    began = time.monotonic()
    kubelet.RemovePodSandbox(api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sandboxes["uid-ended"]), timeout=30)
    removed = time.monotonic() - began
    began = time.monotonic()
    kubelet.CreateContainer(create_request(sandboxes["uid-next"], "uid-next"), timeout=30)
    created = time.monotonic() - began
    sweeping = [p.name for p in (hami / "containers").iterdir() if p.name.startswith(".gone-")]

    assert removed < 1.0, f"RemovePodSandbox took {removed:.1f} s removing the ended pod's files"
    assert created < 1.0, f"the next pod's creation waited {created:.1f} s"
    assert sweeping, "the tree was already gone: the test's disk is not slow enough to tell"
    assert swept(hami, timeout=60) == ["uid-next_main"]


def test_the_directories_of_pods_removed_while_no_shim_ran_go_when_the_shim_starts(
    pm: KubegpuPluginManager, hami: Path
) -> None:
    """The kubelet removed a share pod's sandbox while the shim was down (an upgrade, a crash): no RemovePodSandbox
    reached the shim, and its region directory stayed until some other pod's removal. The shim now forgets the pods
    gone once it serves; a pod still on the node keeps its directory."""
    runtime = SandboxRuntime()
    runtime.sandboxes["sandbox-running"] = sandbox_config("uid-running")
    for uid in ("uid-running", "uid-gone"):
        region(hami, uid).mkdir(parents=True)
        (region(hami, uid) / "cudevshr.cache").write_bytes(b"x" * 4096)

    with shim_before(runtime, pm, hami):
        deadline = time.monotonic() + 10
        while region(hami, "uid-gone").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not region(hami, "uid-gone").exists(), "the directory of a pod removed while no shim ran was left"
        assert (region(hami, "uid-running") / "cudevshr.cache").read_bytes() == b"x" * 4096


def test_a_shim_that_starts_before_its_runtime_forgets_the_gone_pods_once_the_runtime_answers(
    pm: KubegpuPluginManager, hami: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node's boot where the shim starts before containerd: the shim's one look at start found no runtime, and
    the region directory of a pod removed while no shim ran stayed until some other pod's RemovePodSandbox, which on
    a quiet node may be days. The shim now asks again until the runtime answers; stopped, it asks no more."""
    monkeypatch.setattr(shim_module, "FORGET_RETRY_FIRST", 0.2)
    runtime = SandboxRuntime()
    runtime.sandboxes["sandbox-running"] = sandbox_config("uid-running")
    for uid in ("uid-running", "uid-gone"):
        region(hami, uid).mkdir(parents=True)
    sockets = Path(tempfile.mkdtemp(prefix="kubegpu-regions-"))
    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=hami)
    shim = start_shim(f"unix://{sockets / 'shim.sock'}", f"unix://{sockets / 'runtime.sock'}", editor, workers=4)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    try:
        time.sleep(1.0)  # the shim's first looks find nothing listening
        assert region(hami, "uid-gone").is_dir()
        api_pb2_grpc.add_RuntimeServiceServicer_to_server(runtime, server)
        server.add_insecure_port(f"unix://{sockets / 'runtime.sock'}")
        server.start()
        deadline = time.monotonic() + 15
        while region(hami, "uid-gone").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not region(hami, "uid-gone").exists(), "the runtime came up, and the gone pod's directory stayed"
        assert region(hami, "uid-running").is_dir()
    finally:
        shim.stop(0)
        server.stop(0).wait()
        shutil.rmtree(sockets, ignore_errors=True)
    deadline = time.monotonic() + 5
    while any(t.name == "crishim-forget" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(t.name == "crishim-forget" for t in threading.enumerate()), "a stopped shim still asks its runtime"


# ---------------------------------------------------------------------------------------------------------------
# The rule: what is live, what is gone
# ---------------------------------------------------------------------------------------------------------------


def test_only_the_directories_of_pods_not_on_the_node_are_removed(hami: Path, tmp_path: Path) -> None:
    sharing = limits.node_sharing()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("a file of the host")
    for uid, container in (("live", "main"), ("live", "sidecar"), ("gone", "main"), ("gone", "tools")):
        limits.region_directory(sharing, f"{uid}_{container}")
    (region(hami, "gone") / "link").symlink_to(outside)
    (region(hami, "gone", "tools") / "a" / "b").mkdir(parents=True)
    (hami / "containers" / "not-a-holder").mkdir()  # no `<uid>_`: not the plugin's to remove
    (hami / "containers" / "left_link").symlink_to(outside)  # a link where a directory should be: removed itself

    assert limits.remove_gone_regions(sharing, frozenset({"live"})) == 2

    assert swept(hami) == ["live_main", "live_sidecar", "not-a-holder"]
    assert (outside / "keep").read_text() == "a file of the host"  # never followed a link
    assert limits.remove_gone_regions(sharing, frozenset({"live"})) == 0


def test_a_node_without_hami_core_directories_has_nothing_to_remove(tmp_path: Path) -> None:
    sharing = limits.NodeSharing(mode="mps", hami_dir=str(tmp_path / "absent"))

    assert limits.remove_gone_regions(sharing, frozenset()) == 0


def test_a_huge_tree_is_removed_over_several_bounded_sweeps(hami: Path, no_sweeper: None) -> None:
    """A container can leave millions of files: each sweep stops at its budget and the next one goes on where it
    stopped."""
    sharing = limits.node_sharing()
    directory = limits.region_directory(sharing, "gone_main")
    for i in range(50):
        (directory / f"f{i}").write_bytes(b"")
    ticks = iter(range(10_000))

    def clock() -> float:
        return float(next(ticks))

    limits.remove_gone_regions(sharing, frozenset())
    assert not region(hami, "gone").exists()  # set aside at once
    calls = 1
    while not limits.sweep_set_aside(hami / "containers", budget=20.0, clock=clock):
        calls += 1
        assert calls < 100
    assert calls > 1
    assert list((hami / "containers").iterdir()) == []


class _FileSystemClock:
    """Time that passes as the filesystem is read and written: each entry a directory listing returns, and each
    entry removed, costs `step` seconds (a cold or slow disk, or simply millions of entries). The filesystem is the
    real one; only the clock is made up, so that a test can tell how far past its budget a call ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, step: float) -> None:
        self.now, self.step = 0.0, step
        real_scandir, real_unlink, real_rmdir = os.scandir, os.unlink, os.rmdir
        clock = self

        class Listing:
            def __init__(self, *args: Any) -> None:
                self.inner = real_scandir(*args)

            def __enter__(self) -> Listing:
                return self

            def __exit__(self, *exc: object) -> None:
                self.inner.close()

            def __iter__(self) -> Listing:
                return self

            def __next__(self) -> os.DirEntry[str]:
                entry = next(self.inner)
                clock.now += clock.step
                return entry

            def close(self) -> None:
                self.inner.close()

        def unlink(*args: Any, **kwargs: Any) -> None:
            real_unlink(*args, **kwargs)
            clock.now += clock.step

        def rmdir(*args: Any, **kwargs: Any) -> None:
            real_rmdir(*args, **kwargs)
            clock.now += clock.step

        monkeypatch.setattr(limits.os, "scandir", Listing)
        monkeypatch.setattr(limits.os, "unlink", unlink)
        monkeypatch.setattr(limits.os, "rmdir", rmdir)

    def __call__(self) -> float:
        return self.now


def _entries_under(directory: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(directory))


def test_a_wide_directory_in_a_region_is_removed_within_the_budget_and_little_memory(
    hami: Path, monkeypatch: pytest.MonkeyPatch, no_sweeper: None
) -> None:
    """A container left 6,000 files in one subdirectory of its region directory (millions cost a tenant a minute).
    The whole subdirectory was emptied in one call whatever the budget (1 ms an entry: 12 s of the shim's creation
    lock against a budget of 2), and every name in it held in memory at once; now a sweep stops at its budget, holds
    no listing, and the next one goes on."""
    sharing = limits.node_sharing()
    wide = limits.region_directory(sharing, "gone_main") / "wide"
    wide.mkdir()
    for i in range(6000):
        os.close(os.open(wide / f"file-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o600))
    limits.remove_gone_regions(sharing, frozenset())
    clock = _FileSystemClock(monkeypatch, step=0.001)

    tracemalloc.start()
    try:
        limits.sweep_set_aside(hami / "containers", budget=2.0, clock=clock)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < 200_000, f"one sweep held {peak} bytes"
    assert clock.now <= 2.0 + 0.01, f"one sweep ran {clock.now:.1f} s against a budget of 2 s"
    calls = 1
    while any((hami / "containers").iterdir()):
        calls += 1
        assert calls < 20
        clock.now = 0.0
        limits.sweep_set_aside(hami / "containers", budget=2.0, clock=clock)
        assert clock.now <= 2.0 + 0.01
    assert calls >= 3


def test_a_directory_whose_listing_outlasts_the_budget_is_still_removed(
    hami: Path, monkeypatch: pytest.MonkeyPatch, no_sweeper: None
) -> None:
    """Each call listed the whole directory before removing anything, and stopped at the first entry once its budget
    was spent: a region directory whose listing took longer than the budget (200,000 files took 0.3 s to list here,
    a few million take longer than the 2 s budget) was never removed, and every call paid the listing again. Now
    every sweep removes what it reads as it reads it."""
    sharing = limits.node_sharing()
    directory = limits.region_directory(sharing, "gone_main")
    for i in range(3000):
        os.close(os.open(directory / f"file-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o600))
    limits.remove_gone_regions(sharing, frozenset())
    (aside,) = (hami / "containers").iterdir()
    clock = _FileSystemClock(monkeypatch, step=0.001)  # listing all 3,000 takes 3 s

    left = []
    for _ in range(5):
        clock.now = 0.0
        limits.sweep_set_aside(hami / "containers", budget=2.0, clock=clock)
        left.append(_entries_under(aside) if aside.exists() else 0)

    assert left[0] < 3000, "the first sweep removed nothing"
    assert left[-1] == 0 and not aside.exists(), f"entries left after each sweep: {left}"


def test_a_restarted_container_gets_its_empty_directory_without_removing_anything(
    hami: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container's last run left 6,000 files in its region directory; its next creation (under the shim's
    creation lock, every other pod's creation waiting) emptied them all before answering, whatever it took, and
    later for up to 2 s. Now what the last run left is set aside at once and the sweeper removes it; the creation
    reads and removes nothing, and the new run starts from an empty directory all the same."""
    sharing = limits.node_sharing()
    wide = limits.region_directory(sharing, "live_main") / "wide"
    wide.mkdir()
    for i in range(6000):
        os.close(os.open(wide / f"file-{i:06d}", os.O_CREAT | os.O_WRONLY, 0o600))
    woken: list[Path] = []
    with monkeypatch.context() as patch:
        patch.setattr(limits, "_wake_sweeper", woken.append)
        clock = _FileSystemClock(patch, step=0.001)

        directory = limits.region_directory(sharing, "live_main")

    assert clock.now == 0.0, f"the creation read or removed {clock.now / 0.001:.0f} entries"
    assert list(directory.iterdir()) == [] and directory.stat().st_mode & 0o777 == 0o777
    assert woken == [hami / "containers"]
    limits.remove_gone_regions(sharing, frozenset({"live"}))  # the pod is still live: only what was set aside goes
    assert swept(hami) == ["live_main"]


def test_what_a_tenant_leaves_in_its_region_never_reaches_outside_it(
    hami: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_sweeper: None
) -> None:
    """A share container writes what it likes in its region directory while it runs: a fifo, links to the host's
    files and directories, a hard link, names of odd bytes, a directory it may not read, and (a container still
    running in device-plugin mode after its pod was force-deleted) a directory swapped for a link to the host
    between the node's listing and its removal. Everything inside goes; nothing outside is removed, emptied or
    followed."""
    outside = tmp_path / "host"
    (outside / "etc").mkdir(parents=True)
    (outside / "etc" / "passwd").write_text("root:x:0:0")
    sharing = limits.node_sharing()
    directory = limits.region_directory(sharing, "gone_main")
    os.mkfifo(directory / "fifo")
    (directory / "to-dir").symlink_to(outside / "etc")
    (directory / "to-file").symlink_to(outside / "etc" / "passwd")
    os.link(outside / "etc" / "passwd", directory / "hard")
    os.mkdir(os.fsencode(directory) + b"/odd-\xff\n..")
    (directory / "closed" / "inner").mkdir(parents=True)
    (directory / "closed").chmod(0)
    (directory / "victim").mkdir()
    (directory / "victim" / "x").write_text("the tenant's")
    real_open = os.open

    def swapped(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "victim" and dir_fd is not None:  # the tenant swaps it right before the node opens it
            shutil.rmtree(directory / "victim")
            (directory / "victim").symlink_to(outside / "etc")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    limits.remove_gone_regions(sharing, frozenset())
    monkeypatch.setattr(limits.os, "open", swapped)
    assert not limits.sweep_set_aside(hami / "containers")
    assert re.search(r"cannot remove what a gone share container left in '\.gone-[0-9a-f]+'", caplog.text)
    monkeypatch.setattr(limits.os, "open", real_open)
    assert limits.sweep_set_aside(hami / "containers")

    assert list((hami / "containers").iterdir()) == []
    assert (outside / "etc" / "passwd").read_text() == "root:x:0:0"
    assert sorted(p.name for p in outside.rglob("*")) == ["etc", "passwd"]


def test_a_creation_in_flight_is_never_among_the_gone(pm: KubegpuPluginManager, hami: Path) -> None:
    """The shim lists the sandboxes, then the plugins remove what is not listed. A pod whose sandbox was created
    after that listing and whose container is created before the removal would lose the region directory it was just
    given. The creation waits for the removal (one lock spans both), so its directory is made after it."""
    sandboxes = [Sandbox("s-old", "team-a", "pod-old", "uid-old", True, None, True)]
    forget_listed, go_on = threading.Event(), threading.Event()

    class Runtime:
        def sandboxes(self) -> list[Sandbox]:
            listed = list(sandboxes)
            if threading.current_thread().name == "forget":
                forget_listed.set()
                assert go_on.wait(10)
            return listed

        def live_containers(self, sandbox_id: str) -> list[str]:
            return ["main"]

    editor = ContainerEditor(pm, node=NODE, key=KEY, dev_root=hami, sandboxes=Runtime())
    forget = threading.Thread(target=editor.forget_gone_pods, name="forget")
    forget.start()
    assert forget_listed.wait(10)
    # the kubelet runs the new pod's sandbox and creates its container while the removal is under way
    config = sandbox_config("uid-new")
    sandboxes.append(Sandbox("s-new", "team-a", config.metadata.name, "uid-new", True, signed("uid-new"), True))
    with futures.ThreadPoolExecutor(1) as pool:
        created = pool.submit(editor.create_container, create_request("s-new", "uid-new").SerializeToString())
        with pytest.raises(futures.TimeoutError):
            created.result(timeout=0.2)  # held behind the removal
        go_on.set()
        created.result(timeout=10)
    forget.join(10)

    assert region(hami, "uid-new").is_dir()
    editor.forget_gone_pods()  # and the next removal keeps it: its sandbox is listed
    assert region(hami, "uid-new").is_dir()


# ---------------------------------------------------------------------------------------------------------------
# A plugin's failure costs only that plugin
# ---------------------------------------------------------------------------------------------------------------


class _Raises:
    @hookimpl
    def kubegpu_device_forget_pods(self, live_pods: frozenset[str]) -> int:
        raise RuntimeError("the plugin's disk is gone")


class _Answers:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    @hookimpl
    def kubegpu_device_forget_pods(self, live_pods: frozenset[str]) -> object:
        return self.answer


@pytest.mark.parametrize(
    ("plugin", "words"),
    [
        pytest.param(_Raises(), "RuntimeError: the plugin's disk is gone", id="raises"),
        pytest.param(_Answers(True), "WrongAnswer: returned True (bool)", id="bool"),
        pytest.param(_Answers(-1), "WrongAnswer: returned -1 (int)", id="negative"),
        pytest.param(_Answers("done"), "WrongAnswer: returned 'done' (str)", id="text"),
    ],
)
def test_a_plugin_that_fails_to_forget_costs_only_itself(
    make_plugin_manager: Callable[..., KubegpuPluginManager],
    hami: Path,
    plugin: object,
    words: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager: KubegpuPluginManager = make_plugin_manager("device", bad=plugin, nvidia=device)
    with pytest.raises(PluginHookError, match=re.escape(f"plugin 'bad' failed in kubegpu_device_forget_pods: {words}")):
        manager.call("bad", "kubegpu_device_forget_pods", live_pods=frozenset())
    limits.region_directory(limits.node_sharing(), "gone_main")
    editor = ContainerEditor(manager, node=NODE, key=KEY, dev_root=hami, sandboxes=_NoSandboxes())

    editor.forget_gone_pods()  # never raises

    assert not region(hami, "gone").exists() and swept(hami) == []  # the nvidia plugin still ran
    assert "plugin 'bad' failed in kubegpu_device_forget_pods" in caplog.text


class _NoSandboxes:
    def sandboxes(self) -> list[Sandbox]:
        return []

    def live_containers(self, sandbox_id: str) -> list[str]:
        return []


def test_a_runtime_that_cannot_list_removes_nothing(pm: KubegpuPluginManager, hami: Path) -> None:
    class Down(_NoSandboxes):
        def sandboxes(self) -> list[Sandbox]:
            raise ConnectionError("the runtime is down")

    limits.region_directory(limits.node_sharing(), "maybe_main")
    ContainerEditor(pm, node=NODE, key=KEY, dev_root=hami, sandboxes=Down()).forget_gone_pods()

    assert region(hami, "maybe").is_dir()


# ---------------------------------------------------------------------------------------------------------------
# The device-plugin mode
# ---------------------------------------------------------------------------------------------------------------


def test_the_device_plugin_mode_removes_the_directories_of_pods_the_api_server_no_longer_lists(
    pm: KubegpuPluginManager, hami: Path
) -> None:
    listed = [{"metadata": {"uid": "uid-running"}, "status": {"phase": "Running"}}]
    down = False

    def list_pods() -> list[dict[str, Any]]:
        if down:
            raise ConnectionError("the API server is down")
        return listed

    service = DevicePluginService(
        pm, PendingPods(list_pods, NODE, KEY), directory=hami / "dp", host_root=hami, dev_root=hami
    )
    for uid in ("uid-running", "uid-deleted", "uid-later"):
        limits.region_directory(limits.node_sharing(), f"{uid}_main")

    down = True
    service.forget_gone_pods()
    assert region(hami, "uid-deleted").is_dir()  # nothing is known gone while the API server cannot say

    down = False
    service.forget_gone_pods()
    assert swept(hami) == ["uid-running_main"]


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param([{"metadata": {"uid": "uid-running"}}, {"metadata": None}], id="a-pod-without-metadata"),
        pytest.param([{"metadata": {"uid": "uid-running"}}, {"metadata": {"uid": 7}}], id="a-uid-not-text"),
        pytest.param([{"metadata": {"uid": "uid-running"}}, "a proxy's line"], id="not-a-pod"),
        # `KubeClient.list` on a 200 answer of `[]`, not a PodList
        pytest.param(AttributeError("'list' object has no attribute 'get'"), id="not-a-list"),
    ],
)
def test_a_pod_listing_the_device_plugin_cannot_read_removes_nothing(
    pm: KubegpuPluginManager, hami: Path, answer: list[Any] | Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server (or a proxy before it) answered a listing with a pod whose UID cannot be read. A pod without
    metadata counted as UID '' and every other pod's directory went, its own possibly among them; an item that is no
    pod raised out of the interval's round, which then skipped re-registering with the kubelet (the node's devices
    gone after the kubelet's next restart, for as long as the listing stayed so). Now such a listing says nothing
    about which pods are gone."""

    def list_pods() -> list[dict[str, Any]]:
        if isinstance(answer, Exception):
            raise answer
        return answer

    service = DevicePluginService(
        pm, PendingPods(list_pods, NODE, KEY), directory=hami / "dp", host_root=hami, dev_root=hami
    )
    for uid in ("uid-running", "uid-unreadable"):
        limits.region_directory(limits.node_sharing(), f"{uid}_main")

    service.forget_gone_pods()  # never raises

    assert sorted(p.name for p in (hami / "containers").iterdir()) == ["uid-running_main", "uid-unreadable_main"]
    assert "cannot say which pods are gone from the node" in caplog.text


def test_a_sweeper_that_cannot_start_costs_no_creation(
    hami: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A process out of threads cannot start the sweeper: the container's creation goes on all the same (its new
    directory empty), and what was set aside goes at the next wake."""
    sharing = limits.node_sharing()
    (limits.region_directory(sharing, "live_main") / "left").write_text("the last run's")

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("can't start")))
        directory = limits.region_directory(sharing, "live_main")

    assert list(directory.iterdir()) == []
    assert "cannot start the sweeper of" in caplog.text
    assert any(p.name.startswith(".gone-") for p in (hami / "containers").iterdir())
    limits.remove_gone_regions(sharing, frozenset({"live"}))
    assert swept(hami) == ["live_main"]


def _slow_unlink(monkeypatch: pytest.MonkeyPatch, *, written_back: str = "") -> None:
    """A slow disk, 1 ms a file removed; with `written_back`, a container still running in the tree (a force-deleted
    pod's, in device-plugin mode) writes a new file named so for each such file removed: that tree never empties."""
    real_unlink = os.unlink
    written = itertools.count(1)

    def slow_unlink(name: Any, *, dir_fd: int | None = None) -> None:
        time.sleep(0.001)
        real_unlink(name, dir_fd=dir_fd)
        if written_back and str(name).startswith(written_back):
            os.close(os.open(f"{written_back}{next(written)}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=dir_fd))

    monkeypatch.setattr(limits.os, "unlink", slow_unlink)


def test_a_tree_too_big_for_one_sweep_goes_on_a_quiet_node(hami: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gone pod's container left more files than one sweep removes (millions on a slow disk against 10 s; here
    500 at 1 ms against 50 ms), and nothing happens on the node after its RemovePodSandbox: no other pod ends, no
    container restarts. The sweeper stopped at its budget and ended, and only a next wake went on, so on a quiet
    node (a CRI shim's, woken only by those) the rest stayed on the disk for good: 455 of the 500 files. Now a sweep
    its budget stopped is followed by another after a pause, woken or not, until the tree is gone (T152)."""
    monkeypatch.setattr(limits, "SWEEP_BUDGET", 0.05)
    monkeypatch.setattr(limits, "SWEEP_PAUSE", 0.01)
    sharing = limits.node_sharing()
    directory = limits.region_directory(sharing, "gone_main")
    for i in range(500):
        os.close(os.open(directory / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    _slow_unlink(monkeypatch)

    limits.remove_gone_regions(sharing, frozenset())  # its sandbox removed: the one wake there is

    assert swept(hami, timeout=30) == []


def test_a_tree_that_never_empties_takes_no_other_trees_turn(hami: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Device-plugin mode: a pod force-deleted from the API server while its container still runs has its region
    directory set aside, and the container goes on writing into it, a file for each the sweeper removes. Every
    sweep began with the same tree (names in order) and spent its whole budget there, so another tenant's tree set
    aside beside it was never reached: after 30 wakes both were still there. Now a sweep begins after the tree the
    last one's budget ran out in: the other goes at the next sweep, and the endless one still gets its turn (T153)."""
    monkeypatch.setattr(limits, "SWEEP_BUDGET", 0.05)
    monkeypatch.setattr(limits, "SWEEP_PAUSE", 0.01)
    parent = hami / "containers"
    parent.mkdir(mode=0o700)
    endless, other = parent / ".gone-0000000000000000", parent / ".gone-ffffffffffffffff"
    endless.mkdir()
    (endless / "written-0").write_text("")
    other.mkdir()
    (other / "weights").write_text("another tenant's checkpoint")

    with monkeypatch.context() as patch:
        _slow_unlink(patch, written_back="written-")
        limits.remove_gone_regions(limits.node_sharing(), frozenset())
        deadline = time.monotonic() + 10
        while other.exists():
            assert time.monotonic() < deadline, "the other tenant's tree was never reached"
            time.sleep(0.02)
        assert endless.exists()  # still written into, still being swept

    assert swept(hami, timeout=30) == []  # the container stopped: its tree goes too


@pytest.mark.parametrize("mount", ["bind", "tmpfs"], ids=["a-host-directory-bound", "another-filesystem"])
def test_a_mount_point_in_a_gone_pods_tree_is_never_gone_into(
    hami: Path, tmp_path: Path, mount: str, caplog: pytest.LogCaptureFixture, no_sweeper: None
) -> None:
    """Something of the host's is mounted inside a gone pod's region directory (a host directory bound there by a
    node agent, a disk mounted there by mistake). The sweeper went into it as into any directory of the tree and
    removed the files it found at its top, the host's (a bound directory holding a passwd file: empty after one
    sweep), until a subdirectory it could not move out stopped it. Now a mount point is never gone into: the tree
    stays, logged each wake naming why, and goes once it is unmounted."""
    if os.geteuid() != 0:  # the suite runs as root, as the CRI shim does: a set-up without it is broken, not skipped
        pytest.fail("this test mounts a directory, which needs root: run the suite as root (as CI does)")
    sharing = limits.node_sharing()
    directory = limits.region_directory(sharing, "gone_main")
    (directory / "cudevshr.cache").write_text("region")
    host = tmp_path / "host"
    host.mkdir()
    (host / "passwd").write_text("root:x:0:0")
    (directory / "mounted").mkdir()
    command = ["mount", "--bind", str(host)] if mount == "bind" else ["mount", "-t", "tmpfs", "tmpfs"]
    mounted = subprocess.run([*command, str(directory / "mounted")], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed: {mounted.stderr.strip()[:300]}")
    try:
        if mount == "tmpfs":
            (directory / "mounted" / "passwd").write_text("root:x:0:0")
        limits.remove_gone_regions(sharing, frozenset())
        (aside,) = (hami / "containers").iterdir()

        assert not limits.sweep_set_aside(hami / "containers")

        assert (aside / "mounted" / "passwd").read_text() == "root:x:0:0"
        assert re.search(r"left in '\.gone-[0-9a-f]+': a mount point, left as it is with what it holds", caplog.text)
    finally:
        subprocess.run(["umount", str(next((hami / "containers").iterdir()) / "mounted")], check=True)
    assert (host / "passwd").read_text() == "root:x:0:0"
    assert limits.sweep_set_aside(hami / "containers")
    assert list((hami / "containers").iterdir()) == []
