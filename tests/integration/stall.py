"""A TLS proxy in front of the test API server that can hold back what the server sends on pod watches.

It stands for what makes one replica's pod watch fall behind in a real cluster: a half-open connection the kernel has
not noticed yet (the client reads nothing for up to its read timeout), or an API server whose watch cache is behind
etcd. Requests pass through at once; while the proxy is `held`, the bytes the server sends on a connection whose last
request was a watch of pods wait in the proxy, and are delivered in order once it is `released`. Every other request
(lists, the Lease, Bindings) is answered as usual, so only the watch is stale. With `lists=True` the pod lists are
held too: a process that starts behind it cannot finish listing pods until the proxy is released.

The proxy presents the API server's own self-signed certificate (the kubeconfigs skip verification, as the cluster's).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from pathlib import Path

from .cluster import Cluster


class StallingProxy:
    def __init__(self, cluster: Cluster, *, lists: bool = False) -> None:
        self.lists = lists
        certs = cluster.workdir / "certs"
        self.upstream = cluster.port
        self._serving = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._serving.load_cert_chain(certs / "apiserver.crt", certs / "apiserver.key")
        self._connecting = ssl.create_default_context()
        self._connecting.check_hostname = False
        self._connecting.verify_mode = ssl.CERT_NONE
        self.held_watches = 0  # pod watches opened through the proxy so far
        self.loop = asyncio.new_event_loop()
        self._released = asyncio.Event()
        self._released.set()
        self._server = self.loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=self._serving)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self.loop.run_forever, name="stalling-proxy", daemon=True)
        self._thread.start()

    def kubeconfig(self, cluster: Cluster, path: Path) -> Path:
        """A copy of the cluster's kubeconfig that reaches the API server through this proxy."""
        text = cluster.kubeconfig.read_text().replace(cluster.url, f"https://127.0.0.1:{self.port}")
        path.write_text(text)
        return path

    def hold(self) -> None:
        self.loop.call_soon_threadsafe(self._released.clear)

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self._released.set)

    def close(self) -> None:
        """Stop serving and drop every connection (the replicas behind it see them reset)."""

        async def shut() -> None:
            self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(shut(), self.loop)
        self._thread.join(10)
        self.loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(
                "127.0.0.1", self.upstream, ssl=self._connecting, server_hostname="127.0.0.1"
            )
        except OSError:
            writer.close()
            return
        watching = [False]  # the connection's last request watches pods

        async def requests() -> None:
            while data := await reader.read(65536):
                if data.startswith(b"GET "):
                    line = data.split(b"\r\n", 1)[0]
                    watching[0] = b"/api/v1/pods?" in line and (self.lists or b"watch=true" in line)
                    self.held_watches += watching[0]
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def responses() -> None:
            while data := await up_reader.read(65536):
                if watching[0]:
                    await self._released.wait()
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(OSError, ssl.SSLError, ConnectionError):
            await asyncio.gather(requests(), responses())
        for end in (writer, up_writer):
            end.close()
