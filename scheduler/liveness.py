"""Node liveness: no new device pods on a node whose `kubegpu advertise` stopped renewing its Lease.

The advertiser on each node renews a `coordination.k8s.io/v1` Lease, `NAMESPACE/kubegpu-NODE` (namespace
`kube-node-lease` by default, beside the kubelets' own node Leases), labelled `kubegpu.io/node-lease=true`, holder
the node's name, `leaseDurationSeconds` its `--lease-duration` (default 8 s), renewed every `--lease-renew-interval`
(default 2 s): nvidia-gpu-scheduler's figures (`kubegpu.crishim.advertise.NodeLease`).

The custom scheduler and the extender watch those Leases (by label, so the kubelets' Leases in the same namespace
cost nothing) and judge every node once a second in their cluster mirror's loop (`ClusterMirror.judge_nodes`),
because a Lease expires with time, not with an event. `--node-leases` says which nodes are judged:

* `auto` (the default): a node with a kubegpu Lease is live while its Lease is; a node without one is not judged
  (nodes whose devices a vendor device plugin advertises, clusters part-way through a rollout). Deleting a node's
  Lease takes the node out of the check.
* `required`: a node without a kubegpu Lease is not live either.
* `off`: no Lease informer, every node is live (no RBAC on Leases needed).

Expiry is measured on the scheduler's own clock, as client-go's leader election measures it, so clock skew between
machines does not matter once a Lease has been renewed under the scheduler's eyes: a Lease is live for its
`leaseDurationSeconds` after the scheduler saw its `renewTime` change. A Lease first seen (at start, or created)
counts from its `renewTime`, but never from later than the moment it was seen: an advertiser dead for an hour is
dead at once, and one whose clock runs ahead gains nothing.

A node that is not live keeps its pods, and pods that request no device resource are placed there as before; a pod
that requests a device resource is refused (`Engine.set_node_live`) with kube-scheduler-style wording:
`node(s) had an expired kubegpu node lease (kube-node-lease/kubegpu-trn-0, last renewed 12s ago; ...)`.
Until the Lease informer has listed once, no node is judged.
"""

from __future__ import annotations

import argparse
import calendar
import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from kubegpu.core.annotations import NODE_LEASE_LABEL, NODE_LEASE_NAMESPACE, NODE_LEASE_PREFIX

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_NAMESPACE",
    "DEFAULT_RENEW_INTERVAL",
    "LEASE_LABEL",
    "LEASE_PREFIX",
    "MODES",
    "TICK",
    "NodeLeases",
    "add_node_lease_options",
    "from_args",
    "lease_name",
    "leases_path",
    "parse_time",
]

log = logging.getLogger("kubegpu.liveness")

Mode = Literal["auto", "required", "off"]
MODES: tuple[Mode, ...] = ("auto", "required", "off")
DEFAULT_NAMESPACE = NODE_LEASE_NAMESPACE
DEFAULT_DURATION = 8.0
DEFAULT_RENEW_INTERVAL = 2.0
LEASE_PREFIX = NODE_LEASE_PREFIX
LEASE_LABEL = NODE_LEASE_LABEL
TICK = 1.0  # seconds between two judgements of every node
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)")


def lease_name(node: str) -> str:
    """The name of node `node`'s kubegpu Lease: `kubegpu-NODE`."""
    return LEASE_PREFIX + node


def leases_path(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def parse_time(text: object) -> float | None:
    """Seconds since the epoch of a Kubernetes `Time` or `MicroTime` (`2024-05-01T10:00:00.123456Z`), or None."""
    if not isinstance(text, str):
        return None
    match = _TIME.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
    try:
        seconds = float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
    except (OverflowError, ValueError):
        return None
    fraction, zone = match.group(7), match.group(8)
    if fraction:
        seconds += float(fraction)
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds


def _age(seconds: float) -> str:
    """`12s`, `3m`, `5h`: coarse enough that the reason's wording changes at most once a second, and rarely later."""
    if seconds < 120:
        return f"{max(0, math.floor(seconds))}s"
    if seconds < 7200:
        return f"{math.floor(seconds / 60)}m"
    return f"{math.floor(seconds / 3600)}h"


@dataclass(slots=True)
class _Lease:
    renew: object  # renewTime as last seen
    observed: float  # local monotonic time from which the lease counts
    duration: float


class NodeLeases:
    """The kubegpu node Leases as the informer reports them, and each node's verdict at a given moment."""

    def __init__(
        self,
        namespace: str = DEFAULT_NAMESPACE,
        mode: Mode = "auto",
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.namespace = namespace
        self.mode: Mode = mode
        self.clock, self.wall = clock, wall
        self.leases: dict[str, _Lease] = {}  # node name -> its lease
        self.synced = False
        self._dead: set[str] = set()  # nodes judged not live last time, for logging changes only

    @property
    def path(self) -> str:
        return leases_path(self.namespace)

    @property
    def selector(self) -> str:
        return f"{LEASE_LABEL}=true"

    def observe(self, kind: str, payload: Any) -> None:
        """An informer report: `("SYNC", items)`, or an event type and one Lease."""
        if kind == "SYNC":
            seen = {}
            for obj in payload:
                node = self._node(obj)
                if node is not None:
                    seen[node] = obj
            for node in list(self.leases):
                if node not in seen:
                    del self.leases[node]
            for node, obj in seen.items():
                self._apply(node, obj)
            self.synced = True
            return
        node = self._node(payload)
        if node is None:
            return
        if kind == "DELETED":
            self.leases.pop(node, None)
        else:
            self._apply(node, payload)

    @staticmethod
    def _node(obj: Any) -> str | None:
        name = ((obj or {}).get("metadata") or {}).get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name.startswith(LEASE_PREFIX) or len(name) == len(LEASE_PREFIX):
            return None
        return name[len(LEASE_PREFIX) :]

    def _apply(self, node: str, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        renew = spec.get("renewTime")
        try:
            duration = float(spec.get("leaseDurationSeconds") or DEFAULT_DURATION)
        except (TypeError, ValueError):
            duration = DEFAULT_DURATION
        duration = duration if math.isfinite(duration) and duration > 0 else DEFAULT_DURATION
        known = self.leases.get(node)
        now = self.clock()
        if known is not None and known.renew == renew:
            known.duration = duration
            return
        if known is not None:
            observed = now  # renewed under our eyes: counts from now, whatever the advertiser's clock says
        else:
            renewed = parse_time(renew)
            observed = -math.inf if renewed is None else now - max(0.0, self.wall() - renewed)
        self.leases[node] = _Lease(renew, observed, duration)

    def verdicts(self, nodes: Iterable[str]) -> dict[str, str | None]:
        """Each node's verdict now: None when it may take new device pods, else the reason it may not."""
        verdicts: dict[str, str | None] = {}
        if self.mode == "off" or not self.synced:
            return dict.fromkeys(nodes)
        now = self.clock()
        for node in nodes:
            lease = self.leases.get(node)
            where = f"{self.namespace}/{lease_name(node)}"
            if lease is None:
                verdicts[node] = (
                    None
                    if self.mode == "auto"
                    else f"node(s) had no kubegpu node lease ({where}; is kubegpu advertise running there?)"
                )
            elif now - lease.observed > lease.duration:
                age = "never" if lease.observed == -math.inf else f"{_age(now - lease.observed)} ago"
                verdicts[node] = (
                    f"node(s) had an expired kubegpu node lease ({where}, last renewed {age}; kubegpu advertise "
                    "stopped renewing it: is it running there?)"
                )
            else:
                verdicts[node] = None
        dead = {node for node, reason in verdicts.items() if reason is not None}
        for node in sorted(dead - self._dead):
            log.warning("node is not live: no new device pods there", extra={"node": node, "reason": verdicts[node]})
        for node in sorted((self._dead - dead) & verdicts.keys()):
            log.info("node is live again", extra={"node": node})
        self._dead = dead
        return verdicts


def add_node_lease_options(parser: argparse.ArgumentParser) -> None:
    """`--node-leases` and `--node-lease-namespace`, for the custom scheduler and the extender."""
    group = parser.add_argument_group(
        "node liveness", "kubegpu advertise renews a Lease per node; device pods are not placed on a node whose "
        "Lease expired (running pods stay)."
    )  # fmt: skip
    group.add_argument(
        "--node-leases",
        choices=MODES,
        default="auto",
        help="auto (default): judge the nodes that have a kubegpu node Lease; required: a node without one takes no "
        "device pods either; off: ignore the Leases",
    )
    group.add_argument(
        "--node-lease-namespace",
        default=DEFAULT_NAMESPACE,
        help=f"namespace of the kubegpu-NODE Leases the advertisers renew (default {DEFAULT_NAMESPACE})",
    )


def from_args(args: argparse.Namespace) -> NodeLeases | None:
    """The `NodeLeases` the options ask for (None with `--node-leases off`)."""
    mode: Mode = getattr(args, "node_leases", "auto")
    if mode == "off":
        return None
    return NodeLeases(getattr(args, "node_lease_namespace", DEFAULT_NAMESPACE), mode)
