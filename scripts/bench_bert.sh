#!/usr/bin/env bash
# scripts/bench_bert.sh — BERT training throughput in each precision: sequence-classification
# fine-tuning at T=256 and MLM pretraining at T=128 (15% masked), one table row per mode: samples/s,
# ms/step and device memory in use. On a GPU: bert-base (12 layers, 768 channels), B=32; on the CPU
# backend: the tiny config (2 layers, 128 channels), B=8, and the table says the figures are CPU
# figures (the CPU has no bf16/fp16 arithmetic: the low precisions are slower there; compare memory).
# Runs `train_bert --bench`: synthetic shards of full-length sequences it writes itself (nothing is
# downloaded), STEPS steps, the mean time of all but the first (warm-up).
#
#   scripts/bench_bert.sh [STEPS] [extra train_bert options...]
#
# A mode the trainer refuses shows its error in place of the figures, and the exit status is then 1.
set -u
# --help prints the comment above; STEPS is checked here, before a build and eight refused runs.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
steps=${1:-6}
# (At most the trainer's --max-steps bound, 2^30; ten digits at most first, so bash compares no overflow.)
[[ $steps =~ ^[1-9][0-9]{0,9}$ && $steps -ge 2 && $steps -le 1073741824 ]] ||
    { echo "bench_bert.sh: STEPS must be an integer in [2, 1073741824] (the first step is warm-up), not '$steps' (--help)" >&2; exit 2; }
shift || true
cd "$(dirname "$0")/.." || exit 1
make --no-print-directory train_bert >/dev/null || exit 1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    where="GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), bert-base, B=32"
    base=(--bench --config base -b 32 --max-steps "$steps")
else
    where="CPU backend figures (no GPU found: they measure the simulator, not a GPU), tiny BERT, B=8"
    base=(--bench --config tiny -b 8 --max-steps "$steps")
fi

# mode | options
modes=(
    "classify T=256 fp32|--task classify -t 256 --precision fp32"
    "classify T=256 tf32|--task classify -t 256 --precision tf32"
    "classify T=256 bf16|--task classify -t 256 --precision bf16"
    "classify T=256 fp16|--task classify -t 256 --precision fp16"
    "mlm T=128 fp32|--task mlm -t 128 --precision fp32"
    "mlm T=128 tf32|--task mlm -t 128 --precision tf32"
    "mlm T=128 bf16|--task mlm -t 128 --precision bf16"
    "mlm T=128 fp16|--task mlm -t 128 --precision fp16"
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "train_bert --bench, $steps steps per mode; $where"
echo
echo "| mode | samples/s | ms/step | memory |"
echo "|---|---|---|---|"
status=0
for m in "${modes[@]}"; do
    name=${m%%|*}
    read -r -a opts <<< "${m#*|}"
    if ! ./train_bert "${base[@]}" "${opts[@]}" "$@" > "$tmp/stdout" 2> "$tmp/stderr"; then
        echo "| $name | n/a: $(head -1 "$tmp/stderr") | | |"
        status=1
        continue
    fi
    # The summary line: "bench | classify T=256 | fp32 | 12.34 samples/s | 648.2 ms/step | 123.4 MiB"
    awk -F' [|] ' -v name="$name" '/^bench [|]/ {
        sub(/ samples\/s/, "", $4); sub(/ ms\/step/, "", $5)
        printf "| %s | %s | %s | %s |\n", name, $4, $5, $6 }' "$tmp/stdout"
done
exit $status
