#!/usr/bin/env bash
# test/test_makefile.sh — the Makefile's view of the machines people have. The GPU build's command
# line with their MPI installs: the MPI wrapper's flags reach nvcc in a form it takes (Open MPI's
# upstream builds, and HPC-X's and NVHPC's, print g++ options nvcc refuses, -pthread and -Wl,-rpath
# -Wl,DIR, which must go through -Xcompiler/-Xlinker; MPICH has no --showme, so its
# -compile_info/-link_info are read instead). And the GPU it builds for from nvidia-smi: an H100's
# architecture, and none from a driver too old to know the compute_cap field (which prints its
# complaint on stdout). Each install is a stub first on PATH; `make -n` prints the commands without
# running them. Prints `PASS`/`FAIL` lines, then `N passed, N failed`; exits 1 on a failure.
#
#   test/test_makefile.sh
set -u
# The Makefile's own choices are under test, as a make started from a shell makes them: not those of
# the make that may have started this test (make test exports CUDA_ARCHS, and its MAKELEVEL would hide
# the "building for" line).
unset CUDA_ARCHS GPU CPU MAKELEVEL MAKEFLAGS MFLAGS
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 1
passed=0 failed=0
# nvcc: NVCC (which the test runner may set empty), else the one on PATH, else the toolkit's.
nvcc_bin=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [[ ! -x $nvcc_bin ]]; then
    echo "SKIP test_makefile (no nvcc: the GPU build is not made here)"
    echo "0 passed, 0 failed"
    exit 0
fi
sb=$(mktemp -d /tmp/test_makefile_XXXXXX)
trap 'rm -rf "$sb"' EXIT

# stub NAME: an mpicxx for that install in $sb/NAME, its script on stdin.
stub() {
    mkdir -p "$sb/$1"
    cat > "$sb/$1/mpicxx"
    chmod +x "$sb/$1/mpicxx"
}
stub openmpi-upstream <<'X'
#!/bin/sh
case "$1" in
  --showme:compile) echo "-I/opt/ompi/include -pthread" ;;
  --showme:link) echo "-I/opt/ompi/include -pthread -Wl,-rpath -Wl,/opt/ompi/lib -Wl,--enable-new-dtags -L/opt/ompi/lib -lmpi" ;;
  *) exit 1 ;;
esac
X
stub mpich <<'X'
#!/bin/sh
case "$1" in
  -compile_info|-link_info) echo "g++ -Wl,-z,relro -I/usr/include/mpich -L/usr/lib/mpich -lmpichcxx -lmpich" ;;
  *) echo "g++: error: unrecognized command-line option '$1'" >&2; exit 1 ;;
esac
X

# The nvcc command `make -n GPU=1` prints for a GPU trainer with the stub install $1 first on PATH.
nvcc_line() {
    PATH="$sb/$1:$PATH" make -n --no-print-directory GPU=1 CUDA_ARCHS=80 BUILD="$sb/build" NVCC="$nvcc_bin" \
        "$sb/build/gpu/train_gpt2" 2>/dev/null | grep -E '(^|/)nvcc ' | grep -v '✓' | tail -1
}
check() {  # name, the install, words the line must have, words it must not have (| separated)
    local line
    line=$(nvcc_line "$2")
    local ok=1 word
    IFS='|' read -ra want <<< "$3"
    IFS='|' read -ra refuse <<< "$4"
    for word in "${want[@]}"; do [[ " $line " == *" $word "* ]] || ok=0; done
    for word in "${refuse[@]}"; do [[ -n $word && " $line " == *" $word "* ]] && ok=0; done
    if [[ $ok == 1 ]]; then
        echo "PASS $1"
        passed=$((passed + 1))
    else
        echo "FAIL $1: ${line:-no nvcc command}"
        failed=$((failed + 1))
    fi
}
if ! grep -qs . /usr/local/cuda/include/nccl.h /usr/include/nccl.h "${NCCL_HOME:-/nonexistent}/include/nccl.h"; then
    echo "SKIP MPI flags for nvcc (no nccl.h: the build uses no MPI without NCCL)"
else
    check "Open MPI's upstream wrapper: -pthread via -Xcompiler, -Wl,... via -Xlinker" openmpi-upstream \
        "-I/opt/ompi/include|-Xcompiler -pthread|-Xlinker -rpath|-Xlinker /opt/ompi/lib|-Xlinker --enable-new-dtags|-lmpi|-DUSE_MPI" \
        "-pthread -I/opt|-Wl,-rpath|-Wl,/opt/ompi/lib"
    check "MPICH's wrapper (no --showme): its -compile_info/-link_info" mpich \
        "-I/usr/include/mpich|-L/usr/lib/mpich|-lmpichcxx|-lmpich|-Xlinker -z,relro|-DUSE_MPI" "-Wl,-z,relro|g++"
fi

# The target make picks from a stub nvidia-smi printing $2 (its "→ building for" line must hold $3).
check_gpu() {
    mkdir -p "$sb/smi-$1"
    printf '#!/bin/sh\necho "%s"\n' "$2" > "$sb/smi-$1/nvidia-smi"
    chmod +x "$sb/smi-$1/nvidia-smi"
    local line
    line=$(PATH="$sb/smi-$1:$PATH" make -n --no-print-directory BUILD="$sb/build" NVCC="$nvcc_bin" tokenize 2>&1 |
        grep '→ building for')
    if [[ $line == *"$3"* ]]; then
        echo "PASS $4"
        passed=$((passed + 1))
    else
        echo "FAIL $4: ${line:-no target line}"
        failed=$((failed + 1))
    fi
}
check_gpu h100 "NVIDIA H100 80GB HBM3, 9.0" "GPU (nvcc, sm_90a)" "nvidia-smi of an H100: builds for sm_90a"
check_gpu old 'Field "compute_cap" is not a valid field to query.' "CPU backend" \
    "nvidia-smi of a driver without compute_cap: no GPU to build for (not arch 'query.')"
echo "$passed passed, $failed failed"
((failed == 0))
