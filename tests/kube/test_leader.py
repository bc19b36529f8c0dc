"""Leader election's deadline: the leader stops acting before its Lease can expire, whatever its renewals do.

A small Lease API on loopback stands in for the API server (GET, POST, PUT with resourceVersion conflicts, as
`coordination.k8s.io/v1` answers them) and can be told to stop answering, as an API server behind a dead load
balancer does: requests are accepted and never answered. The elector talks to it through the real `KubeClient`, so
the timeouts under test are the ones a scheduler runs with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest

from kubegpu.kube.client import ApiError, Credentials, KubeClient
from kubegpu.kube.leader import LeaderElector, Leadership, timing_problem

PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kubegpu"


class Store:
    """One Lease, as etcd keeps it behind every API server."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.lock = threading.Lock()
        self.renewed_at: list[float] = []  # monotonic times at which a write to the Lease was stored

    def store(self, lease: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        lease["metadata"]["resourceVersion"] = str(self.version)
        self.lease = lease
        self.renewed_at.append(time.monotonic())
        return lease


class LeaseApi(ThreadingHTTPServer):
    """An API server in front of `store`; `hang` makes every request wait unanswered until `release`."""

    daemon_threads = True

    def __init__(self, store: Store | None = None) -> None:
        super().__init__(("127.0.0.1", 0), LeaseHandler)
        self.data = store or Store()
        self.hang = threading.Event()
        self.release = threading.Event()
        self.garbled = 0  # the next this many requests get a 200 whose body is not JSON (a proxy's error page)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def lock(self) -> threading.Lock:
        return self.data.lock

    @property
    def renewed_at(self) -> list[float]:
        return self.data.renewed_at


class LeaseHandler(BaseHTTPRequestHandler):
    server: LeaseApi

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: Any) -> None:
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_one(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = orjson.loads(self.rfile.read(length)) if length else None
        with self.server.lock:
            hang = self.server.hang.is_set()
            lease = self.server.data.lease
            if self.server.garbled > 0:
                self.server.garbled -= 1
                self.garble()
            elif not hang:
                self.respond(lease, body)
        if hang:
            self.server.release.wait(60)

    def garble(self) -> None:
        data = b"<html><body>502 Bad Gateway</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def respond(self, lease: dict[str, Any] | None, body: Any) -> None:
        """The API server's answer (under the lock: `hang` stops every answer after it is set)."""
        if self.command == "GET":
            self.answer(200, lease) if lease else self.answer(404, {"reason": "NotFound", "message": "no"})
        elif self.command == "POST":
            if lease:
                self.answer(409, {"reason": "AlreadyExists", "message": "exists"})
            else:
                self.answer(201, self.server.data.store(body))
        elif lease is None or body["metadata"].get("resourceVersion") != lease["metadata"]["resourceVersion"]:
            self.answer(409, {"reason": "Conflict", "message": "the object has been modified"})
        else:
            self.answer(200, self.server.data.store(body))

    do_GET = do_POST = do_PUT = handle_one


@pytest.fixture
def serve() -> Iterator[Callable[[Store | None], LeaseApi]]:
    servers: list[LeaseApi] = []

    def start(store: Store | None = None) -> LeaseApi:
        server = LeaseApi(store)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def api(serve: Callable[[Store | None], LeaseApi]) -> LeaseApi:
    return serve(None)


def client_for(api: LeaseApi) -> KubeClient:
    return KubeClient(Credentials(api.url, None, None, None, False, None))


def wait_until(condition: Any, timeout: float, what: str) -> float:
    """Poll `condition` until it holds; the monotonic time it was first seen to hold."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.005)
    return time.monotonic()


class Callbacks:
    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()
        self.stopped_at = 0.0

    def on_started(self) -> None:
        self.started.set()

    def on_stopped(self) -> None:
        self.stopped_at = time.monotonic()
        self.stopped.set()


class RecordedLeadership(Leadership):
    def __init__(self) -> None:
        super().__init__()
        self.deadlines: list[float] = []

    def extend(self, until: float) -> None:
        self.deadlines.append(until)
        super().extend(until)


def elector(
    client: Any, callbacks: Callbacks, stop: threading.Event, identity: str = "one", **options: Any
) -> LeaderElector:
    return LeaderElector(
        client,
        namespace="kube-system",
        name="kubegpu",
        identity=identity,
        on_started=callbacks.on_started,
        on_stopped=callbacks.on_stopped,
        stop=stop,
        **options,
    )


def hasty_elector(client: Any, callbacks: Callbacks, stop: threading.Event, leadership: Leadership) -> LeaderElector:
    """`elector` with a 2 s lease renewed within 1 s, tried every 0.1 s, reporting to `leadership`."""
    return elector(
        client, callbacks, stop, lease_duration=2.0, renew_deadline=1.0, retry_period=0.1, leadership=leadership
    )


def test_a_hanging_renewal_ends_leadership_before_the_lease_can_expire(api: LeaseApi) -> None:
    """The API server stops answering: the renewal in flight must not hold the leader past its deadline (the old
    elector waited out the client's 30 s read timeout, while a standby took the Lease after 2 s)."""
    callbacks, stop, term = Callbacks(), threading.Event(), RecordedLeadership()
    timing: dict[str, Any] = {"lease_duration": 2.0, "renew_deadline": 1.0, "retry_period": 0.1}
    one = elector(client_for(api), callbacks, stop, leadership=term, **timing)
    one.start()
    try:
        assert callbacks.started.wait(5), "the elector never led"
        wait_until(lambda: len(api.renewed_at) >= 3, 5, "three renewals")
        with api.lock:
            api.hang.set()
            last_write = api.renewed_at[-1]
        # No other candidate can see the Lease expire before the last stored write plus the lease duration.
        expires = last_write + 2.0
        stopped = callbacks.stopped.wait(max(0.0, expires - time.monotonic()))
        assert stopped, (
            f"still leading {time.monotonic() - last_write:.1f}s after the last renewal, with a 2s lease "
            f"(is_leader={one.is_leader.is_set()})"
        )
        assert callbacks.stopped_at < expires
        assert not one.is_leader.is_set() and not term.holds()
        assert max(term.deadlines) <= last_write + 1.0, "it meant to act past its renew deadline"
    finally:
        stop.set()
        api.release.set()


def test_leadership_ends_at_the_deadline_even_while_the_elector_is_stuck() -> None:
    """What the scheduler checks before each pod and each write is a deadline, not the elector's word: a renewal
    stuck where no timeout reaches (a name lookup, a starved thread) cannot keep a replica acting."""

    class StuckClient:
        def __init__(self) -> None:
            self.lease: dict[str, Any] | None = None
            self.calls = 0
            self.release = threading.Event()

        def request(self, method: str, path: str, *, body: Any = None, timeout: float | None = None) -> Any:
            self.calls += 1
            if self.calls > 5:  # taking the Lease, one renewal, then the next renewal's PUT never returns
                self.release.wait(30)
            if method == "GET":
                if self.lease is None:
                    raise ApiError(404, "NotFound", "no lease")
                return self.lease
            self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.calls)}}
            return self.lease

    client, callbacks, stop, leadership = StuckClient(), Callbacks(), threading.Event(), Leadership()
    one = hasty_elector(client, callbacks, stop, leadership)
    one.start()
    try:
        assert callbacks.started.wait(5)
        wait_until(lambda: client.calls > 5, 5, "the stuck renewal")
        deadline = leadership.deadline
        assert deadline - time.monotonic() <= 1.0
        stopped_holding = wait_until(lambda: not leadership.holds(), 2, "the leadership to lapse")
        assert stopped_holding - deadline < 0.05
        assert one.is_leader.is_set() and not callbacks.stopped.is_set(), "the elector was not stuck after all"
    finally:
        stop.set()
        client.release.set()


def test_a_standby_takes_over_only_after_the_leader_stopped_acting(serve: Callable[[Store | None], LeaseApi]) -> None:
    """Two replicas, each with its own API server in front of one Lease; the leader's API server stops answering.
    The standby takes the Lease once the leader's record has been silent for the lease duration, by which time the
    leader has stopped acting, with the lease duration minus the renew deadline to spare for its last writes."""
    lease = Store()
    leader_api, standby_api = serve(lease), serve(lease)
    stop = threading.Event()
    timing: dict[str, Any] = {"lease_duration": 1.5, "renew_deadline": 0.8, "retry_period": 0.1}
    one_callbacks, one_term = Callbacks(), Leadership()
    one = elector(client_for(leader_api), one_callbacks, stop, "one", leadership=one_term, **timing)
    two_callbacks, two_term = Callbacks(), Leadership()
    two = elector(client_for(standby_api), two_callbacks, stop, "two", leadership=two_term, **timing)
    one.start()
    try:
        assert one_callbacks.started.wait(5)
        two.start()
        wait_until(lambda: len(lease.renewed_at) >= 5, 5, "the leader's renewals")
        assert not two_callbacks.started.is_set()
        with lease.lock:
            leader_api.hang.set()
        one_stopped_acting = wait_until(lambda: not one_term.holds(), 2, "the leader to stop acting")
        two_started_acting = wait_until(two_term.holds, 5, "the standby to take over")
        assert one_callbacks.stopped.wait(1), "the leader never gave up"
        margin = two_started_acting - one_stopped_acting
        assert margin >= 1.5 - 0.8 - 0.05, f"the standby began {margin:.2f}s after the leader stopped"
        assert lease.lease is not None and lease.lease["spec"]["holderIdentity"] == "two"
    finally:
        stop.set()


def test_a_standby_answered_garbage_stays_a_candidate(api: LeaseApi) -> None:
    """A proxy before the API server answers a few requests with a page that is not JSON: the attempt failed, and
    the candidate tries again (its election thread ended on the decoding error, so the replica never led again)."""
    callbacks, stop = Callbacks(), threading.Event()
    with api.lock:
        api.garbled = 2
    one = elector(client_for(api), callbacks, stop, lease_duration=2.0, renew_deadline=1.0, retry_period=0.1)
    one.start()
    try:
        assert callbacks.started.wait(5), f"never led (election thread alive: {one.is_alive()})"
    finally:
        stop.set()


def test_a_leader_whose_renewals_are_answered_garbage_gives_up_at_its_deadline(api: LeaseApi) -> None:
    """The renewals get a page that is not JSON until the renew deadline passes: the leader gives up (the scheduler
    exits so that a fresh process stands by) rather than its election thread ending while the replica still
    reports itself the leader and never acts nor exits."""
    callbacks, stop, leadership = Callbacks(), threading.Event(), Leadership()
    one = hasty_elector(client_for(api), callbacks, stop, leadership)
    one.start()
    try:
        assert callbacks.started.wait(5)
        with api.lock:
            api.garbled = 1_000_000
        assert callbacks.stopped.wait(5), (
            f"never gave up (election thread alive: {one.is_alive()}, holds: {leadership.holds()})"
        )
        assert not one.is_leader.is_set()
    finally:
        stop.set()


@pytest.mark.parametrize(
    ("lease_duration", "renew_deadline", "retry_period", "names"),
    [
        (10, 10, 2, "--lease-duration"),
        (10, 12, 2, "--lease-duration"),
        (15, 10, 10, "--retry-period"),
        (15, 10, 0, "positive"),
    ],
    ids=["deadline-equals-lease", "deadline-past-lease", "no-retry-before-deadline", "zero-retry"],
)
def test_timings_that_could_let_two_replicas_bind_are_refused(
    lease_duration: float, renew_deadline: float, retry_period: float, names: str
) -> None:
    problem = timing_problem(lease_duration, renew_deadline, retry_period)
    assert problem is not None and names in problem
    with pytest.raises(ValueError, match=names):
        LeaderElector(
            None,  # type: ignore[arg-type]
            namespace="kube-system",
            name="kubegpu",
            identity="one",
            on_started=lambda: None,
            on_stopped=lambda: None,
            stop=threading.Event(),
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
        )
    assert timing_problem(15, 10, 2) is None


# -- handing over on SIGTERM ---------------------------------------------------------------------------------------


def edit_by_hand(store: Store, **spec: Any) -> None:
    """A `kubectl edit` of the Lease: the fields given, the rest (renewTime, annotations) as they were."""
    with store.lock:
        assert store.lease is not None
        store.store({**store.lease, "spec": {**store.lease["spec"], **spec}})


@pytest.mark.parametrize(
    ("story", "takes_at_once"),
    [
        ("released by its holder", True),
        ("holder cleared by hand", False),
        ("holder cleared by hand after a replica that keeps annotations took it from a release", False),
        ("holder cleared by hand before the standby ever looked", False),
    ],
)
def test_only_a_lease_its_holder_released_is_taken_at_once(api: LeaseApi, story: str, takes_at_once: bool) -> None:
    """The leader's record is fresh, so a standby must wait it out (15 s), unless the leader itself gave the Lease up
    once it could act no more. A hand edit clearing the holder looks like a release to client-go, not to kubegpu:
    neither on the leader's record, nor on a later holder's that still carries an old release's annotation (a
    replica of an earlier kubegpu, which rewrites the Lease it read)."""
    one = elector(client_for(api), Callbacks(), threading.Event(), "one")
    two = elector(client_for(api), Callbacks(), threading.Event(), "two")
    assert one.try_acquire_or_renew(time.monotonic() + 2)
    if story != "holder cleared by hand before the standby ever looked":  # e.g. a standby just started, or slow
        assert not two.try_acquire_or_renew(time.monotonic() + 2)  # the standby has seen the leader's record
    if story == "released by its holder":
        assert one.release(2)
    elif story.startswith("holder cleared by hand") and "release" not in story:
        edit_by_hand(api.data, holderIdentity=None)
    else:
        assert one.release(2)
        edit_by_hand(api.data, holderIdentity="older", renewTime="2026-01-01T00:00:00.000000Z")
        edit_by_hand(api.data, holderIdentity=None)
    assert two.try_acquire_or_renew(time.monotonic() + 2) is takes_at_once, api.data.lease


def test_a_leader_releases_only_the_record_it_wrote(api: LeaseApi) -> None:
    """Someone wrote the Lease after the leader's last renewal (a standby that waited it out, a hand edit): the
    leader's release must not overwrite that record."""
    one = elector(client_for(api), Callbacks(), threading.Event(), "one")
    assert one.try_acquire_or_renew(time.monotonic() + 2)
    edit_by_hand(api.data, holderIdentity="two")
    assert not one.release(2)
    assert api.data.lease is not None and api.data.lease["spec"]["holderIdentity"] == "two"


def test_a_renewal_answered_after_the_leader_gave_up_does_not_bring_leadership_back() -> None:
    leadership = Leadership()
    leadership.extend(time.monotonic() + 10)
    leadership.give_up()
    leadership.extend(time.monotonic() + 10)
    assert not leadership.holds()
