#!/usr/bin/env bash
# test/test_gpu_check.sh — what scripts/gpu_check.sh (make gpu-check) does without a GPU: one line
# saying so and exit 1; a bad option: one line naming it and exit 2; --help: the usage, exit 0; and
# the parsing of the attention benchmark's sweep lines into its JSON; and the whole script on a stub
# GPU machine. (On a GPU machine the script itself is the test: it runs everything, counts failures.)
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
check "gpu_check --steps 1 refused" 2 "--steps wants a whole number in [2, 999999999]" "$root/scripts/gpu_check.sh" --steps 1
check "gpu_check --steps 08 refused (not read as octal)" 2 "got '08'" "$root/scripts/gpu_check.sh" --steps 08
check "gpu_check --parts with an unknown part" 2 "--parts: 'gpt3' is not one of" "$root/scripts/gpu_check.sh" --parts gpt2_bf16,gpt3
check "gpu_check --budget soon refused" 2 "--budget wants whole seconds" "$root/scripts/gpu_check.sh" --budget soon
check "gpu_check --budget 010 refused (not read as octal 8)" 2 "--budget wants whole seconds in [0, 999999999] (0: no limit), got '010'" "$root/scripts/gpu_check.sh" --budget 010
MAX_LINES=30 check "gpu_check --help: the header comment, whole" 0 "are in build/gpu-check/." "$root/scripts/gpu_check.sh" --help
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
# The whole script on a stub GPU machine (it runs for real only where a GPU is lent, which is rare):
# nvidia-smi, make, ncu and compute-sanitizer replaced on PATH, the GPU programs by scripts that print
# what the real ones print. Checks the parsing of every part, --budget's skips, and that a run cut
# short leaves the JSON of what it had measured.
stub() { cat > "$1"; chmod +x "$1"; }  # writes standard input to an executable file
stub_machine() {  # the sandbox's root
    local sb=$1
    rm -rf "$sb"
    mkdir -p "$sb/scripts" "$sb/test" "$sb/dev" "$sb/build/gpu" "$sb/bin"
    cp "$root"/scripts/{gpu_check.sh,attention_sweep.awk,kernel_profile.py} "$sb/scripts/"
    for t in attention layernorm nccl; do touch "$sb/test/test_$t.cu"; done
    # nvidia-smi: the GPU's description, or asked for clocks (gpu_check samples them while GPT-2
    # trains) three samples, one of them slower and power-capped
    stub "$sb/bin/nvidia-smi" <<'X'
#!/bin/sh
case "$*" in
    *clocks.sm*) echo "2026/12/01 10:00:00.100, 1980, 3201, 650.25, 55, 0x0000000000000000"
                 echo "2026/12/01 10:00:00.200, 1755, 3201, 700.5, 57, 0x0000000000000004"
                 echo "2026/12/01 10:00:00.300, 1980, 3201, [N/A], 56, 0x0000000000000000" ;;
    *) echo "NVIDIA H100 80GB HBM3, 9.0, 81559 MiB, 580.159.04" ;;
esac
X
    printf '#!/bin/sh\necho "$*" > "$(dirname "$0")/../make_args"\n' | stub "$sb/bin/make"  # records what it was asked
    # ncu: with --section, two launches' sections as ncu 2025 writes them on an H100 (its warning
    # first; a measurement row ends after its value, a rule's advice row has every column); else one
    # step of three launches, in three units, one with a thousands separator
    stub "$sb/bin/ncu" <<'X'
#!/bin/sh
sections=
while [ $# -gt 0 ]; do [ "$1" = --log-file ] && log=$2; [ "$1" = --section ] && sections=1; shift; done
if [ -n "$sections" ]; then cat > "$log" <<'C'
==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling results may be inconsistent.
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value","Rule Name","Rule Type","Rule Description","Estimated Speedup Type","Estimated Speedup"
"0","1","dev_attention","h","attention_forward_mma_kernel","1","7","(128, 1, 1)","(16, 12, 8)","0","9.0","GPU Speed Of Light Throughput","Duration","usecond","95.10",
"0","1","dev_attention","h","attention_forward_mma_kernel","1","7","(128, 1, 1)","(16, 12, 8)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","3.25",
"0","1","dev_attention","h","attention_forward_mma_kernel","1","7","(128, 1, 1)","(16, 12, 8)","0","9.0","GPU Speed Of Light Throughput","","","","SOLBottleneck","OPT","advice","local","12.5"
"1","1","dev_attention","h","attention_backward_mma_kernel","1","7","(128, 1, 1)","(6, 12, 8)","0","9.0","Occupancy","Achieved Occupancy","%","11.9",
C
exit 0
fi
cat > "$log" <<'C'
==PROF== Connected to process 1 (train_gpt2)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","train_gpt2","h","attention_forward","1","13","(128, 1, 1)","(16, 12, 16)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1,250.50"
"1","1","train_gpt2","h","nvjet_hsh_256x128","1","13","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","2.5"
"2","1","train_gpt2","h","attention_forward","1","13","(128, 1, 1)","(16, 12, 16)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","749500"
C
X
    # compute-sanitizer: clean; with STUB_SANITIZER=errors racecheck finds 3 errors in test_matmul (exit 99,
    # the --error-exitcode), with STUB_SANITIZER=timeout memcheck of test_attention exits as timeout does
    # when it stops a command (124)
    stub "$sb/bin/compute-sanitizer" <<'X'
#!/bin/sh
case "${STUB_SANITIZER:-}:$*" in
    errors:*racecheck*test_matmul*) echo "========= ERROR SUMMARY: 3 errors"; exit 99 ;;
    timeout:*memcheck*test_attention*) exit 124 ;;
esac
echo "========= ERROR SUMMARY: 0 errors"
X
    for t in attention layernorm matmul fused_classifier; do
        printf '#!/bin/sh\necho "PASS x"\necho "3 passed, 0 failed"\n' | stub "$sb/build/gpu/test_$t"
    done
    stub "$sb/build/gpu/train_gpt2" <<'X'
#!/bin/sh
case "$*" in *fp32*) l=10.98 ;; *) l=10.99 ;; esac
case "$*" in *wgmma-3-red*) [ -n "${STUB_WGMMA3_RED_DIFFERS:-}" ] && l=10.97 ;; esac
case "$*" in *overlap-wgrad*) [ -n "${STUB_OVERLAP_DIFFERS:-}" ] && l=10.96 ;; esac
case "$*" in *"-b auto"*) echo "batch: B=64 T=1024, 1 micro-step -> 65536 tokens per step; 30 steps" ;;
             *) echo "batch: B=16 T=1024, 1 micro-step -> 16384 tokens per step; 30 steps" ;; esac
echo "device memory in use after the first step: 1234.5 MiB of 81559.0 MiB"
case "$*" in *"attention-backward tune"*) echo "attention backward tuned: 1 shape timed in 40 ms"
    echo "  B=64 T=1024 NH=12 HS=64 causal: wgmma-3-red-sum, 1.201 ms a call (8 forms timed; the default, wgmma: 1.310 ms)" ;; esac
echo "step    1/30 | loss $l | norm 1.0 | lr 3.00e-04 | 900.0 ms | 18204 tok/s | MFU 2.0% | eta 0m30s"
echo "step    2/30 | loss 9.5 | norm 1.0 | lr 3.00e-04 | 50.0 ms | 327680 tok/s | MFU 30.0% | eta 0m30s"
echo "step    3/30 | loss 9.0 | norm 1.0 | lr 3.00e-04 | 50.0 ms | 327680 tok/s | MFU 30.0% | eta 0m30s"
echo "step    4/30 | loss 8.5 | norm 1.0 | lr 3.00e-04 | 60.0 ms | 273067 tok/s | MFU 25.0% | eta 0m30s"
echo "step   30/30 | loss 7.0 | norm 1.0 | lr 3.00e-04 | 52.0 ms | 315077 tok/s | MFU 28.0% | eta 0m00s"
X
    stub "$sb/build/gpu/train_bert" <<'X'
#!/bin/sh
[ -n "${STUB_BERT_HANGS:-}" ] && { touch "$STUB_BERT_HANGS"; exec sleep 10; }
echo "bench | base T=256 | bf16 | 512.25 samples/s | 62.5 ms/step | 2048.0 MiB"
X
    stub "$sb/build/gpu/dev_attention" <<'X'
#!/bin/sh
echo "bf16 B=8 T=1024 NH=12 HS=64 causal"
echo "  forward (llmc, flash)   0.2 ms   150.5 TFLOP/s"
echo "  backward (llmc, flash)   0.5 ms   120.25 TFLOP/s"
echo "  forward variant 3 (flash, 32 rows per warp)   0.3 ms   110.75 TFLOP/s"
echo "  backward variant 4 (flash, dQ by atomics)   0.4 ms   130.5 TFLOP/s"
echo "  forward variant 5 (flash, registers for 2 blocks per SM)   0.2 ms   160.5 TFLOP/s   16.2% of peak 989 TFLOP/s"
echo "  backward (llmc, flash), dQ in 1 slice   0.6 ms   90.5 TFLOP/s"
echo "  backward (llmc, flash), dQ in 8 slices   0.5 ms   120.25 TFLOP/s   12.2% of peak 989 TFLOP/s"
echo "  backward (llmc, flash), dQ in 16 slices   failed: out of memory"
echo "  backward variant 6 (flash on mma.sync)   0.3 ms   170.5 TFLOP/s"
echo "  backward variant 7 (flash on wgmma, dQ deferred)   0.3 ms   185.5 TFLOP/s"
echo "  forward variant 8 (flash forward on wgmma)   0.1 ms   290.5 TFLOP/s"
echo "  backward variant 9 (flash on wgmma, registers for 3 blocks per SM)   0.3 ms   195.5 TFLOP/s"
echo "  backward variant 10 (flash on wgmma, dQ by reductions in L2)   0.3 ms   196.5 TFLOP/s"
echo "  backward variant 11 (flash on wgmma, 3 blocks per SM, dQ by reductions)   0.3 ms   197.5 TFLOP/s"
echo "  backward variant 12 (flash on wgmma, dQ summed by the tiles' last writers)   0.3 ms   198.5 TFLOP/s"
echo "  backward variant 13 (flash on wgmma, 3 blocks per SM, dQ by reductions, summed by the last writers)   0.3 ms   199.5 TFLOP/s"
echo "  backward variant 14 (flash on mma.sync, dQ summed by the last writers)   0.3 ms   171.5 TFLOP/s"
echo "  sweep bf16 HS=64 causal T=1024 B=16 NH=32: fwd 150 bwd 120 fwd+bwd 128 TFLOP/s  (FlashAttention-2, H100 SXM: 192)"
echo "  mma-sweep bf16 HS=64 causal T=1024 B=16 NH=32: bwd 175.5 fwd+bwd 165.25 TFLOP/s"
echo "  mma-sweep bf16 HS=64 causal T=2048 B=8 NH=32: bwd n/a fwd+bwd n/a TFLOP/s"
echo "  defer-sweep bf16 HS=64 full T=1024 B=16 NH=32: bwd 190.5 fwd+bwd 180.25 TFLOP/s"
echo "  wgmma-fwd-sweep bf16 HS=64 causal T=2048 B=8 NH=32: fwd 300.5 fwd+bwd 200.25 TFLOP/s"
echo "  wgmma3-sweep bf16 HS=64 causal T=512 B=32 NH=32: bwd 150.5 fwd+bwd 140.25 TFLOP/s"
echo "  wgmma-red-sweep bf16 HS=64 causal T=512 B=32 NH=32: bwd 151.5 fwd+bwd 141.25 TFLOP/s"
echo "  wgmma3-red-sweep bf16 HS=64 full T=2048 B=8 NH=32: bwd 152.5 fwd+bwd 142.25 TFLOP/s"
echo "  wgmma-sum-sweep bf16 HS=64 causal T=1024 B=16 NH=32: bwd 153.5 fwd+bwd 143.25 TFLOP/s"
echo "  wgmma3-red-sum-sweep bf16 HS=64 causal T=2048 B=8 NH=32: bwd 154.5 fwd+bwd 144.25 TFLOP/s"
echo "  mma-sum-sweep bf16 HS=64 full T=512 B=32 NH=32: bwd 176.5 fwd+bwd 166.25 TFLOP/s"
echo "bf16 B=16 T=1024 NH=32 HS=64 causal, the backward by dQ slices:"
echo "  backward (llmc, flash), dQ in 1 slice   0.6 ms   125.5 TFLOP/s   12.7% of peak 989 TFLOP/s"
echo "  backward (llmc, flash), dQ in 2 slices   0.6 ms   119.5 TFLOP/s   12.1% of peak 989 TFLOP/s"
echo "bf16 B=16 T=1024 NH=12 HS=64 causal, the backward by dQ slices:"
echo "  backward (llmc, flash), dQ in 4 slices   0.6 ms   140.5 TFLOP/s   14.2% of peak 989 TFLOP/s"
X
    stub "$sb/build/gpu/dev_matmul" <<'X'
#!/bin/sh
echo "bf16 variant 3 (matmul_forward)  0.1 ms  600.5 TFLOP/s"
echo "fp8 accumulation: sums exact down to products of 2^-13 (beside 1)"
echo "  step GEMMs: heuristic's choices 18.125 ms, fastest algorithm of each 16.5 ms (9.0% less)"
echo "  bias gradients with their weight GEMMs, a step: BGRADB epilogue 3.25 ms, plain GEMM + reduction kernels 2.75 ms"
echo "  fc bias gradient with fc proj dinp and fc dweight, a step: BGRADB in fc dweight 4.5 ms, DGELU_BGRAD in fc proj dinp 4.25 ms"
X
    # the memory-bound kernels' benchmarks: a shape line, then variant lines as dev/cuda/common.h's
    # bench_line prints them on a GPU (and validation lines, which are not timings); adamw's, as the
    # real one's, name no shape (its lines carry N)
    for b in layernorm fused_classifier adamw; do
        shape="bf16, N=8192 C=768:"
        [[ $b == adamw ]] && shape="benchmark on NVIDIA H100 80GB HBM3:"
        stub "$sb/build/gpu/dev_$b" <<X
#!/bin/sh
echo "PASS $b check"
echo "PASS $b check  max_err=0 budget_used=0% (n=7)"
echo "$shape"
echo "  $b (llmc)                                  0.0500 ms   2950.5 GB/s   88.0% of peak 3352 GB/s"
echo "  $b variant 1 (plain)                       0.1000 ms   1475.2 GB/s   44.0% of peak 3352 GB/s"
X
    done
    # dev/torch_bench.py: its figures as the real one prints them, or its exit 3 without torch
    stub "$sb/dev/torch_bench.py" <<'X'
import os, sys
if os.environ.get("STUB_NO_TORCH"):
    print("torch_bench: /usr/bin/python3 has no torch", file=sys.stderr)
    sys.exit(3)
print("torch bf16 GEMM [8192, 768, 3072]: 465.9 TFLOP/s")
print('TORCH_JSON {"torch": "2.11", "gemm_bf16": {"tflops": 465.9}, "sdpa_bf16_causal": {"flash": {"fwd_tflops": 139.2, '
      '"bwd_tflops": 104.5}, "cudnn": {"error": "not built"}}, "gpt2_124m_step": {"tokens_per_s": 331432.0}, '
      '"bert_base_classify_step": {"samples_per_s": 700.54}}')
X
    stub "$sb/scripts/bench_moe.sh" <<'X'
#!/bin/sh
echo '{"model":"dense","tokens_per_s":200000,"val_loss":6.5}' > "$BENCH_JSON"
X
}
sb=$(mktemp -d /tmp/test_gpu_check_XXXXXX)
trap 'rm -rf "$sb"' EXIT
json_field() {  # a python expression on the sandbox's JSON `d`
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print($1)" "$sb/m/build/gpu-check/gpu_check.json" 2>&1
}
stub_machine "$sb/m"
MAX_LINES=140 check "gpu_check on a stub GPU machine: every part, no failure" 0 "gpu_check: 0 failure(s)" \
    env PATH="$sb/m/bin:$PATH" "$sb/m/scripts/gpu_check.sh"
check "... its JSON: finished, 16 GPT-2 runs (ms per step after the first, batch; the third with the mma.sync backward on this H100, the next five with the wgmma backward's other forms, then --overlap-wgrad 1, --attention-backward tune, --gemm-autotune 1, the other bias-gradient route, gemm on an H100), 4 agreements, 12 sanitizer runs, the tests" 0 \
    "True 16 53.0 16 x 1 64 x 1 bf16_64k_mma bf16_64k_wgmma_3 bf16_64k_wgmma_red bf16_64k_wgmma_3_red bf16_64k_wgmma_sum bf16_64k_wgmma_3_red_sum bf16_64k_overlap_wgrad bf16_64k_attention_tune bf16_64k_autotune bf16_64k_bias_gemm 4 12 6" json_field 'd["finished"], len(d["gpt2_d12"]["runs"]), d["gpt2_d12"]["runs"][0]["ms_per_step"], d["gpt2_d12"]["runs"][0]["batch"], d["gpt2_d12"]["runs"][1]["batch"], *[d["gpt2_d12"]["runs"][i]["run"] for i in range(2, 12)], len(d["gpt2_d12"]["agreement_with_fp32"]), len(d["sanitizer"]), d["tests"]["passed"]'
check "... the form --attention-backward tune took and its times" 0 \
    "B=64 T=1024 NH=12 HS=64 causal: wgmma-3-red-sum, 1.201 ms a call (8 forms timed; the default, wgmma: 1.310 ms)" \
    json_field 'd["ours"]["attention_backward_tuned_gpt2_64k"]'
check "... each GPT-2 run's median step and the steps 5% slower than it" 0 "51.0 [4]" \
    json_field 'd["gpt2_d12"]["runs"][0]["median_ms_per_step"], d["gpt2_d12"]["runs"][0]["slow_steps"]'
check "... and the GPU's clocks while it trained: SM clock min/median, samples below 97% of it, power, reasons" 0 \
    "3 1755 1980 1 700.5 {'0x0000000000000000': 2, '0x0000000000000004': 1}" \
    json_field 'd["gpt2_d12"]["runs"][0]["clocks"]["samples"], d["gpt2_d12"]["runs"][0]["clocks"]["sm_mhz_min"], d["gpt2_d12"]["runs"][0]["clocks"]["sm_mhz_median"], d["gpt2_d12"]["runs"][0]["clocks"]["samples_below_97pct"], d["gpt2_d12"]["runs"][0]["clocks"]["power_w_max"], d["gpt2_d12"]["runs"][0]["clocks"]["reasons"]'
check "... each test program with its exit status, tally and seconds" 0 "True" \
    json_field 'len(d["tests"]["each"]) > 0 and all(sorted(t) == ["exit", "failed", "name", "passed", "seconds"] and isinstance(t["seconds"], int) for t in d["tests"]["each"])'
check "... our attention: forward, backward, the forward with 32 rows per warp, the sweep" 0 "150.5 120.25 110.75 1" \
    json_field 'd["ours"]["attention_bf16_causal_fwd_tflops"], d["ours"]["attention_bf16_causal_bwd_tflops"], d["ours"]["attention_bf16_causal_fwd_32_rows_per_warp_tflops"], len(d["ours"]["attention_sweep"])'
check "... the backward by number of dQ slices (three shapes; a failed line null), adding dQ by atomics; the forward capped for 2 blocks" 0 \
    "{'1': 90.5, '8': 120.25, '16': None} {'1': 125.5, '2': 119.5} {'4': 140.5} 130.5 160.5" \
    json_field 'd["ours"]["attention_bf16_causal_bwd_tflops_by_dq_slices"], d["ours"]["attention_bf16_causal_bwd_tflops_by_dq_slices_b16_nh32"], d["ours"]["attention_bf16_causal_bwd_tflops_by_dq_slices_b16_nh12"], d["ours"]["attention_bf16_causal_bwd_dq_atomics_tflops"], d["ours"]["attention_bf16_causal_fwd_regs_for_2_blocks_tflops"]'
check "... the backward on mma.sync where production's is on wgmma (a line without figures null), on wgmma deferring dQ, the forward on wgmma: GPT-2's shape and the sweep's" 0 \
    "170.5 {'causal 1024': [175.5, 165.25], 'causal 2048': [None, None]} 185.5 {'full 1024': [190.5, 180.25]} 290.5 {'causal 2048': [300.5, 200.25]}" \
    json_field 'd["ours"]["attention_bf16_causal_bwd_mma_tflops"], d["ours"]["attention_bf16_bwd_mma_sweep"], d["ours"]["attention_bf16_causal_bwd_wgmma_defer_dq_tflops"], d["ours"]["attention_bf16_bwd_wgmma_defer_dq_sweep"], d["ours"]["attention_bf16_causal_fwd_wgmma_tflops"], d["ours"]["attention_bf16_fwd_wgmma_sweep"]'
check "... the wgmma backward with registers for 3 blocks per SM, adding dQ by reductions, both: GPT-2's shape and the sweep's" 0 \
    "195.5 {'causal 512': [150.5, 140.25]} 196.5 {'causal 512': [151.5, 141.25]} 197.5 {'full 2048': [152.5, 142.25]}" \
    json_field 'd["ours"]["attention_bf16_causal_bwd_wgmma_3_blocks_tflops"], d["ours"]["attention_bf16_bwd_wgmma_3_blocks_sweep"], d["ours"]["attention_bf16_causal_bwd_wgmma_red_dq_tflops"], d["ours"]["attention_bf16_bwd_wgmma_red_dq_sweep"], d["ours"]["attention_bf16_causal_bwd_wgmma_3_blocks_red_dq_tflops"], d["ours"]["attention_bf16_bwd_wgmma_3_blocks_red_dq_sweep"]'
check "... the wgmma backward summing dQ's slices in the kernel, alone and with 3 blocks and reductions, and the mma.sync backward so: GPT-2's shape and the sweep's" 0 \
    "198.5 {'causal 1024': [153.5, 143.25]} 199.5 {'causal 2048': [154.5, 144.25]} 171.5 {'full 512': [176.5, 166.25]}" \
    json_field 'd["ours"]["attention_bf16_causal_bwd_wgmma_sum_dq_tflops"], d["ours"]["attention_bf16_bwd_wgmma_sum_dq_sweep"], d["ours"]["attention_bf16_causal_bwd_wgmma_3_blocks_red_sum_dq_tflops"], d["ours"]["attention_bf16_bwd_wgmma_3_blocks_red_sum_dq_sweep"], d["ours"]["attention_bf16_causal_bwd_mma_sum_dq_tflops"], d["ours"]["attention_bf16_bwd_mma_sum_dq_sweep"]'
check "... the profile: kernels summed by name over units, largest first, idle share of the step" 0 \
    "3 4.5 [('nvjet_hsh_256x128', 1, 2500.0), ('attention_forward', 2, 2000.0)] 0.9118" \
    json_field 'd["profile_gpt2_d12_bf16_step"]["launches"], d["profile_gpt2_d12_bf16_step"]["busy_ms"], [(k["kernel"], k["launches"], k["us"]) for k in d["profile_gpt2_d12_bf16_step"]["kernels"]], d["profile_gpt2_d12_bf16_step"]["idle_share"]'
check "... the attention kernels' ncu sections, per launch" 0 \
    "[('attention_forward_mma_kernel', {'GPU Speed Of Light Throughput / Duration': '95.10 usecond', 'GPU Speed Of Light Throughput / DRAM Throughput': '3.25 %'}), ('attention_backward_mma_kernel', {'Occupancy / Achieved Occupancy': '11.9 %'})]" \
    json_field '[(l["kernel"], l["metrics"]) for l in d["profile_attention_bf16_ncu_sections"]]'
stub_machine "$sb/m"
MAX_LINES=140 check "gpu_check --budget 160 on the stub machine skips the parts that would overrun it" 0 \
    "skipped for --budget 160: pytorch tests sanitizer" env PATH="$sb/m/bin:$PATH" \
    "$sb/m/scripts/gpu_check.sh" --budget 160
check "... and names them in its JSON" 0 "True ['pytorch', 'tests', 'sanitizer'] 3" \
    json_field 'd["finished"], d["skipped"], d["profile_gpt2_d12_bf16_step"]["launches"]'
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check --parts gpt2_bf16,gemm on the stub machine" 0 "gpu_check: 0 failure(s)" \
    env PATH="$sb/m/bin:$PATH" "$sb/m/scripts/gpu_check.sh" --parts gpt2_bf16,gemm
check "... runs those two parts alone" 0 "gpt2_bf16 gemm 1 600.5 0 None []" \
    json_field 'd["parts"], len(d["gpt2_d12"]["runs"]), d["ours"]["gemm_bf16_tflops"], len(d["tests"]["each"]), d["ours"]["attention_bf16_causal_fwd_tflops"], d["sanitizer"]'
check "... a GPT-2 step's GEMMs by algorithm, its bias gradients by route" 0 \
    "{'heuristic': 18.125, 'fastest_algorithm': 16.5} {'bgradb': 3.25, 'reduction_kernels': 2.75} {'bgradb_in_fc_dweight': 4.5, 'dgelu_bgrad_in_fcproj_dinp': 4.25}" \
    json_field 'd["ours"]["gpt2_step_gemms_ms"], d["ours"]["gpt2_step_bias_grad_with_dweight_ms"], d["ours"]["gpt2_step_fc_bias_grad_ms"]'
check "... and builds only their programs" 0 "CUDA_ARCHS=90 build/gpu/train_gpt2 build/gpu/dev_matmul" \
    sed 's/.*GPU=1 //' "$sb/m/make_args"
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check where --attention-backward wgmma-3-red's losses differ from the default's: a failure" 1 \
    "--attention-backward wgmma-3-red: losses differ from the default's: step 1 10.97 vs 10.99" env PATH="$sb/m/bin:$PATH" \
    STUB_WGMMA3_RED_DIFFERS=1 "$sb/m/scripts/gpu_check.sh" --parts gpt2_bf16_64k,gpt2_bf16_64k_wgmma_forms
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check where --overlap-wgrad 1's losses differ from the default's: a failure" 1 \
    "--overlap-wgrad 1: losses differ from the default's: step 1 10.96 vs 10.99" env PATH="$sb/m/bin:$PATH" \
    STUB_OVERLAP_DIFFERS=1 "$sb/m/scripts/gpu_check.sh" --parts gpt2_bf16_64k,gpt2_overlap_wgrad
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check where a sanitizer finds errors: a failure" 1 "racecheck test_matmul: 3 errors" \
    env PATH="$sb/m/bin:$PATH" STUB_SANITIZER=errors "$sb/m/scripts/gpu_check.sh" --parts sanitizer
check "... its verdict in the JSON" 0 "[('racecheck', 'test_matmul', 99, 3, '3 errors')] 1" \
    json_field '[(r["tool"], r["test"], r["exit"], r["errors"], r["verdict"]) for r in d["sanitizer"] if r["verdict"] != "clean"], d["failures"]'
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check where a sanitizer run times out: not a failure, not taken for clean" 0 \
    "memcheck test_attention: timed out (not checked)" env PATH="$sb/m/bin:$PATH" STUB_SANITIZER=timeout \
    "$sb/m/scripts/gpu_check.sh" --parts sanitizer
check "... listed as skipped in the JSON" 0 "['sanitizer memcheck test_attention (timed out)'] 124 11" \
    json_field 'd["skipped"], [r["exit"] for r in d["sanitizer"] if r["test"] == "test_attention" and r["tool"] == "memcheck"][0], sum(r["verdict"] == "clean" for r in d["sanitizer"])'
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check --parts kernels on the stub machine" 0 "6 kernel timings" \
    env PATH="$sb/m/bin:$PATH" "$sb/m/scripts/gpu_check.sh" --parts kernels
check "... the memory-bound kernels' benchmark lines in its JSON, each with its shape" 0 \
    "6 ('layernorm', 'bf16, N=8192 C=768', 'layernorm (llmc)', 0.05, 2950.5, 88.0) ('adamw', '', 'adamw variant 1 (plain)', 44.0)" \
    json_field 'len(d["ours"]["memory_bound_kernels"]), tuple(d["ours"]["memory_bound_kernels"][0].values()), (d["ours"]["memory_bound_kernels"][5]["bench"], d["ours"]["memory_bound_kernels"][5]["shape"], d["ours"]["memory_bound_kernels"][5]["kernel"], d["ours"]["memory_bound_kernels"][5]["peak_percent"])'
check "... and builds only their programs" 0 "CUDA_ARCHS=90 build/gpu/dev_layernorm build/gpu/dev_fused_classifier build/gpu/dev_adamw" \
    sed 's/.*GPU=1 //' "$sb/m/make_args"
stub_machine "$sb/m"
# Runs gpu_check with BERT's run hanging, and ends it with SIGTERM (as a time limit would) once that run
# has started, whatever the machine's speed; returns 124, timeout's status.
cut_short_in_bert() {
    local started=$sb/m/bert_started
    env PATH="$sb/m/bin:$PATH" STUB_BERT_HANGS="$started" "$sb/m/scripts/gpu_check.sh" &
    local pid=$! i
    for ((i = 0; i < 1200; i++)); do
        [[ -e $started ]] && break
        sleep 0.1
    done
    kill -TERM "$pid"
    wait "$pid"
    return 124
}
MAX_LINES=100 check "gpu_check cut short (killed while BERT runs)" 124 "GPT-2 d12" cut_short_in_bert
check "... leaves the JSON of the parts before: not finished, 16 GPT-2 runs, the tests, the GEMM" 0 \
    "False 16 6 600.5" json_field 'd["finished"], len(d["gpt2_d12"]["runs"]), d["tests"]["passed"], d["ours"]["gemm_bf16_tflops"]'
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check --parts gpt2_bf16,bert,pytorch: PyTorch's figures beside ours in the table" 0 \
    "| BERT-base bf16 classify, B=32 T=256 | 512.25 samples/s | 700.5 samples/s (compile, bf16 autocast) |" \
    env PATH="$sb/m/bin:$PATH" "$sb/m/scripts/gpu_check.sh" --parts gpt2_bf16,bert,pytorch
check "... and in its JSON" 0 "331432.0 700.54 not built" json_field \
    'd["pytorch"]["gpt2_124m_step"]["tokens_per_s"], d["pytorch"]["bert_base_classify_step"]["samples_per_s"], d["pytorch"]["sdpa_bf16_causal"]["cudnn"]["error"]'
stub_machine "$sb/m"
MAX_LINES=100 check "gpu_check where python3 has no torch: PyTorch not compared, no failure" 0 \
    "PyTorch: not compared (/usr/bin/python3 has no torch)" \
    env PATH="$sb/m/bin:$PATH" STUB_NO_TORCH=1 "$sb/m/scripts/gpu_check.sh" --parts gpt2_bf16,pytorch
check "kernel_profile.py on a file without ncu's CSV" 1 "no ncu CSV header" python3 "$root/scripts/kernel_profile.py" /dev/null
printf '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n"0","k","gpu__time_duration.sum","usecond","n/a"\n' \
    > "$sb/bad.csv"
check "kernel_profile.py on a duration that is no number" 1 "k: duration 'n/a' is not a number" \
    python3 "$root/scripts/kernel_profile.py" "$sb/bad.csv"
printf '"ID","Kernel Name","Metric Name","Metric Value"\n"0","k","gpu__time_duration.sum","5"\n' > "$sb/nounit.csv"
check "kernel_profile.py on a CSV without a unit column" 1 "no 'Metric Unit' column" \
    python3 "$root/scripts/kernel_profile.py" "$sb/nounit.csv"
printf '\xd0\xff\xfe binary' > "$sb/binary.csv"
check "kernel_profile.py on a file that is not text" 1 "$sb/binary.csv: not text" \
    python3 "$root/scripts/kernel_profile.py" "$sb/binary.csv"
for v in -10 0 nan inf; do
    MAX_LINES=2 check "kernel_profile.py --step-ms $v refused" 2 "argument --step-ms: '$v' is not a time in ms above 0" \
        python3 "$root/scripts/kernel_profile.py" --step-ms "$v" "$sb/bad.csv"
done
MAX_LINES=2 check "kernel_profile.py --top -1 refused" 2 "argument --top: '-1' is not a whole number" \
    python3 "$root/scripts/kernel_profile.py" --top -1 "$sb/bad.csv"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
