#!/usr/bin/env bash
# scripts/bench_moe.sh — dense GPT-2 against Mixture-of-Experts GPT-2 on the bundled Shakespeare data:
# the same steps, batch and learning rate for each model; prints parameters (total, active per
# token), training tokens/s (mean over the steps after the first) and the validation loss at the end.
# Rows: dense; 8 experts top-1 in every other block (the same active parameters as dense, the
# experts having no biases and a router added); 8 experts top-2 (one more expert's worth active).
# On the CPU backend (no GPU) it trains the tiny GPT-2 (4 layers, 128 channels): CPU figures.
#   scripts/bench_moe.sh [steps] [extra train_gpt2 options for every row...]
# TRAIN_GPT2=PATH runs that trainer binary (make gpu-check passes its GPU build) instead of building
# ./train_gpt2 with make; BENCH_JSON=FILE also writes each row to FILE as one JSON object per line.
set -euo pipefail
# --help prints the comment above; STEPS is checked here, before a build.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
steps=${1:-40}
# (At most the trainer's --max-steps bound, 2^30; ten digits at most first, so bash compares no overflow.)
[[ $steps =~ ^[1-9][0-9]{0,9}$ && $steps -ge 2 && $steps -le 1073741824 ]] ||
    { echo "bench_moe.sh: STEPS must be an integer in [2, 1073741824] (the first step is warm-up), not '$steps' (--help)" >&2; exit 2; }
shift || true
cd "$(dirname "$0")/.."
trainer=${TRAIN_GPT2:-}
if [[ -z $trainer ]]; then
    make --no-print-directory train_gpt2 >/dev/null
    trainer=./train_gpt2
fi
if nvidia-smi -L >/dev/null 2>&1; then
    model=(-e d12 -b 8 -t 1024 --precision bf16)
    echo "GPU: GPT-2 124M (d12), B=8 T=1024, bf16, $steps steps"
else
    model=(-e d4 --channels 128 --heads 4 --max-seq-len 128 -b 4 -t 128)
    echo "CPU backend (no GPU found): tiny GPT-2 (4 layers, 128 channels), B=4 T=128, fp32, $steps steps;"
    echo "these are CPU figures: they measure the simulator, not a GPU."
fi
printf "%-34s %10s %10s %9s %9s\n" "model" "params" "active" "tok/s" "val loss"
row() {
    local name=$1
    shift
    local out
    out=$("$trainer" "${model[@]}" -x "$steps" -v "$steps" -m 10 -g 0 "$@")
    local total active tps val
    total=$(sed -n 's/^model: .*, \([0-9.]*\)M parameters$/\1/p' <<<"$out")
    active=$(sed -n 's/^MoE: .* \([0-9.]*\)M active per token$/\1/p' <<<"$out")
    tps=$(awk '/^step +[0-9]+\/[0-9]+ \|/ { n++; if (n > 1) { for (i = 1; i < NF; i++) if ($(i + 1) == "tok/s") { s += $i; k++ } } }
               END { if (k) printf "%.0f", s / k }' <<<"$out")
    val=$(sed -n "s/^step $steps | val loss \([0-9.]*\)$/\1/p" <<<"$out")
    printf "%-34s %9sM %9sM %9s %9s\n" "$name" "$total" "${active:-$total}" "$tps" "$val"
    [[ -z ${BENCH_JSON:-} ]] ||
        printf '{"model":"%s","params_m":%s,"active_params_m":%s,"tokens_per_s":%s,"val_loss":%s}\n' "$name" \
            "${total:-null}" "${active:-${total:-null}}" "${tps:-null}" "${val:-null}" >> "$BENCH_JSON"
}
[[ -z ${BENCH_JSON:-} ]] || : > "$BENCH_JSON"
row "dense" "$@"
row "MoE 8 experts top-1, every 2nd" --moe-experts 8 --moe-top-k 1 "$@"
row "MoE 8 experts top-2, every 2nd" --moe-experts 8 --moe-top-k 2 "$@"
