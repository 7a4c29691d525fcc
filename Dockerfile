# The Sweeper image: the controller (`sweeper sweep`, `sweeper serve`) and the node-local
# check (`sweeper check`, run in a check Job) are the same image.
#   docker build -t ghcr.io/sweeper-dev/sweeper:0.1.0 .
# NVML (libnvidia-ml) and nvidia-smi come from the host through the NVIDIA container
# toolkit in check Jobs, so neither is installed here. fi_info is not installed either: the
# host's needs the host's libfabric and rdma-core, which a check Job does not mount, and the
# full check judges EFA from sysfs. journalctl is: Debian's systemd package (bookworm: 252),
# about 30 MB with its libraries, reads the host's journal files the check Job mounts.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY sweeper ./sweeper
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="sweeper" \
      org.opencontainers.image.description="Keeps the GPU nodes of a Kubernetes cluster healthy" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /install /usr/local
# journalctl, for the journal's kernel lines the ring buffer lost; its version follows the base
# image's Debian release (a journal written by a newer systemd may be unreadable to it, which the
# check reports).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends systemd \
    && rm -rf /var/lib/apt/lists/*
# The shipped playbooks, templates, profiles and policies; a deployment mounts its own over them.
COPY playbooks /opt/sweeper/playbooks
COPY job-templates /opt/sweeper/job-templates
COPY profiles /opt/sweeper/profiles
COPY policies /opt/sweeper/policies
ENV SWEEPER_HOME=/opt/sweeper \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 sweeper && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sweeper
# The controller runs as this user; check and remediation Jobs set their own securityContext.
USER 10001:10001
ENTRYPOINT ["sweeper"]
CMD ["--help"]
