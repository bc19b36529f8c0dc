"""`kubegpu advertise`: publish a node's devices, as its plugins find them, on the Node object.

The advertiser runs on every device node (a DaemonSet, `examples/deploy/node/`). At every interval it asks each
installed device plugin to discover its devices under the host root (`kubegpu_device_discover`) and to check them
(`kubegpu_device_health`), and publishes the result as the node annotation `kubegpu.io/devices`, which the
scheduler side reads as `node.inventories`. A device that was advertised before (in this process, or in the
annotation a previous advertiser left) but is not found any more stays in the inventory, marked unhealthy: the
scheduler then stops placing pods on it. While devices are missing,
the plugin's last topology is kept, so one lost device does not change the shape of the node (a torus does not
become a ring).

A plugin that fails (raises in a hook) is logged with its name and skipped; what it published before is left as it
was, because nothing new is known about its devices. A plugin that failed to load keeps its published inventory for
the same reason.

The Node is patched only when something changed: the annotation is compared with the node's current one, and with
`--update-capacity` the extended resources of the plugins' advertisements (`kubegpu_device_advertise`) are compared
with the node's status capacity and allocatable (patched through the `status` subresource, the documented way of
advertising extended resources by hand), and their labels with the node's labels. Labels this process set before
and no plugin asks for now are removed. Leave `--update-capacity` off where a vendor device plugin already
advertises the same resources through the kubelet: both would write them.

Liveness: beside the rounds, a thread renews the node's kubegpu Lease, `--lease-namespace`/`kubegpu-NODE`
(`kube-node-lease` by default), holder the node's name, `leaseDurationSeconds` the `--lease-duration` (default 8 s),
every `--lease-renew-interval` (default 2 s), as nvidia-gpu-scheduler's node daemons do. The scheduler and the
extender stop placing device pods on a node whose Lease expired (`kubegpu.scheduler.liveness`). The Lease is renewed
only while the rounds go on: when no round has finished for three intervals plus the Lease's duration (discovery hung
on a sysfs read, say), renewing stops and the node goes out of service until a round completes again. On SIGTERM the
Lease is left to expire, not deleted, so a restarting advertiser (a DaemonSet rollout) keeps its node in service when
it is back within the duration.

With `--pod-resources-socket` (the kubelet's `pod-resources/kubelet.sock`), each round also reads the kubelet's
PodResources `List` and publishes the device ids of the pods kubegpu did not place as `kubegpu.io/foreign-devices`
(`kubegpu.crishim.podresources`), so the scheduler counts exactly those ids. Without the socket the annotation is
left as it is.

DRA (`kubegpu.crishim.slices`): where the API server serves `resource.k8s.io/v1` (Kubernetes 1.34+), each round
also keeps one ResourceSlice per plugin (`neuron.kubegpu.io`, `nvidia.kubegpu.io`, `gpu.intel.kubegpu.io`) equal to
the healthy devices found, with the attributes kubegpu's topology rules read; `--resource-slices off` turns it off.

API calls go through `kubegpu.kube.client.KubeClient` (a kubeconfig, or the in-cluster service account).
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubegpu.core.annotations import (
    DEVICES_KEY,
    FOREIGN_DEVICES_KEY,
    MAX_ANNOTATION_BYTES,
    NODE_LEASE_LABEL,
    NODE_LEASE_NAMESPACE,
    NODE_LEASE_PREFIX,
    decode_devices,
    encode_devices,
    encode_foreign_devices,
)
from kubegpu.core.errors import InputError
from kubegpu.core.models import Advertisement, DeviceInfo, DeviceInventory, NodeDevices
from kubegpu.core.plugin_manager import KubegpuPluginManager, PluginHookError, make_plugin_manager
from kubegpu.core.process import parse_interval
from kubegpu.core.quantity import QuantityError, to_int
from kubegpu.crishim import podresources
from kubegpu.crishim.slices import SlicePublisher
from kubegpu.kube.client import ApiError, KubeClient, now_rfc3339

__all__ = [
    "Advertiser",
    "NodeLease",
    "RoundResult",
    "add_advertise_parser",
    "main",
    "mark_missing",
    "parse_interval",
    "run",
]

log = logging.getLogger("kubegpu.advertise")

DEFAULT_INTERVAL = "20s"
DEFAULT_LEASE_DURATION = "8s"
DEFAULT_LEASE_RENEW = "2s"
DESCRIPTION = (
    "Discover this node's devices through the installed device plugins and keep the Node's kubegpu.io/devices "
    "annotation (and, with --update-capacity, its extended-resource capacity and labels) up to date; devices that "
    "disappear are kept, marked unhealthy, so that no new pod is placed on them."
)


# ------------------------------------------------------------------------------------------------------------
# One round
# ------------------------------------------------------------------------------------------------------------


@dataclass
class RoundResult:
    """What one round did: which parts of the Node it patched, or the error that stopped it."""

    annotation: bool = False
    labels: bool = False
    status: bool = False
    slices: int = 0  # ResourceSlices created, replaced or deleted
    error: str | None = None
    devices: NodeDevices = field(default_factory=NodeDevices)

    @property
    def ok(self) -> bool:
        return self.error is None


class Advertiser:
    """Discovers devices through the plugins and keeps one Node's annotation (and capacity, labels) in step."""

    def __init__(
        self,
        client: KubeClient,
        plugins: KubegpuPluginManager,
        node_name: str,
        host_root: Path,
        *,
        update_capacity: bool = False,
        pod_resources: Path | None = None,
        resource_slices: bool = True,
    ) -> None:
        self.slices = SlicePublisher(client, node_name) if resource_slices else None
        self.client = client
        self.pod_resources = pod_resources  # the kubelet's PodResources socket, None: not read
        self.plugins = plugins
        self.node_name = node_name
        self.host_root = host_root
        self.update_capacity = update_capacity
        self.previous: dict[str, DeviceInventory] = {}
        self.labels_set: set[str] = set()
        self.advertised: dict[str, Advertisement] = {}
        self.last_round = time.monotonic()  # when the last round ended (the Lease is renewed while rounds go on)

    @property
    def path(self) -> str:
        return f"/api/v1/nodes/{self.node_name}"

    def run_once(self) -> RoundResult:
        """Discover, compare with the Node, patch what changed. API errors end the round (logged), never the loop."""
        try:
            node = self.client.get(self.path)
        except ApiError as exc:
            message = f"cannot read node {self.node_name}: {exc}"
            log.error("%s", message, extra={"node": self.node_name})
            return RoundResult(error=message)
        metadata = node.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        published = self._published(annotations.get(DEVICES_KEY))
        devices, advertisements = self.collect(published)
        devices = self._within_limit(devices, advertisements, annotations)
        result = RoundResult(devices=devices)

        patch: dict[str, Any] = {}
        encoded = encode_devices(devices)
        if published is None or encode_devices(published) != encoded:
            patch["annotations"] = {DEVICES_KEY: encoded}
        foreign = self._foreign_devices()
        if foreign is not None:
            value = encode_foreign_devices(foreign) if foreign else None
            if annotations.get(FOREIGN_DEVICES_KEY) != value:
                patch.setdefault("annotations", {})[FOREIGN_DEVICES_KEY] = value  # None: removed (merge patch)
        if self.update_capacity:
            labels = self._label_changes(metadata.get("labels") or {}, advertisements)
            if labels:
                patch["labels"] = labels
        try:
            if patch:
                self.client.patch(self.path, {"metadata": patch})
                result.annotation, result.labels = "annotations" in patch, "labels" in patch
                log.info(
                    "node updated",
                    extra={"node": self.node_name, "devices": _summary(devices), "reason": ",".join(sorted(patch))},
                )
            if self.update_capacity:
                status = self._status_changes(node.get("status") or {}, advertisements)
                if status:
                    self.client.patch(f"{self.path}/status", {"status": status})
                    result.status = True
                    log.info("node capacity updated", extra={"node": self.node_name, "devices": status["capacity"]})
        except ApiError as exc:
            result.error = f"cannot patch node {self.node_name}: {exc}"
            log.error("%s", result.error, extra={"node": self.node_name})
            return result
        if self.slices is not None:
            try:
                result.slices = self.slices.publish(str(metadata.get("uid") or ""), devices)
            except ApiError as exc:
                result.error = f"cannot publish the resource slices of node {self.node_name}: {exc}"
                log.error("%s", result.error, extra={"node": self.node_name})
        self.labels_set = {k for a in advertisements.values() for k in a.labels}
        return result

    def run_round(self) -> RoundResult:
        """`run_once`, then note that a round ended (whatever its outcome: the process is alive and not stuck)."""
        try:
            return self.run_once()
        finally:
            self.last_round = time.monotonic()

    def _foreign_devices(self) -> podresources.Held | None:
        """The ids the kubelet gave pods kubegpu did not place, or None when that cannot be known this round."""
        socket = self.pod_resources
        if socket is None or not socket.exists():
            return None
        try:
            held = podresources.list_pod_resources(socket)
            pods: list[dict[str, Any]] = []
            if held:
                pods, _ = self.client.list("/api/v1/pods", fieldSelector=f"spec.nodeName={self.node_name}")
        except (ConnectionError, ApiError) as exc:
            log.warning("foreign devices left as published: %s", exc, extra={"node": self.node_name})
            return None
        return podresources.foreign_devices(held, pods)

    def collect(self, published: NodeDevices | None) -> tuple[NodeDevices, dict[str, Advertisement]]:
        """Every plugin's inventory (missing devices kept as unhealthy) and, with `update_capacity`, its
        advertisement. `published` is the node's current annotation (None when it has none or it is unreadable)."""
        before = dict(published.inventories) if published is not None else {}
        inventories: dict[str, DeviceInventory] = {}
        advertisements: dict[str, Advertisement] = {}
        for name in self.plugins.names:
            try:
                found = self.plugins.call(name, "kubegpu_device_discover", host_root=self.host_root)
            except PluginHookError as exc:
                log.error("plugin skipped this round: %s", exc, extra={"node": self.node_name})
                if name in before:
                    inventories[name] = before[name]
                if name in self.advertised:  # its labels and capacity stay as they were, too
                    advertisements[name] = self.advertised[name]
                continue
            if found is not None:
                found = self._checked(name, found.model_copy(update={"plugin": name}))
            inventory = mark_missing(found, self.previous.get(name) or before.get(name))
            if inventory is None:
                continue
            self.previous[name] = inventories[name] = inventory
            if self.update_capacity:
                advertisement = self._advertise(name, inventory)
                if advertisement is not None:
                    advertisements[name] = advertisement
        for failure in self.plugins.failures:
            # A plugin that could not load says nothing about its devices: what it published stays.
            if failure.name in before and failure.name not in inventories and failure.name not in self.plugins.names:
                inventories[failure.name] = before[failure.name]
        self.advertised = advertisements
        return NodeDevices(inventories=inventories), advertisements

    def _within_limit(
        self, devices: NodeDevices, advertisements: dict[str, Advertisement], annotations: Mapping[str, Any]
    ) -> NodeDevices:
        """The inventories to publish, within what the API server takes for all of a Node's annotations (256 KiB,
        the node's other annotations counted): the devices annotation goes in one patch with every plugin's, so one
        plugin's inventory too large (thousands of devices, long attributes) failed the whole patch and every
        plugin's devices went stale. The largest inventory is left out (and its advertisement with it) until the
        rest fits, logged naming the plugin and its size."""
        others = sum(
            len(str(k).encode()) + len(str(v).encode())
            for k, v in annotations.items()
            if k != DEVICES_KEY and isinstance(v, str)
        )
        budget = MAX_ANNOTATION_BYTES - others - len(DEVICES_KEY)
        inventories = dict(devices.inventories)
        while inventories and len(encode_devices(NodeDevices(inventories=inventories)).encode()) > budget:
            sizes = {
                name: len(encode_devices(NodeDevices(inventories={name: inventory})).encode())
                for name, inventory in inventories.items()
            }
            name = max(sizes, key=lambda n: (sizes[n], n))
            log.error(
                "plugin %r's inventory (%d bytes) is not published: with the node's other annotations it takes the "
                "devices annotation past the %d bytes the API server allows for all of a node's annotations",
                name,
                sizes[name],
                MAX_ANNOTATION_BYTES,
                extra={"node": self.node_name},
            )
            del inventories[name]
            advertisements.pop(name, None)
            self.advertised.pop(name, None)
        return devices if len(inventories) == len(devices.inventories) else NodeDevices(inventories=inventories)

    def _checked(self, name: str, inventory: DeviceInventory) -> DeviceInventory:
        """The inventory with the plugin's health verdicts applied (a failing health check changes nothing)."""
        try:
            health = self.plugins.call(name, "kubegpu_device_health", host_root=self.host_root, inventory=inventory)
        except PluginHookError as exc:
            log.error("health check skipped: %s", exc, extra={"node": self.node_name})
            return inventory
        if not health:
            return inventory
        devices = [d if health.get(d.id, True) else d.model_copy(update={"healthy": False}) for d in inventory.devices]
        return inventory.model_copy(update={"devices": devices})

    def _advertise(self, name: str, inventory: DeviceInventory) -> Advertisement | None:
        try:
            advertisement: Advertisement | None = self.plugins.call(
                name, "kubegpu_device_advertise", inventory=inventory
            )
        except PluginHookError as exc:
            log.error("advertisement skipped: %s", exc, extra={"node": self.node_name})
            return None
        return advertisement

    def _published(self, raw: object) -> NodeDevices | None:
        if raw is None:
            return None
        try:
            return decode_devices(raw)
        except InputError as exc:
            log.warning(
                "the node's annotation is unreadable and will be replaced: %s", exc, extra={"node": self.node_name}
            )
            return None

    def _label_changes(self, current: Mapping[str, str], advertisements: Mapping[str, Advertisement]) -> dict[str, Any]:
        wanted = {k: v for a in advertisements.values() for k, v in a.labels.items()}
        changes: dict[str, Any] = {k: v for k, v in wanted.items() if current.get(k) != v}
        for key in self.labels_set - wanted.keys():
            if key in current:
                changes[key] = None  # merge patch: remove
        return changes

    def _status_changes(
        self, status: Mapping[str, Any], advertisements: Mapping[str, Advertisement]
    ) -> dict[str, dict[str, str]] | None:
        wanted = {r: n for a in advertisements.values() for r, n in a.capacity.items()}
        capacity, allocatable = status.get("capacity") or {}, status.get("allocatable") or {}
        if all(_same(capacity.get(r), n) and _same(allocatable.get(r), n) for r, n in wanted.items()):
            return None
        values = {r: str(n) for r, n in wanted.items()}
        return {"capacity": values, "allocatable": dict(values)}


class NodeLease(threading.Thread):
    """Renews the node's kubegpu Lease every `renew_interval` while `alive()` says the advertiser is making progress.

    One merge patch per renewal (`renewTime`, holder, duration); a missing Lease is created, labelled so that the
    scheduler side's informer selects the kubegpu Leases only. Failures are logged and retried at the next tick.
    """

    def __init__(
        self,
        client: KubeClient,
        node_name: str,
        *,
        namespace: str = NODE_LEASE_NAMESPACE,
        duration: float = 8.0,
        renew_interval: float = 2.0,
        stop: threading.Event,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__(name="node-lease", daemon=True)
        self.client = client
        self.node_name = node_name
        self.namespace = namespace
        self.lease_name = NODE_LEASE_PREFIX + node_name
        self.duration = max(1, math.ceil(duration))  # leaseDurationSeconds is whole seconds
        self.renew_interval = renew_interval
        self.stop_event = stop
        self.alive = alive
        self.renewals = 0
        self._stalled = False

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.lease_name}"

    def _spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.node_name,
            "leaseDurationSeconds": self.duration,
            "renewTime": now_rfc3339(micro=True),
        }

    def renew(self) -> bool:
        """Renew (or create) the Lease once; False when the API server refused or could not be reached."""
        try:
            try:
                self.client.patch(self.path, {"spec": self._spec()})
            except ApiError as exc:
                if exc.status != 404:
                    raise
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.lease_name,
                        "namespace": self.namespace,
                        "labels": {NODE_LEASE_LABEL: "true"},
                    },
                    "spec": {**self._spec(), "acquireTime": now_rfc3339(micro=True)},
                }
                self.client.post(self.path.rsplit("/", 1)[0], body)
                log.info(
                    "node lease created",
                    extra={"node": self.node_name, "reason": f"{self.namespace}/{self.lease_name}"},
                )
        except ApiError as exc:
            log.warning("cannot renew the node lease %s/%s: %s", self.namespace, self.lease_name, exc)
            return False
        self.renewals += 1
        return True

    def run(self) -> None:
        while not self.stop_event.is_set():
            if self.alive():
                if self._stalled:
                    log.info("rounds go on again: renewing the node lease", extra={"node": self.node_name})
                self._stalled = False
                self.renew()
            elif not self._stalled:
                self._stalled = True
                log.error(
                    "no advertise round finished for too long: the node lease is left to expire",
                    extra={"node": self.node_name},
                )
            self.stop_event.wait(self.renew_interval)


def mark_missing(found: DeviceInventory | None, previous: DeviceInventory | None) -> DeviceInventory | None:
    """`found` plus every device of `previous` it lacks, marked unhealthy, devices in natural id order.

    While devices are missing, the previous topology is kept (the node's shape did not change because a device
    disappeared), and the previous attributes stay under the new ones.
    """
    if previous is None:
        return None if found is None else found.model_copy(update={"devices": _ordered(found.devices)})
    base = found or previous.model_copy(update={"devices": []})
    present = {d.id for d in base.devices}
    gone = [d.model_copy(update={"healthy": False}) for d in previous.devices if d.id not in present]
    if not gone:
        return base.model_copy(update={"devices": _ordered(base.devices)})
    return base.model_copy(
        update={
            "devices": _ordered([*base.devices, *gone]),
            "topology": previous.topology or base.topology,
            "attributes": {**previous.attributes, **base.attributes},
        }
    )


def _ordered(devices: Sequence[DeviceInfo]) -> list[DeviceInfo]:
    """Natural order: `card2` before `card10`, `3` before `12`; a stable order keeps the annotation stable."""
    return sorted(
        devices,
        key=lambda d: [
            (0, int(p), "") if p.isascii() and p.isdigit() else (1, 0, p) for p in re.split(r"([0-9]+)", d.id)
        ],
    )


def _same(value: object, expected: int) -> bool:
    if value is None:
        return False
    try:
        return to_int(value) == expected
    except QuantityError:
        return False


def _summary(devices: NodeDevices) -> str:
    """`neuron=15/16` per plugin: healthy over known devices, for the log line."""
    return " ".join(
        f"{name}={len(inv.healthy_ids())}/{len(inv.devices)}" for name, inv in sorted(devices.inventories.items())
    )


# ------------------------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------------------------


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name", required=True, help="the Node to advertise on (the downward API's spec.nodeName)"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="where the host's / is mounted: devices under HOST_ROOT/dev, sysfs under HOST_ROOT/sys (default /)",
    )
    parser.add_argument(
        "--interval",
        type=parse_interval,
        default=parse_interval(DEFAULT_INTERVAL),
        help=f"time between rounds: 20s, 1m, 500ms (default {DEFAULT_INTERVAL})",
    )
    parser.add_argument("--once", action="store_true", help="run one round and exit (status 1 if it failed)")
    parser.add_argument(
        "--update-capacity",
        action="store_true",
        help="also patch the node's capacity/allocatable for the advertised extended resources, and its labels "
        "(leave off where a vendor device plugin advertises the same resources)",
    )
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        help="the kubelet's PodResources socket (usually /var/lib/kubelet/pod-resources/kubelet.sock): publish the "
        "device ids of pods kubegpu did not place as kubegpu.io/foreign-devices",
    )
    parser.add_argument(
        "--lease-namespace",
        default=NODE_LEASE_NAMESPACE,
        help=f"namespace of the node's kubegpu-NODE Lease (default {NODE_LEASE_NAMESPACE}; the scheduler's and the "
        "extender's --node-lease-namespace must name the same)",
    )
    parser.add_argument(
        "--lease-duration",
        type=parse_interval,
        default=parse_interval(DEFAULT_LEASE_DURATION),
        help=f"how long a renewal keeps the node in service, whole seconds (default {DEFAULT_LEASE_DURATION})",
    )
    parser.add_argument(
        "--lease-renew-interval",
        type=parse_interval,
        default=parse_interval(DEFAULT_LEASE_RENEW),
        help=f"time between renewals, well under the duration (default {DEFAULT_LEASE_RENEW})",
    )
    parser.add_argument("--no-node-lease", dest="node_lease", action="store_false", help="do not renew a node Lease")
    parser.add_argument(
        "--resource-slices",
        choices=["auto", "off"],
        default="auto",
        help="publish the devices as DRA ResourceSlices where the API server serves resource.k8s.io/v1 (default auto)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def add_advertise_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "advertise",
        help="publish this node's devices as the kubegpu.io/devices annotation",
        description=DESCRIPTION,
    )
    _add_options(parser)
    return parser


def run(args: argparse.Namespace, *, client_factory: Callable[[str | None], KubeClient] | None = None) -> int:
    from kubegpu.core.process import configure_logging

    configure_logging(args.log_level)
    plugins = make_plugin_manager("device")
    for failure in plugins.failures:
        log.error("%s", failure)
    factory = client_factory or (lambda kubeconfig: KubeClient.from_kubeconfig(kubeconfig, connections=2))
    client = factory(args.kubeconfig)
    advertiser = Advertiser(
        client,
        plugins,
        args.node_name,
        args.host_root,
        update_capacity=args.update_capacity,
        pod_resources=args.pod_resources_socket,
        resource_slices=args.resource_slices == "auto",
    )
    stop = threading.Event()
    if args.node_lease and not args.once:
        if args.lease_renew_interval >= args.lease_duration:
            raise SystemExit("kubegpu advertise: --lease-renew-interval must be shorter than --lease-duration")
        stalled_after = 3 * args.interval + args.lease_duration
        NodeLease(
            client,
            args.node_name,
            namespace=args.lease_namespace,
            duration=args.lease_duration,
            renew_interval=args.lease_renew_interval,
            stop=stop,
            alive=lambda: time.monotonic() - advertiser.last_round < stalled_after,
        ).start()
    if threading.current_thread() is threading.main_thread():

        def terminate(signum: int, _frame: Any) -> None:
            log.info("received signal %d, shutting down", signum)
            stop.set()

        signal.signal(signal.SIGTERM, terminate)
        signal.signal(signal.SIGINT, terminate)
    log.info(
        "kubegpu advertise starting; plugins: %s", ", ".join(plugins.names) or "none", extra={"node": args.node_name}
    )
    while True:
        result = advertiser.run_round()
        if args.once:
            return 0 if result.ok else 1
        if stop.wait(args.interval):
            return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kubegpu.crishim.advertise ...`: the same command outside `kubegpu`."""
    parser = argparse.ArgumentParser(prog="kubegpu advertise", description=DESCRIPTION)
    _add_options(parser)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
