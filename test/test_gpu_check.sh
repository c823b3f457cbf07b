#!/usr/bin/env bash
# test/test_gpu_check.sh — what scripts/gpu_check.sh (make gpu-check) does without a GPU: one line
# saying so and exit 1; a bad option: one line naming it and exit 2; --help: the usage, exit 0; and
# the parsing of the attention benchmark's sweep lines into its JSON.
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
# The sweep lines of dev/cuda/attention.cu -> JSON (scripts/attention_sweep.awk): a causal shape with
# the paper's figure, a full one without, and a line that is not a sweep line.
sweep_json=$(awk -f "$root/scripts/attention_sweep.awk" <<'LINES'
  sweep bf16 HS=128 causal T=2048 B=8 NH=16: fwd 180.5 bwd 150.25 fwd+bwd 158 TFLOP/s  (FlashAttention-2, H100 SXM: 265)
  sweep bf16 HS=64 full T=512 B=32 NH=32: fwd 1.5e-05 bwd 2 fwd+bwd 3 TFLOP/s
  forward (llmc, flash)   0.1 ms   120.0 TFLOP/s
LINES
)
want='[{"dtype": "bf16", "head_size": 128, "causal": true, "T": 2048, "B": 8, "NH": 16, "fwd_tflops": 180.5, "bwd_tflops": 150.25, "fwd_bwd_tflops": 158, "fa2_h100_fwd_bwd_tflops": 265}, {"dtype": "bf16", "head_size": 64, "causal": false, "T": 512, "B": 32, "NH": 32, "fwd_tflops": 1.5e-05, "bwd_tflops": 2, "fwd_bwd_tflops": 3, "fa2_h100_fwd_bwd_tflops": null}]'
check "attention sweep lines -> JSON" 0 "$want" \
    python3 -c 'import json, sys; print(json.dumps([json.loads(l) for l in sys.argv[1].splitlines()]))' "$sweep_json"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
