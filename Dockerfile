# Sluice container images, multi-stage. From the repository root:
#
#   docker build -t sluice:0.1.0 .                        sluice + CPU libtorch + OpenMPI:
#                                                         `sluice train` (also under mpirun), `run`
#   docker build --target fleet -t sluice:0.1.0-fleet .    no libtorch (~30 MB of binary):
#                                                         `sluice run` for preprocessing fleets
#
# Each build stage runs scripts/build.sh — the script the quickstart runs — and the runtime
# stages copy only what it installs under /opt/sluice. scripts/check-dockerfile.sh (part of
# scripts/test.sh) runs every `RUN scripts/build.sh …` line of this file and checks every
# `COPY --from` against what it installed, so a recipe out of step with the build fails the
# suite. The images hold no data and no credentials: mount or reach them at run time.

ARG RUST_IMAGE=rust:1.89-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---- build: sluice with libtorch (CPU, cut from PyPI's wheels) and the MPI backend ----
FROM ${RUST_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y -q --no-install-recommends libssl-dev pkg-config cmake \
        python3 python3-pip libopenmpi-dev openmpi-bin libclang-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/build.sh --mpi --prefix /opt/sluice

# ---- build-fleet: sluice without libtorch (Kafka, every object store, images) ----
FROM ${RUST_IMAGE} AS build-fleet
RUN apt-get update \
    && apt-get install -y -q --no-install-recommends libssl-dev pkg-config cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN scripts/build.sh --no-torch --prefix /opt/sluice

# ---- fleet: `sluice run` only ----
FROM ${RUNTIME_IMAGE} AS fleet
RUN apt-get update \
    && apt-get install -y -q --no-install-recommends ca-certificates libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 sluice
COPY --from=build-fleet /opt/sluice/bin/sluice /usr/local/bin/sluice
USER sluice
WORKDIR /home/sluice
ENTRYPOINT ["sluice"]

# ---- train (the default image): `sluice train` and `sluice run`, one rank per pod ----
# OpenMPI and SSH as the MPI Operator's base images have them (Kubeflow Trainer's MPI runtime
# uses the same conventions): user `mpiuser` (uid 1000), an SSH server for that user on port
# 2222 from /home/mpiuser/.sshd_config (the worker pods run `sshd -De -f` it), and an SSH
# client that reaches port 2222 without host-key prompts; the operator mounts the keys at
# /home/mpiuser/.ssh. `sluice k8s` writes the manifests.
FROM ${RUNTIME_IMAGE} AS train
RUN apt-get update \
    && apt-get install -y -q --no-install-recommends ca-certificates libssl3 libgomp1 \
        openmpi-bin libopenmpi3 openssh-client openssh-server \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --shell /bin/bash mpiuser \
    && printf 'PidFile /home/mpiuser/sshd.pid\nHostKey /home/mpiuser/.ssh/id_rsa\nStrictModes no\nPort 2222\n' \
        > /home/mpiuser/.sshd_config \
    && chown mpiuser:mpiuser /home/mpiuser/.sshd_config \
    && printf 'Host *\n    Port 2222\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n' \
        >> /etc/ssh/ssh_config
COPY --from=build /opt/sluice/bin/sluice /usr/local/bin/sluice
COPY --from=build /opt/sluice/lib /opt/sluice/lib
ENV LD_LIBRARY_PATH=/opt/sluice/lib \
    OMP_NUM_THREADS=1
USER mpiuser
WORKDIR /home/mpiuser
ENTRYPOINT ["sluice"]
