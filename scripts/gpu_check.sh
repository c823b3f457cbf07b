#!/usr/bin/env bash
# scripts/gpu_check.sh — the GPU acceptance run (`make gpu-check`): on a machine with an NVIDIA GPU,
# builds for its architecture, runs the kernel tests on it, compute-sanitizer over the kernels' own
# tests, GPT-2 d12 training in every precision, BERT-base fine-tuning in every precision, our kernel
# benchmarks (attention swept over FlashAttention-2's shapes), one GPT-2 step's kernels under Nsight
# Compute, dense vs MoE GPT-2, and the same work in PyTorch when python3 has torch; prints one table,
# writes one JSON file. About 7 minutes on an H100 (400 s measured before the sweep, the profile and
# the MoE rows). Needs nvcc, cuBLASLt, nvidia-smi; installs nothing.
#
#   scripts/gpu_check.sh [--json FILE] [--steps N] [--budget SECONDS] [--parts LIST] [--skip-sanitizer]
#                        [--skip-torch]
#
# The parts run most telling first: the build, attention, GPT-2 bf16, PyTorch's step, the profile,
# the kernel tests, the GEMMs, GPT-2 in the other precisions, BERT, the sanitizers, MoE. --budget S
# (a lent GPU's time limit): a part whose usual time would end past S seconds is skipped and named in
# the JSON, and each command's time limit is cut to what is left of S. The JSON is rewritten after every
# part, so a run cut short keeps what it measured. --parts a,b,... runs (and builds for) only those
# parts: attention gpt2_bf16 gpt2_bf16_64k gpt2_bf16_64k_mma (H100/H200: the backward on mma.sync)
# gpt2_bf16_64k_wgmma_forms (H100/H200: the wgmma backward's other forms) gpt2_overlap_wgrad
# gpt2_attention_tune (the attention backward's fastest form, timed) gpt2_autotune gpt2_bias_grad (the
# other --bias-grad route) pytorch profile tests gemm kernels gpt2_fp32 gpt2_tf32 gpt2_fp16 gpt2_fp8 bert
# sanitizer moe (a second, shorter run on the same machine finishes a budgeted one). The build counts
# against --budget too.
# The JSON (default build/gpu-check/gpu_check.json) and every log are in build/gpu-check/.
set -u
cd "$(dirname "$0")/.."

json_out=build/gpu-check/gpu_check.json
steps=30
sanitize=1
torch_bench=1
budget=0
parts=
all_parts="attention gpt2_bf16 gpt2_bf16_64k gpt2_bf16_64k_mma gpt2_bf16_64k_wgmma_forms gpt2_overlap_wgrad gpt2_attention_tune gpt2_autotune gpt2_bias_grad pytorch profile tests gemm kernels gpt2_fp32 gpt2_tf32 gpt2_fp16 gpt2_fp8 bert sanitizer moe"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --json) json_out="${2:?--json needs a file}"; shift 2 ;;
        --steps) steps="${2:?--steps needs a number}"; shift 2 ;;
        --budget) budget="${2:?--budget needs a number of seconds}"; shift 2 ;;
        --parts) parts="${2:?--parts needs a list of parts}"; shift 2 ;;
        --skip-sanitizer) sanitize=; shift ;;
        --skip-torch) torch_bench=; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done
# Decimal without leading zeros (bash reads 08 as bad octal, 010 as 8) and at most 9 digits (no overflow).
[[ "$steps" =~ ^[1-9][0-9]{0,8}$ && "$steps" -ge 2 ]] ||
    { echo "gpu_check: --steps wants a whole number in [2, 999999999], got '$steps'" >&2; exit 2; }
[[ "$budget" =~ ^(0|[1-9][0-9]{0,8})$ ]] ||
    { echo "gpu_check: --budget wants whole seconds in [0, 999999999] (0: no limit), got '$budget'" >&2; exit 2; }
parts=${parts//,/ }
for part in $parts; do
    [[ " $all_parts " == *" $part "* ]] || { echo "gpu_check: --parts: '$part' is not one of: $all_parts" >&2; exit 2; }
done
wants() { [[ -z $parts || " $parts " == *" $1 "* ]]; }  # whether part $1 is asked for

# CUDA numbers the GPUs as nvidia-smi does (by PCI bus, not fastest first), so that the programs' device
# 0 is the GPU described here and built for.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
if [[ -z "$gpu" ]]; then
    echo "gpu_check: no NVIDIA GPU found (nvidia-smi lists none); this check runs on a GPU machine only" >&2
    exit 1
fi
IFS=',' read -r gpu_name gpu_cc gpu_mem gpu_driver <<< "$gpu"
gpu_name=$(echo $gpu_name) gpu_cc=$(echo $gpu_cc) gpu_mem=$(echo $gpu_mem) gpu_driver=$(echo $gpu_driver)
if [[ ! $gpu_cc =~ ^[0-9]+\.[0-9]+$ ]]; then  # a driver older than compute_cap prints its complaint instead
    echo "gpu_check: nvidia-smi gives no compute capability ('$gpu'): the driver is too old for this CUDA" >&2
    exit 1
fi
arch=${gpu_cc/./}
logs=build/gpu-check
mkdir -p "$logs" "$(dirname "$json_out")"
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
echo "gpu_check: $gpu_name (compute capability $gpu_cc, $gpu_mem, driver $gpu_driver); logs in $logs/"

# --------------------------------------------------------------------------------------------------
# The budget: a part runs only if its usual time on an H100 (rounded up) ends inside --budget.
# Each command's time limit is also capped by what is left of the budget, so a part that runs long
# (a hung profiler, a slow GPU) cannot carry the run past it; a loop stops where the budget runs out.
skipped=()
fits() {  # a part's name, its usual seconds: 0 (run it) or 1 (not asked for, or skipped and said so)
    wants "$1" || return 1
    [[ $budget -eq 0 || $(( $(elapsed) + $2 )) -le $budget ]] && return 0
    echo "skipped: $1 (takes about $2 s; $(( budget - $(elapsed) )) s of --budget $budget left)"
    skipped+=("$1")
    return 1
}
cap() {  # a command's time limit: $1 seconds, or what is left of --budget if less (at least 10)
    local left=$(( budget - $(elapsed) ))
    [[ $budget -eq 0 ]] && left=$1
    (( left < 10 )) && left=10
    (( left < $1 )) && echo "$left" || echo "$1"
}
out_of_budget() {  # inside a loop of part $1: whether under 10 s of the budget are left (then said so)
    [[ $budget -eq 0 || $(( budget - $(elapsed) )) -ge 10 ]] && return 1
    echo "  $1: --budget $budget ran out; the rest skipped"
    skipped+=("$1 (cut short)")
    return 0
}

# --------------------------------------------------------------------------------------------------
# Build: the tests, the trainers and the kernel benchmarks, for this GPU's architecture only.
ranks_tests="nccl distributed data_parallel train_gpt2_ranks train_bert_ranks"  # need several GPUs
program_tests="checkpoint train_bert hf_gpt2 gpt2_moe"  # run the trainers as programs, many times
tests=()
shopt -s nullglob
for f in test/simt/test_*.cu test/test_*.cu; do
    t=${f##*/test_}; t=${t%.cu}
    [[ $t == simt || " $ranks_tests " == *" $t "* ]] && continue
    tests+=("$t")
done
targets=()  # what the asked-for parts run
wants tests && targets+=("${tests[@]/#/build/gpu/test_}")
wants sanitizer && ! wants tests && targets+=(build/gpu/test_{attention,layernorm,matmul,fused_classifier})
for part in gpt2_bf16 gpt2_bf16_64k gpt2_bf16_64k_mma gpt2_bf16_64k_wgmma_forms gpt2_overlap_wgrad gpt2_attention_tune gpt2_autotune gpt2_bias_grad profile gpt2_fp32 gpt2_tf32 gpt2_fp16 gpt2_fp8 moe; do
    wants $part && targets+=(build/gpu/train_gpt2) && break
done
wants bert && targets+=(build/gpu/train_bert)
{ wants attention || wants profile; } && targets+=(build/gpu/dev_attention)
wants gemm && targets+=(build/gpu/dev_matmul)
memory_benches="layernorm fused_classifier adamw"  # the memory-bound kernels of a step (part kernels)
if wants kernels; then for b in $memory_benches; do targets+=("build/gpu/dev_$b"); done; fi
echo "building ${#targets[@]} programs for sm_$arch ..."
build_failures=0
# The build counts against --budget too, and a build that overruns it stops there (the parts then run
# with what was built).
if [[ ${#targets[@]} -gt 0 ]] && ! timeout "$(cap 1200)" make --no-print-directory -k -j"$(nproc)" GPU=1 \
        CUDA_ARCHS="$arch" "${targets[@]}" > "$logs/build.log" 2>&1; then
    grep -m5 -E "error" "$logs/build.log"
    for t in "${targets[@]}"; do [[ -x $t ]] || { echo "  did not build: $t"; build_failures=$((build_failures + 1)); }; done
    [[ $build_failures -eq 0 ]] && build_failures=1
    echo "the build failed in part (whole log: $logs/build.log); going on with what was built"
fi
echo "built in $(elapsed) s"

# --------------------------------------------------------------------------------------------------
# The JSON, rewritten after every part from what has been measured so far.
jstr() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "${s//$'\t'/ }"; }
jnum() { [[ "$1" =~ ^-?[0-9.]+([eE][-+]?[0-9]+)?$ ]] && printf '%s' "$1" || printf 'null'; }
join() { local IFS=,; echo "$*"; }
test_json=() san_json=() gpt_json=() mem_json=() agree_json=() bert_json=() sweep_json=() moe_json=() skipped_json=()
tests_passed=0 tests_failed=0 torch_json=null profile_json=null attention_metrics_json=null
ours_fwd= ours_bwd= ours_gemm= fp8_accum= gemm_heur= gemm_best= bgrad_fused= bgrad_kernels= fcb_bgradb= fcb_dgelu=
ours_slices= ours_slices_b16= ours_fwd32= ours_bwd4= ours_fwd5= ours_bwd6= mma_sweep= ours_bwd7= defer_sweep= ours_fwd8= fwd8_sweep= ours_slices_gpt2=
ours_bwd9= wgmma3_sweep= ours_bwd10= wgmma_red_sweep= ours_bwd11= wgmma3_red_sweep=
ours_bwd12= wgmma_sum_sweep= ours_bwd13= wgmma3_red_sum_sweep= ours_bwd14= mma_sum_sweep=
failures=$build_failures
# An attention variant's two JSON fields: pass (fwd or bwd), name, its TFLOP/s at GPT-2's shape and
# its sweep ({"causal 1024": [pass, fwd+bwd], ...}).
variant_json() {
    printf '  "attention_bf16_causal_%s_%s_tflops":%s,\n  "attention_bf16_%s_%s_sweep":{%s},\n' "$1" "$2" \
        "$(jnum "$3")" "$1" "$2" "$4"
}
write_json() {  # "final" once every part has run or been skipped
    skipped_json=()
    for part in "${skipped[@]}"; do skipped_json+=("$(jstr "$part")"); done
    {
        printf '{"gpu":%s,"compute_capability":%s,"memory":%s,"driver":%s,"date":%s,"commit":%s,"seconds":%s,' \
            "$(jstr "$gpu_name")" "$(jstr "$gpu_cc")" "$(jstr "$gpu_mem")" "$(jstr "$gpu_driver")" \
            "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(jstr "$(git rev-parse --short HEAD 2>/dev/null)$([[ -n $(git status --porcelain 2>/dev/null) ]] && echo ' with uncommitted changes')")" "$(elapsed)"
        printf '"finished":%s,"budget_s":%s,"parts":%s,"skipped":[%s],\n' \
            "$([[ ${1:-} == final ]] && echo true || echo false)" "$budget" "$(jstr "${parts:-all}")" \
            "$(join "${skipped_json[@]}")"
        printf ' "tests":{"passed":%s,"failed":%s,"each":[%s]},\n' "$tests_passed" "$tests_failed" "$(join "${test_json[@]}")"
        printf ' "sanitizer":[%s],\n' "$(join "${san_json[@]}")"
        printf ' "gpt2_d12":{"batch":16,"seq":1024,"steps":%s,"runs":[%s],"agreement_with_fp32":[%s]},\n' \
            "$steps" "$(join "${gpt_json[@]}")" "$(join "${agree_json[@]}")"
        printf ' "profile_gpt2_d12_bf16_step":%s,\n' "$profile_json"
        printf ' "profile_attention_bf16_ncu_sections":%s,\n' "$attention_metrics_json"
        printf ' "bert_base_classify":{"batch":32,"seq":256,"runs":[%s]},\n' "$(join "${bert_json[@]}")"
        printf ' "ours":{"attention_bf16_causal_fwd_tflops":%s,"attention_bf16_causal_bwd_tflops":%s,"gemm_bf16_tflops":%s,\n' \
            "$(jnum "${ours_fwd:-}")" "$(jnum "${ours_bwd:-}")" "$(jnum "${ours_gemm:-}")"
        printf '  "attention_bf16_causal_fwd_32_rows_per_warp_tflops":%s,\n' "$(jnum "${ours_fwd32:-}")"
        printf '  "attention_bf16_causal_bwd_tflops_by_dq_slices":{%s},\n' "${ours_slices:-}"
        printf '  "attention_bf16_causal_bwd_tflops_by_dq_slices_b16_nh32":{%s},\n' "${ours_slices_b16:-}"
        printf '  "attention_bf16_causal_bwd_dq_atomics_tflops":%s,\n' "$(jnum "${ours_bwd4:-}")"
        printf '  "attention_bf16_causal_fwd_regs_for_2_blocks_tflops":%s,\n' "$(jnum "${ours_fwd5:-}")"
        variant_json bwd mma "${ours_bwd6:-}" "${mma_sweep:-}"
        variant_json bwd wgmma_defer_dq "${ours_bwd7:-}" "${defer_sweep:-}"
        variant_json fwd wgmma "${ours_fwd8:-}" "${fwd8_sweep:-}"
        variant_json bwd wgmma_3_blocks "${ours_bwd9:-}" "${wgmma3_sweep:-}"
        variant_json bwd wgmma_red_dq "${ours_bwd10:-}" "${wgmma_red_sweep:-}"
        variant_json bwd wgmma_3_blocks_red_dq "${ours_bwd11:-}" "${wgmma3_red_sweep:-}"
        variant_json bwd wgmma_sum_dq "${ours_bwd12:-}" "${wgmma_sum_sweep:-}"
        variant_json bwd wgmma_3_blocks_red_sum_dq "${ours_bwd13:-}" "${wgmma3_red_sum_sweep:-}"
        variant_json bwd mma_sum_dq "${ours_bwd14:-}" "${mma_sum_sweep:-}"
        printf '  "attention_bf16_causal_bwd_tflops_by_dq_slices_b16_nh12":{%s},\n' "${ours_slices_gpt2:-}"
        printf '  "attention_backward_tuned_gpt2_64k":%s,\n' "$([[ -n ${attention_tuned:-} ]] && jstr "$attention_tuned" || echo null)"
        printf '  "fp8_accumulation_exact_to_pow2":%s,\n' "$(jnum "${fp8_accum:+-$fp8_accum}")"
        printf '  "gpt2_step_gemms_ms":{"heuristic":%s,"fastest_algorithm":%s},\n' "$(jnum "${gemm_heur:-}")" \
            "$(jnum "${gemm_best:-}")"
        printf '  "gpt2_step_bias_grad_with_dweight_ms":{"bgradb":%s,"reduction_kernels":%s},\n' \
            "$(jnum "${bgrad_fused:-}")" "$(jnum "${bgrad_kernels:-}")"
        printf '  "gpt2_step_fc_bias_grad_ms":{"bgradb_in_fc_dweight":%s,"dgelu_bgrad_in_fcproj_dinp":%s},\n' \
            "$(jnum "${fcb_bgradb:-}")" "$(jnum "${fcb_dgelu:-}")"
        printf '  "memory_bound_kernels":[%s],\n' "$(join "${mem_json[@]}")"
        printf '  "attention_sweep":[%s]},\n' "$(join "${sweep_json[@]}")"
        printf ' "moe_gpt2_124m":{"batch":8,"seq":1024,"steps":20,"rows":[%s]},\n' "$(join "${moe_json[@]}")"
        printf ' "pytorch":%s,\n "failures":%s}\n' "$torch_json" "$failures"
    } > "$json_out.tmp" && mv "$json_out.tmp" "$json_out"
}
write_json

# --------------------------------------------------------------------------------------------------
# Our attention (dev/cuda/attention.cu): GPT-2 124M's shape, then the sweep over FlashAttention-2's
# benchmark shapes, one JSON object per shape.
flops_of() {  # the TFLOP/s on the first line of $1 after the section header matching $2 that contains $3
    awk -v sec="$2" -v key="$3" 'index($0, sec) == 1 { in_sec = 1; next } /^[^ ]/ { in_sec = 0 }
        in_sec && index($0, key) { for (i = 1; i < NF; i++) if ($(i + 1) == "TFLOP/s") { print $i; exit } }' "$1"
}
if fits attention 60; then
    timeout "$(cap 300)" build/gpu/dev_attention > "$logs/dev_attention.log" 2>&1 || failures=$((failures + 1))
    ours_fwd=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "forward (llmc, flash)")
    ours_bwd=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward (llmc, flash)")
    # The forward with two 16-row tiles per warp instead of production's one: what a second would buy.
    ours_fwd32=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "forward variant 3")
    # The backward adding dQ by atomics (dev variant 4), and with each number of dQ slices the shape
    # allows: {"slices": TFLOP/s, ...}.
    ours_bwd4=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 4")
    # Production's forward with its registers capped for 2 blocks per SM instead of 4 (dev variant 5).
    ours_fwd5=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "forward variant 5")
    # Where production's backward is on wgmma (sm_90a), the same on mma.sync (dev variant 6) and the
    # wgmma one deferring dQ (dev variant 7), and each over the sweep's head-size-64 shapes:
    # {"causal|full T": [bwd, fwd+bwd], ...}.
    ours_bwd6=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 6")
    ours_bwd7=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 7")
    sweep_of() {  # the "$1-sweep" lines
        awk -v tag="$1-sweep" '$1 == tag && $2 == "bf16" && $12 == "TFLOP/s" {
            printf "%s\"%s %s\":[%s,%s]", sep, $4, substr($5, 3), num($9), num($11); sep = "," }
            function num(x) { return x ~ /^[0-9]+([.][0-9]+)?$/ ? x : "null" }' "$logs/dev_attention.log"
    }
    mma_sweep=$(sweep_of mma)
    defer_sweep=$(sweep_of defer)
    # The forward on wgmma (dev variant 8, sm_90a): GPT-2's shape, and the sweep's HS=64 shapes
    # ([fwd, fwd+bwd with production's backward]).
    ours_fwd8=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "forward variant 8")
    fwd8_sweep=$(sweep_of wgmma-fwd)
    # The wgmma backward with its registers capped for 3 blocks per SM instead of 2 (dev variant 9),
    # adding dQ by reductions in L2 (10), both (11), sm_90a: GPT-2's shape, and the sweep's HS=64
    # shapes ([bwd, fwd+bwd]).
    ours_bwd9=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 9 ")
    ours_bwd10=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 10 ")
    ours_bwd11=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 11 ")
    wgmma3_sweep=$(sweep_of wgmma3)
    wgmma_red_sweep=$(sweep_of wgmma-red)
    wgmma3_red_sweep=$(sweep_of wgmma3-red)
    # The wgmma backward summing dQ's slices in the kernel, by each query tile's last writer (dev
    # variant 12), and so with 3 blocks per SM and dQ by reductions (13).
    ours_bwd12=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 12 ")
    ours_bwd13=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 13 ")
    wgmma_sum_sweep=$(sweep_of wgmma-sum)
    wgmma3_red_sum_sweep=$(sweep_of wgmma3-red-sum)
    # The mma.sync backward summing dQ's slices in the kernel (dev variant 14; any device at HS = 64).
    ours_bwd14=$(flops_of "$logs/dev_attention.log" "bf16 B=8 T=1024 NH=12 HS=64 causal" "backward variant 14 ")
    mma_sum_sweep=$(sweep_of mma-sum)
    slices_of() {  # {"slices": TFLOP/s, ...} from the section of dev_attention.log whose header starts with $1
        awk -v sec="$1" 'index($0, sec) == 1 { in_sec = 1; next } /^[^ ]/ { in_sec = 0 }
            in_sec && /backward \(llmc, flash\), dQ in [0-9]+ slice/ {
                n = v = ""
                for (i = 1; i < NF; i++) { if ($i == "in") n = $(i + 1); if ($(i + 1) == "TFLOP/s" && v == "") v = $i }
                printf "%s\"%s\":%s", sep, n, v ~ /^[0-9]+([.][0-9]+)?$/ ? v : "null"; sep = "," }' "$logs/dev_attention.log"
    }
    ours_slices=$(slices_of "bf16 B=8 T=1024 NH=12 HS=64 causal")
    ours_slices_b16=$(slices_of "bf16 B=16 T=1024 NH=32 HS=64 causal, the backward by dQ slices")
    ours_slices_gpt2=$(slices_of "bf16 B=16 T=1024 NH=12 HS=64 causal, the backward by dQ slices")
    mapfile -t sweep_json < <(awk -f scripts/attention_sweep.awk "$logs/dev_attention.log")
    echo "ours: attention bf16 causal B=8 T=1024 NH=12 HS=64: fwd ${ours_fwd:-?} / bwd ${ours_bwd:-?} TFLOP/s;" \
         "sweep over ${#sweep_json[@]} shapes (B·T = 16k tokens, NH·HS = 2048): see the table"
    write_json
fi

# --------------------------------------------------------------------------------------------------
# GPT-2 d12 (124M), B=16, T=1024, $steps steps from the same random initialization and data in every
# precision (bf16 first, the rest later), and bf16 at 65536 tokens per step with the largest
# micro-batch that fits (-b auto: B=64 on an 80 GB card, llm.c's setting for its MFU figures). Per
# run: step-1 loss, last loss, tokens/s, MFU and ms per step (means of the steps after the first),
# device memory in use after the first step.
declare -A loss1 lossN step_ms
# The GPU's clocks while a run trains, sampled by nvidia-smi every 100 ms into $logs/gpt2_<run>.clocks.csv
# (time, SM and memory clock in MHz, power in W, temperature, the active clock-event reasons: the
# driver's bit mask of why the clocks are below their maximum, e.g. 0x4 the power cap, 0x80 the power
# brake). What explains slow steps if a clock explains them. nvidia-smi before driver 530 calls the
# reasons clocks_throttle_reasons.
clock_fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader > /dev/null 2>&1 ||
    clock_fields=${clock_fields/clocks_event_reasons/clocks_throttle_reasons}
clock_summary() {  # a run's clocks CSV -> a JSON object (null without samples) and a line for the log
    awk -F', *' 'NF >= 6 && $2 ~ /^[0-9]+$/ { n++; sm[n] = $2 + 0; if ($4 + 0 > pw) pw = $4 + 0
            if ($5 + 0 > temp) temp = $5 + 0; if (!($6 in seen)) order[++r] = $6; seen[$6]++ }
        END { if (!n) { print "null"; print "no clock samples"; exit }
              for (i = 1; i <= n; i++) u[i] = sm[i]
              for (i = 2; i <= n; i++) { v = u[i]; for (j = i - 1; j >= 1 && u[j] > v; j--) u[j + 1] = u[j]; u[j + 1] = v }
              med = u[int((n + 1) / 2)]; low = 0; for (i = 1; i <= n; i++) if (sm[i] < 0.97 * med) low++
              reasons = ""; text = ""
              for (i = 1; i <= r; i++) { reasons = reasons (i > 1 ? "," : "") sprintf("\"%s\":%d", order[i], seen[order[i]])
                                         text = text (i > 1 ? ", " : "") sprintf("%s x%d", order[i], seen[order[i]]) }
              printf "{\"samples\":%d,\"sm_mhz_min\":%d,\"sm_mhz_median\":%d,\"sm_mhz_max\":%d,\"samples_below_97pct\":%d,\"power_w_max\":%.1f,\"temperature_c_max\":%d,\"reasons\":{%s}}\n",
                  n, u[1], med, u[n], low, pw, temp, reasons
              printf "clocks: SM %d MHz median (min %d, max %d), %d of %d samples below 97%% of the median; power <= %.0f W, <= %d C; reasons %s\n",
                  med, u[1], u[n], low, n, pw, temp, text }' "$1"
}
gpt2_run() {  # a name for the run, its precision, the batch options (default -b 16)
    local key=$1 p=$2 log="$logs/gpt2_$1.log" rc why l1 lN tok mfu ms med slow mem batch sampler clocks clocks_line
    shift 2
    local batch_args=(-b 16)
    [[ $# -gt 0 ]] && batch_args=("$@")
    nvidia-smi -i 0 --query-gpu="$clock_fields" --format=csv,noheader,nounits -lms 100 > "$logs/gpt2_$key.clocks.csv" \
        2> /dev/null &
    sampler=$!
    timeout "$(cap 300)" build/gpu/train_gpt2 -e d12 "${batch_args[@]}" -t 1024 -x "$steps" -v 0 -g 0 --precision "$p" \
        > "$log" 2>&1
    rc=$?
    kill "$sampler" 2> /dev/null
    wait "$sampler" 2> /dev/null
    { read -r clocks; read -r clocks_line; } < <(clock_summary "$logs/gpt2_$key.clocks.csv")
    batch=$(sed -n 's/^batch: B=\([0-9]*\) T=1024, \([0-9]*\) micro-step.*/\1 x \2/p' "$log" | head -1)
    if [[ $rc -ne 0 ]]; then
        why=$(grep -m1 -iE "error|refus|need|not supported" "$log")
        [[ $rc -eq 124 ]] && why="timed out"
        echo "  $key: exit $rc: ${why:-see $log}"
        [[ $p != fp8 || $arch -ge 89 ]] && failures=$((failures + 1))
        gpt_json+=("{\"run\":$(jstr "$key"),\"precision\":$(jstr "$p"),\"exit\":$rc,\"error\":$(jstr "${why:-}")}")
        return
    fi
    # Step 1's and the last step's loss; the means of tokens/s, MFU and ms over the steps after the
    # first; their median ms, and the steps more than 5% slower than it (seen on an H200: two steps in
    # every eight, about one a second, 6-10% slower).
    read -r l1 lN tok mfu ms med slow <<< "$(awk -F' [|] ' '/^step +[0-9]+\/[0-9]+ [|]/ {
            split($1, s, /[ \/]+/); n = s[2]; sub(/loss /, "", $2); sub(/ ms/, "", $5); sub(/ tok\/s/, "", $6)
            sub(/MFU /, "", $7); sub(/%/, "", $7); if (n == 1) first = $2; last = $2
            if (n > 1) { tok += $6; mfu += $7; ms += $5; k++; step[k] = n; t[k] = $5 + 0 } }
        END { for (i = 1; i <= k; i++) u[i] = t[i]
              for (i = 2; i <= k; i++) { v = u[i]; for (j = i - 1; j >= 1 && u[j] > v; j--) u[j + 1] = u[j]; u[j + 1] = v }
              m = k ? (k % 2 ? u[(k + 1) / 2] : (u[k / 2] + u[k / 2 + 1]) / 2) : 0
              list = ""; for (i = 1; i <= k; i++) if (t[i] > 1.05 * m) list = list (list == "" ? "" : ",") step[i]
              printf "%s %s %.0f %.1f %.3f %.3f %s\n", first, last, k ? tok / k : 0, k ? mfu / k : 0, k ? ms / k : 0, m,
                  list == "" ? "-" : list }' "$log")"
    [[ $slow == - ]] && slow=
    mem=$(grep -oE 'memory in use after the first step: [0-9.]+ MiB' "$log" | grep -oE '[0-9.]+' | head -1)
    loss1[$key]=$l1 lossN[$key]=$lN step_ms[$key]=$med  # the profile's step is a typical one: the median
    gpt_json+=("{\"run\":$(jstr "$key"),\"precision\":$(jstr "$p"),\"batch\":$(jstr "${batch:-?}"),\"exit\":0,\"loss_step1\":$(jnum "$l1"),\"loss_last\":$(jnum "$lN"),\"tokens_per_s\":$(jnum "$tok"),\"mfu_percent\":$(jnum "$mfu"),\"ms_per_step\":$(jnum "$ms"),\"median_ms_per_step\":$(jnum "$med"),\"slow_steps\":[$slow],\"memory_mib\":$(jnum "${mem:-}"),\"clocks\":${clocks:-null}}")
    printf "  %-8s B=%-7s loss %s -> %s  %8s tok/s  MFU %5s%%  %s ms/step (median %s%s)  %s MiB\n" "$key" \
        "${batch:-?}" "$l1" "$lN" "$tok" "$mfu" "$ms" "$med" "${slow:+; 5% slower: steps $slow}" "${mem:-?}"
    echo "           $clocks_line"
}
if fits gpt2_bf16 40; then
    echo "GPT-2 d12, T=1024, $steps steps, bf16 (B=16) ..."
    gpt2_run bf16 bf16
    write_json
fi
if fits gpt2_bf16_64k 60; then
    echo "GPT-2 d12, T=1024, $steps steps, bf16, 65536 tokens per step (-b auto) ..."
    gpt2_run bf16_64k bf16 -b auto -d 65536
    write_json
fi
# Run $1 against bf16_64k: "ok" or "DISAGREES", and how far its loss decrease is from bf16_64k's (as a
# share of it; at most 0.05, the precision runs' criterion below), with $2 = 1 also step 1's loss equal;
# nothing (status 1) unless both ran.
bf16_64k_agreement() {
    [[ -n "${loss1[bf16_64k]:-}" && -n "${loss1[$1]:-}" ]] || return 1
    awk -v a1="${loss1[bf16_64k]}" -v aN="${lossN[bf16_64k]}" -v b1="${loss1[$1]}" -v bN="${lossN[$1]}" -v same1="$2" \
        'BEGIN { dec = a1 - aN; dd = ((b1 - bN) - dec) / dec; if (dd < 0) dd = -dd
                 printf "%s %.3f\n", ((!same1 || a1 == b1) && dd <= 0.05) ? "ok" : "DISAGREES", dd }'
}
# On an H100/H200 (compute capability 9.0, built sm_90a) the attention backward above is on wgmma; the
# same with it on mma.sync, as on other GPUs (--attention-backward mma).
if [[ $arch == 90 ]] && fits gpt2_bf16_64k_mma 60; then
    echo "GPT-2 d12, the same with --attention-backward mma ..."
    gpt2_run bf16_64k_mma bf16 -b auto -d 65536 --attention-backward mma
    # The forward is unchanged, so step 1's loss must be the wgmma run's exactly; the decrease after it
    # within 5% of it (the precision runs' criterion below).
    if read -r ok dd < <(bf16_64k_agreement bf16_64k_mma 1); then
        [[ $ok != ok ]] && failures=$((failures + 1)) && echo "  the wgmma backward disagrees with mma's: step-1" \
            "losses ${loss1[bf16_64k]} vs ${loss1[bf16_64k_mma]} (must be equal), decrease off by $dd (bound 0.05)"
    fi
    write_json
fi
# The 65536-token run again with the options $2 under the name bf16_64k_$1: the same results as
# bf16_64k, every loss bit for bit (a failure otherwise); only the step time may differ.
same_as_64k_run() {
    local key=bf16_64k_$1 what=$2
    echo "GPT-2 d12, the 65536-token run with $what ..."
    gpt2_run "$key" bf16 -b auto -d 65536 $2
    if [[ -n "${loss1[bf16_64k]:-}" && -n "${loss1[$key]:-}" ]] &&
        [[ ${loss1[bf16_64k]} != "${loss1[$key]}" || ${lossN[bf16_64k]} != "${lossN[$key]}" ]]; then
        failures=$((failures + 1))
        echo "  $what: losses differ from the default's: step 1 ${loss1[$key]} vs ${loss1[bf16_64k]}," \
            "last ${lossN[$key]} vs ${lossN[bf16_64k]} (must be equal)"
    fi
    write_json
}
# On an H100/H200 the wgmma backward's other forms (--attention-backward wgmma-3: registers capped for
# 3 blocks per SM instead of 2; wgmma-red: dQ added by reductions in L2; wgmma-3-red: both; wgmma-sum
# and wgmma-3-red-sum: the default and wgmma-3-red summing dQ's slices in the kernel): the same
# gradients.
if [[ $arch == 90 ]] && fits gpt2_bf16_64k_wgmma_forms 150; then
    for form in wgmma-3 wgmma-red wgmma-3-red wgmma-sum wgmma-3-red-sum; do
        same_as_64k_run "${form//-/_}" "--attention-backward $form"
    done
fi
# The blocks' weight gradients on a second stream (--overlap-wgrad 1): the same kernels on the same
# inputs.
if fits gpt2_overlap_wgrad 60; then
    same_as_64k_run overlap_wgrad "--overlap-wgrad 1"
fi
# The attention backward's kernel in the fastest of its forms at GPT-2's shape on this GPU
# (--attention-backward tune, timed at the first step): its gradients, so the same losses bit for bit;
# the form it took and its time (and the default's) per call.
if fits gpt2_attention_tune 60; then
    same_as_64k_run attention_tune "--attention-backward tune"
    attention_tuned=$(grep -A1 -m1 "^attention backward tuned:" "$logs/gpt2_bf16_64k_attention_tune.log" | sed -n '2s/^ *//p')
    [[ -n $attention_tuned ]] && echo "  tuned: $attention_tuned"
    write_json
fi
# The 65536-token run again with --gemm-autotune 1 (each GEMM shape takes the fastest of cuBLASLt's
# candidates, timed at the first step): its ms per step against the heuristic's. Other algorithms may
# add in another order, so the losses are compared as the precisions are: the decrease within 5%.
if fits gpt2_autotune 60; then
    echo "GPT-2 d12, the 65536-token run with --gemm-autotune 1 ..."
    gpt2_run bf16_64k_autotune bf16 -b auto -d 65536 --gemm-autotune 1
    grep -m1 "^GEMM autotune:" "$logs/gpt2_bf16_64k_autotune.log" | sed 's/^/  /'
    if read -r ok dd < <(bf16_64k_agreement bf16_64k_autotune 0); then
        [[ $ok != ok ]] && failures=$((failures + 1)) && echo "  the autotuned run disagrees: loss decrease off by" \
            "$dd of the untuned run's (bound 0.05)"
    fi
    write_json
fi

# The 65536-token run again with the other --bias-grad route than this GPU's default (Hopper: gemm,
# elsewhere kernels): the step time of each route. The forward is unchanged, so step 1's loss must be
# the same; the decrease after it within 5%.
if fits gpt2_bias_grad 60; then
    other_route=kernels
    [[ $arch == 90 ]] && other_route=gemm
    echo "GPT-2 d12, the 65536-token run with --bias-grad $other_route ..."
    gpt2_run "bf16_64k_bias_$other_route" bf16 -b auto -d 65536 --bias-grad "$other_route"
    if read -r ok dd < <(bf16_64k_agreement "bf16_64k_bias_$other_route" 1); then
        [[ $ok != ok ]] && failures=$((failures + 1)) && echo "  --bias-grad $other_route disagrees: step-1 losses" \
            "${loss1[bf16_64k]} vs ${loss1[bf16_64k_bias_$other_route]} (must be equal), decrease off by $dd (bound 0.05)"
    fi
    write_json
fi

# --------------------------------------------------------------------------------------------------
# PyTorch on the same GPU (a benchmark beside ours, not an oracle): the GEMM, SDPA, the GPT-2 step.
if ! wants pytorch; then
    :
elif [[ -z $torch_bench ]]; then
    echo "PyTorch: not compared (--skip-torch)"
elif fits pytorch 260; then
    echo "PyTorch: bf16 GEMM, SDPA (flash, cuDNN), GPT-2 124M and BERT-base steps (compile, bf16 autocast," \
         "fused AdamW) ..."
    timeout "$(cap 460)" python3 dev/torch_bench.py --batch 16 --seq 1024 --bert-batch 32 --bert-seq 256 --steps 10 \
        > "$logs/torch.log" 2>&1
    rc=$?
    if [[ $rc -eq 3 ]]; then  # no torch, or no CUDA in it: nothing to compare with
        echo "PyTorch: not compared ($(head -1 "$logs/torch.log" | sed 's/^torch_bench: //'))"
    else
        grep -v '^TORCH_JSON' "$logs/torch.log" | tail -5 | sed 's/^/  /'
        torch_json=$(grep -m1 '^TORCH_JSON ' "$logs/torch.log" | sed 's/^TORCH_JSON //')
        [[ -z $torch_json ]] && torch_json=null && echo "  PyTorch: exit $rc, no figures ($logs/torch.log)"
    fi
    write_json
fi
pyget() {  # a number out of the torch JSON, by a python expression on `d`
    [[ $torch_json == null ]] && return
    python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(round($1, 1))" "$torch_json" 2>/dev/null
}

# --------------------------------------------------------------------------------------------------
# Where the bf16 step's time goes: the run's third step (the first that only replays CUDA graphs)
# under Nsight Compute, one kernel at a time, each kernel's duration summed by name
# (scripts/kernel_profile.py); set against the step time measured above. Then what bounds our
# attention kernels. A diagnosis, not a check: a profiler that cannot run here (no ncu, no access to
# the counters) is reported, not failed.
profile_result() {  # kernel_profile.py's log, its JSON line's tag, ncu's exit, the variable for the JSON:
                    # the log's table printed, or an error object naming ncu's exit
    local json
    json=$(grep -m1 "^$2 " "$1" | sed "s/^$2 //")
    if [[ -n $json ]]; then
        grep -v "^$2 " "$1" | sed 's/^/  /'
    else
        echo "  nothing measured (ncu exit $3): $(head -c 300 "$1")"
        json="{\"error\":$(jstr "ncu exit $3: $(head -c 300 "$1")")}"
    fi
    printf -v "$4" '%s' "$json"
}
if ! wants profile; then
    :
elif ! command -v ncu >/dev/null 2>&1; then
    echo "profile: skipped (ncu, Nsight Compute's command line, is not on PATH)"
elif fits profile 120; then
    echo "profile: one GPT-2 d12 bf16 step (B=16 T=1024) under ncu ..."
    timeout "$(cap 300)" ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$logs/profile.csv" \
        --clock-control none --cache-control none build/gpu/train_gpt2 -e d12 -b 16 -t 1024 -x 3 -v 0 -g 0 \
        --precision bf16 --profile-step 3 > "$logs/profile_run.log" 2>&1
    rc=$?
    python3 scripts/kernel_profile.py "$logs/profile.csv" ${step_ms[bf16]:+--step-ms ${step_ms[bf16]}} --top 15 \
        > "$logs/profile.log" 2>&1
    profile_result "$logs/profile.log" PROFILE_JSON "$rc" profile_json
    # Our attention kernels at GPT-2 124M's shape (dev_attention --profile): what bounds each, from
    # ncu's sections (throughput against the peaks, occupancy, warp states, compute and memory).
    echo "profile: our bf16 attention, forward and backward (B=8 T=1024 NH=12 HS=64 causal), ncu's sections ..."
    timeout "$(cap 300)" ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --csv --log-file "$logs/attention_ncu.csv" \
        --clock-control none build/gpu/dev_attention --profile > "$logs/attention_ncu_run.log" 2>&1
    rc=$?
    python3 scripts/kernel_profile.py --metrics "$logs/attention_ncu.csv" > "$logs/attention_ncu.log" 2>&1
    profile_result "$logs/attention_ncu.log" METRICS_JSON "$rc" attention_metrics_json
    write_json
fi

# --------------------------------------------------------------------------------------------------
# Kernel tests on the GPU.
if fits tests 300; then  # on an H200 the tests before test_train_bert took 190 s, 120 of them test_checkpoint
    echo "kernel tests (${#tests[@]}; the ${ranks_tests// /, } tests need several GPUs: skipped) ..."
    for t in "${tests[@]}"; do
        [[ -x build/gpu/test_$t ]] || continue  # counted with the build's failures
        out_of_budget tests && break
        # A test's own limit: 120 s, 300 s for those that run the trainers as programs, each run
        # starting a CUDA context (test_checkpoint's 94 checks took over 120 s on an H200).
        own_limit=120
        [[ " $program_tests " == *" $t "* ]] && own_limit=300
        limit=$(cap $own_limit)
        test_start=$SECONDS
        timeout "$limit" "build/gpu/test_$t" > "$logs/test_$t.log" 2>&1
        rc=$?
        test_seconds=$((SECONDS - test_start))
        if [[ $rc -eq 124 && $limit -lt $own_limit ]]; then  # stopped by the budget, not by its own limit
            echo "  test_$t: stopped at --budget $budget; it and the rest skipped"
            skipped+=("tests (cut short)")
            break
        fi
        tally=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$logs/test_$t.log" | tail -1)
        p=$(echo "$tally" | awk '{print $1}') f=$(echo "$tally" | awk '{print $3}')
        p=${p:-0} f=${f:-0}
        [[ $rc -ne 0 && $f -eq 0 ]] && f=1  # a crash, a timeout or no tally counts as a failure
        tests_passed=$((tests_passed + p)) tests_failed=$((tests_failed + f))
        [[ $f -gt 0 ]] && echo "  FAIL test_$t: exit $rc, ${tally:-no tally} ($logs/test_$t.log)"
        test_json+=("{\"name\":$(jstr "test_$t"),\"exit\":$rc,\"passed\":$p,\"failed\":$f,\"seconds\":$test_seconds}")
    done
    failures=$((failures + tests_failed))
    echo "kernel tests: $tests_passed passed, $tests_failed failed ($(elapsed) s)"
    write_json
fi

# --------------------------------------------------------------------------------------------------
# Our GEMMs (dev/cuda/matmul.cu): the MLP up-projection, how many bits the fp8 GEMM keeps while it
# accumulates, and a GPT-2 124M step's bf16 GEMMs (B=16 T=1024) with the heuristic's algorithms
# against the fastest cuBLASLt offers, its bias gradients by BGRADB against the reduction kernels, and
# fc's by BGRADB in its weight GEMM against DGELU_BGRAD in fc proj's input-gradient GEMM.
if fits gemm 60; then
    timeout "$(cap 300)" build/gpu/dev_matmul > "$logs/dev_matmul.log" 2>&1 || failures=$((failures + 1))
    # "bf16 variant 3" is the production path: matmul_forward, cuBLASLt with the bias+GELU epilogue.
    ours_gemm=$(awk '$1 == "bf16" && $2 == "variant" && $3 == "3" { for (i = 1; i < NF; i++) if ($(i + 1) == "TFLOP/s") { print $i; exit } }' \
        "$logs/dev_matmul.log")
    # The fp8 GEMM's accumulation: sums of 1 and products 2^-j stay exact down to this j (fp32: all).
    fp8_accum=$(sed -n 's/^fp8 accumulation: sums exact down to products of 2^-\([0-9]*\) .*/\1/p' "$logs/dev_matmul.log")
    read -r gemm_heur gemm_best < <(sed -n "s/^  step GEMMs: heuristic's choices \([0-9.]*\) ms, fastest algorithm of each \([0-9.]*\) ms.*/\1 \2/p" \
        "$logs/dev_matmul.log")
    read -r bgrad_fused bgrad_kernels < <(sed -n 's/^  bias gradients with their weight GEMMs, a step: BGRADB epilogue \([0-9.]*\) ms, plain GEMM + reduction kernels \([0-9.]*\) ms/\1 \2/p' \
        "$logs/dev_matmul.log")
    read -r fcb_bgradb fcb_dgelu < <(sed -n 's/^  fc bias gradient with fc proj dinp and fc dweight, a step: BGRADB in fc dweight \([0-9.]*\) ms, DGELU_BGRAD in fc proj dinp \([0-9.]*\) ms/\1 \2/p' \
        "$logs/dev_matmul.log")
    echo "ours: bf16 GEMM ${ours_gemm:-?} TFLOP/s, fp8 GEMM sums exact to 2^-${fp8_accum:-?} beside 1;" \
         "a GPT-2 step's GEMMs ${gemm_heur:-?} ms (fastest algorithms: ${gemm_best:-?} ms)"
    write_json
fi

# --------------------------------------------------------------------------------------------------
# The memory-bound kernels of a training step (LayerNorm, the fused classifier, AdamW), each variant of
# their dev/cuda benchmarks: time, GB/s and the share of the GPU's DRAM peak. A line is one JSON entry
# with the shape line it is under; a benchmark whose validation fails counts as a failure.
if fits kernels 60; then
    echo "memory-bound kernels (dev/cuda: ${memory_benches// /, }) ..."
    for b in $memory_benches; do
        out_of_budget kernels && break
        if ! timeout "$(cap 120)" "build/gpu/dev_$b" > "$logs/dev_$b.log" 2>&1; then
            failures=$((failures + 1))
            echo "  dev_$b: failed ($logs/dev_$b.log)"
        fi
        # "  NAME   0.0123 ms   2950.1 GB/s   88.1% of peak 3352 GB/s", under a line naming the shape
        # (one with a '=' that is no PASS/FAIL line; adamw's name none: N is in each line)
        while IFS=$'\x1f' read -r shape name ms gbps share; do  # unit separators: an empty shape stays a field
            mem_json+=("{\"bench\":$(jstr "$b"),\"shape\":$(jstr "$shape"),\"kernel\":$(jstr "$name"),\"ms\":$(jnum "$ms"),\"gb_per_s\":$(jnum "$gbps"),\"peak_percent\":$(jnum "$share")}")
        done < <(awk '/^[^ ].*=/ && !/^(PASS|FAIL) / { shape = $0; sub(/:$/, "", shape) }
            / ms +[0-9.]+ GB\/s +[0-9.]+% of peak/ { line = $0; sub(/^ +/, "", line)
                n = split(line, f, / +/); for (i = 1; i <= n; i++) if (f[i] == "ms") break
                name = f[1]; for (j = 2; j < i - 1; j++) name = name " " f[j]
                share = f[i + 3]; sub(/%/, "", share)
                printf "%s\037%s\037%s\037%s\037%s\n", shape, name, f[i - 1], f[i + 1], share }' "$logs/dev_$b.log")
        grep -E "^[^ ].*=|% of peak" "$logs/dev_$b.log" | grep -vE "^(PASS|FAIL) " | sed 's/^/  /'
    done
    echo "  ${#mem_json[@]} kernel timings (JSON ours.memory_bound_kernels)"
    write_json
fi

# --------------------------------------------------------------------------------------------------
# GPT-2 in the other precisions, and their agreement with fp32: the step-1 losses (same weights and
# batch) differ only by the precision's rounding of the logits, which moves a cross-entropy by at
# most eps times the logits' spread: within 2^-8 (bf16's eps) of the fp32 loss, relative. After
# training, each precision's decrease from step 1 must be within 5% of fp32's (the criterion the
# optimizer tests use for 8-bit AdamW).
ran_other=
for p in fp32 tf32 fp16 fp8; do
    if fits "gpt2_$p" "$([[ $p == fp32 ]] && echo 60 || echo 40)"; then
        [[ -z $ran_other ]] && echo "GPT-2 d12, B=16 T=1024, $steps steps, fp32, tf32, fp16, fp8 ..." && ran_other=1
        gpt2_run "$p" "$p"
    fi
done
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
write_json

# --------------------------------------------------------------------------------------------------
# BERT-base sequence-classification fine-tuning at T=256, B=32 (train_bert --bench: synthetic
# full-length sequences), per precision: samples/s.
if fits bert 80; then
    echo "BERT-base classification, T=256 B=32, per precision ..."
    for p in fp32 tf32 bf16 fp16; do
        out_of_budget bert && break
        log="$logs/bert_$p.log"
        timeout "$(cap 300)" build/gpu/train_bert --bench --config base -b 32 --max-steps 8 --task classify -t 256 \
            --precision "$p" > "$log" 2>&1
        rc=$?
        line=$(grep -E '^bench [|]' "$log" | tail -1)
        sps=$(echo "$line" | grep -oE '[0-9.]+ samples/s' | grep -oE '[0-9.]+')
        mem=$(echo "$line" | grep -oE '[0-9.]+ MiB' | grep -oE '[0-9.]+')
        [[ $rc -ne 0 || -z $sps ]] && failures=$((failures + 1)) && echo "  $p: exit $rc ($log)"
        bert_json+=("{\"precision\":$(jstr "$p"),\"exit\":$rc,\"samples_per_s\":$(jnum "${sps:-}"),\"memory_mib\":$(jnum "${mem:-}")}")
        printf "  %-5s %8s samples/s  %s MiB\n" "$p" "${sps:-n/a}" "${mem:-?}"
    done
    write_json
fi

# --------------------------------------------------------------------------------------------------
# compute-sanitizer over the kernels' own tests: one tool at a time, its 4 runs side by side (they
# share the GPU; each has a limit). A run that times out checked nothing: it is listed as skipped.
if ! wants sanitizer; then
    :
elif [[ -z $sanitize ]] || ! command -v compute-sanitizer >/dev/null 2>&1; then
    echo "compute-sanitizer: skipped ($([[ -n $sanitize ]] && echo 'not on PATH' || echo '--skip-sanitizer'))"
elif fits sanitizer 300; then
    echo "compute-sanitizer memcheck, racecheck, synccheck over attention, layernorm, matmul, fused_classifier ..."
    for tool in memcheck racecheck synccheck; do
        out_of_budget "sanitizer $tool" && break
        pids=()
        for t in attention layernorm matmul fused_classifier; do
            timeout "$(cap 150)" compute-sanitizer --tool "$tool" --error-exitcode 99 "build/gpu/test_$t" \
                > "$logs/san_${tool}_$t.log" 2>&1 &
            pids+=("$!:$tool:$t")
        done
        for entry in "${pids[@]}"; do
            IFS=: read -r pid tool t <<< "$entry"
            wait "$pid"
            rc=$?
            errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$logs/san_${tool}_$t.log" | awk '{print $3}' | tail -1)
            case $rc in
                0) verdict=clean ;;
                124) verdict="timed out (not checked)"; skipped+=("sanitizer $tool test_$t (timed out)") ;;
                99) verdict="${errors:-some} errors"; failures=$((failures + 1)) ;;
                *) verdict="exit $rc"; failures=$((failures + 1)) ;;
            esac
            [[ $verdict != clean ]] && echo "  $tool test_$t: $verdict ($logs/san_${tool}_$t.log)"
            san_json+=("{\"tool\":$(jstr "$tool"),\"test\":$(jstr "test_$t"),\"exit\":$rc,\"errors\":$(jnum "${errors:-}"),\"verdict\":$(jstr "$verdict")}")
        done
    done
    echo "sanitizers done ($(elapsed) s)"
    write_json
fi

# --------------------------------------------------------------------------------------------------
# Dense GPT-2 124M against Mixture-of-Experts GPT-2 (8 experts in every other block, top-1 and top-2),
# the same steps, batch and learning rate (scripts/bench_moe.sh): parameters, tokens/s, val loss.
if fits moe 120; then
    echo "dense vs MoE GPT-2 124M, bf16, B=8 T=1024, 20 steps each (scripts/bench_moe.sh) ..."
    TRAIN_GPT2=build/gpu/train_gpt2 BENCH_JSON="$logs/bench_moe.jsonl" timeout "$(cap 300)" scripts/bench_moe.sh 20 \
        > "$logs/bench_moe.log" 2>&1 || failures=$((failures + 1))
    mapfile -t moe_json < <(cat "$logs/bench_moe.jsonl" 2>/dev/null)
    sed -n '/^model /,$p' "$logs/bench_moe.log" | sed 's/^/  /'
fi
write_json final

# --------------------------------------------------------------------------------------------------
echo
echo "| $gpu_name | ours | PyTorch |"
echo "|---|---|---|"
[[ ${#test_json[@]} -gt 0 ]] && echo "| kernel tests | $tests_passed passed, $tests_failed failed | |"
for r in "${gpt_json[@]}"; do
    key=$(echo "$r" | grep -oE '"run":"[a-z0-9_]+"' | cut -d'"' -f4)
    p=$(echo "$r" | grep -oE '"precision":"[a-z0-9]+"' | cut -d'"' -f4)
    batch=$(echo "$r" | grep -oE '"batch":"[^"]*"' | cut -d'"' -f4)
    tok=$(echo "$r" | grep -oE '"tokens_per_s":[0-9.]+' | cut -d: -f2)
    mfu=$(echo "$r" | grep -oE '"mfu_percent":[0-9.]+' | cut -d: -f2)
    extra=""
    [[ $key == bf16 ]] && extra=$(pyget 'd["gpt2_124m_step"]["tokens_per_s"]') && extra=${extra:+$extra tok/s (compile, bf16 autocast)}
    [[ $key == *_mma ]] && p="$p, attention backward on mma.sync"
    echo "| GPT-2 124M $p, B×micro-steps ${batch:-?}, T=1024 | ${tok:-failed} tok/s${mfu:+, MFU $mfu%} | $extra |"
done
if [[ $profile_json == '{"launches"'* ]]; then
    busy=$(echo "$profile_json" | grep -oE '"busy_ms":[0-9.]+' | cut -d: -f2)
    idle=$(echo "$profile_json" | grep -oE '"idle_share":[0-9.]+' | cut -d: -f2)
    echo "| GPT-2 124M bf16 step's kernels (ncu) | ${busy} ms busy${idle:+, $(awk -v i="$idle" 'BEGIN { printf "%.1f", 100 * i }')% idle} | |"
fi
for r in "${bert_json[@]}"; do
    p=$(echo "$r" | grep -oE '"precision":"[a-z0-9]+"' | cut -d'"' -f4)
    sps=$(echo "$r" | grep -oE '"samples_per_s":[0-9.]+' | cut -d: -f2)
    extra=""
    [[ $p == bf16 ]] && extra=$(pyget 'd["bert_base_classify_step"]["samples_per_s"]') && extra=${extra:+$extra samples/s (compile, bf16 autocast)}
    echo "| BERT-base $p classify, B=32 T=256 | ${sps:-failed} samples/s | $extra |"
done
sdpa() {  # SDPA's forward or backward TFLOP/s through the flash and cuDNN backends, or nothing
    [[ $torch_json == null ]] && return
    echo "flash $(pyget "d['sdpa_bf16_causal']['flash']['$1_tflops']"), cuDNN $(pyget "d['sdpa_bf16_causal']['cudnn']['$1_tflops']") TFLOP/s"
}
variant_rows() {  # an attention variant's rows: what it is, its TFLOP/s at GPT-2's shape, its sweep, its pass
    [[ -n $2 ]] && echo "| ... $1 | $2 TFLOP/s | |"
    [[ -n $3 ]] && echo "| ... $1 over the sweep's HS=64 shapes ($4, fwd+bwd) | ${3//\"/} | |"
    return 0
}
if [[ -n $ours_fwd$ours_bwd ]]; then
    echo "| attention bf16 causal fwd, B=8 T=1024 NH=12 HS=64 | ${ours_fwd:-?} TFLOP/s | $(sdpa fwd) |"
    echo "| ... the forward with 32 rows per warp (dev variant 3) | ${ours_fwd32:-?} TFLOP/s | |"
    echo "| attention bf16 causal bwd | ${ours_bwd:-?} TFLOP/s | $(sdpa bwd) |"
    [[ -n ${ours_slices:-} ]] && echo "| ... the backward by dQ slices (slices: TFLOP/s) | ${ours_slices//\"/} | |"
    [[ -n ${ours_slices_b16:-} ]] && echo "| ... the same at B=16 NH=32 | ${ours_slices_b16//\"/} | |"
    [[ -n ${ours_slices_gpt2:-} ]] && echo "| ... the same at B=16 NH=12 (GPT-2's training step) | ${ours_slices_gpt2//\"/} | |"
    echo "| ... the backward adding dQ by atomics (dev variant 4) | ${ours_bwd4:-?} TFLOP/s | |"
    echo "| ... the forward with registers for 2 blocks per SM (dev variant 5) | ${ours_fwd5:-?} TFLOP/s | |"
    variant_rows "the backward on mma.sync where production's is on wgmma (dev variant 6)" "$ours_bwd6" "$mma_sweep" bwd
    variant_rows "the wgmma backward deferring dQ (dev variant 7)" "$ours_bwd7" "$defer_sweep" bwd
    variant_rows "the forward on wgmma (dev variant 8)" "$ours_fwd8" "$fwd8_sweep" fwd
    variant_rows "the wgmma backward with registers for 3 blocks per SM (dev variant 9)" "$ours_bwd9" "$wgmma3_sweep" bwd
    variant_rows "the wgmma backward adding dQ by reductions in L2 (dev variant 10)" "$ours_bwd10" "$wgmma_red_sweep" bwd
    variant_rows "both: 3 blocks per SM, dQ by reductions (dev variant 11)" "$ours_bwd11" "$wgmma3_red_sweep" bwd
    variant_rows "the wgmma backward summing dQ's slices in the kernel (dev variant 12)" "$ours_bwd12" \
        "$wgmma_sum_sweep" bwd
    variant_rows "variant 11 summing dQ's slices in the kernel (dev variant 13)" "$ours_bwd13" \
        "$wgmma3_red_sum_sweep" bwd
    variant_rows "the mma.sync backward summing dQ's slices in the kernel (dev variant 14)" "$ours_bwd14" \
        "$mma_sum_sweep" bwd
fi
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
torch_gemm=$(pyget 'd["gemm_bf16"]["tflops"]')
[[ -n $ours_gemm ]] && echo "| bf16 linear 8192x768 -> 3072 (ours: + bias + GELU epilogue) | ${ours_gemm} TFLOP/s | ${torch_gemm:+$torch_gemm TFLOP/s (plain GEMM)} |"
[[ -n $gemm_heur ]] && echo "| GPT-2 124M bf16 step's GEMMs (B=16): heuristic's / fastest algorithms | ${gemm_heur} / ${gemm_best:-?} ms | |"
[[ -n $bgrad_fused ]] && echo "| ... its bias gradients with their weight GEMMs: BGRADB / reduction kernels | ${bgrad_fused} / ${bgrad_kernels:-?} ms | |"
[[ -n $fcb_bgradb ]] && echo "| ... fc's bias gradient: BGRADB in fc dweight / DGELU_BGRAD in fc proj dinp | ${fcb_bgradb} / ${fcb_dgelu:-?} ms | |"
echo
[[ ${#skipped[@]} -gt 0 ]] && echo "skipped for --budget $budget: ${skipped[*]}"
echo "gpu_check: $failures failure(s), $(elapsed) s; JSON: $json_out"
[[ $failures -eq 0 ]]
