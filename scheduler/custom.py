"""`kubegpu scheduler`: the custom scheduler binary, for pods whose `spec.schedulerName` names it.

A thin front-end around the same `Engine` the simulator uses, wired from the parts it shares with the extender:
the cluster mirror (`mirror.py`: informers into the engine, the ledger rebuilt from bound pods' allocations), the
binder (`binder.py`: Bindings, Events, conditions, evictions) and the health and metrics server (`health.py`), plus
its own queue (`queue.py`, after kube-scheduler's). One thread owns the engine and runs the loop:

1. apply informer events (nodes first at start-up, then pods) and binding results;
2. take pending pods by priority, then arrival, and run the engine's cycle;
3. for a placement, reserve it in the engine at once and hand the Binding (which carries the signed allocation and
   the plugins' annotations) to the binder; a failure rolls the reservation back and retries the pod with backoff
   (1 s doubling to 10 s);
4. when nothing fits, a Warning Event `FailedScheduling` with kube-scheduler's `0/N nodes are available: ...` message
   and the pod condition `PodScheduled=False/Unschedulable`; the pod waits until the cluster changes in a way that
   can help it instead of being retried in a loop;
5. when nothing fits and the pod may preempt, the engine's device-aware preemption (`Engine.preempt`) names a node and
   the pods of lower priority to evict there, with PodDisruptionBudgets from their own informer: the pod's
   `status.nominatedNodeName` is set, the node is held for it (`Engine.nominate`), each victim gets a `Preempted`
   Event and is deleted gracefully, and the pod binds once they are gone. While its victims terminate it does not
   preempt again.

With leader election (the default) informers run on every replica, keeping a standby warm, but only the holder of the
Lease schedules, and only until its `Leadership` deadline (`kube/leader.py`): the loop checks it before each pod and
the writer before sending each write, so the leader stops deciding and binding at the renew deadline whatever its
renewals and its backlog of writes do; queued writes are then refused unsent, and the process exits. Renewals use a
client of their own, so they never wait behind the writer's rate limiter. `/metrics`, `/healthz` and `/readyz` are
served on `--metrics-address`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import time
from typing import Any

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.process import configure_logging, read_key
from kubegpu.kube.client import ApiError, AsyncKubeClient, KubeClient
from kubegpu.kube.leader import LeaderElector, Leadership, timing_problem
from kubegpu.scheduler import liveness
from kubegpu.scheduler.binder import Binder
from kubegpu.scheduler.engine import POLICIES, Decision, Engine, Policy
from kubegpu.scheduler.health import HealthServer, Metrics
from kubegpu.scheduler.mirror import ClusterMirror
from kubegpu.scheduler.queue import Entry, SchedulingQueue

__all__ = ["CustomScheduler", "add_scheduler_parser"]

log = logging.getLogger("kubegpu.scheduler")

BATCH = 64  # pods scheduled between two looks at the informer events


class CustomScheduler:
    """The loop of `kubegpu scheduler`: the mirror's events, then the queue's pods through the engine's cycle."""

    def __init__(
        self,
        client: KubeClient,
        writer: AsyncKubeClient,
        engine: Engine,
        *,
        name: str,
        leases: liveness.NodeLeases | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self.engine = engine
        self.name = name
        self.metrics = Metrics()
        self.binder = Binder(writer, self.metrics, component=name)
        self.queue = SchedulingQueue(name, self.metrics, spread_of=engine.spread_constraints)
        self.mirror = ClusterMirror(
            client,
            engine,
            self.binder,
            self.queue,
            leases=leases,
            watch_budgets=True,
            watch_volumes=True,
            watch_owners=True,
        )
        self.stop = self.mirror.stop
        # Until when this replica may decide and bind (the elector's; held for good without leader election).
        self.leadership = leadership or Leadership.unconditional()
        self.exit_code = 0

    def run_loop(self) -> None:
        mirror, queue = self.mirror, self.queue
        while not self.stop.is_set():
            mirror.beat()
            ready = self.leadership.holds() and mirror.ready()
            mirror.apply_events(0.0 if ready and queue.active else 0.2)
            with mirror.lock:
                queue.promote()
                mirror.judge_nodes()
                if ready:
                    self.schedule_active(BATCH)

    def schedule_active(self, limit: int) -> None:
        """Run the cycle for up to `limit` active pods, by priority then arrival, while this replica leads; a pod whose
        cycle raises costs only itself."""
        batch = self.queue.pop_batch(limit)
        for done, entry in enumerate(batch):
            if not self.leadership.holds():
                self.queue.put_back(batch[done:])
                return
            try:
                self._schedule(entry)
            except Exception as exc:
                request = entry.request
                meta = {"name": request.name, "namespace": request.namespace, "uid": request.uid}
                self.mirror.internal_error("schedule", meta, exc)
                self.queue.retry_later(entry)

    # -- one cycle ------------------------------------------------------------------------------------------------

    def _schedule(self, entry: Entry) -> None:
        started = time.perf_counter()
        decision = self.engine.schedule(entry.request)
        self.metrics.latency.observe(time.perf_counter() - started)
        if decision.scheduled:
            self.metrics.attempts.labels("scheduled").inc()
            self.queue.binding_started(entry)
            self.queue.wake_for(entry.request)
            self.binder.submit(self._bind(entry, decision))
            return
        result = "error" if decision.code.name == "ERROR" else "unschedulable"
        self.metrics.attempts.labels(result).inc()
        message = decision.reason or "no node fits"
        if result == "unschedulable":
            self._preempt(entry)
        log.info("unschedulable", extra={"pod": entry.key, "node": decision.node, "reason": message})
        self.queue.park(entry)
        if message != entry.message:
            entry.message = message
            self.binder.submit(self.binder.report_unschedulable(entry.request, message))

    def _preempt(self, entry: Entry) -> None:
        """DefaultPreemption's PostFilter: evict pods of lower priority where that lets the pod fit. A pod whose
        nominated node still has victims terminating waits for them instead of preempting again."""
        pod, mirror = entry.request, self.mirror
        if self.engine.awaits_victims(entry.key, mirror.evicting):
            return
        preemption = self.engine.preempt(pod, list(mirror.budgets.values()))
        if preemption.node is None:
            self.engine.unnominate(entry.key)
            return
        self.engine.nominate(pod, preemption.node)
        mirror.evicting_started(preemption.victims)
        log.info("preempting", extra={"pod": entry.key, "node": preemption.node, "victims": list(preemption.victims)})
        victims = [placed.request for placed in self.engine.placements(preemption.victims)]
        self.binder.submit(self.binder.evict(pod, preemption.node, victims))

    # -- the Binding, and what its result does to the queue ---------------------------------------------------------

    async def _bind(self, entry: Entry, decision: Decision) -> None:
        error = await self.binder.bind(entry.request, decision)
        self.mirror.post(self._bound, entry, decision, error)

    def _bound(self, entry: Entry, decision: Decision, error: ApiError | None) -> None:
        """A Binding's result, on the loop thread; anything unexpected costs only this pod."""
        try:
            self.queue.binding_done(entry.key)
            if error is not None:
                self._bind_failed(entry, decision, error)
        except Exception as exc:
            request = entry.request
            self.mirror.internal_error("bind", {"name": request.name, "namespace": request.namespace}, exc)

    def _bind_failed(self, entry: Entry, decision: Decision, error: ApiError) -> None:
        self.mirror.roll_back(entry.request, decision.node, error)
        if error.status == 404:
            return  # the pod is gone
        if error.status == 409 and "resourceVersion" not in str(error) and "modified" not in str(error):
            # Already bound (by another scheduler or an earlier attempt): the pod watch will count it.
            return
        self.queue.retry_later(entry)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    problem = timing_problem(args.lease_duration, args.renew_deadline, args.retry_period) if args.leader_elect else None
    if problem:
        log.error("%s", problem)
        return 2
    config = None
    policy: Policy = args.policy or "binpack"
    if args.config:
        from kubegpu.scheduler.config import ConfigError, load_config  # pydantic and YAML: only for a --config

        try:
            config, policy = load_config(args.config, args.policy)
        except ConfigError as exc:
            log.error("--config: %s", exc)
            return 2
    args.scheduler_name = args.scheduler_name or (config and config.scheduler_name) or "kubegpu-scheduler"
    key = read_key(args.allocation_key_file)
    leadership = Leadership() if args.leader_elect else Leadership.unconditional()
    client = KubeClient.from_kubeconfig(args.kubeconfig, qps=args.kube_api_qps, burst=args.kube_api_burst)
    fence = leadership.remaining if args.leader_elect else None
    writer = AsyncKubeClient(client.credentials, client.limiter, connections=args.binders, fence=fence)
    writer.warm(args.binders)  # the TLS handshakes happen while the plugins load and the informers list
    plugins = make_plugin_manager("scheduler")
    for failure in plugins.failures:
        log.error("%s", failure)
    engine = Engine(plugins, policy=policy, signing_key=key, scoring=config.profile if config else None)
    scheduler = CustomScheduler(
        client, writer, engine, name=args.scheduler_name, leases=liveness.from_args(args), leadership=leadership
    )
    if config is not None:
        scheduler.queue.initial_backoff, scheduler.queue.max_backoff = config.initial_backoff, config.max_backoff
    scheduler.mirror.start_informers()  # on every replica: a standby keeps its mirror warm
    server = HealthServer(scheduler.mirror, scheduler.metrics, args.metrics_address, writer.loop)
    log.info("kubegpu scheduler %s starting; metrics on %s:%d", args.scheduler_name, *server.address)

    def terminate(signum: int, _frame: Any) -> None:
        log.info("received signal %d, shutting down", signum)
        scheduler.stop.set()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)

    def lost() -> None:
        log.error("leadership lost; exiting so that a fresh process can stand by")
        scheduler.metrics.leader.set(0)
        scheduler.stop.set()
        scheduler.exit_code = 1

    if args.leader_elect:
        # The Lease's own client: its own connection and no rate limiter, so a renewal never waits behind the
        # writer's backlog (a burst of Bindings and Events can owe the shared limiter tens of seconds).
        elector_client = KubeClient(client.credentials, connections=1)
        LeaderElector(
            elector_client,
            namespace=args.lease_namespace,
            name=args.lease_name or args.scheduler_name,
            identity=args.identity or f"{socket.gethostname()}_{os.getpid()}",
            on_started=lambda: scheduler.metrics.leader.set(1),
            on_stopped=lost,
            stop=scheduler.stop,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
            leadership=leadership,
        ).start()
    else:
        scheduler.metrics.leader.set(1)
    scheduler.run_loop()
    server.shutdown()
    writer.close()
    return scheduler.exit_code


def add_scheduler_parser(sub: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        "scheduler",
        help="the custom scheduler for pods whose spec.schedulerName names it",
        description="Schedule pending pods whose spec.schedulerName equals --scheduler-name on a real cluster: "
        "concrete devices are chosen by the plugins and written as the signed kubegpu.io/allocation annotation "
        "before the Binding is created.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.add_argument(
        "--scheduler-name", help="spec.schedulerName to serve (default: the --config profile's, else kubegpu-scheduler)"
    )
    parser.add_argument("--allocation-key-file", required=True, help="HMAC key shared with the CRI shim")
    parser.add_argument("--policy", choices=POLICIES, help="node preference (default binpack)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1beta1): score weights, plugins on and off",
    )
    parser.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false", help="schedule without taking the Lease"
    )
    parser.add_argument("--lease-namespace", default="kube-system", help="namespace of the leader-election Lease")
    parser.add_argument("--lease-name", help="name of the Lease (default: the scheduler name)")
    parser.add_argument(
        "--lease-duration", type=float, default=15.0, help="seconds a standby waits for a silent leader (default 15)"
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        help="seconds after its last renewal began at which a leader stops binding; shorter than --lease-duration "
        "(default 10)",
    )
    parser.add_argument("--retry-period", type=float, default=2.0, help="seconds between renewals (default 2)")
    parser.add_argument("--identity", help="leader-election identity (default: hostname_pid)")
    parser.add_argument(
        "--metrics-address", default="0.0.0.0:10261", help="HOST:PORT for /metrics, /healthz, /readyz (port 0: any)"
    )
    parser.add_argument(
        "--binders", type=int, default=32, help="annotation patches and Bindings in flight at once (default 32)"
    )
    parser.add_argument(
        "--kube-api-qps", type=float, default=50.0, help="API requests a second, as kube-scheduler's (default 50)"
    )
    parser.add_argument("--kube-api-burst", type=int, default=100, help="API request burst (default 100)")
    liveness.add_node_lease_options(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)
    return parser
