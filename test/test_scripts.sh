#!/usr/bin/env bash
# test/test_scripts.sh — the benchmark and launch scripts' own checks, run without building or
# training: the bench scripts refuse a STEPS the trainers would refuse (one line, exit 2, before any
# build); run_multi_gpu.sh refuses an NGPU out of range and a TRAINER that is a folder; and
# bench_techniques.sh, run against a stub trainer, prints a loss that is not a number as it is (not as
# 0.0000) and fails.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
passed=0 failed=0
report() {  # ok name detail
    if [[ $1 == 1 ]]; then echo "PASS $2  $3"; passed=$((passed + 1)); else echo "FAIL $2  $3"; failed=$((failed + 1)); fi
}
check() {  # name, expected exit, expected text, command... (one line of output at most)
    local name=$1 want_rc=$2 want_text=$3
    shift 3
    local out rc ok=0
    out=$("$@" 2>&1)
    rc=$?
    [[ $rc -eq $want_rc && $out == *"$want_text"* && $(echo "$out" | wc -l) -le 1 ]] && ok=1
    report $ok "$name" "exit $rc: $(echo "$out" | head -2)"
}
sb=$(mktemp -d)
trap 'rm -rf "$sb"' EXIT

# STEPS: the trainers' --max-steps takes at most 2^30; a number past it, or too long for bash's
# arithmetic, is refused by the script before it builds anything.
for s in bench_gpt2 bench_bert bench_moe bench_techniques; do
    for steps in 1073741825 99999999999999999999 0 abc; do
        [[ $s == bench_gpt2 || $steps != 0 ]] || continue
        check "$s.sh $steps refused" 2 "$s.sh: STEPS must be an integer in [" "$root/scripts/$s.sh" "$steps"
    done
done
check "bench_techniques.sh 1 refused (the first step is warm-up)" 2 "in [2, 1073741824]" \
    "$root/scripts/bench_techniques.sh" 1

check "run_multi_gpu.sh NGPU too large refused" 1 "NGPU must be an integer in [1, 9999]" \
    env NGPU=99999999999999999999 TRAINER=/bin/true "$root/scripts/run_multi_gpu.sh"
check "run_multi_gpu.sh NGPU=0 refused" 1 "NGPU must be an integer in [1, 9999]" \
    env NGPU=0 TRAINER=/bin/true "$root/scripts/run_multi_gpu.sh"
if command -v mpirun >/dev/null 2>&1; then
    check "run_multi_gpu.sh TRAINER a folder refused" 1 "TRAINER=$sb is not an executable file" \
        env NGPU=1 TRAINER="$sb" "$root/scripts/run_multi_gpu.sh"
else
    echo "SKIP run_multi_gpu.sh TRAINER a folder (no mpirun here: the script stops before it)"
fi

# bench_techniques.sh with a stub trainer (and a make that builds nothing): the fp16 run logs a loss
# that is not finite (null), the SGD run logs no step at all; the others fall from 4 to 3.
mkdir -p "$sb/repo/scripts" "$sb/bin"
cp "$root/scripts/bench_techniques.sh" "$sb/repo/scripts/"
printf '#!/bin/sh\nexit 0\n' > "$sb/bin/make"
cat > "$sb/repo/train_gpt2" <<'STUB'
#!/usr/bin/env bash
out= steps=2 all="$*"
while [[ $# -gt 0 ]]; do
    case $1 in -o) out=$2; shift 2 ;; -x) steps=$2; shift 2 ;; *) shift ;; esac
done
mkdir -p "$out"
echo '{"event":"run","B":4}' > "$out/log.jsonl"
case $all in *"sgd"*) exit 0 ;; esac
for ((i = 1; i <= steps; i++)); do
    loss=$((5 - i)).5
    [[ $all == *fp16* && $i == "$steps" ]] && loss=null
    echo "{\"event\":\"step\",\"step\":$i,\"loss\":$loss,\"tokens_per_s\":1000}" >> "$out/log.jsonl"
done
echo "device memory in use after the first step: 12.5 MiB"
STUB
chmod +x "$sb/bin/make" "$sb/repo/train_gpt2"
out=$(env PATH="$sb/bin:$PATH" "$sb/repo/scripts/bench_techniques.sh" 2 2>&1)
rc=$?
row() { echo "$out" | grep -m1 "^$1 " | tr -s ' '; }
[[ $rc == 1 && $(row "fp16 + loss scaling") == *" 4 12.5 null no" && $(row "bf16 + SGD momentum") == *" 4 none no" &&
   $(row "bf16") == "bf16 1000 1.00x 4 12.5 3.5000 yes" && $out != *"invalid number"* ]] && ok=1 || ok=0
report $ok "bench_techniques.sh: a loss that is null or missing shows as such, and the run fails" \
    "exit $rc: $(row "fp16 + loss scaling") | $(row "bf16 + SGD momentum") | $(row "bf16")"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
