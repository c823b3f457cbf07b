#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU acceptance run (`make gpu-check`): on a machine with an NVIDIA GPU,
# builds for its architecture, runs the kernel tests on it, compute-sanitizer over the kernels' own
# tests, GPT-2 d12 training in every precision, BERT-base fine-tuning in every precision, our kernel
# benchmarks (attention swept over FlashAttention-2's shapes), dense vs MoE GPT-2, and the same work in
# PyTorch when python3 has torch; prints one table, writes one JSON file. About 7 minutes on an H100
# (400 s measured before the sweep and the MoE rows). Needs nvcc, cuBLASLt, nvidia-smi; installs nothing.
#
#   scripts/gpu_check.sh [--json FILE] [--steps N] [--skip-sanitizer] [--skip-torch]
#
# The JSON (default build/gpu-check/gpu_check.json) and every log are in build/gpu-check/.
set -u
cd "$(dirname "$0")/.."

json_out=build/gpu-check/gpu_check.json
steps=30
sanitize=1
torch_bench=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --json) json_out="${2:?--json needs a file}"; shift 2 ;;
        --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
        --skip-sanitizer) sanitize=; shift ;;
        --skip-torch) torch_bench=; shift ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_check: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done
[[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 2 ]] || { echo "gpu_check: --steps wants a number >= 2, got '$steps'" >&2; exit 2; }

gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
if [[ -z "$gpu" ]]; then
    echo "gpu_check: no NVIDIA GPU found (nvidia-smi lists none); this check runs on a GPU machine only" >&2
    exit 1
fi
IFS=',' read -r gpu_name gpu_cc gpu_mem gpu_driver <<< "$gpu"
gpu_name=$(echo $gpu_name) gpu_cc=$(echo $gpu_cc) gpu_mem=$(echo $gpu_mem) gpu_driver=$(echo $gpu_driver)
arch=${gpu_cc/./}
logs=build/gpu-check
mkdir -p "$logs" "$(dirname "$json_out")"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
echo "gpu_check: $gpu_name (compute capability $gpu_cc, $gpu_mem, driver $gpu_driver); logs in $logs/"

# --------------------------------------------------------------------------------------------------
# Build: the tests, the trainers and the kernel benchmarks, for this GPU's architecture only.
ranks_tests="nccl distributed data_parallel train_gpt2_ranks train_bert_ranks"  # need several GPUs
tests=()
for f in test/simt/test_*.cu test/test_*.cu; do
    t=${f##*/test_}; t=${t%.cu}
    [[ $t == simt || " $ranks_tests " == *" $t "* ]] && continue
    tests+=("$t")
done
targets=("${tests[@]/#/build/gpu/test_}" build/gpu/train_gpt2 build/gpu/train_bert build/gpu/dev_attention
         build/gpu/dev_matmul)
echo "building ${#targets[@]} programs for sm_$arch ..."
build_failures=0
if ! make --no-print-directory -k -j"$(nproc)" GPU=1 CUDA_ARCHS="$arch" "${targets[@]}" > "$logs/build.log" 2>&1; then
    grep -m5 -E "error" "$logs/build.log"
    for t in "${targets[@]}"; do [[ -x $t ]] || { echo "  did not build: $t"; build_failures=$((build_failures + 1)); }; done
    [[ $build_failures -eq 0 ]] && build_failures=1
    echo "the build failed in part (whole log: $logs/build.log); going on with what was built"
fi
echo "built in $(elapsed) s"

# --------------------------------------------------------------------------------------------------
# JSON pieces, assembled at the end.
jstr() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "${s//$'\t'/ }"; }
jnum() { [[ "$1" =~ ^-?[0-9.]+([eE][-+]?[0-9]+)?$ ]] && printf '%s' "$1" || printf 'null'; }
test_json=() san_json=() gpt_json=() bert_json=()
failures=$build_failures

# --------------------------------------------------------------------------------------------------
# Kernel tests on the GPU.
echo "kernel tests (${#tests[@]}; the ${ranks_tests// /, } tests need several GPUs: skipped) ..."
tests_passed=0 tests_failed=0
for t in "${tests[@]}"; do
    [[ -x build/gpu/test_$t ]] || continue  # counted with the build's failures
    timeout 120 "build/gpu/test_$t" > "$logs/test_$t.log" 2>&1
    rc=$?
    tally=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$logs/test_$t.log" | tail -1)
    p=$(echo "$tally" | awk '{print $1}') f=$(echo "$tally" | awk '{print $3}')
    p=${p:-0} f=${f:-0}
    [[ $rc -ne 0 && $f -eq 0 ]] && f=1  # a crash, a timeout or no tally counts as a failure
    tests_passed=$((tests_passed + p)) tests_failed=$((tests_failed + f))
    [[ $f -gt 0 ]] && echo "  FAIL test_$t: exit $rc, ${tally:-no tally} ($logs/test_$t.log)"
    test_json+=("{\"name\":$(jstr "test_$t"),\"exit\":$rc,\"passed\":$p,\"failed\":$f}")
done
failures=$((failures + tests_failed))
echo "kernel tests: $tests_passed passed, $tests_failed failed ($(elapsed) s)"

# --------------------------------------------------------------------------------------------------
# compute-sanitizer over the kernels' own tests, all at once (they share the GPU; each has a limit).
if [[ -n $sanitize ]] && command -v compute-sanitizer >/dev/null 2>&1; then
    echo "compute-sanitizer memcheck, racecheck, synccheck over attention, layernorm, matmul, fused_classifier ..."
    pids=()
    for tool in memcheck racecheck synccheck; do
        for t in attention layernorm matmul fused_classifier; do
            timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 99 "build/gpu/test_$t" \
                > "$logs/san_${tool}_$t.log" 2>&1 &
            pids+=("$!:$tool:$t")
        done
    done
    for entry in "${pids[@]}"; do
        IFS=: read -r pid tool t <<< "$entry"
        wait "$pid"
        rc=$?
        errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$logs/san_${tool}_$t.log" | awk '{print $3}' | tail -1)
        case $rc in
            0) verdict=clean ;;
            124) verdict="timed out (not checked)" ;;
            99) verdict="${errors:-some} errors"; failures=$((failures + 1)) ;;
            *) verdict="exit $rc"; failures=$((failures + 1)) ;;
        esac
        [[ $verdict != clean ]] && echo "  $tool test_$t: $verdict ($logs/san_${tool}_$t.log)"
        san_json+=("{\"tool\":$(jstr "$tool"),\"test\":$(jstr "test_$t"),\"exit\":$rc,\"errors\":$(jnum "${errors:-}"),\"verdict\":$(jstr "$verdict")}")
    done
    echo "sanitizers done ($(elapsed) s)"
else
    echo "compute-sanitizer: skipped ($([[ -n $sanitize ]] && echo 'not on PATH' || echo '--skip-sanitizer'))"
fi

# --------------------------------------------------------------------------------------------------
# GPT-2 d12 (124M), B=16, T=1024, $steps steps from the same random initialization and data in every
# precision. Per run: step-1 loss, last loss, tokens/s and MFU (mean of the steps after the first),
# device memory in use after the first step.
echo "GPT-2 d12, B=16 T=1024, $steps steps per precision ..."
declare -A loss1 lossN
for p in fp32 tf32 bf16 fp16 fp8; do
    log="$logs/gpt2_$p.log"
    timeout 300 build/gpu/train_gpt2 -e d12 -b 16 -t 1024 -x "$steps" -v 0 -g 0 --precision "$p" > "$log" 2>&1
    rc=$?
    if [[ $rc -ne 0 ]]; then
        why=$(grep -m1 -iE "error|refus|need|not supported" "$log")
        [[ $rc -eq 124 ]] && why="timed out"
        echo "  $p: exit $rc: ${why:-see $log}"
        [[ $p != fp8 || $arch -ge 89 ]] && failures=$((failures + 1))
        gpt_json+=("{\"precision\":$(jstr "$p"),\"exit\":$rc,\"error\":$(jstr "${why:-}")}")
        continue
    fi
    read -r l1 lN tok mfu <<< "$(awk -F' [|] ' '/^step +[0-9]+\/[0-9]+ [|]/ {
            split($1, s, /[ \/]+/); n = s[2]; sub(/loss /, "", $2); sub(/ tok\/s/, "", $6); sub(/MFU /, "", $7)
            sub(/%/, "", $7); if (n == 1) first = $2; last = $2
            if (n > 1) { tok += $6; mfu += $7; k++ } }
        END { printf "%s %s %.0f %.1f\n", first, last, k ? tok / k : 0, k ? mfu / k : 0 }' "$log")"
    mem=$(grep -oE 'memory in use after the first step: [0-9.]+ MiB' "$log" | grep -oE '[0-9.]+' | head -1)
    loss1[$p]=$l1 lossN[$p]=$lN
    gpt_json+=("{\"precision\":$(jstr "$p"),\"exit\":0,\"loss_step1\":$(jnum "$l1"),\"loss_last\":$(jnum "$lN"),\"tokens_per_s\":$(jnum "$tok"),\"mfu_percent\":$(jnum "$mfu"),\"memory_mib\":$(jnum "${mem:-}")}")
    printf "  %-5s loss %s -> %s  %8s tok/s  MFU %5s%%  %s MiB\n" "$p" "$l1" "$lN" "$tok" "$mfu" "${mem:-?}"
done
# Agreement: the step-1 losses (same weights and batch) differ only by the precision's rounding of the
# logits, which moves a cross-entropy by at most eps times the logits' spread: within 2^-8 (bf16's
# eps) of the fp32 loss, relative. After training, each precision's decrease from step 1 must be
# within 5% of fp32's (the criterion the optimizer tests use for 8-bit AdamW).
agree_json=()
if [[ -n "${loss1[fp32]:-}" ]]; then
    for p in tf32 bf16 fp16 fp8; do
        [[ -z "${loss1[$p]:-}" ]] && continue
        verdict=$(awk -v a1="${loss1[fp32]}" -v aN="${lossN[fp32]}" -v b1="${loss1[$p]}" -v bN="${lossN[$p]}" 'BEGIN {
            d1 = (b1 - a1) / a1; if (d1 < 0) d1 = -d1
            dec = a1 - aN; dd = ((b1 - bN) - dec) / dec; if (dd < 0) dd = -dd
            printf "%s %.2e %.3f", (d1 <= 2^-8 && dd <= 0.05) ? "ok" : "DISAGREES", d1, dd }')
        read -r ok d1 dd <<< "$verdict"
        [[ $ok != ok ]] && failures=$((failures + 1)) && echo "  $p disagrees with fp32: step-1 loss off by $d1 (bound 2^-8), decrease off by $dd (bound 0.05)"
        agree_json+=("{\"precision\":$(jstr "$p"),\"step1_rel_diff\":$(jnum "$d1"),\"decrease_rel_diff\":$(jnum "$dd"),\"ok\":$([[ $ok == ok ]] && echo true || echo false)}")
    done
fi
echo "GPT-2 done ($(elapsed) s)"

# --------------------------------------------------------------------------------------------------
# BERT-base sequence-classification fine-tuning at T=256, B=32 (train_bert --bench: synthetic
# full-length sequences), per precision: samples/s.
echo "BERT-base classification, T=256 B=32, per precision ..."
for p in fp32 tf32 bf16 fp16; do
    log="$logs/bert_$p.log"
    timeout 300 build/gpu/train_bert --bench --config base -b 32 --max-steps 8 --task classify -t 256 \
        --precision "$p" > "$log" 2>&1
    rc=$?
    line=$(grep -E '^bench [|]' "$log" | tail -1)
    sps=$(echo "$line" | grep -oE '[0-9.]+ samples/s' | grep -oE '[0-9.]+')
    mem=$(echo "$line" | grep -oE '[0-9.]+ MiB' | grep -oE '[0-9.]+')
    [[ $rc -ne 0 || -z $sps ]] && failures=$((failures + 1)) && echo "  $p: exit $rc ($log)"
    bert_json+=("{\"precision\":$(jstr "$p"),\"exit\":$rc,\"samples_per_s\":$(jnum "${sps:-}"),\"memory_mib\":$(jnum "${mem:-}")}")
    printf "  %-5s %8s samples/s  %s MiB\n" "$p" "${sps:-n/a}" "${mem:-?}"
done
echo "BERT done ($(elapsed) s)"

# --------------------------------------------------------------------------------------------------
# Our kernel benchmarks (dev/cuda): attention at GPT-2 124M's shape, the MLP up-projection GEMM.
timeout 300 build/gpu/dev_attention > "$logs/dev_attention.log" 2>&1 || failures=$((failures + 1))
timeout 300 build/gpu/dev_matmul > "$logs/dev_matmul.log" 2>&1 || failures=$((failures + 1))
flops_of() {  # the TFLOP/s on the first line of $1 after the section header matching $2 that contains $3
    awk -v sec="$2" -v key="$3" 'index($0, sec) == 1 { in_sec = 1; next } /^[^ ]/ { in_sec = 0 }
        in_sec && index($0, key) { for (i = 1; i < NF; i++) if ($(i + 1) == "TFLOP/s") { print $i; exit } }' "$1"
}
ours_fwd=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "forward (llmc, flash)")
ours_bwd=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward (llmc, flash)")
# dev/cuda/matmul.cu's "bf16 variant 3" is the production path: matmul_forward, cuBLASLt with the
# bias+GELU epilogue.
ours_gemm=$(awk '$1 == "bf16" && $2 == "variant" && $3 == "3" { for (i = 1; i < NF; i++) if ($(i + 1) == "TFLOP/s") { print $i; exit } }' \
    "$logs/dev_matmul.log")
# The fp8 GEMM's accumulation: sums of 1 and products 2^-j stay exact down to this j (fp32: all).
fp8_accum=$(sed -n 's/^fp8 accumulation: sums exact down to products of 2^-\([0-9]*\) .*/\1/p' "$logs/dev_matmul.log")
echo "ours: attention bf16 causal fwd ${ours_fwd:-?} / bwd ${ours_bwd:-?} TFLOP/s, bf16 GEMM ${ours_gemm:-?} TFLOP/s," \
    "fp8 GEMM sums exact to 2^-${fp8_accum:-?} beside 1"
# dev/cuda/attention.cu's sweep over FlashAttention-2's benchmark shapes, one JSON object per shape.
mapfile -t sweep_json < <(awk -f scripts/attention_sweep.awk "$logs/dev_attention.log")
echo "ours: attention sweep over ${#sweep_json[@]} shapes (B·T = 16k tokens, NH·HS = 2048): see the table"

# Dense GPT-2 124M against Mixture-of-Experts GPT-2 (8 experts in every other block, top-1 and top-2),
# the same steps, batch and learning rate (scripts/bench_moe.sh): parameters, tokens/s, val loss.
echo "dense vs MoE GPT-2 124M, bf16, B=8 T=1024, 20 steps each (scripts/bench_moe.sh) ..."
TRAIN_GPT2=build/gpu/train_gpt2 BENCH_JSON="$logs/bench_moe.jsonl" timeout 300 scripts/bench_moe.sh 20 \
    > "$logs/bench_moe.log" 2>&1 || failures=$((failures + 1))
mapfile -t moe_json < <(cat "$logs/bench_moe.jsonl" 2>/dev/null)
sed -n '/^model /,$p' "$logs/bench_moe.log" | sed 's/^/  /'

# --------------------------------------------------------------------------------------------------
# PyTorch on the same GPU (a benchmark beside ours, not an oracle).
torch_json=null
if [[ -n $torch_bench ]] && python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "PyTorch: bf16 GEMM, SDPA (flash, cuDNN), GPT-2 124M step (compile, bf16 autocast, fused AdamW) ..."
    timeout 400 python3 dev/torch_bench.py --batch 16 --seq 1024 --steps 10 > "$logs/torch.log" 2>&1
    grep -v '^TORCH_JSON' "$logs/torch.log" | tail -4 | sed 's/^/  /'
    torch_json=$(grep -m1 '^TORCH_JSON ' "$logs/torch.log" | sed 's/^TORCH_JSON //')
    [[ -z $torch_json ]] && torch_json=null
else
    echo "PyTorch: not compared ($([[ -n $torch_bench ]] && echo 'python3 has no torch with CUDA' || echo '--skip-torch'))"
fi
pyget() {  # a number out of the torch JSON, by a python expression on `d`
    [[ $torch_json == null ]] && return
    python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(round($1, 1))" "$torch_json" 2>/dev/null
}

# --------------------------------------------------------------------------------------------------
join() { local IFS=,; echo "$*"; }
{
    printf '{"gpu":%s,"compute_capability":%s,"memory":%s,"driver":%s,"date":%s,"commit":%s,"seconds":%s,\n' \
        "$(jstr "$gpu_name")" "$(jstr "$gpu_cc")" "$(jstr "$gpu_mem")" "$(jstr "$gpu_driver")" \
        "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(jstr "$(git rev-parse --short HEAD 2>/dev/null)$([[ -n $(git status --porcelain 2>/dev/null) ]] && echo ' with uncommitted changes')")" "$(elapsed)"
    printf ' "tests":{"passed":%s,"failed":%s,"each":[%s]},\n' "$tests_passed" "$tests_failed" "$(join "${test_json[@]}")"
    printf ' "sanitizer":[%s],\n' "$(join "${san_json[@]}")"
    printf ' "gpt2_d12":{"batch":16,"seq":1024,"steps":%s,"runs":[%s],"agreement_with_fp32":[%s]},\n' \
        "$steps" "$(join "${gpt_json[@]}")" "$(join "${agree_json[@]}")"
    printf ' "bert_base_classify":{"batch":32,"seq":256,"runs":[%s]},\n' "$(join "${bert_json[@]}")"
    printf ' "ours":{"attention_bf16_causal_fwd_tflops":%s,"attention_bf16_causal_bwd_tflops":%s,"gemm_bf16_tflops":%s,\n' \
        "$(jnum "${ours_fwd:-}")" "$(jnum "${ours_bwd:-}")" "$(jnum "${ours_gemm:-}")"
    printf '  "fp8_accumulation_exact_to_pow2":%s,\n' "$(jnum "${fp8_accum:+-$fp8_accum}")"
    printf '  "attention_sweep":[%s]},\n' "$(join "${sweep_json[@]}")"
    printf ' "moe_gpt2_124m":{"batch":8,"seq":1024,"steps":20,"rows":[%s]},\n' "$(join "${moe_json[@]}")"
    printf ' "pytorch":%s,\n "failures":%s}\n' "$torch_json" "$failures"
} > "$json_out"

# --------------------------------------------------------------------------------------------------
echo
echo "| $gpu_name | ours | PyTorch |"
echo "|---|---|---|"
echo "| kernel tests | $tests_passed passed, $tests_failed failed | |"
for r in "${gpt_json[@]}"; do
    p=$(echo "$r" | grep -oE '"precision":"[a-z0-9]+"' | cut -d'"' -f4)
    tok=$(echo "$r" | grep -oE '"tokens_per_s":[0-9.]+' | cut -d: -f2)
    mfu=$(echo "$r" | grep -oE '"mfu_percent":[0-9.]+' | cut -d: -f2)
    extra=""
    [[ $p == bf16 ]] && extra=$(pyget 'd["gpt2_124m_step"]["tokens_per_s"]') && extra=${extra:+$extra tok/s (compile, bf16 autocast)}
    echo "| GPT-2 124M $p, B=16 T=1024 | ${tok:-failed} tok/s${mfu:+, MFU $mfu%} | $extra |"
done
for r in "${bert_json[@]}"; do
    p=$(echo "$r" | grep -oE '"precision":"[a-z0-9]+"' | cut -d'"' -f4)
    sps=$(echo "$r" | grep -oE '"samples_per_s":[0-9.]+' | cut -d: -f2)
    echo "| BERT-base $p classify, B=32 T=256 | ${sps:-failed} samples/s | |"
done
echo "| attention bf16 causal fwd, B=8 T=1024 NH=12 HS=64 | ${ours_fwd:-?} TFLOP/s | flash $(pyget 'd["sdpa_bf16_causal"]["flash"]["fwd_tflops"]'), cuDNN $(pyget 'd["sdpa_bf16_causal"]["cudnn"]["fwd_tflops"]') TFLOP/s |"
echo "| attention bf16 causal bwd | ${ours_bwd:-?} TFLOP/s | flash $(pyget 'd["sdpa_bf16_causal"]["flash"]["bwd_tflops"]'), cuDNN $(pyget 'd["sdpa_bf16_causal"]["cudnn"]["bwd_tflops"]') TFLOP/s |"
for r in "${moe_json[@]}"; do
    name=$(echo "$r" | sed 's/.*"model":"\([^"]*\)".*/\1/')
    tok=$(echo "$r" | grep -oE '"tokens_per_s":[0-9.]+' | cut -d: -f2)
    val=$(echo "$r" | grep -oE '"val_loss":[0-9.]+' | cut -d: -f2)
    echo "| GPT-2 124M bf16 B=8, $name, 20 steps | ${tok:-failed} tok/s, val loss ${val:-?} | |"
done
field() { echo "$r" | grep -oE "\"$1\":[0-9.a-z]+" | cut -d: -f2; }  # a value of the sweep object $r
for r in "${sweep_json[@]}"; do  # the causal shapes, which the FlashAttention-2 paper reports
    [[ $r == *'"causal":true'* ]] || continue
    echo "| attention bf16 causal fwd+bwd, HS=$(field head_size) T=$(field T), B·T=16k NH·HS=2048 |" \
         "$(field fwd_bwd_tflops) TFLOP/s | FlashAttention-2 paper, H100 SXM: $(field fa2_h100_fwd_bwd_tflops) TFLOP/s |"
done
echo "| bf16 linear 8192x768 -> 3072 (ours: + bias + GELU epilogue) | ${ours_gemm:-?} TFLOP/s | $(pyget 'd["gemm_bf16"]["tflops"]') TFLOP/s (plain GEMM) |"
echo
echo "gpu_check: $failures failure(s), $(elapsed) s; JSON: $json_out"
[[ $failures -eq 0 ]]
