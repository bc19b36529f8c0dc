# One image for every kubegpu component: `kubegpu scheduler`, `extender`, `crishim`, `advertise`, `device-plugin`,
# `top`, `simulate` (examples/deploy/kustomize names it `kubegpu:0.1.0`).
#
#   docker build -t kubegpu:0.1.0 .                                          # any Debian/Ubuntu base with Python 3.10+
#   buildah bud --build-arg BASE=localhost/debian-python:bookworm -t kubegpu:0.1.0 .   # a base made offline
#
# BASE needs python3 (3.10 or later) with venv and pip. With no registry at hand, make one with mmdebstrap:
#   mmdebstrap --variant=apt --include=python3,python3-venv,python3-pip bookworm - | podman import - debian-python:bookworm
# Build dependencies are installed from PyPI (or the index PIP_INDEX_URL names), the wheels kept in one layer.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_INDEX_URL=${PIP_INDEX_URL}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cli cli
COPY core core
COPY plugins plugins
COPY kube kube
COPY scheduler scheduler
COPY crishim crishim
RUN python3 -m venv /opt/kubegpu && /opt/kubegpu/bin/pip install --no-compile . \
    && /opt/kubegpu/bin/kubegpu plugins list

FROM ${BASE}
COPY --from=build /opt/kubegpu /opt/kubegpu
ENV PATH=/opt/kubegpu/bin:$PATH PYTHONUNBUFFERED=1
# Unprivileged by default; node-side DaemonSets that need more say so in their securityContext.
USER 65532:65532
ENTRYPOINT []
CMD ["kubegpu", "--help"]
