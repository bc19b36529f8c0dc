"""`kubegpu crishim`: the CRI shim between the kubelet and containerd that hands each container its devices.

The kubelet talks CRI (RuntimeService and ImageService, `runtime.v1` from kubelet 1.23 on, `runtime.v1alpha2`
before: both are served) to the shim's unix socket; the shim forwards every call to the runtime's socket. The method
table is generated from the service descriptors of the generated stubs (PyPI `container-runtime-interface-api`), so
no RPC is left out: requests and responses travel as raw bytes (never decoded, so never altered), with the caller's
metadata, the remaining deadline, and the runtime's status code, details and metadata passed back unchanged. The
server-streaming GetContainerEvents is relayed message by message, and a caller that goes away cancels the call
upstream.

Each version is forwarded in the same version while the runtime speaks it, else in the other one
(`RuntimeVersions`): v1 is v1alpha2 graduated, the messages they share have the same field numbers, so the bytes of a
request of one are a valid request of the other. containerd 1.6 speaks both; containerd 2.0 only v1.

Only CreateContainer is looked at, and RemovePodSandbox followed: after the runtime's answer (and once when the shim
starts serving, for the pods removed while none ran), the shim lists the node's sandboxes and tells every plugin the
UIDs of the pods left (`Device.kubegpu_device_forget_pods`), so that each removes what it keeps on the host for the
pods gone (HAMi-core's region directories).

The pod's `kubegpu.io/allocation` is the one its sandbox was created with, as the runtime recorded it (ListPodSandbox
reports each sandbox's annotations; containerd 1.6 does), not the copy of the pod's current annotations the kubelet
puts in the request, which the pod's owner may have changed since; the copy is used only when the runtime reports no
annotations, and the API server (with `--kubeconfig`) when the sandbox was created without one. A copy without one (an
editor removed it after the sandbox was created) still gets the sandbox's, checked as any below, so a restarted
container keeps its devices unless another pod has since been given them. The allocation must be signed with this
node's key, name this node and this pod (`verify.py`), and no other live (READY) sandbox on the node may hold one of
its whole devices: of two verified allocations naming one device, the one issued earlier is stale and refused, and a
device a live container already has is never given to another pod (shared devices, with `shares`, are not compared).
One lock spans reading the sandboxes, checking and marking the container being created, so concurrent calls cannot
both hand out a device; verified allocations are remembered per sandbox id. Which containers of another pod hold a
device is the runtime's answer (created, running or unknown), and those being created through the shim until the
runtime answers (for good when its answer is lost): never what the shim once applied, so a container that has exited
holds nothing, as a freshly started shim sees it.

Every installed plugin declares what selects its devices (`Device.kubegpu_device_owned`: env variables, device and
mount paths, CDI kinds); the shim removes all of it from every container, then each resource allocated to the
container goes to the plugin that owns it (`Device.kubegpu_device_edit_container`), which adds back exactly its
devices, editing a runtime-neutral copy of the container config (`ContainerEdit`: device nodes, env, mounts, CDI
names, annotations). So a user-set `NVIDIA_VISIBLE_DEVICES=all` reaches the runtime removed from a container without
an allocation, a sidecar the allocation does not name, or a container granted another plugin's devices. The edit is
written back into the protobuf, keeping every field the plugins do not model as the kubelet sent it; a container
with nothing to remove and nothing granted is forwarded byte for byte.

Every refusal answers `FAILED_PRECONDITION` naming the check (missing, malformed, unsigned, tampered, copied or
foreign allocation; stale or in use; a plugin that fails, whatever it raises; anything unexpected while reading or
applying the allocation), and nothing reaches the runtime: never `UNKNOWN`, never an unanswered call. When the API
server or the runtime cannot say what the container may have, the answer is `UNAVAILABLE` and the kubelet retries.

When the runtime is down, callers get `UNAVAILABLE`, as they would from the runtime's own socket; the channel to the
runtime reconnects by itself (backoff capped at one second), so a restarted containerd is picked up without
restarting the shim. The listening socket is created with mode 0600; SIGTERM stops the server gracefully (exit 0).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

import grpc
from cri_api.v1 import api_pb2
from cri_api.v1alpha2 import api_pb2 as v1alpha2_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from pydantic import ValidationError

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord
from kubegpu.core.errors import describe_validation_error
from kubegpu.core.models import (
    CDI_ANNOTATION_PREFIX,
    ContainerAllocation,
    ContainerEdit,
    DeviceNode,
    DeviceOwnership,
    Mount,
)
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.core.process import add_verify_key_argument
from kubegpu.crishim.verify import AllocationRefused, PodIdentity, managed_resources, verified_allocation

__all__ = [
    "CDI_ANNOTATION",
    "ApiPods",
    "ContainerEditor",
    "Creation",
    "PodSource",
    "RunningShim",
    "RuntimeSandboxes",
    "RuntimeVersions",
    "Sandbox",
    "SandboxSource",
    "add_crishim_parser",
    "apply_edit",
    "edit_from_config",
    "main",
    "run",
    "start_shim",
    "unix_path",
]

log = logging.getLogger("kubegpu.crishim")

# ---------------------------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------------------------

EDIT_HOOK = "kubegpu_device_edit_container"
OWNED_HOOK = "kubegpu_device_owned"
FORGET_HOOK = "kubegpu_device_forget_pods"
# The CRI versions served, each by the generated module that describes it. v1 first: the shim asks the runtime in v1.
CRI_VERSIONS: dict[str, Any] = {"v1": api_pb2, "v1alpha2": v1alpha2_pb2}
RUNTIME = "RuntimeService"
CDI_ANNOTATION = "cdi.k8s.io/kubegpu"  # where `--cdi annotation` puts the CDI names the plugins added
CdiMode = Literal["field", "annotation", "off"]
DESCRIPTION = (
    "Serve CRI runtime.v1 and runtime.v1alpha2 on --listen, forwarding every call to --runtime-endpoint in a "
    "version it speaks; CreateContainer requests of pods with a kubegpu.io/allocation are verified (signature, node, "
    "pod) and edited by the owning device plugins (device nodes, env, mounts, CDI names)."
)

# A deadline further away than this is "no deadline": the sync server reports ~9.2e18 s when the caller set none.
NO_DEADLINE = 10 * 365 * 24 * 3600.0
SANDBOX_ID_CHARS = 13  # how much of a sandbox ID a refusal shows: as `crictl pods` does, and `crictl stopp` takes
UID_CHARS = 8  # how much of a pod's UID a refusal shows where two pods share a name
# Messages are limited by the kubelet and the runtime themselves; the shim must not be the tighter limit.
MESSAGE_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
# grpc's default reconnect backoff grows to 120 s; a restarted containerd should be used within a second.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Metadata the transport sets itself; forwarding it would be refused or would be wrong.
RESERVED_METADATA = ("user-agent", "te", "content-type")
# The codes a call ends with when the runtime's own answer may not have come back: the runtime may have done it.
LOST = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE})


# ---------------------------------------------------------------------------------------------------------------
# CreateContainer: verify the allocation, let the owning plugins edit the container
# ---------------------------------------------------------------------------------------------------------------


class PodSource(Protocol):
    """Where the shim reads a pod when its sandbox carries no allocation (the API server)."""

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The Pod manifest, or None when it does not exist; raise `ConnectionError` when it cannot be read."""
        ...


class ApiPods:
    """`PodSource` over the kubegpu API client (one keep-alive GET per lookup)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def get_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        from kubegpu.kube.client import ApiError

        try:
            pod: Mapping[str, Any] = self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise ConnectionError(f"reading pod {namespace}/{name} from the API server: {exc}") from None
        return pod


class Sandbox(NamedTuple):
    """One pod sandbox as the runtime reports it: `allocation` is the `kubegpu.io/allocation` annotation it was
    created with (None without one); `annotated` says whether the runtime reports annotations at all."""

    id: str
    namespace: str
    name: str
    uid: str
    ready: bool
    allocation: str | None
    annotated: bool

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class SandboxSource(Protocol):
    """The runtime's own record of the node's pod sandboxes and their containers."""

    def sandboxes(self) -> list[Sandbox]:
        """Every sandbox on the node, ready or not; raise `ConnectionError` when the runtime cannot say."""
        ...

    def sandbox(self, sandbox_id: str) -> Sandbox | None:
        """The sandbox `sandbox_id`, or None when the runtime does not know it; raise `ConnectionError` when the
        runtime cannot say."""
        ...

    def live_containers(self, sandbox_id: str) -> list[str]:
        """The names of the sandbox's containers that are created or running (or in an unknown state)."""
        ...


class RuntimeSandboxes:
    """`SandboxSource` over the runtime's CRI socket, in whichever version it speaks: one ListPodSandbox
    (ListContainers only when two live pods claim the same device; a ListPodSandbox filtered by id for one sandbox)."""

    LIVE = (
        api_pb2.ContainerState.CONTAINER_CREATED,
        api_pb2.ContainerState.CONTAINER_RUNNING,
        api_pb2.ContainerState.CONTAINER_UNKNOWN,
    )

    def __init__(self, versions: RuntimeVersions, timeout: float = 10.0) -> None:
        self.versions = versions
        self.timeout = timeout

    def _call(self, method: str, request: Any, response_type: Any) -> Any:
        """The runtime's answer; read with `_lenient` where a text in it is not UTF-8 (the kubelet passes a pod's
        annotation values on as the API server stored them, and neither checks that they are UTF-8: one pod's
        bytes must not make the node's list unreadable, refusing every device pod on the node)."""
        body, _ = self.versions.call("v1", RUNTIME, method, request.SerializeToString(), timeout=self.timeout)
        try:
            return response_type.FromString(body)
        except DecodeError:
            lenient = _lenient(response_type.DESCRIPTOR.full_name).FromString(body)
            log.warning("the runtime's %s answer has text that is not UTF-8; it is read with U+FFFD for it", method)
            return lenient

    def sandboxes(self) -> list[Sandbox]:
        return self._list(api_pb2.ListPodSandboxRequest())

    def sandbox(self, sandbox_id: str) -> Sandbox | None:
        # The runtime reads an id filter as a prefix of ids (containerd): only the exact one is this sandbox.
        request = api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(id=sandbox_id))
        return next((s for s in self._list(request) if s.id == sandbox_id), None)

    def _list(self, request: Any) -> list[Sandbox]:
        try:
            response = self._call("ListPodSandbox", request, api_pb2.ListPodSandboxResponse)
        except grpc.RpcError as exc:
            raise ConnectionError(f"asking the runtime for its pod sandboxes: {_rpc_error(exc)}") from None
        ready = api_pb2.PodSandboxState.SANDBOX_READY
        listed = []
        for item in response.items:
            annotations = _text_map(item.annotations)
            listed.append(
                Sandbox(
                    _text(item.id),
                    _text(item.metadata.namespace),
                    _text(item.metadata.name),
                    _text(item.metadata.uid),
                    item.state == ready,
                    annotations.get(ALLOCATION_KEY),
                    len(annotations) > 0,
                )
            )
        return listed

    def live_containers(self, sandbox_id: str) -> list[str]:
        request = api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(pod_sandbox_id=sandbox_id))
        try:
            response = self._call("ListContainers", request, api_pb2.ListContainersResponse)
        except grpc.RpcError as exc:
            raise ConnectionError(f"asking the runtime for the containers of {sandbox_id}: {_rpc_error(exc)}") from None
        return [_text(c.metadata.name) for c in response.containers if c.state in self.LIVE]


@functools.cache
def _lenient(full_name: str) -> Any:
    """The message class of CRI v1's `full_name` with every string field read as bytes (and every map as its
    entries): the same wire format, without the UTF-8 check that makes the generated class refuse the whole message."""
    file = descriptor_pb2.FileDescriptorProto()
    api_pb2.DESCRIPTOR.CopyToProto(file)

    def as_bytes(messages: Iterable[Any]) -> None:
        for message in messages:
            message.options.ClearField("map_entry")  # a map's key may not be bytes; its entries as a list may
            for item in message.field:
                if item.type == item.TYPE_STRING:
                    item.type = item.TYPE_BYTES
            as_bytes(message.nested_type)

    as_bytes(file.message_type)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _text_map(entries: Any) -> dict[str, str]:
    """A map field as a dict, from the generated class (a mapping) or `_lenient`'s (a list of entries, the last of
    a key winning, as protobuf's maps have it)."""
    if isinstance(entries, Mapping):
        return dict(entries)
    return {_text(entry.key): _text(entry.value) for entry in entries}


def _rpc_error(error: grpc.RpcError) -> str:
    call: Any = error
    return f"{call.code().name}: {call.details()}"


Devices = dict[tuple[str, str], list[str]]  # (resource, device id) -> the containers it is allocated to


class ContainerEditor:
    """Applies verified allocations to CreateContainer requests; knows nothing about sockets or servers.

    `sandboxes` is the runtime's own record of the node's sandboxes (`start_shim` gives it the runtime's); without
    it (unit tests, benchmarks) the request's sandbox config is believed and no other pod is looked at.
    """

    def __init__(
        self,
        plugins: KubegpuPluginManager,
        *,
        node: str,
        key: bytes,
        verify_keys: Sequence[bytes] = (),
        dev_root: Path = Path("/dev"),
        pods: PodSource | None = None,
        cdi: CdiMode = "field",
        sandboxes: SandboxSource | None = None,
    ) -> None:
        self.plugins = plugins
        self.node = node
        self.key = key
        self.verify_keys = tuple(verify_keys)  # accepted besides `key` in a rotation (--allocation-verify-key-file)
        self.dev_root = dev_root
        self.pods = pods
        self.cdi: CdiMode = cdi
        self.sandboxes = sandboxes
        self.owned = DeviceOwnership.union(self._ownerships().values())
        # One decision at a time between reading the node's sandboxes and recording what was applied, so that two
        # CreateContainer calls can never both hand out one device.
        self._lock = threading.Lock()
        self._verified: dict[str, tuple[str, AllocationRecord | None]] = {}  # sandbox id -> (annotation, verified)
        # sandbox id -> container -> creations given whole devices whose container the runtime may not list yet:
        # from the check until the runtime answers (then the runtime's list says), for good when its answer was lost.
        self._creating: dict[str, Counter[str]] = {}
        self._creating_lock = threading.Lock()  # short: `answered` must not wait behind a creation's plugin edit

    def _ownerships(self) -> dict[str, DeviceOwnership]:
        """What each installed plugin owns (`kubegpu_device_owned`); a plugin that fails to say owns nothing."""
        found = {}
        for name in self.plugins.names:
            try:
                owned = self.plugins.call(name, OWNED_HOOK)
            except PluginHookError as exc:
                log.error("%s; its env and devices are not removed from containers without its allocation", exc)
                continue
            if owned is None:
                continue
            if not isinstance(owned, DeviceOwnership):
                log.error("plugin %r returned %s from %s, not DeviceOwnership", name, type(owned).__name__, OWNED_HOOK)
                continue
            found[name] = owned
        return found

    # -- CreateContainer -----------------------------------------------------------------------------------------

    def create_container(self, body: bytes, *, cdi: CdiMode | None = None, wait: float | None = None) -> bytes:
        """`prepare(...).body`, for a caller that never says what the runtime answered: the whole devices given
        stay held by the container for as long as its sandbox is listed."""
        return self.prepare(body, cdi=cdi, wait=wait).body

    def prepare(self, body: bytes, *, cdi: CdiMode | None = None, wait: float | None = None) -> Creation:
        """The request bytes to forward (`Creation.body`): `body` itself when nothing changes, else the edited request.
        Tell `answered` what the runtime said: until then the container counts as holding the whole devices it was
        given, whether or not the runtime lists it yet.

        `body` is a CreateContainerRequest of CRI v1 or v1alpha2 (the fields read and edited have the same numbers);
        `cdi` overrides the editor's CDI mode for this call (`annotation` for a runtime spoken to in v1alpha2, whose
        ContainerConfig has no CDI field). `wait`: at most how many seconds to wait for the node's device check that
        another creation holds (the caller's deadline; None: as long as it takes).

        Raises `AllocationRefused` (answer FAILED_PRECONDITION), for a failed check and for anything else that goes
        wrong while reading, verifying or applying the allocation; or `ConnectionError` (the API server or the
        runtime could not say what the container may have, or the check was not free within `wait`: answer
        UNAVAILABLE, the kubelet retries).
        """
        try:
            request = api_pb2.CreateContainerRequest.FromString(body)
        except Exception as exc:
            raise AllocationRefused("request", f"the CreateContainer request cannot be decoded: {exc}") from None
        metadata = request.sandbox_config.metadata
        pod = PodIdentity(metadata.namespace, metadata.name, metadata.uid)
        container = request.config.metadata.name
        try:
            edited, holds = self._create(request, body, pod, container, cdi or self.cdi, wait)
            return Creation(edited, request.pod_sandbox_id, container, holds)
        except (AllocationRefused, ConnectionError):
            raise
        except Exception as exc:
            log.exception("CreateContainer of pod %s container %s failed", pod.key, container)
            raise AllocationRefused(
                "error",
                f"pod {pod.key} container {container}: kubegpu could not read or apply the pod's allocation "
                f"({_brief(exc)}); the container is not created",
            ) from None

    def answered(self, creation: Creation, *, created: bool | None) -> None:
        """What the runtime said to a prepared creation: `created` True (it lists the container from now on, and its
        state says whether it holds its devices), False (it refused: nothing was created), None (the answer was lost:
        a deadline, a cancelled call, a dropped connection; the runtime may still create it, so the container goes on
        holding the devices while its sandbox is listed, as when no answer is ever given)."""
        if not creation.holds or created is None:
            return
        with self._creating_lock:
            pending = self._creating.get(creation.sandbox_id)
            if pending is None or pending[creation.container] <= 0:
                return
            pending[creation.container] -= 1
            if pending[creation.container] <= 0:
                del pending[creation.container]
            if not pending:
                del self._creating[creation.sandbox_id]

    def _create(
        self, request: Any, body: bytes, pod: PodIdentity, container: str, cdi: CdiMode, wait: float | None = None
    ) -> tuple[bytes, bool]:
        """The request to forward, and whether it gives the container whole devices (a creation `answered` settles)."""
        # The kubelet's copy of the pod's annotations, else the one the runtime recorded for the sandbox (an editor
        # removed it from the pod since), else (with --kubeconfig) the API server's.
        fallback = request.sandbox_config.annotations.get(ALLOCATION_KEY)
        from_api = fallback is None
        if fallback is None:
            fallback = self._recorded_allocation(request.pod_sandbox_id, pod, container)
            from_api = fallback is None
        if fallback is None:
            fallback = self._allocation_from_api(pod, container)
            if fallback is None:
                return self._edit(request, body, pod, container, None, cdi), False
        if self.sandboxes is None:
            record = verified_allocation(fallback, key=self.key, node=self.node, pod=pod, also=self.verify_keys)
            return self._edit(request, body, pod, container, record, cdi), False
        # A creation that cannot have the check before its caller gives up leaves, rather than hold one of the
        # shim's workers past the deadline: behind a plugin edit that hangs, the kubelet's retries would otherwise
        # take every worker, and the shim would answer nothing else for the node (its sandboxes, its status).
        if not self._lock.acquire(timeout=-1 if wait is None else max(0.0, wait)):
            raise ConnectionError(
                f"pod {pod.key} container {container}: another container's creation has held the node's device "
                "check for longer than this call may wait"
            )
        try:
            listed = {s.id: s for s in self.sandboxes.sandboxes()}
            self._forget_all_but(listed)
            own = listed.get(request.pod_sandbox_id)
            text = self._sandbox_allocation(own, fallback, from_api, pod, container)
            if text is None:
                return self._edit(request, body, pod, container, None, cdi), False
            record = self._verified_for(request.pod_sandbox_id, text, pod)
            wanted = _whole_devices(record, container)
            if wanted:
                self._check_exclusive(request.pod_sandbox_id, pod, container, record, wanted, listed.values())
            edited = self._edit(request, body, pod, container, record, cdi)
            if wanted:
                with self._creating_lock:
                    self._creating.setdefault(request.pod_sandbox_id, Counter())[container] += 1
            return edited, bool(wanted)
        finally:
            self._lock.release()

    def _recorded_allocation(self, sandbox_id: str, pod: PodIdentity, container: str) -> str | None:
        """The allocation the runtime recorded for the sandbox when the request's copy of the pod's annotations has
        none: the pod's was removed after the sandbox was created (an editor, a tool that rewrites annotations), and
        the container's next restart would have lost its devices. It is checked as any: verified, and under the
        node's lock no other live container or creation in flight may hold its devices (`_check_exclusive`), so a
        device the scheduler has since given another pod is refused, never held twice (T208's rules). None when
        there is no runtime view, the sandbox has none, or the runtime cannot say (the API server decides then).
        Asked of this sandbox alone: every container of a pod without devices comes here, and a listing of every
        sandbox on the node costs in proportion to the node's pods."""
        if self.sandboxes is None:
            return None
        try:
            own = self.sandboxes.sandbox(sandbox_id)
        except ConnectionError:
            return None
        if own is None or own.allocation is None:
            return None
        log.warning(
            "the pod's %s was removed after its sandbox was created; the sandbox's is used",
            ALLOCATION_KEY,
            extra={"pod": pod.key, "devices": container},
        )
        return own.allocation

    @staticmethod
    def _sandbox_allocation(
        own: Sandbox | None, fallback: str, from_api: bool, pod: PodIdentity, container: str
    ) -> str | None:
        """The allocation the sandbox was created with, as the runtime recorded it, not the request's copy of the
        pod's annotations, which the pod's owner may have changed since (a rolled-back allocation put back).
        `fallback` (the request's copy, or the API server's when the sandbox was created without one) only when the
        runtime does not know the sandbox or reports no annotations for it."""
        if own is None or not own.annotated:
            return fallback
        if own.allocation is None:
            if from_api:
                return fallback
            log.warning(
                "the pod's %s was added after its sandbox was created; it is not applied",
                ALLOCATION_KEY,
                extra={"pod": pod.key, "devices": container},
            )
            return None
        if not from_api and fallback != own.allocation:
            log.warning(
                "the pod's %s changed after its sandbox was created; the sandbox's is used",
                ALLOCATION_KEY,
                extra={"pod": pod.key, "devices": container},
            )
        return own.allocation

    def _verified_for(self, sandbox_id: str, text: str, pod: PodIdentity) -> AllocationRecord:
        """`verified_allocation`, remembered per sandbox (a sandbox's annotations never change)."""
        cached = self._verified.get(sandbox_id)
        if cached is not None and cached[0] == text and cached[1] is not None and cached[1].podUID == pod.uid:
            return cached[1]
        record = verified_allocation(text, key=self.key, node=self.node, pod=pod, also=self.verify_keys)
        self._verified[sandbox_id] = (text, record)
        return record

    def _held_by(self, sandbox: Sandbox) -> AllocationRecord | None:
        """Another sandbox's verified allocation, or None when it has none that verifies (it holds nothing)."""
        if sandbox.allocation is None:
            return None
        cached = self._verified.get(sandbox.id)
        if cached is not None and cached[0] == sandbox.allocation:
            return cached[1]
        identity = PodIdentity(sandbox.namespace, sandbox.name, sandbox.uid)
        try:
            record: AllocationRecord | None = verified_allocation(
                sandbox.allocation, key=self.key, node=self.node, pod=identity, also=self.verify_keys
            )
        except AllocationRefused:
            record = None
        self._verified[sandbox.id] = (sandbox.allocation, record)
        return record

    # -- RemovePodSandbox ----------------------------------------------------------------------------------------

    def forget_gone_pods(self, wait: float | None = None) -> bool:
        """Tell every plugin the UIDs of the pods still on the node (`kubegpu_device_forget_pods`), so that each
        removes what it keeps on the host for the others (HAMi-core's region directories). Called after each
        RemovePodSandbox. Under the creation lock, with the sandboxes listed under it: a container being created
        holds the lock from its own listing to its plugin edit, so a pod whose sandbox exists when the edit runs is
        never among the gone. `wait`: at most how long to wait for the lock; a call that cannot have it leaves the
        work to the next one. Never raises: a failing runtime or plugin is logged. False when the plugins could not
        be told (the lock held past `wait`, or the runtime could not list its sandboxes)."""
        if self.sandboxes is None:
            return False
        if not self._lock.acquire(timeout=-1 if wait is None else max(0.0, wait)):
            log.info("pods gone from the node are forgotten at the next RemovePodSandbox: creation holds the lock")
            return False
        try:
            listed = {s.id: s for s in self.sandboxes.sandboxes()}
            self._forget_all_but(listed)
            live = frozenset(s.uid for s in listed.values())
            for name in self.plugins.names:
                try:
                    self.plugins.call(name, FORGET_HOOK, live_pods=live)
                except PluginHookError as exc:
                    log.error("%s; what it keeps for gone pods stays until the next RemovePodSandbox", exc)
            return True
        except ConnectionError as exc:
            log.warning("cannot say which pods are gone from the node: %s", exc)
            return False
        finally:
            self._lock.release()

    def _forget_all_but(self, listed: Mapping[str, Sandbox]) -> None:
        for gone in [sandbox_id for sandbox_id in self._verified if sandbox_id not in listed]:
            del self._verified[gone]
        with self._creating_lock:
            for gone in [sandbox_id for sandbox_id in self._creating if sandbox_id not in listed]:
                del self._creating[gone]

    def _check_exclusive(
        self,
        sandbox_id: str,
        pod: PodIdentity,
        container: str,
        record: AllocationRecord,
        wanted: Devices,
        listed: Iterable[Sandbox],
    ) -> None:
        """Refuse when another live pod on this node holds, or was issued later, a whole device `wanted` names.

        Of two verified allocations naming the same device, the one the scheduler issued later is its current
        decision; the earlier is stale (rolled back after a failed bind, or replayed by the pod's owner). A stale
        allocation is refused (`stale`). The later one is refused too while the stale pod's container already has the
        device (`in-use`): a device is never taken from a running container, nor given to two live pods.
        Shared devices (Intel cards, with `shares`) have co-holders by design and are not compared.
        """
        for other in listed:
            if other.id == sandbox_id or not other.ready or other.uid == pod.uid:
                continue
            held = self._held_by(other)
            if held is None:
                continue
            theirs = _whole_devices(held)
            clash = sorted(device for device in wanted if device in theirs)
            if not clash:
                continue
            resource, device = clash[0]
            this, that = _names(pod.key, pod.uid, other.key, other.uid)
            if held.issued > record.issued:
                lingers = _lingers("this pod's", sandbox_id)
                advice = (
                    f"This pod was deleted and {pod.key} created again: do not delete {pod.key}, that name is now "
                    f"{that}'s; {lingers}"
                    if pod.key == other.key
                    else "This allocation was rolled back or replayed: delete the pod so that the scheduler places it "
                    f"again; {_lingers('if it was force-deleted (gone from the API server), its', sandbox_id)}"
                )
                raise AllocationRefused(
                    "stale",
                    f"{this} container {container}: the allocation issued at {_when(record.issued)} is older "
                    f"than {that}'s allocation of the same device ({resource} {device}) issued at "
                    f"{_when(held.issued)}; the scheduler has since given it to {that}. {advice}",
                )
            holders = self._holding(other, set(clash), theirs)
            if holders:
                older = (
                    f"{that}'s allocation is older (stale), but"
                    if held.issued < record.issued
                    else "neither allocation was issued later, and"
                )
                earlier = ", the earlier pod of that name," if pod.key == other.key else ""
                gone = _lingers("if it was force-deleted (gone from the API server), its", other.id)
                raise AllocationRefused(
                    "in-use",
                    f"{this} container {container}: {resource} {device} is in use by container {holders[0]} of "
                    f"{that} (its allocation issued at {_when(held.issued)}, this one at "
                    f"{_when(record.issued)}); {older} a device is never given to two live pods: this container can "
                    f"be created once {that}{earlier} has ended; {gone}",
                )

    def _holding(self, other: Sandbox, clash: set[tuple[str, str]], theirs: Devices) -> list[str]:
        """The containers of `other` that have a device of `clash` now: live in the runtime, or being created (this
        shim gave them their devices and the runtime has not answered). Not every container this shim ever gave one
        to: a stale pod's container that has exited (and whose restarts are refused as `stale`) would otherwise keep
        the device from the pod the scheduler gave it to for as long as the stale pod exists, which a shim
        restarted meanwhile, asking the runtime, does not do."""
        assert self.sandboxes is not None
        live = set(self.sandboxes.live_containers(other.id))
        with self._creating_lock:
            live.update(self._creating.get(other.id, ()))
        return sorted({c for device in clash for c in theirs[device] if c in live})

    # -- the edit ------------------------------------------------------------------------------------------------

    def _edit(
        self,
        request: Any,
        body: bytes,
        pod: PodIdentity,
        container: str,
        record: AllocationRecord | None,
        cdi: CdiMode,
    ) -> bytes:
        """Remove every plugin's entries from the container, add back what `record` grants it; `body` when that
        changes nothing."""
        granted = record is not None and bool(record.given(container))
        if not granted and not self._carries_owned(request.config):
            return body
        before = edit_from_config(request.config)
        edit = before.model_copy(deep=True)
        removed = edit.remove_owned(self.owned, str(self.dev_root))
        applied = self.apply(record, pod, container, edit) if record is not None and granted else ""
        if edit == before:
            return body
        apply_edit(request.config, before, edit, cdi=cdi)
        if applied:
            log.info("applied allocation", extra={"pod": pod.key, "devices": f"{container}:{applied}"})
        else:
            log.info(
                "removed device selections from a container without allocated devices: %s",
                ", ".join(removed),
                extra={"pod": pod.key, "devices": container},
            )
        edited: bytes = request.SerializeToString()
        return edited

    def _carries_owned(self, config: Any) -> bool:
        """Whether a ContainerConfig has anything a plugin owns (read on the protobuf: most containers have none)."""
        owned, dev_root = self.owned, str(self.dev_root)
        return (
            any(owned.owns_env(kv.key) for kv in config.envs)
            or any(owned.owns_device(d.container_path, d.host_path, dev_root) for d in config.devices)
            or any(owned.owns_mount(m.container_path) for m in config.mounts)
            or any(owned.owns_cdi(d.name) for d in config.CDI_devices)
            or any(
                owned.owns_cdi(name.strip())
                for key, value in config.annotations.items()
                if key.startswith(CDI_ANNOTATION_PREFIX)
                for name in value.split(",")
            )
        )

    def apply(self, record: AllocationRecord, pod: PodIdentity, container: str, edit: ContainerEdit) -> str:
        """Route each allocated resource to its owning plugin and let it edit `edit`; a summary for the log."""
        owned: dict[str, dict[str, list[str]]] = {}
        for resource, ids in record.given(container).items():
            owner = self.plugins.owner_of(resource)
            if owner is None:
                raise AllocationRefused(
                    "plugin",
                    f"pod {pod.key} container {container}: no device plugin on this node handles {resource} "
                    f"(installed: {', '.join(self.plugins.names) or 'none'}); install the plugin that provides it",
                )
            owned.setdefault(owner, {})[resource] = list(ids)
        shares = record.shares.get(container, {})
        for plugin, resources in owned.items():
            allocation = ContainerAllocation(
                pod_uid=record.podUID,
                node=record.node,
                container=container,
                resources=resources,
                # A GPU share names its amounts under resources of its own (nvidia.com/gpucores beside
                # nvidia.com/gpu), lent to an init container without ids of them: the plugin's shares go along.
                shares={r: dict(s) for r, s in shares.items() if r in resources or self.plugins.owner_of(r) == plugin},
                fields=dict(record.plugins.get(plugin, {})),
            )
            try:
                self.plugins.call(plugin, EDIT_HOOK, allocation=allocation, edit=edit, dev_root=self.dev_root)
                ContainerEdit.model_validate(edit.model_dump(warnings=False))
            except PluginHookError as exc:
                raise AllocationRefused(
                    "plugin", f"pod {pod.key} container {container}: the allocation cannot be applied: {exc}"
                ) from None
            except ValidationError as exc:
                raise AllocationRefused(
                    "plugin",
                    f"pod {pod.key} container {container}: plugin {plugin!r} left an invalid container config after "
                    f"{EDIT_HOOK}: {describe_validation_error(exc, 'edit')}",
                ) from None
            except BaseException as exc:  # SystemExit and the like: uncaught, the worker would never answer the call
                raise AllocationRefused(
                    "plugin",
                    f"pod {pod.key} container {container}: plugin {plugin!r} failed in {EDIT_HOOK}: {_brief(exc)}",
                ) from None
        return ";".join(f"{r}={','.join(ids)}" for resources in owned.values() for r, ids in resources.items())

    def _allocation_from_api(self, pod: PodIdentity, container: str) -> str | None:
        """The allocation from the API server when the sandbox has none; None when the container needs none."""
        if self.pods is None:
            return None
        manifest = self.pods.get_pod(pod.namespace, pod.name)
        if manifest is None or (manifest.get("metadata") or {}).get("uid") != pod.uid:
            return None  # the pod is gone (or was recreated): the kubelet is about to remove this sandbox
        text = ((manifest.get("metadata") or {}).get("annotations") or {}).get(ALLOCATION_KEY)
        if text is not None:
            return str(text)
        wanted = managed_resources(manifest, container, self.plugins.owner_of)
        if wanted:
            raise AllocationRefused(
                "missing",
                f"pod {pod.key} container {container} requests {', '.join(wanted)} but the pod has no "
                f"{ALLOCATION_KEY} annotation: schedule it with the kubegpu scheduler (spec.schedulerName)",
            )
        return None


class Creation(NamedTuple):
    """A CreateContainer request ready to forward (`ContainerEditor.prepare`): `body`, and whether it gives the
    container `container` of sandbox `sandbox_id` whole devices (`holds`: tell `ContainerEditor.answered`)."""

    body: bytes
    sandbox_id: str
    container: str
    holds: bool


def _whole_devices(record: AllocationRecord, container: str | None = None) -> Devices:
    """(resource, device id) -> containers, for the whole devices one container is given (or all the pod's, with
    every container, init containers included, that is given each). Resources with `shares` are split over shared
    devices (Intel cards) and are left out."""
    devices: Devices = {}
    named = (
        [*record.containers.items(), *record.init.items()]
        if container is None
        else [(container, record.given(container))]
    )
    for name, resources in named:
        shared = record.shares.get(name, {})
        for resource, ids in resources.items():
            if resource not in shared:
                for device in ids:
                    devices.setdefault((resource, device), []).append(name)
    return devices


def _names(key: str, uid: str, other_key: str, other_uid: str) -> tuple[str, str]:
    """How a refusal names this pod and the other: `pod ns/name`, with a short UID each when they share the name (a pod
    deleted, force-deleted or not, and created again under its name: the old one's sandbox may outlive it)."""
    if key != other_key:
        return f"pod {key}", f"pod {other_key}"
    size = UID_CHARS  # UIDs are random: the first characters tell two apart; more only where they do not
    while size < max(len(uid), len(other_uid)) and uid[:size] == other_uid[:size]:
        size += UID_CHARS
    return f"pod {key} (uid {uid[:size]})", f"pod {other_key} (uid {other_uid[:size]})"


def _lingers(whose: str, sandbox_id: str) -> str:
    """Advice for a sandbox whose pod is gone from the API server (force-deleted) while the kubelet has not yet stopped
    it: `kubectl delete` cannot reach it, and deleting the pod of its name would delete another pod."""
    short = sandbox_id[:SANDBOX_ID_CHARS]
    return (
        f"{whose} sandbox {short} lingers on this node until the kubelet stops it: `crictl stopp {short}` stops it now"
    )


def _when(issued: int) -> str:
    """An `issued` stamp for people: the nanoseconds and the UTC time they stand for."""
    if issued <= 0:
        return "an unknown time (no issued stamp)"
    moment = datetime.fromtimestamp(issued / 1e9, tz=timezone.utc)
    return f"{issued} ({moment.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z)"


def _brief(exc: BaseException, limit: int = 300) -> str:
    """`Type: message`, cut to `limit` characters (a message may quote the input it choked on)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def edit_from_config(config: Any) -> ContainerEdit:
    """The parts of a CRI ContainerConfig that plugins may change, as a `ContainerEdit`."""
    return ContainerEdit(
        devices=[
            DeviceNode(host_path=d.host_path, container_path=d.container_path, permissions=d.permissions)
            for d in config.devices
        ],
        envs={kv.key: kv.value for kv in config.envs},
        mounts=[
            Mount(host_path=m.host_path, container_path=m.container_path, readonly=m.readonly) for m in config.mounts
        ],
        cdi_devices=[d.name for d in config.CDI_devices],
        annotations=dict(config.annotations),
    )


def apply_edit(config: Any, before: ContainerEdit, after: ContainerEdit, *, cdi: CdiMode = "field") -> None:
    """Write the changes from `before` to `after` into a CRI ContainerConfig, in place.

    Entries the plugins left alone keep their protobuf as sent (a Mount's propagation and SELinux fields, the order
    of env entries); new ones are appended. CDI names go to the `CDI_devices` field (`field`), or the names the plugins
    added go to the annotation `cdi.k8s.io/kubegpu` for runtimes that read only annotations (`annotation`), or are
    dropped (`off`); names the plugins removed are removed in every mode.
    """
    if after.devices != before.devices:
        _replace(
            config.devices,
            _keep_or_build(
                config.devices,
                [(n.host_path, n.container_path, n.permissions) for n in after.devices],
                lambda d: (d.host_path, d.container_path, d.permissions),
                lambda key: api_pb2.Device(host_path=key[0], container_path=key[1], permissions=key[2]),
            ),
        )
    if after.envs != before.envs:
        envs = []
        seen: set[str] = set()
        for kv in config.envs:
            if kv.key in after.envs:
                kv.value = after.envs[kv.key]  # the kubelet's entry, fields kubegpu does not know included
                envs.append(kv)
                seen.add(kv.key)
        envs.extend(api_pb2.KeyValue(key=k, value=v) for k, v in after.envs.items() if k not in seen)
        _replace(config.envs, envs)
    if after.mounts != before.mounts:
        _replace(
            config.mounts,
            _keep_or_build(
                config.mounts,
                [(m.host_path, m.container_path, m.readonly) for m in after.mounts],
                lambda m: (m.host_path, m.container_path, m.readonly),
                lambda key: api_pb2.Mount(host_path=key[0], container_path=key[1], readonly=key[2]),
            ),
        )
    annotations = dict(after.annotations)
    if after.cdi_devices != before.cdi_devices:
        requested = set(before.cdi_devices)
        if cdi == "field":
            names = list(after.cdi_devices)
        else:
            names = [n for n in after.cdi_devices if n in requested]
            added = [n for n in after.cdi_devices if n not in requested]
            if cdi == "annotation" and added:
                annotations[CDI_ANNOTATION] = ",".join(added)
        _replace(config.CDI_devices, [api_pb2.CDIDevice(name=n) for n in names])
    if annotations != before.annotations:
        config.annotations.clear()
        config.annotations.update(annotations)


def _keep_or_build(
    existing: Iterable[Any],
    wanted: list[tuple[Any, ...]],
    key_of: Callable[[Any], tuple[Any, ...]],
    build: Callable[[tuple[Any, ...]], Any],
) -> list[Any]:
    """The wanted entries in order, reusing the request's own protobuf for each one it already had (so fields kubegpu
    does not model survive), building the others."""
    originals: dict[tuple[Any, ...], list[Any]] = {}
    for entry in existing:
        originals.setdefault(key_of(entry), []).append(entry)
    result = []
    for key in wanted:
        kept = originals.get(key)
        result.append(kept.pop(0) if kept else build(key))
    return result


def _replace(field: Any, items: Sequence[Any]) -> None:
    del field[:]
    field.extend(items)


# ---------------------------------------------------------------------------------------------------------------
# The proxy: one generic handler per RPC of the runtime.v1 and runtime.v1alpha2 services
# ---------------------------------------------------------------------------------------------------------------


class RuntimeVersions:
    """The CRI version the runtime is spoken to in, for each version the shim serves, and the calls to it.

    A served version is forwarded in itself first. When the runtime answers UNIMPLEMENTED "unknown service" (a
    containerd 2.0 has no v1alpha2; a runtime from before v1 has no v1), the served version switches to the other one,
    when it has the method, and the call is made again there once; later calls go there directly. v1 only adds to
    v1alpha2 (fields, methods), so the bytes of a v1alpha2 request are a complete v1 request; a v1 request forwarded
    in v1alpha2 loses only the fields v1alpha2 lacks (`CDI_devices`: the shim then writes CDI names as annotations).
    """

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self._upstream = {version: version for version in CRI_VERSIONS}
        self._methods: dict[str, grpc.UnaryUnaryMultiCallable] = {}

    def upstream(self, served: str) -> str:
        """The version calls of the `served` version are forwarded in now."""
        return self._upstream[served]

    def _method(self, path: str) -> grpc.UnaryUnaryMultiCallable:
        method = self._methods.get(path)
        if method is None:
            method = self._methods[path] = self.channel.unary_unary(path)
        return method

    def call(
        self,
        served: str,
        service: str,
        method: str,
        request: bytes,
        *,
        timeout: float | None,
        metadata: Sequence[tuple[str, str | bytes]] | None = None,
    ) -> tuple[bytes, Any]:
        """`(response bytes, call)` of one unary call, in the version the runtime speaks."""
        upstream = self._upstream[served]
        try:
            return self._method(f"/runtime.{upstream}.{service}/{method}").with_call(  # type: ignore[no-any-return]
                request, timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as error:
            other = self._switch(served, upstream, service, method, error)
            if other is None:
                raise
        return self._method(f"/runtime.{other}.{service}/{method}").with_call(  # type: ignore[no-any-return]
            request, timeout=timeout, metadata=metadata
        )

    def _switch(self, served: str, upstream: str, service: str, method: str, error: grpc.RpcError) -> str | None:
        """The version to call `method` in again, after `error`; None when it is the runtime's answer to pass on."""
        call: Any = error
        if call.code() is not grpc.StatusCode.UNIMPLEMENTED:
            return None
        # grpc-go says "unknown service runtime.v1alpha2.RuntimeService"; other servers only that the method was not
        # found, which a runtime also answers for one method it lacks: then the version's Version call tells.
        if not (call.details() or "").startswith(f"unknown service runtime.{upstream}.") and self._speaks(upstream):
            return None
        for other, module in CRI_VERSIONS.items():
            if other != upstream and method in module.DESCRIPTOR.services_by_name[service].methods_by_name:
                log.info("the runtime does not speak CRI %s; CRI %s calls are forwarded in %s", upstream, served, other)
                self._upstream[served] = other
                return other
        return None

    def _speaks(self, version: str) -> bool:
        try:
            self._method(f"/runtime.{version}.{RUNTIME}/Version")(b"", timeout=5.0)
        except grpc.RpcError as error:
            return error.code() is not grpc.StatusCode.UNIMPLEMENTED
        return True


def _remaining(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > NO_DEADLINE else remaining


def _answer_within(context: grpc.ServicerContext) -> float | None:
    """How long the call may wait and still be answered before its deadline: a tenth (at most a second) is kept for
    the answer to travel."""
    remaining = _remaining(context)
    return None if remaining is None else remaining - min(1.0, remaining / 10)


def _metadata(context: grpc.ServicerContext) -> list[tuple[str, str | bytes]]:
    return [
        (k, v)
        for k, v in context.invocation_metadata()
        if not k.startswith((":", "grpc-")) and k not in RESERVED_METADATA
    ]


def _fail(context: grpc.ServicerContext, error: grpc.RpcError) -> None:
    """End the call with the runtime's status, details and trailing metadata."""
    call: Any = error
    trailing = call.trailing_metadata()
    if trailing:
        context.set_trailing_metadata(trailing)
    context.abort(call.code(), call.details() or "")


def _unary(
    versions: RuntimeVersions,
    served: str,
    service: str,
    method: str,
    answered: Callable[[grpc.RpcError | None], None] | None = None,
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    """`answered` (if given) is told the runtime's error, or None, before the caller is answered."""

    def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            response, call = versions.call(
                served, service, method, request, timeout=_remaining(context), metadata=_metadata(context)
            )
        except grpc.RpcError as error:
            if answered is not None:
                answered(error)
            _fail(context, error)
            raise  # not reached: abort raised
        if answered is not None:
            answered(None)
        initial, trailing = call.initial_metadata(), call.trailing_metadata()
        if initial:
            context.send_initial_metadata(initial)
        if trailing:
            context.set_trailing_metadata(trailing)
        return response

    return forward


def _server_stream(method: grpc.UnaryStreamMultiCallable) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
    def forward(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        call: Any = method(request, timeout=_remaining(context), metadata=_metadata(context))
        context.add_callback(call.cancel)  # the caller went away: stop the upstream stream too
        first = True
        try:
            for item in call:
                if first:
                    first = False
                    initial = call.initial_metadata()
                    if initial:
                        context.send_initial_metadata(initial)
                yield item
        except grpc.RpcError as error:
            if error.code() is grpc.StatusCode.CANCELLED and not context.is_active():
                return
            _fail(context, error)
        trailing = call.trailing_metadata()
        if trailing:
            context.set_trailing_metadata(trailing)

    return forward


def _create_container(
    versions: RuntimeVersions, served: str, editor: ContainerEditor
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def create(request: bytes, context: grpc.ServicerContext) -> bytes:
        # v1alpha2's ContainerConfig has no CDI field: CDI names for a runtime spoken to in it go to annotations.
        cdi: CdiMode = "annotation" if editor.cdi == "field" and versions.upstream(served) != "v1" else editor.cdi
        try:
            creation = editor.prepare(request, cdi=cdi, wait=_answer_within(context))
        except AllocationRefused as refused:
            log.warning("refused CreateContainer: %s", refused, extra={"reason": refused.check})
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"kubegpu: {refused.check} check failed: {refused}")
        except ConnectionError as exc:
            log.warning("cannot decide CreateContainer: %s", exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"kubegpu: {exc}")
        except Exception as exc:  # a bug of the shim's own: still a refusal, never UNKNOWN or an unedited container
            log.exception("CreateContainer failed")
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"kubegpu: error check failed: {_brief(exc)}")

        def answered(error: grpc.RpcError | None) -> None:
            # A runtime that answered created the container or refused it; one whose answer was lost may still.
            code = None if error is None else error.code()
            editor.answered(creation, created=True if code is None else False if code not in LOST else None)

        return _unary(versions, served, RUNTIME, "CreateContainer", answered)(creation.body, context)

    return create


def _remove_pod_sandbox(
    versions: RuntimeVersions, served: str, editor: ContainerEditor
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    forward = _unary(versions, served, RUNTIME, "RemovePodSandbox")

    def remove(request: bytes, context: grpc.ServicerContext) -> bytes:
        response = forward(request, context)
        # The runtime's answer comes back unchanged; what the plugins kept for the pods now gone goes first.
        try:
            editor.forget_gone_pods(wait=_answer_within(context))
        except Exception:  # a bug of the shim's own: the sandbox is removed all the same
            log.exception("forgetting the pods gone from the node failed")
        return response

    return remove


def proxy_handlers(versions: RuntimeVersions, editor: ContainerEditor) -> list[grpc.GenericRpcHandler]:
    """Generic handlers for every method of the RuntimeService and ImageService of every served CRI version."""
    handlers = []
    for served, module in CRI_VERSIONS.items():
        for service in module.DESCRIPTOR.services_by_name.values():
            methods: dict[str, grpc.RpcMethodHandler] = {}
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                if method.client_streaming:
                    raise NotImplementedError(f"{path}: client-streaming RPCs are not part of CRI")
                if method.server_streaming:
                    methods[method.name] = grpc.unary_stream_rpc_method_handler(
                        _server_stream(versions.channel.unary_stream(path))
                    )
                elif service.name == RUNTIME and method.name == "CreateContainer":
                    methods[method.name] = grpc.unary_unary_rpc_method_handler(
                        _create_container(versions, served, editor)
                    )
                elif service.name == RUNTIME and method.name == "RemovePodSandbox":
                    methods[method.name] = grpc.unary_unary_rpc_method_handler(
                        _remove_pod_sandbox(versions, served, editor)
                    )
                else:
                    methods[method.name] = grpc.unary_unary_rpc_method_handler(
                        _unary(versions, served, service.name, method.name)
                    )
            handlers.append(grpc.method_handlers_generic_handler(service.full_name, methods))
    return handlers


# ---------------------------------------------------------------------------------------------------------------
# Serving
# ---------------------------------------------------------------------------------------------------------------


def unix_path(endpoint: str) -> Path:
    """`unix:///run/kubegpu/cri.sock` (or a plain path) -> the socket path."""
    if endpoint.startswith("unix://"):
        endpoint = endpoint[len("unix://") :]
    elif "://" in endpoint:
        raise ValueError(f"{endpoint}: only unix sockets are supported (unix:///path/to/socket)")
    if not endpoint.startswith("/"):
        raise ValueError(f"{endpoint}: the socket path must be absolute")
    return Path(endpoint)


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file left by a shim that died; refuse to take over a socket someone still serves."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SystemExit(f"kubegpu crishim: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)
    else:
        raise SystemExit(f"kubegpu crishim: another process is serving {path}")
    finally:
        probe.close()


@dataclass
class RunningShim:
    """A started shim: its gRPC server, its channel to the runtime, and its socket."""

    server: grpc.Server
    channel: grpc.Channel
    socket: Path
    stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self, grace: float = 5.0) -> None:
        self.stopping.set()
        self.server.stop(grace).wait()
        self.channel.close()
        self.socket.unlink(missing_ok=True)


def start_shim(listen: str, runtime_endpoint: str, editor: ContainerEditor, *, workers: int = 32) -> RunningShim:
    """Serve the shim on `listen` (a unix socket, created with mode 0600) in front of `runtime_endpoint`.

    An editor without a `SandboxSource` gets the runtime's (`RuntimeSandboxes` on the same channel). Once serving,
    it tells the plugins the pods on the node (`ContainerEditor.forget_gone_pods`), as after each RemovePodSandbox."""
    path = unix_path(listen)
    unix_path(runtime_endpoint)  # fail early on a malformed endpoint
    path.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_socket(path)
    channel = grpc.insecure_channel(runtime_endpoint, options=MESSAGE_OPTIONS + RECONNECT_OPTIONS)
    versions = RuntimeVersions(channel)
    if editor.sandboxes is None:
        editor.sandboxes = RuntimeSandboxes(versions)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="crishim"), options=MESSAGE_OPTIONS
    )
    server.add_generic_rpc_handlers(proxy_handlers(versions, editor))
    # The socket is bound here: the umask makes it 0600 from its first moment (the kubelet runs as root), and the
    # chmod holds even where a filesystem ignores the umask for sockets. Nothing is served before start().
    previous = os.umask(0o177)
    try:
        if not server.add_insecure_port(f"unix://{path}"):
            raise SystemExit(f"kubegpu crishim: cannot listen on {path}")
    finally:
        os.umask(previous)
    path.chmod(0o600)
    server.start()
    # Pods removed while no shim ran left what the plugins keep for them (HAMi-core's region directories): forget
    # them now, beside the calls already served, and again until the runtime answers (a node whose containerd
    # starts after the shim may see no RemovePodSandbox for days).
    running = RunningShim(server, channel, path)
    threading.Thread(
        target=_forget_at_start, args=(editor, running.stopping), name="crishim-forget", daemon=True
    ).start()
    return running


# How long the shim waits before it asks a runtime that could not list its sandboxes at start again: doubling from
# the first to the last, then the last until it answers (or a RemovePodSandbox has done it).
FORGET_RETRY_FIRST, FORGET_RETRY_LAST = 1.0, 60.0


def _forget_at_start(editor: ContainerEditor, stopping: threading.Event) -> None:
    delay = FORGET_RETRY_FIRST
    while not stopping.is_set():
        try:
            if editor.forget_gone_pods():
                return
        except Exception:  # a bug of the shim's own: the shim serves all the same, and the next removal tries again
            log.exception("forgetting the pods gone from the node at start failed")
            return
        if stopping.wait(delay):
            return
        delay = min(FORGET_RETRY_LAST, delay * 2)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default="unix:///run/kubegpu/cri.sock", help="the kubelet's --container-runtime-endpoint"
    )
    parser.add_argument(
        "--runtime-endpoint", default="unix:///run/containerd/containerd.sock", help="the real runtime's CRI socket"
    )
    parser.add_argument("--node-name", required=True, help="this node's name, as allocations name it")
    parser.add_argument("--allocation-key-file", required=True, help="HMAC key shared with the kubegpu scheduler")
    add_verify_key_argument(parser)
    parser.add_argument(
        "--kubeconfig", help="read pods from the API server when a sandbox carries no allocation (default: don't)"
    )
    parser.add_argument("--dev-root", default="/dev", help="where host device files are (default /dev)")
    parser.add_argument(
        "--cdi",
        choices=["field", "annotation", "off"],
        default="field",
        help="where CDI device names go: the CRI CDI_devices field (default), the cdi.k8s.io/kubegpu annotation, "
        "or nowhere (runtimes without CDI)",
    )
    parser.add_argument("--workers", type=int, default=32, help="calls served at once (default 32)")
    parser.add_argument("--shutdown-grace", type=float, default=5.0, help="seconds calls get to finish on SIGTERM")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def add_crishim_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "crishim",
        help="the CRI shim in front of containerd that applies kubegpu allocations to containers",
        description=DESCRIPTION,
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from kubegpu.core.process import configure_logging, read_key, read_verify_keys

    configure_logging(args.log_level)
    key = read_key(args.allocation_key_file)
    verify_keys = read_verify_keys(args.allocation_verify_key_file, key)
    plugins = make_plugin_manager("device")
    for failure in plugins.failures:
        log.error("%s", failure)
    pods: PodSource | None = None
    if args.kubeconfig:
        from kubegpu.kube.client import KubeClient

        pods = ApiPods(KubeClient.from_kubeconfig(args.kubeconfig, connections=4, timeout=5.0))
    editor = ContainerEditor(
        plugins,
        node=args.node_name,
        key=key,
        verify_keys=verify_keys,
        dev_root=Path(args.dev_root),
        pods=pods,
        cdi=args.cdi,
    )
    try:
        shim = start_shim(args.listen, args.runtime_endpoint, editor, workers=args.workers)
    except ValueError as exc:
        raise SystemExit(f"kubegpu crishim: {exc}") from None
    stop = threading.Event()

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    log.info(
        "kubegpu crishim serving %s in front of %s for node %s (plugins: %s)",
        shim.socket,
        args.runtime_endpoint,
        args.node_name,
        ", ".join(plugins.names) or "none",
    )
    stop.wait()
    shim.stop(args.shutdown_grace)
    log.info("stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kubegpu crishim", description=DESCRIPTION)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
