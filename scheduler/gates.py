"""Scheduling gates (`spec.schedulingGates`, Kubernetes 1.26+, GA in 1.30): a pod that carries any is not ready to
be scheduled. Kueue and other admission controllers create pods gated and remove the gates once quota admits them.

kube-scheduler's SchedulingGates plugin refuses such a pod at PreEnqueue, before it enters the active queue, with
"waiting for scheduling gates: [a b]"; the pod waits, tried by no cycle, until an update removes its last gate. The
API server itself gives a pod created with gates the condition `PodScheduled=False`, reason `SchedulingGated`,
message "Scheduling is blocked due to non-empty scheduling gates"; no scheduler writes it. kubegpu does the same: the
cluster mirror keeps gated pods out of the queue (`mirror.ClusterMirror`), and `kubegpu top`, `kubegpu simulate`
and `/metrics` (`kubegpu_scheduler_pending_pods{queue="gated"}`, kube-scheduler's label) show them as gated.

Gate names come from tenants: what is shown is bounded (`MAX_SHOWN` names, each shortened, control characters
escaped).
"""

from __future__ import annotations

from collections.abc import Sequence

from kubegpu.core.errors import shorten

__all__ = ["CONDITION_MESSAGE", "REASON", "gated_reason"]

REASON = "SchedulingGated"  # the PodScheduled condition's reason, and the STATUS kubectl shows
CONDITION_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"  # the API server's, on create
MAX_SHOWN = 8


def gated_reason(gates: Sequence[str]) -> str:
    """Why a gated pod waits, in kube-scheduler's words: `SchedulingGated: waiting for scheduling gates: [a b]`."""
    shown = " ".join(shorten(str(gate)) for gate in gates[:MAX_SHOWN])
    more = f" and {len(gates) - MAX_SHOWN} more" if len(gates) > MAX_SHOWN else ""
    return f"{REASON}: waiting for scheduling gates: [{shown}]{more}"
