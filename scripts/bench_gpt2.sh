#!/usr/bin/env bash
# scripts/bench_gpt2.sh — training throughput of train_gpt2: N steps of GPT-2 124M at T=1024 on a GPU
# (tokens/s, ms/step, MFU, device memory), or of a tiny GPT-2 on the CPU backend (CPU figures).
# Token content does not matter for speed, so it trains on a shard of random tokens it writes itself.
#   scripts/bench_gpt2.sh [steps] [extra train_gpt2 options...]
set -euo pipefail
# --help prints the comment above; STEPS is checked here, before a build, not by the trainer after it.
case ${1:-} in -h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
steps=${1:-10}
# (At most the trainer's --max-steps bound, 2^30; ten digits at most first, so bash compares no overflow.)
[[ $steps =~ ^[1-9][0-9]{0,9}$ && $steps -le 1073741824 ]] ||
    { echo "bench_gpt2.sh: STEPS must be an integer in [1, 1073741824], not '$steps' (--help)" >&2; exit 2; }
shift || true
cd "$(dirname "$0")/.."
make --no-print-directory train_gpt2 >/dev/null
shard=$(mktemp /tmp/bench_gpt2_XXXXXX.bin)
trap 'rm -f "$shard"' EXIT
python3 - "$shard" <<'PY'
import random, struct, sys
n = 4 * 1024 * 1024 + 1
random.seed(0)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(random.randrange(50257) for _ in range(n))))
PY
if nvidia-smi -L >/dev/null 2>&1; then
    echo "GPU benchmark: GPT-2 124M (d12), B=8 T=1024, bf16, $steps steps"
    ./train_gpt2 -i "$shard" -j '' -e d12 -b 8 -t 1024 --precision bf16 -x "$steps" -v 0 -g 0 "$@"
else
    echo "CPU-backend benchmark (no GPU found): tiny GPT-2 (4 layers, 128 channels, 4 heads), B=4 T=128, fp32."
    echo "These are CPU figures: they measure the simulator, not a GPU."
    ./train_gpt2 -i "$shard" -j '' -e d4 --channels 128 --heads 4 --max-seq-len 128 -b 4 -t 128 -x "$steps" -v 0 -g 0 "$@"
fi
