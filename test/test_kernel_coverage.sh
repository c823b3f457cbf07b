#!/usr/bin/env bash
# test/test_kernel_coverage.sh — the kernel coverage check (scripts/kernel_coverage.py) on planted
# source trees and launch records: a kernel defined and never launched fails and is named, a fully
# launched tree passes. With the directory of the test binaries as argument (run_tests.sh gives
# its BUILD_DIR), also what the CPU backend records under SIMT_COVERAGE_DIR: template kernels by
# base name, and a kernel whose launch faults (the process ends in _exit, running no exit handler).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
build=${1:-}
coverage="$root/scripts/kernel_coverage.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
report() {  # ok (0/1), name, detail
    if [[ $1 == 1 ]]; then echo "PASS $2  $3"; passed=$((passed + 1)); else echo "FAIL $2  $3"; failed=$((failed + 1)); fi
}
# check name want_rc want_text: runs the coverage script on $tmp/rec and $tmp/src; passes when it
# exits with want_rc and its output has want_text (the line shown).
check() {
    local out rc
    out=$(python3 "$coverage" "$tmp/rec" "$tmp/src" 2>&1)
    rc=$?
    local ok=0
    [[ $rc -eq $2 && $out == *"$3"* ]] && ok=1
    local line
    line=$(echo "$out" | grep -m1 -F "$3" || echo "$out" | head -1)
    report $ok "$1" "exit $rc: $line"
}

# A source tree: a header kernel, a template kernel with launch bounds (never launched), a kernel of
# the same name in two tests (each test must launch its own), and what must not count: a
# declaration, a commented-out kernel, one in a string, one in dev/cuda/bench_simt.cu.
mkdir -p "$tmp/src/llmc" "$tmp/src/test" "$tmp/src/dev/cuda" "$tmp/rec"
cat > "$tmp/src/llmc/ops.cuh" <<'EOF'
__global__ void scale_kernel(float* x, float a) { x[threadIdx.x] *= a; }
template <class T>
__global__ void __launch_bounds__(4 * 32, 1)
    unused_kernel(T* x) {
    x[0] = T(1);
}
__global__ void declared_kernel(int n);
// __global__ void commented_kernel(int n) {}
const char* text = "__global__ void quoted_kernel() {}";
EOF
cat > "$tmp/src/test/test_a.cu" <<'EOF'
__global__ void probe_kernel(int* out) { out[0] = 1; }
EOF
cat > "$tmp/src/test/test_b.cu" <<'EOF'
__global__ void probe_kernel(int* out) { out[0] = 2; }
EOF
echo '__global__ void bench_kernel() {}' > "$tmp/src/dev/cuda/bench_simt.cu"

printf 'scale_kernel\nprobe_kernel\n' > "$tmp/rec/test_a.100"
check "planted: a template kernel never launched fails, named with its place" 1 \
    "FAIL kernel never launched: unused_kernel (llmc/ops.cuh:3)"
check "planted: a test's own kernel launched only by another test of the same kernel name fails" 1 \
    "FAIL kernel never launched: probe_kernel (test/test_b.cu:1), by test_b"
check "declarations, comments, strings and bench_simt.cu are not counted" 1 "2 of 4 kernels executed"

printf 'unused_kernel\n' > "$tmp/rec/test_a.101"  # a forked child of test_a: a file of its own
printf 'probe_kernel\n' > "$tmp/rec/test_b.102"
check "every kernel launched (records of several processes joined) passes" 0 "4 of 4 kernels executed"

printf 'ghost_kernel\n' > "$tmp/rec/test_b.103"
check "a launched kernel the sources do not define fails (the check misread them)" 1 \
    "FAIL kernel launched by test_b but not found among the sources' definitions: ghost_kernel"
rm "$tmp/rec/test_b.103"
printf '? 0x1234\n' > "$tmp/rec/test_b.104"
check "a launch the backend could not name fails" 1 "FAIL kernel launched by test_b at 0x1234 has no name"
rm "$tmp/rec/test_b.104"
mkdir "$tmp/rec/sub.d"
check "a folder among the records is not read as one" 0 "4 of 4 kernels executed"
rmdir "$tmp/rec/sub.d"
out=$(python3 "$coverage" "$tmp/rec/test_a.101" "$tmp/src" 2>&1)
rc=$?
[[ $rc == 2 && $out == "kernel_coverage.py: error: not a directory: $tmp/rec/test_a.101 ("* ]] && ok=1 || ok=0
report $ok "a file as the records' directory: refused as not a directory" "exit $rc: $(echo "$out" | head -1)"

# What the backend records: binaries built for the CPU backend only (nvcc's do not record).
if [[ -n "$build" ]] && grep -q SIMT_COVERAGE_DIR "$build/test_gelu" 2>/dev/null; then
    rec="$tmp/backend"
    mkdir -p "$rec"
    SIMT_COVERAGE_DIR="$rec" "$build/test_gelu" > /dev/null 2>&1
    names=$(cat "$rec"/test_gelu.* 2>/dev/null | sort | tr '\n' ' ')
    [[ $names == "gelu_backward_inplace_kernel gelu_forward_kernel " ]] && ok=1 || ok=0
    report $ok "backend: test_gelu's template kernels recorded once each, by base name" "$names"

    rm -f "$rec"/*
    SIMT_COVERAGE_DIR="$rec" "$build/test_simt" --plant divergent_barrier > /dev/null 2>&1
    rc=$?
    names=$(cat "$rec"/test_simt.* 2>/dev/null | tr '\n' ' ')
    [[ $rc == 3 && $names == "divergent_barrier_kernel " ]] && ok=1 || ok=0
    report $ok "backend: a launch that faults (exit 3 through _exit) is recorded" "exit $rc: $names"
else
    echo "SKIP what the backend records (needs the CPU backend's build: test_kernel_coverage.sh build/cpu)"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
