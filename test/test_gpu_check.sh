#!/usr/bin/env bash
# test/test_gpu_check.sh — what scripts/gpu_check.sh (make gpu-check) does without a GPU: one line
# saying so and exit 1; a bad option: one line naming it and exit 2; --help: the usage, exit 0.
# (On a GPU machine the script itself is the test: it runs everything and counts failures.)
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
passed=0 failed=0
check() {  # name, expected exit, expected text, command...
    local name=$1 want_rc=$2 want_text=$3
    shift 3
    local out rc
    out=$("$@" 2>&1)
    rc=$?
    if [[ $rc -eq $want_rc && $out == *"$want_text"* && $(echo "$out" | wc -l) -le ${MAX_LINES:-1} ]]; then
        echo "PASS $name  exit $rc: $(echo "$out" | head -1)"
        passed=$((passed + 1))
    else
        echo "FAIL $name  exit $rc (want $want_rc), output: $(echo "$out" | head -3)"
        failed=$((failed + 1))
    fi
}
if nvidia-smi -L >/dev/null 2>&1; then
    echo "SKIP gpu_check's no-GPU message (this machine has a GPU: run make gpu-check)"
else
    check "gpu_check without a GPU" 1 "no NVIDIA GPU found" "$root/scripts/gpu_check.sh"
fi
check "gpu_check with an unknown option" 2 "unknown option '--bogus'" "$root/scripts/gpu_check.sh" --bogus
check "gpu_check --steps 1 refused" 2 "--steps wants a number >= 2" "$root/scripts/gpu_check.sh" --steps 1
MAX_LINES=20 check "gpu_check --help" 0 "make gpu-check" "$root/scripts/gpu_check.sh" --help
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
