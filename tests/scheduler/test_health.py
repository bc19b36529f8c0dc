"""One health and metrics server for both live front-ends: `kubegpu scheduler` serves `/metrics`, `/healthz` and
`/readyz` on `--metrics-address`, `kubegpu extender` beside its verbs on its one port, both from the same registry and
the same cluster mirror. What an operator's probes and Prometheus see, without a cluster."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator

import orjson
import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.kube.client import ApiError
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import ExtenderHttpServer, ExtenderServer
from kubegpu.scheduler.health import HealthServer
from kubegpu.scheduler.mirror import DRA_KINDS

from .test_extender_bind import Writer, extender_with
from .test_service_guards import RecordingWriter


def get(address: tuple[str, int], path: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://{address[0]}:{address[1]}{path}", timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


@pytest.fixture
def scheduler() -> Iterator[tuple[CustomScheduler, HealthServer]]:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    custom = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    server = HealthServer(custom.mirror, custom.metrics, "127.0.0.1:0")
    yield custom, server
    server.shutdown()


def test_the_scheduler_is_ready_once_its_informers_listed_and_healthy_while_its_loop_beats(
    scheduler: tuple[CustomScheduler, HealthServer],
) -> None:
    custom, server = scheduler
    status, _, body = get(server.address, "/readyz")  # type: ignore[arg-type]
    assert status == 503
    assert orjson.loads(body)["status"].startswith(
        "syncing nodes, pods, namespaces, poddisruptionbudgets, persistentvolumeclaims, persistentvolumes, "
    )
    custom.mirror.on_nodes("SYNC", [])
    custom.mirror.on_namespaces("SYNC", [])
    custom.mirror.on_pods("SYNC", [])
    custom.mirror.on_budgets("SYNC", [])
    status, _, body = get(server.address, "/readyz")  # type: ignore[arg-type]
    assert status == 503  # the operator reads what is still being listed
    assert orjson.loads(body)["status"] == (
        "syncing persistentvolumeclaims, persistentvolumes, services, replicationcontrollers, replicasets, "
        "statefulsets, podgroups, deviceclasses, resourceslices, resourceclaimtemplates, resourceclaims"
    )
    custom.mirror.on_claims("SYNC", [])
    custom.mirror.on_volumes("SYNC", [])
    assert custom.mirror.owners_synced, "the owners a pod's default spread reads are watched too"
    for owner in custom.mirror.owners_synced:
        assert get(server.address, "/readyz")[0] == 503  # type: ignore[arg-type]
        custom.mirror.on_owners(owner, "SYNC", [])
    assert get(server.address, "/readyz")[0] == 503  # type: ignore[arg-type]
    custom.mirror.on_podgroups("SYNC", [])  # gangs: a member is never tried before its PodGroup is known
    for kind in DRA_KINDS:  # DRA: a claim's devices are known before any pod is tried
        assert get(server.address, "/readyz")[0] == 503  # type: ignore[arg-type]
        custom.mirror.on_dra(kind, "SYNC", [])
    assert get(server.address, "/readyz")[0] == 200  # type: ignore[arg-type]
    assert get(server.address, "/healthz")[0] == 200  # type: ignore[arg-type]
    custom.mirror.heartbeat -= 60  # the loop applying informer events has not beaten for a minute
    assert get(server.address, "/healthz")[0] == 503  # type: ignore[arg-type]
    assert get(server.address, "/nothing")[0] == 404  # type: ignore[arg-type]


def test_the_scheduler_exports_its_metrics_in_prometheus_text(scheduler: tuple[CustomScheduler, HealthServer]) -> None:
    custom, server = scheduler
    custom.metrics.attempts.labels("unschedulable").inc()
    status, kind, body = get(server.address, "/metrics")  # type: ignore[arg-type]
    assert status == 200 and kind.startswith("text/plain")
    assert 'kubegpu_scheduler_schedule_attempts_total{result="unschedulable"} 1.0' in body.decode()


def test_the_extender_serves_metrics_beside_its_verbs_without_a_client_certificate() -> None:
    """A failed Binding is counted in the extender's `/metrics`, which answers (like the probes) a caller without a
    client certificate; the verbs still need one."""
    extender, body = extender_with(Writer(ApiError(500, "InternalError", "etcd is down")))
    assert "failed" in asyncio.run(extender.bind(body))["Error"]
    http = ExtenderHttpServer(extender, "127.0.0.1:0", None, client_auth=True)
    try:
        status, kind, metrics = get(http.address, "/metrics")  # type: ignore[arg-type]
        assert status == 200 and kind.startswith("text/plain")
        assert "kubegpu_scheduler_bind_errors_total 1.0" in metrics.decode()
        assert get(http.address, "/readyz")[0] == 503  # type: ignore[arg-type]
        assert get(http.address, "/apis/kubegpu/v1/nodes")[0] == 401  # type: ignore[arg-type]
    finally:
        http.shutdown()


def test_both_front_ends_export_the_same_metrics() -> None:
    plugins = make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False)
    extender = ExtenderServer(Engine(plugins), None, None)  # type: ignore[arg-type]
    custom = CustomScheduler(None, None, Engine(plugins), name="kubegpu")  # type: ignore[arg-type]
    names = {metric.name for metric in extender.metrics.registry.collect()}
    assert "kubegpu_scheduler_plugin_failures" in names
    assert names == {metric.name for metric in custom.metrics.registry.collect()}
