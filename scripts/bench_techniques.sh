#!/usr/bin/env bash
# scripts/bench_techniques.sh — every speed and memory technique of train_gpt2 side by side: runs a
# fixed number of steps for each on the same data and prints one table row per technique (tokens/s,
# speed-up against fp32, batch, device memory in use, final loss, whether training stayed stable).
#
#   scripts/bench_techniques.sh [STEPS] [extra train_gpt2 options...]
#
# On a GPU it trains GPT-2 124M (d12, T=1024, B=8); on the CPU backend the trainer's tiny default
# model, and the table says the figures are CPU figures (they show memory and stability, not GPU
# speed). A technique the binary refuses shows its error instead of a row, and the exit status is
# then 1. The speed-up is against the fp32 row ("n/a" if that row failed).
set -u
# --help prints the comment above; STEPS is checked here, before a build and eleven refused runs.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
steps=${1:-10}
# (At most the trainer's --max-steps bound, 2^30; ten digits at most first, so bash compares no overflow.)
[[ $steps =~ ^[1-9][0-9]{0,9}$ && $steps -ge 2 && $steps -le 1073741824 ]] ||
    { echo "bench_techniques.sh: STEPS must be an integer in [2, 1073741824] (the first step is warm-up), not '$steps' (--help)" >&2; exit 2; }
shift || true
cd "$(dirname "$0")/.." || exit 1
# Built like the other bench scripts: a stale ./train_gpt2 would time the code before the last edit.
make --no-print-directory train_gpt2 >/dev/null || exit 1

if nvidia-smi -L >/dev/null 2>&1; then
    where="GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
    base=(-e d12 -b 8 -t 1024 -x "$steps" -v 0 -g 0)
else
    where="CPU backend (figures are CPU figures: compare memory and loss, not speed)"
    base=(-x "$steps" -v 0 -g 0)
fi

# name | options
techniques=(
    "fp32|--precision fp32"
    "tf32|--precision tf32"
    "bf16|--precision bf16"
    "bf16 + recompute gelu|--precision bf16 --recompute gelu"
    "bf16 + recompute ln|--precision bf16 --recompute ln"
    "bf16 + recompute layer|--precision bf16 --recompute layer"
    "fp16 + loss scaling|--precision fp16"
    "fp8 (E4M3/E5M2 matmuls)|--precision fp8"
    "bf16 + AdamW 8-bit|--precision bf16 --optimizer adamw8bit"
    "bf16 + Adafactor|--precision bf16 --optimizer adafactor"
    "bf16 + SGD momentum|--precision bf16 --optimizer sgd --lr 0.05"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "train_gpt2 techniques, $steps steps each, on $where"
printf "%-26s %12s %8s %6s %12s %11s %7s\n" "method" "tokens/s" "speedup" "B" "memory MiB" "final loss" "stable"
fp32_tps="" status=0
for t in "${techniques[@]}"; do
    name=${t%%|*}
    read -r -a opts <<< "${t#*|}"
    out="$tmp/run"
    rm -rf "$out"
    if ! ./train_gpt2 "${base[@]}" "${opts[@]}" "$@" -o "$out" > "$tmp/stdout" 2> "$tmp/stderr"; then
        printf "%-26s %s\n" "$name" "n/a: $(head -1 "$tmp/stderr")"
        status=1
        continue
    fi
    # Mean tokens/s over the steps after the first (warm-up), the last loss, and whether every loss
    # was finite and the last is below the first.
    read -r tps loss stable B <<< "$(awk -F'[,:{}]' '
        /"event":"run"/ { for (i = 1; i < NF; i++) if ($i == "\"B\"") B = $(i + 1) }
        /"event":"step"/ {
            for (i = 1; i < NF; i++) {
                if ($i == "\"loss\"") loss = $(i + 1)
                if ($i == "\"tokens_per_s\"") tps = $(i + 1)
            }
            n++
            if (n == 1) first = loss
            if (n > 1) { sum += tps; m++ }
            if (loss == "null") bad = 1
        }
        END {
            printf "%.0f %s %s %s\n", m ? sum / m : tps, n ? loss : "none",
                   (n && !bad && loss + 0 < first + 0) ? "yes" : "no", B
        }
    ' "$out/log.jsonl")"
    mem=$(sed -n 's/^device memory in use after the first step: \([0-9.]*\) MiB.*/\1/p' "$tmp/stdout")
    [[ $name == fp32 ]] && fp32_tps=$tps
    speedup=$(awk -v a="$tps" -v b="$fp32_tps" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else printf "n/a" }')
    # A loss that is not a number (null: not finite; none: no step logged) is shown as it is, and fails.
    if [[ $loss =~ ^-?[0-9.]+([eE][-+]?[0-9]+)?$ ]]; then
        loss=$(printf "%.4f" "$loss")
    else
        stable=no status=1
    fi
    printf "%-26s %12s %8s %6s %12s %11s %7s\n" "$name" "$tps" "$speedup" "$B" "$mem" "$loss" "$stable"
done
exit $status
