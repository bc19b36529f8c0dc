"""The extender's bind verb against a stand-in API writer: a reservation is rolled back on every failure of the
Binding, whatever exception the Python in use raises for it, and the write goes on when kube-scheduler hangs up."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from kubegpu.core.manifests import pod_request
from kubegpu.core.plugin_manager import make_plugin_manager
from kubegpu.core.testing import make_node, pod_manifest
from kubegpu.kube.client import ApiError
from kubegpu.plugins.nvidia import scheduler as nvidia
from kubegpu.scheduler.engine import Engine
from kubegpu.scheduler.extender import ExtenderServer

from .test_properties import NODE_KINDS

KEY = b"k" * 32


class Writer:
    """The API writer's two calls the bind verb makes: POST the Binding, GET the pod back after a lost answer."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self.release = asyncio.Event()
        self.hold = False
        self.bindings: list[dict[str, Any]] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()  # the bind runs on the writer's loop, as `kubegpu extender` sets it up

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.hold:
            await self.release.wait()
        if self.failure is not None:
            raise self.failure
        self.bindings.append(body)
        return {}

    async def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        raise ApiError(0, "Unreachable", "the API server cannot be reached")


def extender_with(writer: Writer) -> tuple[ExtenderServer, bytes]:
    engine = Engine(make_plugin_manager("scheduler", plugins=[("nvidia", nvidia)], autoload=False), signing_key=KEY)
    engine.add_node(make_node("p3-0", **NODE_KINDS["p3"]))
    extender = ExtenderServer(engine, None, writer)  # type: ignore[arg-type]
    pod = pod_manifest("p", {"main": {"nvidia.com/gpu": 8}}, namespace="ns")
    pod["metadata"].update(uid="uid-1", resourceVersion="1")
    extender.unbound.pods["ns/p"] = ("1", pod_request(pod)[0])
    body = orjson.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-1", "Node": "p3-0"})
    return extender, body


@pytest.mark.parametrize(
    "failure",
    [
        ApiError(409, "Conflict", "the pod is already bound"),
        asyncio.TimeoutError(),  # aiohttp's timeout: not a TimeoutError before Python 3.11
        TimeoutError(),
        ConnectionResetError(),
        RuntimeError("a bug"),
    ],
    ids=["api-error", "asyncio-timeout", "timeout", "connection-reset", "a-bug"],
)
def test_any_failure_of_the_binding_rolls_the_reservation_back(failure: BaseException) -> None:
    """Finding 10 of issue 10 (the extender's part): on Python 3.10 an aiohttp timeout escaped the rollback, and
    the pod's eight GPUs stayed reserved for a pod that was never bound."""
    extender, body = extender_with(Writer(failure))
    answer = asyncio.run(extender.bind(body))
    assert answer["Error"].startswith("binding ns/p to p3-0 failed"), answer
    assert "ns/p" not in extender.engine.pods
    # The devices are free again: the same pod binds once the API server answers.
    extender.binder.writer.failure = None  # type: ignore[attr-defined]
    assert asyncio.run(extender.bind(body)) == {"Error": ""}
    assert extender.engine.pods["ns/p"].node == "p3-0"


def test_a_caller_hanging_up_does_not_cancel_the_binding_or_its_rollback() -> None:
    """kube-scheduler's timeout closes the connection while the Binding is being written; the HTTP server cancels
    its wait. The write goes on, and its outcome (here a failure) is still settled: the reservation rolled back."""
    writer = Writer(ApiError(500, "InternalError", "etcd is down"))
    writer.hold = True
    extender, body = extender_with(writer)

    async def story() -> None:
        waiting = asyncio.get_running_loop().create_task(extender.bind(body))
        for _ in range(1000):  # until reserved, with the Binding under way
            if "ns/p" in extender.engine.pods:
                break
            await asyncio.sleep(0)
        waiting.cancel()  # the connection is gone
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert "ns/p" in extender.engine.pods
        writer.release.set()
        await asyncio.wait_for(asyncio.gather(*extender._placing), 5)

    asyncio.run(story())
    assert "ns/p" not in extender.engine.pods
