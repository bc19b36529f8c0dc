"""`kubegpu crishim`: the CRI shim between the kubelet and containerd that hands each container its devices.

The kubelet talks CRI (`runtime.v1` RuntimeService and ImageService) to the shim's unix socket; the shim forwards
every call to the runtime's socket. The method table is generated from the service descriptors of the generated
stubs (PyPI `container-runtime-interface-api`), so no RPC is left out: requests and responses travel as raw bytes
(never decoded, so never altered), with the caller's metadata, the remaining deadline, and the runtime's status code,
details and metadata passed back unchanged. The server-streaming GetContainerEvents is relayed message by message,
and a caller that goes away cancels the call upstream.

Only CreateContainer is looked at. The kubelet copies the pod's annotations into the request's sandbox config, so
the scheduler's `kubegpu.io/allocation` is there (when it is not and `--kubeconfig` is given, the pod is read from the
API server). The allocation must be signed with this node's key, name this node and this pod (`verify.py`); then each
resource allocated to the container goes to the plugin that owns it (`Device.kubegpu_device_edit_container`), which
edits a runtime-neutral copy of the container config (`ContainerEdit`: device nodes, env, mounts, CDI names,
annotations). The edit is written back into the protobuf, keeping every field the plugins do not model as the kubelet
sent it. A refusal (missing, unsigned, tampered, copied or foreign allocation; a plugin that fails) answers
`FAILED_PRECONDITION` naming the check, and nothing reaches the runtime. A container of a pod without a kubegpu
allocation, or without allocated devices, is forwarded byte for byte.

When the runtime is down, callers get `UNAVAILABLE`, as they would from the runtime's own socket; the channel to the
runtime reconnects by itself (backoff capped at one second), so a restarted containerd is picked up without
restarting the shim. The listening socket is created with mode 0600; SIGTERM stops the server gracefully (exit 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import grpc
from cri_api.v1 import api_pb2

from kubegpu.core.annotations import ALLOCATION_KEY, AllocationRecord
from kubegpu.core.models import ContainerAllocation, ContainerEdit, DeviceNode, Mount
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.crishim.verify import AllocationRefused, PodIdentity, managed_resources, verified_allocation

__all__ = [
    "CDI_ANNOTATION",
    "ApiPods",
    "ContainerEditor",
    "PodSource",
    "RunningShim",
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
CREATE_CONTAINER = "/runtime.v1.RuntimeService/CreateContainer"
CDI_ANNOTATION = "cdi.k8s.io/kubegpu"  # where `--cdi annotation` puts the CDI names the plugins added
CdiMode = Literal["field", "annotation", "off"]
DESCRIPTION = (
    "Serve CRI runtime.v1 on --listen, forwarding every call to --runtime-endpoint; CreateContainer requests of pods "
    "with a kubegpu.io/allocation are verified (signature, node, pod) and edited by the owning device plugins "
    "(device nodes, env, mounts, CDI names)."
)

# A deadline further away than this is "no deadline": the sync server reports ~9.2e18 s when the caller set none.
NO_DEADLINE = 10 * 365 * 24 * 3600.0
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
        from kubegpu.scheduler.kube import ApiError

        try:
            pod: Mapping[str, Any] = self.client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise ConnectionError(f"reading pod {namespace}/{name} from the API server: {exc}") from None
        return pod


class ContainerEditor:
    """Applies verified allocations to CreateContainer requests; knows nothing about sockets or servers."""

    def __init__(
        self,
        plugins: KubegpuPluginManager,
        *,
        node: str,
        key: bytes,
        dev_root: Path = Path("/dev"),
        pods: PodSource | None = None,
        cdi: CdiMode = "field",
    ) -> None:
        self.plugins = plugins
        self.node = node
        self.key = key
        self.dev_root = dev_root
        self.pods = pods
        self.cdi: CdiMode = cdi

    def create_container(self, body: bytes) -> bytes:
        """The request bytes to forward: `body` itself when nothing changes, else the edited request.

        Raises `AllocationRefused` (answer FAILED_PRECONDITION) or `ConnectionError` (the API server could not say
        whether the pod needs devices: answer UNAVAILABLE, the kubelet retries).
        """
        request = api_pb2.CreateContainerRequest.FromString(body)
        metadata = request.sandbox_config.metadata
        pod = PodIdentity(metadata.namespace, metadata.name, metadata.uid)
        container = request.config.metadata.name
        text = request.sandbox_config.annotations.get(ALLOCATION_KEY)
        if text is None:
            text = self._allocation_from_api(pod, container)
            if text is None:
                return body
        record = verified_allocation(text, key=self.key, node=self.node, pod=pod)
        resources = record.containers.get(container)
        if not resources:
            return body
        before = edit_from_config(request.config)
        edit = before.model_copy(deep=True)
        applied = self.apply(record, pod, container, edit)
        if edit == before:
            return body
        apply_edit(request.config, before, edit, cdi=self.cdi)
        log.info("applied allocation", extra={"pod": pod.key, "devices": f"{container}:{applied}"})
        edited: bytes = request.SerializeToString()
        return edited

    def apply(self, record: AllocationRecord, pod: PodIdentity, container: str, edit: ContainerEdit) -> str:
        """Route each allocated resource to its owning plugin and let it edit `edit`; a summary for the log."""
        owned: dict[str, dict[str, list[str]]] = {}
        for resource, ids in record.containers.get(container, {}).items():
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
                shares={r: dict(s) for r, s in shares.items() if r in resources},
                fields=dict(record.plugins.get(plugin, {})),
            )
            try:
                self.plugins.call(plugin, EDIT_HOOK, allocation=allocation, edit=edit, dev_root=self.dev_root)
            except PluginHookError as exc:
                raise AllocationRefused(
                    "plugin", f"pod {pod.key} container {container}: the allocation cannot be applied: {exc}"
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
                envs.append(api_pb2.KeyValue(key=kv.key, value=after.envs[kv.key]))
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
# The proxy: one generic handler per RPC of the runtime.v1 services
# ---------------------------------------------------------------------------------------------------------------


def _remaining(context: grpc.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None or remaining > NO_DEADLINE else remaining


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


def _unary(method: grpc.UnaryUnaryMultiCallable) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            response, call = method.with_call(request, timeout=_remaining(context), metadata=_metadata(context))
        except grpc.RpcError as error:
            _fail(context, error)
            raise  # not reached: abort raised
        initial, trailing = call.initial_metadata(), call.trailing_metadata()
        if initial:
            context.send_initial_metadata(initial)
        if trailing:
            context.set_trailing_metadata(trailing)
        response_bytes: bytes = response
        return response_bytes

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
    method: grpc.UnaryUnaryMultiCallable, editor: ContainerEditor
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    forward = _unary(method)

    def create(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            edited = editor.create_container(request)
        except AllocationRefused as refused:
            log.warning("refused CreateContainer: %s", refused, extra={"reason": refused.check})
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"kubegpu: {refused.check} check failed: {refused}")
        except ConnectionError as exc:
            log.warning("cannot decide CreateContainer: %s", exc)
            context.abort(grpc.StatusCode.UNAVAILABLE, f"kubegpu: {exc}")
        return forward(edited, context)

    return create


def proxy_handlers(channel: grpc.Channel, editor: ContainerEditor) -> list[grpc.GenericRpcHandler]:
    """Generic handlers for every method of runtime.v1 RuntimeService and ImageService, forwarding to `channel`."""
    handlers = []
    for service in api_pb2.DESCRIPTOR.services_by_name.values():
        methods: dict[str, grpc.RpcMethodHandler] = {}
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            if method.client_streaming:
                raise NotImplementedError(f"{path}: client-streaming RPCs are not part of CRI v1")
            if method.server_streaming:
                methods[method.name] = grpc.unary_stream_rpc_method_handler(_server_stream(channel.unary_stream(path)))
            elif path == CREATE_CONTAINER:
                methods[method.name] = grpc.unary_unary_rpc_method_handler(
                    _create_container(channel.unary_unary(path), editor)
                )
            else:
                methods[method.name] = grpc.unary_unary_rpc_method_handler(_unary(channel.unary_unary(path)))
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

    def stop(self, grace: float = 5.0) -> None:
        self.server.stop(grace).wait()
        self.channel.close()
        self.socket.unlink(missing_ok=True)


def start_shim(listen: str, runtime_endpoint: str, editor: ContainerEditor, *, workers: int = 32) -> RunningShim:
    """Serve the shim on `listen` (a unix socket, created with mode 0600) in front of `runtime_endpoint`."""
    path = unix_path(listen)
    unix_path(runtime_endpoint)  # fail early on a malformed endpoint
    path.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_socket(path)
    channel = grpc.insecure_channel(runtime_endpoint, options=MESSAGE_OPTIONS + RECONNECT_OPTIONS)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="crishim"), options=MESSAGE_OPTIONS
    )
    server.add_generic_rpc_handlers(proxy_handlers(channel, editor))
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
    return RunningShim(server, channel, path)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default="unix:///run/kubegpu/cri.sock", help="the kubelet's --container-runtime-endpoint"
    )
    parser.add_argument(
        "--runtime-endpoint", default="unix:///run/containerd/containerd.sock", help="the real runtime's CRI socket"
    )
    parser.add_argument("--node-name", required=True, help="this node's name, as allocations name it")
    parser.add_argument("--allocation-key-file", required=True, help="HMAC key shared with the kubegpu scheduler")
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
    from kubegpu.core.process import configure_logging, read_key

    configure_logging(args.log_level)
    key = read_key(args.allocation_key_file)
    plugins = make_plugin_manager("device")
    for failure in plugins.failures:
        log.error("%s", failure)
    pods: PodSource | None = None
    if args.kubeconfig:
        from kubegpu.scheduler.kube import KubeClient

        pods = ApiPods(KubeClient.from_kubeconfig(args.kubeconfig, connections=4, timeout=5.0))
    editor = ContainerEditor(
        plugins, node=args.node_name, key=key, dev_root=Path(args.dev_root), pods=pods, cdi=args.cdi
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
