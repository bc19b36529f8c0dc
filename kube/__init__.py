"""The Kubernetes API client both sides of kubegpu use: the scheduler's front-ends and the node side.

`client` is the fast client (a keep-alive connection pool with orjson, an asyncio twin for writes) and the
list-then-watch `Informer`; `leader` is Lease-based leader election on top of it. Nothing here knows the scheduler or
the node side: both import this package, never each other.
"""
