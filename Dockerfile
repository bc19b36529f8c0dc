# One image for every kubegpu component: `kubegpu scheduler`, `extender`, `crishim`, `advertise`, `device-plugin`,
# `top`, `simulate` (examples/deploy/kustomize names it `kubegpu:0.1.0`).
#
#   docker build -t kubegpu:0.1.0 .                                          # any Debian/Ubuntu base with Python 3.10+
#   ./scripts/image.sh                                                       # no registry: base made with mmdebstrap
#
# BASE needs python3 (3.10 or later) with venv (its pip reads the lock's environment markers from 20.3 on) and
# libstdc++ (grpcio's wheels); on Debian: python3, python3-venv, libstdc++6, and ca-certificates for HTTPS indexes.
# With no registry at hand, scripts/image.sh makes one with mmdebstrap, imports it into buildah's storage and runs
#   buildah bud --layers --network host --build-arg BASE=localhost/kubegpu-base:bookworm-KEY -t kubegpu:0.1.0 .
# Dependencies come from PyPI, or from the index the build arguments PIP_INDEX_URL / PIP_EXTRA_INDEX_URL /
# PIP_TRUSTED_HOST name, PIP_CERT naming a CA bundle mounted into the build (they reach the build stage only, never the
# image).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Dependencies first, in a layer of their own keyed by the lock alone: exactly the versions the test suite ran, every
# file's hash checked (requirements/runtime.txt, exported from uv.lock by scripts/lock.sh, with the build tools), so
# a change to kubegpu's code rebuilds only the small layer below and a rebuild next month resolves nothing.
COPY requirements/runtime.txt ./requirements/
RUN python3 -m venv /opt/kubegpu \
    && /opt/kubegpu/bin/pip install --require-hashes --no-deps -r requirements/runtime.txt
# The package folders (.dockerignore leaves out tests, docs, examples, scripts and caches): a package folder added to
# pyproject.toml's package-dir needs no line here.
COPY . ./
RUN /opt/kubegpu/bin/pip install --no-deps --no-build-isolation . \
    && /opt/kubegpu/bin/kubegpu plugins list

FROM ${BASE}
COPY --from=build /opt/kubegpu /opt/kubegpu
ENV PATH=/opt/kubegpu/bin:$PATH PYTHONUNBUFFERED=1
# Unprivileged by default; node-side DaemonSets that need more say so in their securityContext.
USER 65532:65532
ENTRYPOINT []
CMD ["kubegpu", "--help"]
