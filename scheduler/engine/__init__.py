"""The scheduling engine: one cluster state, one scheduling cycle, used unchanged by every front-end.

The simulator, the custom scheduler and the extender are thin adapters around `Engine`. Its parts, each a module
named after what it owns (the Kubernetes scheduler framework splits the same work alike: `internal/cache`, the
framework's extension points, its plugins):

* `records`: the records and results (`NodeRecord`, `PodRecord`, `Plan`, `Decision`, `Placement`);
* `framework`, `enqueue`, `kubefilters`, `kubescores`: the shapes of a rule, and kube-scheduler's PreEnqueue, QueueSort,
  filters and scores in them, by name;
* `state`: every attribute the parts share, and every memo with its key and what invalidates it;
* `ledger`: which devices each placed pod holds, taken and given back atomically; an allocation's provenance;
* `cache`: the nodes, their usage, capacity indexes, classes and node tree, and the numbered change log;
* `plan`: a pod's plan, made once (PreFilter), and the claims, volumes and owners it reads;
* `filtering`: Kubernetes' node filters and the device plugins' fit (Filter), and counting refusals;
* `scoring`: the score plugins over the feasible nodes (PreScore, Score);
* `reserving`: holding a decided pod's devices, and giving them back (Reserve, Unreserve; both idempotent);
* `sampling`: kube-scheduler's sample of feasible nodes from each pod shape's remembered answers;
* `cycle`: one pod's cycle: `decide` (PreFilter, Filter, Score) returns a decision, `schedule` decides and reserves;
* `admission`: recording pods that are already bound (`admit_bound`, `admit_by_count`);
* `preempt`: the what-ifs of preemption (PostFilter) and nomination;
* `permit`: the Permit stage (approve, wait with a timeout, reject) and its built-in Coscheduling rule;
* `gangdomains`: the topology levels, the domains held for a preempting gang, each node's room for a gang's members;
* `gangpreempt`: preempting for a gang that fits nowhere (`preempt_gang`, PostFilter for a gang);
* `gangs`: placing a gang whole in a topology (`place_gang`);
* `queries`: what the front-ends read.

The parts are layers of one class, in the order above from `records` up: each builds on the ones below it and never
on one above (an import-linter contract holds this). One verb per act, in Kubernetes' sense: a cycle *decides*, a
decided pod's devices are *reserved* (and *unreserved*), a pod already bound is *admitted*; whatever the act, the
ledger *holds* a pod's devices and *gives them back*, and a deleted pod is *released*.

The engine knows no HTTP, gRPC or Kubernetes client; it calls plugins only through the plugin manager, and a plugin
that raises becomes a reason naming it, never a crash.
"""

from __future__ import annotations

from kubegpu.scheduler.engine.framework import PermitPlugin, PreEnqueuePlugin, QueuedPod, QueueSortPlugin
from kubegpu.scheduler.engine.queries import Queries
from kubegpu.scheduler.engine.records import (
    CHECKS_REMEMBERED,
    POLICIES,
    Decision,
    GangPlacement,
    GangPreemption,
    NodeRecord,
    PermitAnswer,
    PermitCode,
    Placement,
    Plan,
    PodRecord,
    Policy,
    Verdict,
    Waiting,
    summarize_reasons,
)
from kubegpu.scheduler.engine.rules import rule_names

__all__ = [
    "CHECKS_REMEMBERED",
    "POLICIES",
    "Decision",
    "Engine",
    "GangPlacement",
    "GangPreemption",
    "NodeRecord",
    "PermitAnswer",
    "PermitCode",
    "PermitPlugin",
    "Placement",
    "Plan",
    "PodRecord",
    "Policy",
    "PreEnqueuePlugin",
    "QueueSortPlugin",
    "QueuedPod",
    "Verdict",
    "Waiting",
    "rule_names",
    "summarize_reasons",
]


class Engine(Queries):
    """The cluster state and the scheduling cycle: the facade the front-ends hold. Its methods are the parts' own
    (see the module docstring); the state they share is set in `kubegpu.scheduler.engine.state`."""
