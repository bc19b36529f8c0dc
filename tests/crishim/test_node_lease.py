"""The advertiser's node Lease: created when missing, renewed by one merge patch, left to expire when rounds stall."""

from __future__ import annotations

import argparse
import threading
from typing import Any

import pytest

from kubegpu.core.annotations import NODE_LEASE_LABEL
from kubegpu.crishim import advertise
from kubegpu.crishim.advertise import NodeLease, add_advertise_parser
from kubegpu.kube.client import ApiError
from kubegpu.scheduler.liveness import parse_time

PATH = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/kubegpu-trn-0"


class FakeLeases:
    """The Lease API as the renewer uses it: PATCH (404 while absent) and POST."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.calls: list[str] = []
        self.renewed = threading.Event()

    def patch(self, path: str, body: dict[str, Any], *, strategic: bool = False) -> Any:
        self.calls.append("PATCH")
        assert path == PATH and not strategic
        if self.lease is None:
            raise ApiError(404, "NotFound", 'leases "kubegpu-trn-0" not found')
        self.lease["spec"].update(body["spec"])
        self.renewed.set()
        return self.lease

    def post(self, path: str, body: dict[str, Any]) -> Any:
        self.calls.append("POST")
        assert path == PATH.rsplit("/", 1)[0]
        self.lease = body
        return body


def test_the_lease_is_created_labelled_then_renewed_with_one_patch() -> None:
    api = FakeLeases()
    lease = NodeLease(api, "trn-0", duration=7.5, stop=threading.Event())  # type: ignore[arg-type]
    assert lease.renew() and lease.renew()
    assert api.calls == ["PATCH", "POST", "PATCH"]
    assert api.lease is not None
    assert api.lease["metadata"]["labels"] == {NODE_LEASE_LABEL: "true"}
    spec = api.lease["spec"]
    assert spec["holderIdentity"] == "trn-0" and spec["leaseDurationSeconds"] == 8  # whole seconds, rounded up
    assert parse_time(spec["renewTime"]) is not None and parse_time(spec["acquireTime"]) is not None


def test_renewing_stops_while_rounds_stall_and_resumes_after() -> None:
    api = FakeLeases()
    stop, progressing = threading.Event(), threading.Event()
    lease = NodeLease(
        api,  # type: ignore[arg-type]
        "trn-0",
        renew_interval=0.01,
        stop=stop,
        alive=progressing.is_set,
    )
    lease.start()
    try:
        stop.wait(0.1)
        assert api.calls == []  # stalled from the start: the Lease is never renewed
        progressing.set()
        assert api.renewed.wait(5)
    finally:
        stop.set()
        lease.join(5)


def test_an_api_error_is_logged_and_the_next_tick_retries(caplog: pytest.LogCaptureFixture) -> None:
    class Refusing(FakeLeases):
        def post(self, path: str, body: dict[str, Any]) -> Any:
            raise ApiError(403, "Forbidden", "leases is forbidden")

    lease = NodeLease(Refusing(), "trn-0", stop=threading.Event())  # type: ignore[arg-type]
    assert not lease.renew()
    assert "cannot renew the node lease kube-node-lease/kubegpu-trn-0: 403 Forbidden" in caplog.text


def test_a_renew_interval_not_shorter_than_the_duration_is_refused() -> None:
    parser = argparse.ArgumentParser(prog="kubegpu")
    add_advertise_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["advertise", "--node-name", "n", "--lease-duration", "2s", "--lease-renew-interval", "2s"]
    )
    args.log_level = "error"
    with pytest.raises(SystemExit, match="--lease-renew-interval must be shorter than --lease-duration"):
        advertise.run(args, client_factory=lambda kubeconfig: FakeLeases())  # type: ignore[arg-type,return-value]
