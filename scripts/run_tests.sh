#!/usr/bin/env bash
# scripts/run_tests.sh — runs the test suite that `make test` built: every test binary (the multi-rank
# ones — nccl, distributed, data_parallel — under mpirun with 2 and 3 ranks), then nvcc compile
# checks; prints each test's own lines and a final tally, and exits non-zero if anything failed. Called by the Makefile with:
#   BUILD_DIR   directory of the test binaries (empty: skip them)
#   ASAN_DIR    directory of the ASan build of test_simt (runs the planted ASan bugs)
#   TESTS       test names (test_<name>)
#   DEVS        dev/cuda file names whose validation runs too (dev_<name>)
#   NVCC, CUDA_ARCHS, NVCC_CHECK_FLAGS, CU_SOURCES   compile checks (NVCC empty: skip)
#   REQUIRE_ORACLE=1   a missing Python oracle (torch + transformers) fails the python checks
#                      instead of skipping them (CI sets it)
#   KERNEL_COVERAGE=1  (make test) the CPU backend records every kernel launched (SIMT_COVERAGE_DIR),
#                      and the suite ends with scripts/kernel_coverage.py: "N of M kernels executed",
#                      one failure per __global__ kernel of the sources that no test launched
#   SMALL_DEVICE=l4    (make test) the single-process kernel and model tests and the dev/cuda
#                      validations run a second time under SIMT_DEVICE=l4, the smallest device
#                      profile (99 KiB of opt-in shared memory per block, 1536 threads per SM,
#                      compute capability 8.9); NOT_ON_SMALL_DEVICE names the tests left out
#   TEST_JOBS=n        tests run n at a time (default: one per core), printed in a fixed order
# test_fp8 and test_cublaslt also run with SIMT_FP8_ACCUMULATION_BITS=13 (a narrow fp8 accumulator).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"

# Python oracle checks, run after the binaries with /usr/bin/python3 (Debian's torch, transformers
# from pip): "name script test-binary" each; the script gets the test binary's path as its argument
# and prints the same PASS/FAIL lines and tally as the binaries. Add a check with one line.
PY_ORACLE_CHECKS=(
    "hf_gpt2_roundtrip test/hf_gpt2_roundtrip.py test_hf_gpt2"
    "hf_bert_roundtrip test/hf_bert_roundtrip.py test_bert"
    "hf_train_bert_export test/hf_train_bert_export.py test_train_bert"
    "bert_to_safetensors test/test_bert_to_safetensors.py test_train_bert"
)
# The tests the second pass under SMALL_DEVICE leaves out: those that launch no kernel (host code
# only), the multi-rank ones (the single-process tests launch the same kernels, and their mpirun
# runs would double the pass's cost) and test_simt (its device-profile checks run each profile
# themselves). The dev/cuda validations run again too.
NOT_ON_SMALL_DEVICE=" cli tokenizer wordpiece dataloader bert_data safetensors tokenize_tool zero
    nccl distributed data_parallel train_gpt2_ranks train_bert_ranks simt "
passed=0
failed=0
failed_names=()

# The tests run TEST_JOBS at a time (default: one per core; each test is one process, the CPU
# backend running its blocks on one thread). `run NAME CMD...` starts CMD in the background; the
# outputs are printed in the order the tests were started, each as soon as it and those before it
# are done, with its wall time, and its "N passed, N failed" line is added to the tally. `collect`
# waits for every test started so far (before the nvcc checks, which take every core themselves,
# and before the kernel coverage, which reads what the tests recorded).
jobs_dir=$(mktemp -d)
TEST_JOBS="${TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}"
started=0
reported=0

run() {
    local name="$1"; shift
    while (( $(jobs -rp | wc -l) >= TEST_JOBS )); do
        wait -n
        report_done
    done
    local i=$started
    started=$((started + 1))
    printf '%s' "$name" > "$jobs_dir/$i.name"
    (
        start=$SECONDS
        "$@" > "$jobs_dir/$i.out" 2>&1
        status=$?
        echo "$((SECONDS - start))" > "$jobs_dir/$i.secs"
        echo "$status" > "$jobs_dir/$i.tmp" && mv "$jobs_dir/$i.tmp" "$jobs_dir/$i.status"
    ) &
}

# Prints the finished tests that are next in start order and adds them to the tally.
report_done() {
    while (( reported < started )) && [[ -f "$jobs_dir/$reported.status" ]]; do
        local i=$reported name out status tally
        reported=$((reported + 1))
        name=$(cat "$jobs_dir/$i.name")
        out=$(cat "$jobs_dir/$i.out")
        status=$(cat "$jobs_dir/$i.status")
        echo "== $name"
        echo "$out"
        echo "   ($name: $(cat "$jobs_dir/$i.secs") s)"
        tally=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
        if [[ -n "$tally" ]]; then
            passed=$((passed + $(echo "$tally" | awk '{print $1}')))
            failed=$((failed + $(echo "$tally" | awk '{print $3}')))
        fi
        if [[ $status -ne 0 || -z "$tally" ]]; then
            [[ -z "$tally" || $(echo "$tally" | awk '{print $3}') == 0 ]] && failed=$((failed + 1))
            echo "FAIL $name exited with status $status"
            failed_names+=("$name")
        fi
    done
}

collect() {
    wait
    report_done
}

# MPI_LSAN_OPTIONS (make test-asan sets it): LeakSanitizer's options for the processes mpirun starts.
MPIRUN=(mpirun --oversubscribe)
[[ -n ${MPI_LSAN_OPTIONS:-} ]] && MPIRUN+=(-x "LSAN_OPTIONS=$MPI_LSAN_OPTIONS")
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)

# On the CPU backend every stream runs as late as CUDA's ordering rules allow (llmc/simt/streams.cpp),
# so a missing stream wait or an early host read fails here as it could on a GPU.
export SIMT_STREAMS="${SIMT_STREAMS:-adversarial}"

coverage_dir=
if [[ -n "${BUILD_DIR:-}" && "${KERNEL_COVERAGE:-}" == 1 ]]; then
    coverage_dir=$(mktemp -d)
    export SIMT_COVERAGE_DIR="$coverage_dir"  # every process below records, mpirun's ranks included
fi

# test_simt first (the backend everything else runs on), then the slowest tests, so that the last
# minutes of the suite do not run one long test alone on an otherwise idle machine; the rest in
# TESTS's order. Only the order of the output changes with it.
FIRST="simt train_gpt2_ranks attention train_bert train_bert_ranks gpt2 data_parallel checkpoint bert"
ordered=$(for t in $FIRST; do [[ " $TESTS " == *" $t "* ]] && echo "$t"; done
          for t in $TESTS; do [[ " $FIRST " == *" $t "* ]] || echo "$t"; done)

if [[ -n "${BUILD_DIR:-}" ]]; then
    for t in $ordered; do
        case "$t" in
            simt) run "test_simt" "$BUILD_DIR/test_simt" "$ASAN_DIR/test_simt" ;;
            nccl)
                run "test_nccl (2 ranks)" "${MPIRUN[@]}" -np 2 "$BUILD_DIR/test_nccl"
                run "test_nccl (3 ranks)" "${MPIRUN[@]}" -np 3 "$BUILD_DIR/test_nccl" ;;
            distributed)
                run "test_distributed (2 ranks)" "${MPIRUN[@]}" -np 2 "$BUILD_DIR/test_distributed"
                run "test_distributed (3 ranks)" "${MPIRUN[@]}" -np 3 "$BUILD_DIR/test_distributed" ;;
            data_parallel)
                run "test_data_parallel (2 ranks)" "${MPIRUN[@]}" -np 2 "$BUILD_DIR/test_data_parallel"
                run "test_data_parallel (3 ranks)" "${MPIRUN[@]}" -np 3 "$BUILD_DIR/test_data_parallel" ;;
            *) run "test_$t" "$BUILD_DIR/test_$t" ;;
        esac
    done
    for d in ${DEVS:-}; do
        run "dev/cuda/$d.cu" "$BUILD_DIR/dev_$d"
    done
    if [[ -n "${SMALL_DEVICE:-}" ]]; then
        for t in $ordered; do
            [[ "$NOT_ON_SMALL_DEVICE" == *[[:space:]]$t[[:space:]]* ]] && continue
            run "test_$t (SIMT_DEVICE=$SMALL_DEVICE)" env SIMT_DEVICE="$SMALL_DEVICE" "$BUILD_DIR/test_$t"
        done
        for d in ${DEVS:-}; do
            run "dev/cuda/$d.cu (SIMT_DEVICE=$SMALL_DEVICE)" env SIMT_DEVICE="$SMALL_DEVICE" "$BUILD_DIR/dev_$d"
        done
    fi
    # The fp8 GEMM tests again with a narrow fp8 accumulator, as Hopper's tensor cores have: their
    # budgets must follow the accumulation the probe measures (test/fp8_accumulation.h), not fp32's.
    for t in fp8 cublaslt; do
        [[ " $TESTS " == *" $t "* ]] || continue
        run "test_$t (SIMT_FP8_ACCUMULATION_BITS=13)" env SIMT_FP8_ACCUMULATION_BITS=13 "$BUILD_DIR/test_$t"
    done
    run "test_kernel_coverage (scripts/kernel_coverage.py)" bash "$root/test/test_kernel_coverage.sh" "$BUILD_DIR"
    run "test_gpu_check (scripts/gpu_check.sh)" bash "$root/test/test_gpu_check.sh"
    run "test_scripts (the bench and launch scripts' checks)" bash "$root/test/test_scripts.sh"
    run "test_makefile (the GPU build: MPI flags, nvidia-smi)" bash "$root/test/test_makefile.sh"
    run "test_sass_check (scripts/sass_check.py)" python3 "$root/test/test_sass_check.py"
    run "test_docs (README.md and the docs' links)" bash "$root/test/test_docs.sh"
    run "test_install_deps (scripts/install_deps.sh)" bash "$root/test/test_install_deps.sh"
    if python3 -c 'import matplotlib' >/dev/null 2>&1; then
        run "test_plot (scripts/plot.py)" python3 "$root/test/test_plot.py"
    else
        echo "SKIP test_plot (scripts/plot.py needs matplotlib: python3 -m pip install matplotlib)"
    fi
    if /usr/bin/python3 -c 'import torch, transformers' >/dev/null 2>&1; then have_oracle=1; else have_oracle=; fi
    for check in "${PY_ORACLE_CHECKS[@]}"; do
        read -r name script bin <<< "$check"
        [[ " $TESTS " == *" ${bin#test_} "* ]] || continue  # its binary is not part of this suite
        if [[ -n "$have_oracle" ]]; then
            run "$name" /usr/bin/python3 "$root/$script" "$BUILD_DIR/$bin"
        elif [[ "${REQUIRE_ORACLE:-}" == 1 ]]; then
            echo "FAIL $name (REQUIRE_ORACLE=1, but /usr/bin/python3 cannot import torch and transformers)"
            failed=$((failed + 1))
            failed_names+=("$name")
        else
            echo "SKIP $name (needs Debian python3-torch and pip transformers<4.46 for /usr/bin/python3)"
        fi
    done
fi

collect

if [[ -n "${NVCC:-}" && -n "${CU_SOURCES:-}" ]]; then
    targets=$(for a in $CUDA_ARCHS; do [[ $a == 90 ]] && a=90a; printf '%s ' "$a"; done)
    targets=${targets% }
    echo "== nvcc compile checks (sm_${targets// /, sm_})"
    # One nvcc per file for all the architectures (ptxas runs per architecture), the files in
    # parallel; results are printed in a fixed order. -fatbin compiles the device code only: nvcc's
    # front end still reads and checks the whole file, host code included (its warnings are errors),
    # but the host compiler's pass over nvcc's host-side output, half of a `-c`'s time, is left out
    # (the CPU backend's g++ build compiles that host code, and a GPU build all of it). A test that
    # includes a whole trainer (test/gpt2_trainer.h, test/bert_trainer.h; and the suites of such
    # tests) compiles nothing the trainer's own check does not (the same kernels): it is left to
    # `make test-gpu`, which builds it with nvcc on a GPU machine; the trainers themselves are
    # checked here for every architecture.
    results=$(mktemp -d)
    start=$SECONDS
    # 9.0 as sm_90a, as the Makefile builds it (wgmma).
    gencode=$(for a in $targets; do printf -- ' -gencode arch=compute_%s,code=sm_%s' "$a" "$a"; done)
    archs="sm_${targets// /+sm_}"
    checked=$(for f in $CU_SOURCES; do grep -qE '#include "((gpt2|bert)_trainer\.h|test_[a-z0-9_]+\.cu)"' "$f" || echo "$f"; done)
    # The files that compile the attention kernels (the trainers, and those including
    # llmc/attention.cuh) take half a minute to a minute and a half each where the others take
    # seconds: started first, they do not end the check running alone on one core.
    heavy=$(for f in $checked; do [[ $f != */* ]] || grep -q 'llmc/attention.cuh"' "$f" && echo "$f"; done)
    checked=$(echo "$heavy"; for f in $checked; do [[ " "$(echo $heavy)" " == *" $f "* ]] || echo "$f"; done)
    echo "$checked" |
        xargs -P "$(nproc)" -L 1 sh -c '
            out="'"$results"'/$(echo "$0" | tr / _)"
            if "'"$NVCC"'" '"$NVCC_CHECK_FLAGS"' '"$gencode"' -fatbin "$0" -o /dev/null > "$out.log" 2>&1
            then echo ok > "$out.status"; else echo fail > "$out.status"; fi'
    for f in $checked; do
        key="$results/$(echo "$f" | tr / _)"
        if [[ $(cat "$key.status" 2>/dev/null) == ok ]]; then
            echo "PASS nvcc $archs $f"
            passed=$((passed + 1))
        else
            echo "FAIL nvcc $archs $f"
            head -20 "$key.log" 2>/dev/null
            failed=$((failed + 1))
            failed_names+=("nvcc $archs $f")
        fi
    done
    echo "   (nvcc compile checks: $((SECONDS - start)) s)"
    rm -rf "$results"
    # What the bf16 attention kernels compile to on A100 and H100 (ldmatrix, cp.async, no spills, two
    # blocks per SM); CI (REQUIRE_ORACLE=1) fails without cuobjdump or nvdisasm instead of skipping.
    run "sass checks (scripts/sass_check.py)" env REQUIRE_SASS="${REQUIRE_ORACLE:-}" \
        python3 "$root/scripts/sass_check.py" --nvcc "$NVCC" --arch 80 --arch 90a
fi

collect

# Last, so that the suite ends with it: which kernels of the sources no test above launched.
if [[ -n "$coverage_dir" ]]; then
    run "kernel coverage (scripts/kernel_coverage.py)" python3 "$root/scripts/kernel_coverage.py" "$coverage_dir"
    collect
    rm -rf "$coverage_dir"
fi
rm -rf "$jobs_dir"

echo
[[ ${#failed_names[@]} -gt 0 ]] && echo "failing: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
