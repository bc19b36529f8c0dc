"""The version-adaptive client: what kubegpu asks the API server before it writes, and what it does with the answer.

* `/version`: a server older than 1.20 is refused (the front-end stops, exits 2, and `/readyz` says why); one newer
  than 1.35 is served with a warning, shown in the log and in `/readyz`; the version is shown there too.
* Events are written as `events.k8s.io/v1` where served (1.19+, what kube-scheduler writes), else as core `v1`.
* Leases (`coordination.k8s.io/v1`) are looked for when the front-end takes any; `/readyz` names them when missing.

The documents are the ones servers answer: the 1.20.2 ones recorded from the API server the integration tests run
(`tests/integration/test_api_versions.py` checks them against it), the newer ones in the exact upstream shape
(apimachinery's `version.Info`, an `APIGroup`), a managed cluster's `minor: "31+"` among them.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kubegpu.core.models import PodRequest
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.kube import discovery
from kubegpu.kube.client import ApiError
from kubegpu.scheduler.binder import Binder
from kubegpu.scheduler.custom import CustomScheduler
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.health import Metrics, answer_health
from kubegpu.scheduler.mirror import DRA_KINDS

from .test_service_guards import RecordingWriter

FIXTURES = Path(__file__).parent.parent / "fixtures" / "discovery"
POD = PodRequest(namespace="team", name="trainer", uid="uid-1", containers=())


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize(
    ("document", "judged", "verdict"),
    [
        ("version-1.19.16.json", (1, 19), "refused"),
        ("version-1.20.2.json", (1, 20), None),
        ("version-eks-1.31.json", (1, 31), None),
        ("version-1.34.json", (1, 34), None),
        ("version-1.36.json", (1, 36), "warned"),
    ],
)
def test_the_server_version_is_read_and_judged(document: str, judged: tuple[int, int], verdict: str | None) -> None:
    version = discovery.server_version(recorded(document))
    assert version is not None and (version.major, version.minor) == judged
    answer = discovery.version_verdict(version)
    assert (None if answer is None else "refused" if answer[0] else "warned") == verdict
    if answer is not None:
        assert version.git_version in answer[1]


def test_an_emulated_release_is_judged_by_the_release_it_serves() -> None:
    document = {**recorded("version-1.36.json"), "emulationMinor": "35"}
    version = discovery.server_version(document)
    assert version is not None and discovery.version_verdict(version) is None


@pytest.mark.parametrize("document", [None, [], {}, {"major": "one", "minor": "20"}, {"major": "1"}])
def test_a_version_document_kubegpu_cannot_read_states_no_version(document: Any) -> None:
    assert discovery.server_version(document) is None


class ApiServer:
    """Stands in for `KubeClient`: `/version` and the discovery documents named, a 404 for any other path."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self.documents = documents
        self.asked: list[str] = []

    def get(self, path: str, **_params: Any) -> Any:
        self.asked.append(path)
        if path in self.documents:
            answer = self.documents[path]
            if isinstance(answer, ApiError):
                raise answer
            return answer
        raise ApiError(404, "NotFound", "the server could not find the requested resource")


def surveyed(documents: dict[str, Any], *, leases: bool = False) -> CustomScheduler:
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    custom = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    custom.mirror.client = ApiServer(documents)  # type: ignore[assignment]
    custom.mirror.needs_leases = leases
    custom.mirror.survey_server()
    return custom


def ready(custom: CustomScheduler) -> tuple[int, Any]:
    mirror = custom.mirror
    for synced in (
        mirror.on_nodes,
        mirror.on_pods,
        mirror.on_claims,
        mirror.on_volumes,
        mirror.on_budgets,
        mirror.on_podgroups,
        mirror.on_namespaces,
    ):
        synced("SYNC", [])
    for owner in mirror.owners_synced:
        mirror.on_owners(owner, "SYNC", [])
    for kind in DRA_KINDS:
        mirror.on_dra(kind, "SYNC", [])
    return answer_health("/readyz", mirror, custom.metrics)  # type: ignore[return-value,arg-type]


SERVER_1_34 = {
    "/version": recorded("version-1.34.json"),
    "/apis/events.k8s.io": recorded("events.k8s.io-1.34.json"),
    "/apis/coordination.k8s.io": recorded("coordination.k8s.io-1.34.json"),
}


def test_a_1_34_server_gets_events_k8s_io_v1_and_readyz_shows_the_versions() -> None:
    custom = surveyed(SERVER_1_34, leases=True)
    assert custom.binder.events_api == "events.k8s.io/v1"
    status, body = ready(custom)
    assert status == 200
    assert body["kubernetes"] == "v1.34.1"
    assert body["apis"] == {"events": "events.k8s.io/v1", "leases": "coordination.k8s.io/v1"}
    assert "warnings" not in body and "missing" not in body


def test_a_server_without_events_k8s_io_gets_core_events_and_one_without_leases_is_named() -> None:
    custom = surveyed({"/version": recorded("version-1.20.2.json")}, leases=True)
    assert custom.binder.events_api == "v1"
    status, body = ready(custom)
    assert status == 200
    assert body["apis"] == {"events": "v1", "leases": None}
    assert body["missing"] == ["the API server serves no version of leases that kubegpu reads"]


def test_a_server_older_than_1_20_is_refused_and_the_scheduler_stops(caplog: pytest.LogCaptureFixture) -> None:
    custom = surveyed({**SERVER_1_34, "/version": recorded("version-1.19.16.json")})
    assert custom.stop.is_set(), "the front-end stops (and `kubegpu scheduler` exits 2)"
    assert "/apis/events.k8s.io" not in custom.mirror.client.asked  # type: ignore[attr-defined]
    status, body = ready(custom)
    assert status == 503
    assert body["status"].startswith("refused: the API server is Kubernetes v1.19.16, older than 1.20")
    assert "older than 1.20, the oldest kubegpu supports" in caplog.text


def test_a_server_newer_than_1_35_is_served_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    custom = surveyed({**SERVER_1_34, "/version": recorded("version-1.36.json")})
    assert not custom.stop.is_set()
    status, body = ready(custom)
    assert status == 200
    assert body["kubernetes"] == "v1.36.0"
    assert body["warnings"] == [
        "the API server is Kubernetes v1.36.0, newer than 1.35, the newest kubegpu is verified against; kubegpu goes "
        "on with the newest API versions it knows (see /readyz's apis)"
    ]
    assert "newer than 1.35" in caplog.text


def test_discovery_is_asked_again_while_the_server_cannot_answer() -> None:
    documents: dict[str, Any] = {**SERVER_1_34, "/version": ApiError(503, "ServiceUnavailable", "etcd is down")}
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    custom = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    server = ApiServer(documents)
    custom.mirror.client = server  # type: ignore[assignment]
    thread = threading.Thread(target=custom.mirror.survey_server, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while server.asked.count("/version") < 2:
        assert time.monotonic() < deadline, "/version was not asked again"
        time.sleep(0.01)
    documents["/version"] = recorded("version-1.34.json")
    thread.join(10)
    assert not thread.is_alive()
    assert custom.binder.events_api == "events.k8s.io/v1"


class Posts:
    """Stands in for the asynchronous writer: records each POST."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, Any]] = []

    async def post(self, path: str, body: Any) -> Any:
        self.posted.append((path, body))
        return body


# The fields of events.k8s.io/v1 Event (k8s.io/api/events/v1 types.go, 1.34) and of core/v1 Event.
EVENTS_V1_FIELDS = {
    "apiVersion", "kind", "metadata", "eventTime", "series", "reportingController", "reportingInstance", "action",
    "reason", "regarding", "related", "note", "type", "deprecatedSource", "deprecatedFirstTimestamp",
    "deprecatedLastTimestamp", "deprecatedCount",
}  # fmt: skip


def written(
    events_api: str, message: str, component: str = "kubegpu-scheduler", pod: PodRequest = POD
) -> tuple[str, Any]:
    posts = Posts()
    binder = Binder(posts, Metrics(), component=component)  # type: ignore[arg-type]
    binder.events_api = events_api
    asyncio.run(binder.post_event(pod, "FailedScheduling", message))
    (posted,) = posts.posted
    return posted


def test_an_events_k8s_io_v1_event_is_written_as_kube_scheduler_writes_it() -> None:
    path, body = written("events.k8s.io/v1", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    assert path == "/apis/events.k8s.io/v1/namespaces/team/events"
    assert set(body) <= EVENTS_V1_FIELDS
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer",
        "namespace": "team",
        "uid": "uid-1",
    }
    assert (body["reportingController"], body["action"], body["reason"], body["type"]) == (
        "kubegpu-scheduler",
        "Scheduling",
        "FailedScheduling",
        "Warning",
    )
    assert body["note"] == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert body["eventTime"].endswith("Z") and "." in body["eventTime"]  # MicroTime
    assert body["reportingInstance"].startswith("kubegpu-scheduler-")
    name = body["metadata"]["name"]  # a DNS subdomain, as the API server requires of this API's names
    assert name.startswith("trainer.") and re.fullmatch(
        r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name
    )


DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


@pytest.mark.parametrize("cut_at", ["-", "."], ids=["dash", "dot"])
def test_an_event_on_a_pod_of_a_long_name_is_named_as_the_api_server_takes_it(cut_at: str) -> None:
    # A valid 250-character pod name whose 236th character is '-' or '.': the Event's name was its first 236
    # characters and ".<time>", "…a-.18f…" or "…a..18f…", which the API server refuses (422): the pod's owner never
    # saw why it waits.
    name = "a" * 235 + cut_at + "b" * 14
    assert re.fullmatch(DNS_SUBDOMAIN, name) and len(name) <= 253
    pod = PodRequest(namespace="team", name=name, uid="uid-2", containers=())
    _, body = written("events.k8s.io/v1", "fits nowhere", pod=pod)
    event_name = body["metadata"]["name"]
    assert len(event_name) <= 253 and re.fullmatch(DNS_SUBDOMAIN, event_name), event_name
    assert body["regarding"]["name"] == name


def test_a_long_note_is_cut_to_the_1024_bytes_the_api_server_takes_and_a_bad_controller_name_replaced() -> None:
    _, body = written("events.k8s.io/v1", "é" * 2000, component="Kubegpu Scheduler!")
    assert len(body["note"].encode()) <= 1024
    # Cut as every bounded text is, with what was left out counted (`kubectl describe` shows it).
    kept = body["note"].split("…")[0]
    assert body["note"] == f"{kept}… ({2000 - len(kept)} more characters)" and len(body["note"].encode()) > 1000
    assert body["reportingController"] == "kubegpu"


def test_core_v1_events_keep_their_shape() -> None:
    path, body = written("v1", "fits nowhere")
    assert path == "/api/v1/namespaces/team/events"
    assert (body["apiVersion"], body["involvedObject"]["name"], body["message"]) == ("v1", "trainer", "fits nowhere")


@pytest.mark.parametrize(
    ("document", "api"),
    [("events.k8s.io-1.20.2.json", "events.k8s.io/v1"), ("events.k8s.io-1.34.json", "events.k8s.io/v1"), (None, "v1")],
    ids=["1.20.2-recorded", "1.34", "not-served"],
)
def test_events_are_written_in_the_newest_api_the_server_serves(document: str | None, api: str) -> None:
    server = ApiServer({"/apis/events.k8s.io": recorded(document)} if document else {})
    assert discovery.events_api(server) == api  # type: ignore[arg-type]


def test_nothing_is_scheduled_before_the_server_is_judged() -> None:
    """`/readyz` (and the scheduling loop, which waits for it) waits for the survey as for the first lists: no pod is
    bound by a scheduler that has not yet seen it is talking to a server older than it supports."""
    engine = Engine(make_plugin_manager("scheduler", plugins=(), autoload=False))
    custom = CustomScheduler(None, RecordingWriter(), engine, name="kubegpu")  # type: ignore[arg-type]
    custom.mirror.client = ApiServer(SERVER_1_34)  # type: ignore[assignment]
    custom.mirror.surveyed = threading.Event()  # what start_informers sets before it starts the survey's thread
    assert ready(custom) == (503, {"status": "syncing discovery"})
    assert not custom.mirror.ready()
    custom.mirror.survey_server()
    assert ready(custom)[0] == 200 and custom.mirror.ready()
