#!/usr/bin/env bash
# Installs a CPU libtorch 2.13.0 (what `tch 0.26` needs) into target/services/libtorch/torch,
# cut from PyPI's wheels: download.pytorch.org (tch's own download) is not reachable from
# every network, PyPI is. The x86_64 torch wheel is the CUDA build; its CPU library needs
# the CUDA runtime and CUPTI shared objects (from two small nvidia wheels) but no GPU, and the
# CUDA-only libraries are left out so torch-sys links the CPU build.
#
#   scripts/libtorch.sh            install if missing, print the directory
#   source scripts/libtorch.sh     same, and export LIBTORCH for cargo
#
# Idempotent: a stamp file records the installed version. ~540 MB download, ~1 GB on disk.
# (No `set -e` here: when sourced it would change the caller's shell; errors return 1.)

_sluice_libtorch() {
    local root dest version stamp tmp
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    dest="$root/target/services/libtorch"
    version="2.13.0"
    stamp="$dest/torch/.sluice-libtorch"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
        echo "$dest/torch"
        return 0
    fi
    echo "[libtorch] installing CPU libtorch $version from PyPI wheels into $dest" >&2
    command -v python3 >/dev/null || { echo "[libtorch] python3 is needed (to fetch wheels from PyPI)" >&2; return 1; }
    tmp="$(mktemp -d)"
    python3 -m pip download --no-deps --no-cache-dir --disable-pip-version-check --quiet -d "$tmp" \
        "torch==$version" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cupti==13.0.85" >&2 \
        || { echo "[libtorch] downloading the wheels from PyPI failed" >&2; rm -rf "$tmp"; return 1; }
    rm -rf "$dest"
    mkdir -p "$dest" || return 1
    python3 - "$tmp" "$dest" <<'PY' || { echo "[libtorch] unpacking failed" >&2; rm -rf "$tmp"; return 1; }
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
skip = ("libtorch_cuda", "libc10_cuda", "libtorch_python", "libtorch_nvshmem",
        "libcaffe2_nvrtc", "libtorch_global_deps")
torch_wheel = glob.glob(os.path.join(tmp, "torch-*.whl"))[0]
with zipfile.ZipFile(torch_wheel) as z:
    for n in z.namelist():
        keep = n.startswith(("torch/lib/", "torch/include/")) or n == "torch/version.py"
        if keep and not os.path.basename(n).startswith(skip):
            z.extract(n, dest)
for pattern, lib in (("nvidia_cuda_runtime-*.whl", "libcudart.so.13"),
                     ("nvidia_cuda_cupti-*.whl", "libcupti.so.13")):
    with zipfile.ZipFile(glob.glob(os.path.join(tmp, pattern))[0]) as z:
        data = z.read("nvidia/cu13/lib/" + lib)
    with open(os.path.join(dest, "torch", "lib", lib), "wb") as f:
        f.write(data)
for so in glob.glob(os.path.join(dest, "torch", "lib", "*.so*")):
    os.chmod(so, 0o755)
PY
    rm -rf "$tmp"
    echo "$version" > "$stamp" || return 1
    echo "$dest/torch"
}

if _sluice_libtorch_dir="$(_sluice_libtorch)"; then
    if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
        export LIBTORCH="$_sluice_libtorch_dir"
        unset LIBTORCH_USE_PYTORCH
    else
        echo "$_sluice_libtorch_dir"
    fi
else
    if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then return 1; else exit 1; fi
fi
