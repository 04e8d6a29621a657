# syntax=docker/dockerfile:1
# The platform's image: Ray head and GPU workers, sweep drivers, the nightly job. One image for
# linux/amd64 and linux/arm64 (GB200 hosts are aarch64):
#
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg REVISION=$(git rev-parse HEAD) \
#       -t ghcr.io/ladder/scaling-ladder:0.1.0 --push .
#
# It installs the project as `make` does (`make .venv/.installed`: a venv in .venv/, -e '.[dev]'
# installed by uv with pip's settings, then the bytecode warm-up), then the `gpu` and `ray-cluster` extras (JAX's CUDA plugin; Ray's
# dashboard, job server and client, at the version cluster/kuberay/raycluster-gb200.yaml names).
#
# torch is pinned to torch==2.13.0. Installed from PyPI, as here, that pin is the CUDA 13 build on both
# architectures: the CUDA libraries come as wheels and the host provides only the driver, through the
# NVIDIA container toolkit. For a CPU-only image (a laptop, a CPU pool), point pip at PyTorch's CPU index,
# where the same pin is the CPU build:  --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# --build-arg EXTRAS=ray-cluster
ARG PYTHON_VERSION=3.12
FROM python:${PYTHON_VERSION}-slim-bookworm

ARG TORCH_INDEX_URL=""
ARG EXTRAS=gpu,ray-cluster
ARG REVISION=unknown
LABEL org.opencontainers.image.title="scaling-ladder" \
      org.opencontainers.image.description="Scaling-ladder experiment platform: ladder, sweeps on Ray, MLflow, fits" \
      org.opencontainers.image.revision="${REVISION}"

# make and a C/C++ toolchain: make runs the install as on a workstation; Triton (FlexAttention's compiled
# kernels) and inductor compile their launchers at run time. wget: KubeRay's health probes call it.
# Debian's point releases replace package versions, so pins here would break rebuilds; the base image tag
# fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends make gcc g++ libc6-dev wget \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/ladder
COPY . .

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -n "${TORCH_INDEX_URL}" ]; then export PIP_EXTRA_INDEX_URL="${TORCH_INDEX_URL}"; fi \
    && make .venv/.installed \
    && .venv/bin/pip install --quiet --no-compile -e ".[${EXTRAS}]" \
    && .venv/bin/ladder --help > /dev/null

# Trials write their run directories, checkpoints and caches under the working directory: /runs, the
# volume every node of a pool shares (cluster/kuberay/raycluster-gb200.yaml mounts it).
RUN useradd --create-home --uid 1000 ladder && mkdir -p /runs && chown ladder:ladder /runs
ENV PATH=/opt/ladder/.venv/bin:${PATH} \
    PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /runs
CMD ["ladder", "--help"]
