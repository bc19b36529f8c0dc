"""The Filter extension point's shape: a node filter is a named object with one method, enabled, disabled and
ordered by name through the profile (`scores.Profile.filters_off`), kube-scheduler's own as much as a third party's.

The built-in ones are kube-scheduler 1.20's node-local filters (`kubefilters.py`); an `Engine` takes more through
its `filters` argument, run after them. Plain objects on the hot path, called only when a node's remembered answer
is stale (`Filtering.check`); pluggy stays the boundary for the device plugins' own fit.
"""

from __future__ import annotations

from typing import Any, Protocol

from kubegpu.core.models import NodeSelectorTerm, PodRequest
from kubegpu.core.status import Status
from kubegpu.scheduler.engine.records import NodeRecord, Plan, Verdict


class FilterContext(Protocol):
    """What a node filter may read of the engine besides the node: the claims and volumes a front-end reports."""

    track_volumes: bool
    claims: dict[tuple[str, str], str]
    deleting_claims: set[tuple[str, str]]
    volumes: dict[str, tuple[NodeSelectorTerm, ...] | None]


class NodeFilter(Protocol):
    """One rule of the Filter extension point, for one node.

    `name`: kube-scheduler's plugin name (or the rule's own, for a third party), by which a profile disables it.
    `reads_usage`: False when the rule reads only the node (its labels, taints, conditions), never what is in use:
    such rules run first, and one's unresolvable refusal settles every node of the node's class at once.
    `applies` is its PreFilter: False when the rule cannot refuse the pod on any node (a pod without a node
    selector and NodeAffinity), so the pod's cycle skips it; asked once per pod plan.
    `filter` returns None when the node passes, else a `Status` whose reasons are kube-scheduler's sentences:
    unresolvable when no eviction could change it, unschedulable when pods leaving could.
    """

    name: str
    reads_usage: bool

    def applies(self, pod: PodRequest) -> bool: ...

    def filter(self, engine: FilterContext, record: NodeRecord, pod: PodRequest, plan: Plan) -> Status | None: ...


class PermitPlugin(Protocol):
    """One rule of the Permit extension point, asked after a pod's devices are reserved (`Engine.permit`).

    `name`: the rule's name, given in its refusals. `permit` answers a `Verdict`: APPROVE, WAIT with a timeout in
    seconds (the pod keeps its reservation; the front-end binds it once approved, `Engine.allow`), or REJECT with a
    reason (the engine gives the reservation back). It reads the engine (`engine.pods`, `engine.waiting`) and never
    changes it. The built-in Coscheduling rule (`permit.py`) runs first; an `Engine` takes more through `permits`.
    """

    name: str

    def permit(self, engine: Any, pod: PodRequest, node: str) -> Verdict: ...
