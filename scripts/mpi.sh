#!/usr/bin/env bash
# OpenMPI for the `mpi` all-reduce backend (cargo feature `mpi`): the library, `mpirun` and
# libclang (the `mpi` crate generates its bindings at build time). Debian/Ubuntu, ~30 s.
# Source it to also get the environment `mpirun` needs here (root user, more ranks than cores).
if ! command -v mpirun >/dev/null 2>&1 || [[ ! -f /usr/include/x86_64-linux-gnu/openmpi/mpi.h && ! -f /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]] || ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
        echo "[mpi] installing OpenMPI and libclang with apt-get" >&2
        apt-get install -y -q libopenmpi-dev openmpi-bin libclang-dev >/dev/null
    else
        echo "error: OpenMPI not found; install libopenmpi-dev openmpi-bin libclang-dev" >&2
        return 1 2>/dev/null || exit 1
    fi
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
