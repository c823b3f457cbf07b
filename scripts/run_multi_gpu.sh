#!/usr/bin/env bash
# scripts/run_multi_gpu.sh — data-parallel training on the GPUs of one machine: Open MPI's mpirun
# starts one train_gpt2 process per GPU; each takes its rank from MPI, drives GPU <local rank>, and
# joins the others in one NCCL communicator (llmc/distributed.h). Options after the script's name
# go to every train_gpt2 process unchanged.
#
#   scripts/run_multi_gpu.sh -i 'dev/data/fineweb10B/*train*.bin' -e d12 -b 16 -t 1024
#   NGPU=4 scripts/run_multi_gpu.sh ...                  # the first 4 GPUs only
#
# What it expects:
#   - ./train_gpt2 built with MPI: `make train_gpt2` must print "✓ MPI: mpicxx" (Debian/Ubuntu:
#     apt-get install libopenmpi-dev) — a build without MPI refuses to start as one of N processes.
#   - NCCL installed for the GPU build (libnccl2 + libnccl-dev, or the CUDA toolkit's copy).
#   - Open MPI's mpirun on PATH, the same MPI train_gpt2 was built against.
# Environment:
#   NGPU         processes to start (default: every GPU nvidia-smi lists). Without a GPU the program
#                runs on the CPU backend, where every process simulates its own GPU; NGPU must then
#                be given (e.g. NGPU=2 to try multi-GPU code paths on a laptop).
#   TRAINER      the program to start (default ./train_gpt2; ./train_bert works the same way).
#   NCCL_DEBUG   NCCL's log level, passed to every rank (default WARN: only problems; INFO shows the
#                rings/trees and transports NCCL picked, the first thing to look at when it is slow).
#   MPIRUN_ARGS  extra mpirun options, e.g. NUMA binding on a multi-socket machine whose GPUs 0-3
#                hang off socket 0 and 4-7 off socket 1: "--map-by ppr:4:socket --bind-to socket".
set -euo pipefail
# --help alone prints the comment above (./train_gpt2 --help lists the trainer's options).
[[ $# -eq 1 && ( $1 == -h || $1 == --help ) ]] && { sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0; }
cd "$(dirname "$0")/.."

trainer=${TRAINER:-./train_gpt2}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
ngpu=${NGPU:-$gpus}
# Checked as text first: bash arithmetic would read NGPU=abc as an unset variable.
if [[ -n ${NGPU:-} && ! $NGPU =~ ^[1-9][0-9]{0,3}$ ]]; then
    echo "run_multi_gpu.sh: NGPU must be an integer in [1, 9999] (processes to start), not '$NGPU'" >&2
    exit 1
fi
if [[ "$ngpu" -lt 1 ]]; then
    echo "run_multi_gpu.sh: no GPU found (nvidia-smi); set NGPU=<processes> to run them on the CPU backend" >&2
    exit 1
fi
if [[ "$gpus" -gt 0 && "$ngpu" -gt "$gpus" ]]; then
    echo "run_multi_gpu.sh: NGPU=$ngpu but this machine has $gpus GPUs (one process per GPU)" >&2
    exit 1
fi
if ! command -v mpirun >/dev/null 2>&1; then
    echo "run_multi_gpu.sh: mpirun not found (apt-get install openmpi-bin libopenmpi-dev, then rebuild)" >&2
    exit 1
fi
if [[ ! -f "$trainer" || ! -x "$trainer" ]]; then  # -x alone holds for a folder
    case $trainer in
        ./train_gpt2 | ./train_bert) make --no-print-directory "${trainer#./}" ;;
        *) echo "run_multi_gpu.sh: TRAINER=$trainer is not an executable file" >&2; exit 1 ;;
    esac
fi

# --bind-to none: Open MPI binds each rank to a single core when it starts two or fewer, which
# starves the dataloader's prefetch thread (and, on the CPU backend, the simulated GPU's workers).
# -x NCCL_DEBUG: exported explicitly so it also reaches ranks if MPIRUN_ARGS adds remote hosts.
cmd=(mpirun -np "$ngpu" --bind-to none -x "NCCL_DEBUG=${NCCL_DEBUG:-WARN}")
[[ "$gpus" -eq 0 ]] && cmd+=(--oversubscribe)   # CPU backend: more processes than cores is fine
[[ $(id -u) -eq 0 ]] && cmd+=(--allow-run-as-root)  # containers often run as root
# shellcheck disable=SC2206  # MPIRUN_ARGS is a list of options, split on purpose
cmd+=(${MPIRUN_ARGS:-} "$trainer" "$@")
echo "${cmd[*]}"
exec "${cmd[@]}"
