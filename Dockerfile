# laxflow's container image: the daemon, the coordinator, `laxflow status`, and
# the source of the shim that serving pods preload (deploy/kubernetes/).
#
#   docker build -t laxflow:0.1.0 .
#   docker run --rm laxflow:0.1.0 shim-path
#
# Stage "build" compiles everything native (the cffi modules, the mfs glue,
# liblaxflow_shim.so through setup.py, and the NCCL profiler plugin) and
# collects laxflow's wheel with the wheels of its dependencies; the runtime
# stage installs them offline (--no-index) and carries no compiler.

FROM python:3.12-slim-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev make libibverbs-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY native/ native/
COPY src/ src/
# The wheel's build runs `make -C native` (the shim, needs <infiniband/verbs.h>);
# the profiler plugin is not part of the wheel's build, so it is built here.
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
    && make -C native/nccl_profiler OUT=/plugin

FROM python:3.12-slim-bookworm AS runtime
# libibverbs1: the shim links the real libibverbs.so.1; libnuma1: NIC locality;
# iproute2: `ip` for port checks. Providers (mlx5 ...) come with the serving
# image that runs the shim, not with this one.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libibverbs1 libnuma1 iproute2 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 laxflow \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin laxflow
COPY --from=build /wheels /wheels
COPY --from=build /plugin/libnccl-profiler-laxflow.so /plugin/
SHELL ["/bin/sh", "-e", "-c"]
RUN pip install --no-cache-dir --no-index --find-links /wheels /wheels/laxflow-*.whl \
    && cp /plugin/libnccl-profiler-laxflow.so "$(dirname "$(laxflow shim-path)")/" \
    && rm -rf /wheels /plugin
USER 10001:10001
ENTRYPOINT ["laxflow"]
CMD ["--help"]
