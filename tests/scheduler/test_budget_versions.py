"""PodDisruptionBudgets on every Kubernetes people run: `kubegpu scheduler` reads them in the version the API server
serves (policy/v1 from 1.21, policy/v1beta1 until 1.24), so preemption keeps honouring them on 1.25 and later, where
v1beta1 is gone; `/readyz` waits for their first list and shows the version, and names the API when the server
serves neither. The API server here is a stand-in answering discovery, list and watch; the integration tests
(`tests/integration/test_preemption.py`) do the same against a real 1.20.2 server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.kube.client import ApiError
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.health import answer_health
from kubegpu.scheduler.mirror import DRA_KINDS

from .test_service_guards import RecordingWriter

DISCOVERY = Path(__file__).parent.parent / "fixtures" / "discovery"
BUDGET = {
    "apiVersion": "policy/v1",
    "kind": "PodDisruptionBudget",
    "metadata": {"name": "db", "namespace": "team"},
    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    "status": {"disruptionsAllowed": 0},
}


class ApiServer:
    """Stands in for `KubeClient`: discovery answers `policy_document` (None: 404), and only the collections of the
    versions it lists exist; watches idle until the test stops."""

    def __init__(self, policy_document: Any, stop: threading.Event) -> None:
        self.policy_document = policy_document
        self.stop = stop
        self.listed: list[str] = []

    def get(self, path: str, **_params: Any) -> Any:
        if path == "/apis/policy" and self.policy_document is not None:
            return self.policy_document
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def list(self, path: str, **_params: Any) -> tuple[list[dict[str, Any]], str]:
        self.listed.append(path)
        served = [v["groupVersion"] for v in (self.policy_document or {}).get("versions", [])]
        if not any(path.startswith(f"/apis/{group_version}/") for group_version in served):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return [BUDGET], "1"

    def watch(self, path: str, version: str, **_params: Any) -> Iterator[dict[str, Any]]:
        self.stop.wait(10)
        return iter(())


def scheduler(document: str | None) -> tuple[CustomScheduler, ApiServer]:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False))
    custom = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    policy = json.loads((DISCOVERY / document).read_text()) if document else None
    server = ApiServer(policy, custom.mirror.stop)
    custom.mirror.client = server  # type: ignore[assignment]
    return custom, server


def wait_until(condition: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def stopped() -> Iterator[list[CustomScheduler]]:
    started: list[CustomScheduler] = []
    yield started
    for custom in started:
        custom.mirror.stop.set()


@pytest.mark.parametrize(
    ("document", "path", "version"),
    [
        ("policy-1.34.json", "/apis/policy/v1/poddisruptionbudgets", "policy/v1"),
        ("policy-1.24.json", "/apis/policy/v1/poddisruptionbudgets", "policy/v1"),
        ("policy-1.20.2.json", "/apis/policy/v1beta1/poddisruptionbudgets", "policy/v1beta1"),
    ],
    ids=["1.34", "1.24", "1.20"],
)
def test_budgets_are_listed_in_the_version_the_server_serves_and_reach_preemption(
    document: str, path: str, version: str, stopped: list[CustomScheduler]
) -> None:
    custom, server = scheduler(document)
    stopped.append(custom)
    mirror = custom.mirror
    custom.mirror.start_informers()
    wait_until(lambda: mirror.events.qsize() and path in server.listed, f"a list of {path}")
    wait_until(lambda: (mirror.apply_events(0.05), "team/db" in mirror.budgets)[1], "the budget applied")

    assert [p for p in server.listed if "poddisruptionbudgets" in p] == [path]
    assert mirror.budgets["team/db"].allowed == 0
    assert "poddisruptionbudgets" not in mirror.syncing()
    assert mirror.apis()["poddisruptionbudgets"] == version


def test_readyz_waits_for_the_budgets_first_list_then_shows_their_version(stopped: list[CustomScheduler]) -> None:
    custom, _ = scheduler("policy-1.34.json")
    stopped.append(custom)
    mirror = custom.mirror
    mirror.on_nodes("SYNC", [])
    mirror.on_namespaces("SYNC", [])
    mirror.on_pods("SYNC", [])
    mirror.on_claims("SYNC", [])
    mirror.on_volumes("SYNC", [])
    mirror.on_podgroups("SYNC", [])
    for owner in mirror.owners_synced:
        mirror.on_owners(owner, "SYNC", [])
    for kind in DRA_KINDS:
        mirror.on_dra(kind, "SYNC", [])

    status, body = answer_health("/readyz", mirror, custom.metrics)  # type: ignore[misc]
    assert (status, body) == (503, {"status": "syncing poddisruptionbudgets"})

    threading.Thread(target=mirror.watch_budget_versions, daemon=True).start()
    wait_until(lambda: (mirror.apply_events(0.05), not mirror.syncing())[1], "the budgets listed")
    status, body = answer_health("/readyz", mirror, custom.metrics)  # type: ignore[misc]
    assert (status, body) == (200, {"status": "ready", "apis": {"poddisruptionbudgets": "policy/v1"}})


def test_a_server_serving_no_budget_api_is_named_by_readyz_and_scheduling_goes_on(
    stopped: list[CustomScheduler], caplog: pytest.LogCaptureFixture
) -> None:
    custom, server = scheduler(None)
    stopped.append(custom)
    mirror = custom.mirror
    threading.Thread(target=mirror.watch_budget_versions, daemon=True).start()
    wait_until(lambda: (mirror.apply_events(0.05), mirror.budgets_synced.is_set())[1], "the budgets given up")
    for synced in (
        mirror.on_nodes,
        mirror.on_pods,
        mirror.on_namespaces,
        mirror.on_claims,
        mirror.on_volumes,
        mirror.on_podgroups,
    ):
        synced("SYNC", [])
    for owner in mirror.owners_synced:
        mirror.on_owners(owner, "SYNC", [])
    for kind in DRA_KINDS:
        mirror.on_dra(kind, "SYNC", [])

    status, body = answer_health("/readyz", mirror, custom.metrics)  # type: ignore[misc]
    assert status == 200
    assert body["missing"] == ["the API server serves no version of poddisruptionbudgets that kubegpu reads"]
    assert not [p for p in server.listed if "poddisruptionbudgets" in p], "nothing is listed in a loop"
    assert "serves PodDisruptionBudgets in none of policy/v1, policy/v1beta1" in caplog.text


class Forbidding(ApiServer):
    """`ApiServer` whose role may not list PodDisruptionBudgets until `allowed` is set (a 403, as the API server
    answers a ServiceAccount whose role predates them: the extender's before it read budgets)."""

    allowed = False

    def get(self, path: str, **params: Any) -> Any:
        if path.endswith("/poddisruptionbudgets") and not self.allowed:
            raise ApiError(403, "Forbidden", 'poddisruptionbudgets.policy is forbidden: User "x" cannot list')
        if path.endswith("/poddisruptionbudgets"):
            return {"items": []}
        return super().get(path, **params)

    def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        if not self.allowed:
            raise ApiError(403, "Forbidden", 'poddisruptionbudgets.policy is forbidden: User "x" cannot list')
        return super().list(path, **params)


def test_a_role_that_may_not_list_budgets_leaves_the_process_ready_says_so_once_and_reads_them_once_allowed(
    stopped: list[CustomScheduler], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role without `poddisruptionbudgets` list (an extender deployed with its role from before it read budgets,
    or an edited one): the informer retried its 403 for good, and `/readyz` waited for the budgets' first list, so
    the process never became ready. Now it is ready without budgets, warns once, and lists them once allowed."""
    from kubegpu.scheduler import mirror as mirror_module

    monkeypatch.setattr(mirror_module, "PODGROUP_RECHECK", 0.05)
    custom, _ = scheduler("policy-1.34.json")
    stopped.append(custom)
    mirror = custom.mirror
    server = Forbidding(mirror.client.policy_document, mirror.stop)  # type: ignore[attr-defined]
    mirror.client = server  # type: ignore[assignment]
    threading.Thread(target=mirror.watch_budget_versions, daemon=True).start()
    wait_until(lambda: (mirror.apply_events(0.05), mirror.budgets_synced.is_set())[1], "the budgets given up for now")
    assert "poddisruptionbudgets" not in mirror.syncing()
    assert mirror.apis()["poddisruptionbudgets"] is None
    time.sleep(0.3)  # several rechecks
    assert caplog.text.count("may not list PodDisruptionBudgets (403 Forbidden)") == 1
    server.allowed = True
    wait_until(lambda: (mirror.apply_events(0.05), "team/db" in mirror.budgets)[1], "the budget listed once allowed")
    assert mirror.apis()["poddisruptionbudgets"] == "policy/v1"
