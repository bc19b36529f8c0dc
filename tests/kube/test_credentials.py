"""The API clients' TLS set-up: a client told to verify nothing loads no certificate authorities."""

from __future__ import annotations

import ssl

import pytest

from kubegpu.kube.client import AsyncKubeClient, Credentials, KubeClient, RateLimiter


def test_a_client_that_verifies_nothing_loads_no_certificate_authorities(monkeypatch: pytest.MonkeyPatch) -> None:
    """`insecure-skip-tls-verify`: the writer's context and the pool's connections verify nothing, so the system's
    certificate authorities (15-30 ms each time) are never loaded, at start or per connection."""
    loaded: list[object] = []
    original = ssl.SSLContext.load_default_certs
    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", lambda self, *a: loaded.append(a) or original(self, *a))
    credentials = Credentials("https://127.0.0.1:1", None, None, None, False, "Bearer x")
    writer = AsyncKubeClient(credentials, RateLimiter(0, 1), connections=1)
    try:
        context = writer.session.connector._ssl  # type: ignore[union-attr]
        assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_NONE
    finally:
        writer.close()
    pool = KubeClient(credentials).pool
    context = pool.connection_pool_kw["ssl_context"]
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    assert loaded == []
