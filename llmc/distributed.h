// llmc/distributed.h — the multi-process runtime of data-parallel training: who this process is
// (rank, world, local rank) and which GPU it drives, the NCCL communicator bootstrapped over MPI,
// a communication stream, fatal errors that take the whole job down, and the collectives the
// trainer needs (scalar reductions for logging; grouped all-reduce, reduce-scatter and all-gather
// of gradient and parameter chunks, partitioned as llmc/zero.h plans).
//
// Launching. A process started directly is a world of one: no MPI, no NCCL, and every collective
// below is the identity (or a device copy), so a trainer has one code path. A process started by
// a launcher — mpirun (Open MPI sets OMPI_COMM_WORLD_*), srun (SLURM_STEP_NUM_TASKS, SLURM_PROCID,
// SLURM_LOCALID; an sbatch script alone is not a launch), mpiexec/Hydra or any PMI (PMI_SIZE,
// PMI_RANK), or PMIx (PMIX_RANK) — runs MPI_Init and takes rank and world from MPI; its local rank
// and local world come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), and what the launcher's
// environment says is cross-checked (a mismatch means MPI and the launcher are not wired together,
// e.g. srun without --mpi=pmix). Local rank i drives GPU i, or GPU 0 when the launcher gave each
// process one GPU (srun --gpus-per-task=1); two ranks of a node landing on one GPU is an error.
// On the CPU backend every process is its own virtual device 0. Rank 0 makes the ncclUniqueId,
// MPI_Bcast's it, every rank joins with ncclCommInitRank (llm.c's bootstrap). Built without MPI
// (USE_MPI undefined), a process that a launcher started as one of several refuses to run.
//
// Failures. distributed_fatal(fmt, ...) prints "rank R/W: message" and, once MPI is up, calls
// MPI_Abort, which ends every rank of the job (mpirun and srun both kill the rest), so no rank is
// left waiting in a collective for a peer that died. distributed_init routes cudaCheck (through
// fatal_error_prefix / fatal_error_hook in cuda_common.h) the same way; the trainer should send its
// own fatal errors through distributed_fatal (or print with fatal_error_prefix and call
// fatal_exit()) rather than exit().
//
// Usage:
//     Distributed d = distributed_init(&argc, &argv);      // first thing in main()
//     float loss = all_reduce_mean_scalar(d, local_loss);   // logging: the same value on every rank
//     stream_wait(d.comm_stream, stream, layer_done[l]);    // layer l's gradients are final ...
//     reduce_scatter_chunks(d, sharded_chunks(plan, g, grads, grad_shard), ReduceOp::Avg, d.comm_stream);
//     stream_wait(stream, d.comm_stream, comm_done);        // ... the optimizer waits for them
//     distributed_finalize(d);
#pragma once
#include "cuda_common.h"
#include "zero.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <unistd.h>

#include <array>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <string>
#include <vector>

#ifdef USE_MPI
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // MPI's C API only: its deprecated C++ bindings slow the build and warn
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <nccl.h>
#else
typedef struct ncclComm* ncclComm_t;  // nccl.h's own typedef, so Distributed is the same struct in every build
#endif

// ----------------------------------------------------------------------------
// Who this process is

struct Distributed {
    int rank = 0, world = 1;              // this process among all of the job's
    int local_rank = 0, local_world = 1;  // among the job's processes on this node
    int device = 0;                       // the CUDA device this process drives
    bool mpi = false;                     // MPI_Init was called (a launcher started the process)
    ncclComm_t comm = nullptr;            // all ranks; nullptr when world == 1
    cudaStream_t comm_stream = nullptr;   // non-blocking stream for collectives that overlap compute
};

// ----------------------------------------------------------------------------
// Fatal errors

// Makes fatal errors (distributed_fatal, cudaCheck) start with "rank R/W: " ("?" for an unknown world).
inline void distributed_set_identity(int rank, int world) {
    static char prefix[48];
    if (world >= 0) snprintf(prefix, sizeof(prefix), "rank %d/%d: ", rank, world);
    else snprintf(prefix, sizeof(prefix), "rank %d/?: ", rank);
    fatal_error_prefix = prefix;
    fatal_error_rank = rank;
}

// Prints "rank R/W: message" ("PROGRAM: error: message" in a single process) and ends the whole job.
[[noreturn]] inline void distributed_fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline void distributed_fatal(const char* fmt, ...) {
    fflush(stdout);
    // One write for the whole line: mpirun forwards each rank's stderr in the pieces it was written
    // in, so a prefix written apart from its message can end up apart from it.
    char line[2048];
    int n = fatal_error_lead(line, 64);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    fputs(line, stderr);
    fflush(stderr);
    fatal_exit();
}

#ifdef USE_MPI
// fatal_error_hook while MPI is up: MPI_Abort ends every process of the job, not just this one.
inline void distributed_abort_job(int status) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
    }
}

// Checks an NCCL call; a failure names the call, NCCL's explanation and (through the prefix) the rank.
#define ncclCheck(call) distributed_nccl_check((call), #call, __FILE__, __LINE__)
inline void distributed_nccl_check(ncclResult_t r, const char* call, const char* file, int line) {
    if (r != ncclSuccess)
        distributed_fatal("[NCCL ERROR] %s: %s\n  in: %s\n  at %s:%d", ncclGetErrorString(r), ncclGetLastError(nullptr),
                          call, file, line);
}
#endif

// ----------------------------------------------------------------------------
// The launcher's view (environment) and its checks; pure functions, so tests can feed them any
// environment.

// What the environment says about how this process was started.
struct LaunchEnv {
    const char* launcher = nullptr;  // nullptr: started directly (a world of one)
    int world = -1, rank = -1;       // -1: the launcher does not say
    int local_rank = -1, local_world = -1;
};

// A non-negative decimal environment value, or -1 when absent or malformed.
inline int distributed_env_int(const char* s) {
    if (!s || !*s) return -1;
    char* end = nullptr;
    long v = strtol(s, &end, 10);
    return (*end || v < 0 || v > INT_MAX) ? -1 : (int)v;
}

// Reads the launch from environment variables through get(name) (getenv, or a test's table). The
// MPI launchers come before Slurm: mpirun/mpiexec inside an allocation start their daemons with
// srun, whose SLURM_* variables then describe the daemons, not the ranks.
template <class Get>
LaunchEnv distributed_launch_env(Get get) {
    LaunchEnv e;
    auto num = [&](const char* name) { return distributed_env_int(get(name)); };
    if (get("OMPI_COMM_WORLD_SIZE")) {
        e = {"mpirun (Open MPI)", num("OMPI_COMM_WORLD_SIZE"), num("OMPI_COMM_WORLD_RANK"),
             num("OMPI_COMM_WORLD_LOCAL_RANK"), num("OMPI_COMM_WORLD_LOCAL_SIZE")};
    } else if (get("PMI_SIZE") || get("PMI_RANK")) {
        e = {"a PMI launcher (mpiexec)", num("PMI_SIZE"), num("PMI_RANK"), num("MPI_LOCALRANKID"),
             num("MPI_LOCALNRANKS")};
    } else if (get("SLURM_STEP_NUM_TASKS")) {
        e = {"srun", num("SLURM_STEP_NUM_TASKS"), num("SLURM_PROCID"), num("SLURM_LOCALID"), -1};
    } else if (get("PMIX_RANK")) {
        e = {"a PMIx launcher", -1, num("PMIX_RANK"), -1, -1};
    }
    return e;
}

// Why a build without MPI cannot run this launch; "" when it can (no launcher, or a world of one).
inline std::string distributed_no_mpi_refusal(const LaunchEnv& e) {
    if (!e.launcher || e.world == 1) return "";
    std::string n = e.world > 1 ? std::to_string(e.world) : std::string("several");
    return std::string("this program was built without MPI (the Makefile found no mpicxx, so USE_MPI is undefined), "
                       "but ") + e.launcher + " started it as one of " + n + " processes; it can only train as a "
                       "single process. Install MPI (apt-get install libopenmpi-dev), rebuild, and launch again, "
                       "or run it without a launcher";
}

// What the launcher's environment and MPI disagree on; "" when they agree on everything both know.
inline std::string distributed_launch_mismatch(const LaunchEnv& e, int world, int rank, int local_rank) {
    std::string l = e.launcher ? e.launcher : "the launcher";
    const std::string unwired = ": MPI and the launcher are not wired together (under Slurm use srun --mpi=pmix, "
                                "see srun --mpi=list; or start the job with this MPI's own mpirun)";
    if (e.world >= 0 && e.world != world)
        return l + " started " + std::to_string(e.world) + " processes, but MPI_Init made this one part of a world of " +
               std::to_string(world) + unwired;
    if (e.rank >= 0 && e.rank != rank)
        return l + " calls this process rank " + std::to_string(e.rank) + " but MPI calls it rank " +
               std::to_string(rank) + unwired;
    if (e.local_rank >= 0 && e.local_rank != local_rank)
        return l + " calls this process local rank " + std::to_string(e.local_rank) + " of its node but MPI's "
               "shared-memory split makes it local rank " + std::to_string(local_rank) + ", so the GPU it would "
               "drive is not the one the launcher intends";
    return "";
}

// The device local rank drives among device_count visible ones, or -1 with a reason in err: local
// rank i takes GPU i; a process that sees one GPU takes it (the launcher bound one GPU per process,
// which distributed_init verifies by comparing GPU UUIDs across the node). On the CPU backend every
// process has its own virtual device 0.
inline int distributed_pick_device(int local_rank, int local_world, int device_count, bool cpu_backend,
                                   std::string* err) {
    if (cpu_backend) return 0;
    if (device_count >= local_world) return local_rank;
    if (device_count == 1) return 0;
    *err = "this node runs " + std::to_string(local_world) + " ranks but each sees only " +
           std::to_string(device_count) + " GPU" + (device_count == 1 ? "" : "s") +
           ": one GPU per rank is needed; launch at most " + std::to_string(device_count) +
           " ranks per node (mpirun -np, srun --ntasks-per-node) or give each rank its own GPU "
           "(srun --gpus-per-task=1)";
    return -1;
}

// The lowest local rank other than me whose GPU UUID equals mine, or -1 (every rank has its own GPU).
inline int distributed_shared_device(const std::vector<std::array<unsigned char, 16>>& uuids, int me) {
    for (int r = 0; r < (int)uuids.size(); r++)
        if (r != me && uuids[r] == uuids[me]) return r;
    return -1;
}

// ----------------------------------------------------------------------------
// Start and end

// A new communicator over all ranks (llm.c's bootstrap: rank 0's unique id broadcast over MPI):
// the gradients' (Distributed::comm), and one for collectives that must not share it (expert
// parallelism's token exchange runs on the compute stream while the communication stream reduces
// gradients; NCCL orders a communicator's operations by issue, not by stream). Collective: every
// rank calls it; nullptr for a world of one. Release with distributed_comm_destroy.
inline ncclComm_t distributed_new_comm(const Distributed& d) {
    ncclComm_t comm = nullptr;
#ifdef USE_MPI
    if (d.world > 1) {
        ncclUniqueId id;
        if (d.rank == 0) ncclCheck(ncclGetUniqueId(&id));
        MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
        ncclCheck(ncclCommInitRank(&comm, d.world, id, d.rank));
    }
#else
    (void)d;
#endif
    return comm;
}

// Releases a communicator made by distributed_new_comm (nullptr: nothing to do).
inline void distributed_comm_destroy(ncclComm_t comm) {
#ifdef USE_MPI
    if (comm) ncclCheck(ncclCommDestroy(comm));
#else
    (void)comm;
#endif
}

// Sets up this process's part of the job (see the top of the file); call first in main(). argc and
// argv go to MPI_Init, which may remove its own arguments.
inline Distributed distributed_init(int* argc, char*** argv) {
    Distributed d;
    LaunchEnv env = distributed_launch_env([](const char* name) -> const char* { return getenv(name); });
    if (env.launcher && env.rank >= 0) distributed_set_identity(env.rank, env.world);
#ifndef USE_MPI
    (void)argc;
    (void)argv;
    // Rank 0 (or a process that does not know its rank) explains; the others just stop, so the job
    // prints one message instead of one per process.
    std::string refusal = distributed_no_mpi_refusal(env);
    if (!refusal.empty() && env.rank > 0) fatal_exit();
    if (!refusal.empty()) distributed_fatal("%s", refusal.c_str());
#else
    MPI_Comm node = MPI_COMM_NULL;
    if (env.launcher) {
        MPI_Init(argc, argv);
        d.mpi = true;
        MPI_Comm_rank(MPI_COMM_WORLD, &d.rank);
        MPI_Comm_size(MPI_COMM_WORLD, &d.world);
        distributed_set_identity(d.rank, d.world);
        fatal_error_hook = distributed_abort_job;
        // Ranks sharing a node's memory are the node's ranks; keyed by rank, so local ranks follow
        // global order (as mpirun's and srun's local ids do).
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d.rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &d.local_rank);
        MPI_Comm_size(node, &d.local_world);
        std::string mismatch = distributed_launch_mismatch(env, d.world, d.rank, d.local_rank);
        if (!mismatch.empty()) distributed_fatal("%s", mismatch.c_str());
    }
#endif
    int device_count = 0;
    cudaError_t count_status = cudaGetDeviceCount(&device_count);
    if (count_status == cudaErrorNoDevice || count_status == cudaErrorInsufficientDriver)  // a GPU build, no GPU
        distributed_fatal("this program was built for the GPU and CUDA finds none here (%s): on a machine without a "
                          "GPU, build it for the CPU backend (make CPU=1 ...)", cudaGetErrorString(count_status));
    cudaCheck(count_status);
    std::string err;
    d.device = distributed_pick_device(d.local_rank, d.local_world, device_count, on_cpu_backend(), &err);
    if (d.device < 0) distributed_fatal("%s", err.c_str());
    cudaCheck(cudaSetDevice(d.device));
#ifdef USE_MPI
    if (node != MPI_COMM_NULL) {
        if (!on_cpu_backend() && d.local_world > 1) {
            cudaDeviceProp prop;
            cudaCheck(cudaGetDeviceProperties(&prop, d.device));
            std::array<unsigned char, 16> mine;
            memcpy(mine.data(), &prop.uuid, 16);
            std::vector<std::array<unsigned char, 16>> uuids(d.local_world);
            MPI_Allgather(mine.data(), 16, MPI_BYTE, uuids.data(), 16, MPI_BYTE, node);
            int other = distributed_shared_device(uuids, d.local_rank);
            char host[256] = "?";
            gethostname(host, sizeof(host) - 1);
            if (other >= 0)
                distributed_fatal("local rank %d and local rank %d on host %s drive the same GPU: this node runs %d "
                                  "ranks but has fewer GPUs for them; launch at most one rank per GPU (mpirun -np, "
                                  "srun --ntasks-per-node) or give each rank its own GPU (srun --gpus-per-task=1)",
                                  d.local_rank, other, host, d.local_world);
        }
        MPI_Comm_free(&node);
    }
    d.comm = distributed_new_comm(d);
#endif
    cudaCheck(cudaStreamCreateWithFlags(&d.comm_stream, cudaStreamNonBlocking));
    return d;
}

// Waits for the communication stream, then releases the communicator, the stream and MPI.
inline void distributed_finalize(Distributed& d) {
    if (d.comm_stream) {
        cudaCheck(cudaStreamSynchronize(d.comm_stream));
        cudaCheck(cudaStreamDestroy(d.comm_stream));
        d.comm_stream = nullptr;
    }
    distributed_comm_destroy(d.comm);
    d.comm = nullptr;
#ifdef USE_MPI
    if (d.mpi) {
        fatal_error_hook = nullptr;
        MPI_Finalize();
        d.mpi = false;
    }
#endif
}

// Makes waiter wait for everything queued on producer so far, through event (recorded anew).
inline void stream_wait(cudaStream_t waiter, cudaStream_t producer, cudaEvent_t event) {
    cudaCheck(cudaEventRecord(event, producer));
    cudaCheck(cudaStreamWaitEvent(waiter, event, 0));
}

// ----------------------------------------------------------------------------
// Scalar reductions on the host (loss, norms, flags for logging and decisions). Every rank's value
// is gathered and combined in rank order in double, so the result is bit-identical on every rank
// and from run to run, whatever reduction tree the MPI library would pick. They synchronize all
// ranks: call them where the host waits anyway (after the step's stream synchronization).

// Sum of x over ranks.
inline double all_reduce_sum_scalar(const Distributed& d, double x) {
#ifdef USE_MPI
    if (d.world > 1) {
        std::vector<double> all(d.world);
        MPI_Allgather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
        double sum = 0.0;
        for (double v : all) sum += v;
        return sum;
    }
#endif
    (void)d;
    return x;
}
inline float all_reduce_sum_scalar(const Distributed& d, float x) { return (float)all_reduce_sum_scalar(d, (double)x); }

// Mean of x over ranks (the global loss when every rank has the same number of tokens).
inline double all_reduce_mean_scalar(const Distributed& d, double x) { return all_reduce_sum_scalar(d, x) / d.world; }
inline float all_reduce_mean_scalar(const Distributed& d, float x) {
    return (float)(all_reduce_sum_scalar(d, (double)x) / d.world);
}

// Maximum of x over ranks (flags: "any rank saw inf", "any rank wants to stop").
inline int all_reduce_max_scalar(const Distributed& d, int x) {
#ifdef USE_MPI
    if (d.world > 1) {
        std::vector<int> all(d.world);
        MPI_Allgather(&x, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
        int m = all[0];
        for (int v : all) m = v > m ? v : m;
        return m;
    }
#endif
    (void)d;
    return x;
}

// Maximum of x over ranks; NaN on any rank gives NaN (a broken value must not hide behind a max).
inline float all_reduce_max_scalar(const Distributed& d, float x) {
#ifdef USE_MPI
    if (d.world > 1) {
        std::vector<float> all(d.world);
        MPI_Allgather(&x, 1, MPI_FLOAT, all.data(), 1, MPI_FLOAT, MPI_COMM_WORLD);
        float m = all[0];
        for (float v : all) m = (std::isnan(v) || std::isnan(m)) ? NAN : (v > m ? v : m);
        return m;
    }
#endif
    (void)d;
    return x;
}

// ----------------------------------------------------------------------------
// Device collectives on chunks, each list issued as one NCCL group on the given stream (usually
// d.comm_stream, ordered after the compute stream with stream_wait). With world 1 they reduce to
// nothing or a device copy, so the trainer needs no special case.

// How gradients combine across ranks: Avg when each rank's loss is a mean over its own tokens.
enum class ReduceOp { Sum, Avg };

// n elements of device memory.
template <class T>
struct DeviceSpan {
    T* ptr;
    size_t n;
};

// A chunk of n elements in the full (replicated) buffer and this rank's slot for it in its shard
// buffer: rank r's piece is [r*s, min(n, (r+1)*s)) of the chunk, at the start of the slot. A
// rank-local chunk (llmc/zero.h) is this rank's alone: the whole of it, copied, never communicated.
template <class T>
struct ShardedChunk {
    T* full;  // (n)
    size_t n;
    T* slot;  // (s)
    size_t s;
    bool rank_local = false;
};

// The chunks of plan.groups[group] in a full buffer and a shard buffer laid out by plan.
template <class T>
std::vector<ShardedChunk<T>> sharded_chunks(const ZeroPlan& plan, int group, T* full, T* shard) {
    std::vector<ShardedChunk<T>> out;
    const ZeroGroup& g = plan.groups[group];
    for (int i = g.begin; i < g.end; i++) {
        const ZeroChunk& c = plan.chunks[i];
        out.push_back({full + c.offset, c.n, shard + c.shard_offset, c.s, c.rank_local});
    }
    return out;
}

// The chunks of plan.groups[group] in a full buffer, as spans for all_reduce_chunks (ZeRO-0); the
// rank-local chunks are left out (nothing to reduce).
template <class T>
std::vector<DeviceSpan<T>> chunk_spans(const ZeroPlan& plan, int group, T* full) {
    std::vector<DeviceSpan<T>> out;
    const ZeroGroup& g = plan.groups[group];
    for (int i = g.begin; i < g.end; i++)
        if (!plan.chunks[i].rank_local) out.push_back({full + plan.chunks[i].offset, plan.chunks[i].n});
    return out;
}

// Copies the pieces rank owns from a full buffer into its shard buffer, without communication: the
// starting point of a shard (fp32 params as their own master, a fresh run's parameter shard).
template <class T>
void extract_shard(const ZeroPlan& plan, int rank, const T* full, T* shard, cudaStream_t stream) {
    for (const ZeroShardPiece& p : zero_shard_pieces(plan, rank))
        cudaCheck(cudaMemcpyAsync(shard + p.shard_offset, full + p.flat_offset, p.range.size() * sizeof(T),
                                  cudaMemcpyDeviceToDevice, stream));
}

#ifdef USE_MPI
// The NCCL element type of T.
template <class T> struct NcclType;
template <> struct NcclType<float> { static constexpr ncclDataType_t value = ncclFloat32; };
template <> struct NcclType<double> { static constexpr ncclDataType_t value = ncclFloat64; };
template <> struct NcclType<__nv_bfloat16> { static constexpr ncclDataType_t value = ncclBfloat16; };
template <> struct NcclType<__half> { static constexpr ncclDataType_t value = ncclFloat16; };
template <> struct NcclType<int> { static constexpr ncclDataType_t value = ncclInt32; };

inline ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Avg ? ncclAvg : ncclSum; }
#endif

// Every span, in place, becomes the sum (or mean) of that span over all ranks (ZeRO-0 gradients,
// a device scalar such as a shard's squared norm).
template <class T>
void all_reduce_chunks(const Distributed& d, const std::vector<DeviceSpan<T>>& spans, ReduceOp op,
                       cudaStream_t stream) {
#ifdef USE_MPI
    if (d.world == 1) return;
    ncclCheck(ncclGroupStart());
    for (const DeviceSpan<T>& sp : spans)
        if (sp.n > 0) ncclCheck(ncclAllReduce(sp.ptr, sp.ptr, sp.n, NcclType<T>::value, nccl_op(op), d.comm, stream));
    ncclCheck(ncclGroupEnd());
#else
    (void)d;
    (void)spans;
    (void)op;
    (void)stream;
#endif
}

// Checks that a chunk's world pieces of s cover its n elements.
template <class T>
void check_sharded_chunk(const Distributed& d, const ShardedChunk<T>& c, const char* fn) {
    if (c.s * (size_t)d.world < c.n)
        distributed_fatal("%s: a chunk of %zu elements does not fit in %d pieces of %zu", fn, c.n, d.world, c.s);
}

// Each rank's slot receives its piece of every chunk summed (or averaged) over all ranks' full
// buffers; the rest of the slot (padding) is not written. How: a chunk whose n is exactly world*s
// goes through ncclReduceScatter; any other goes through one ncclReduce per owner rank (the root)
// of exactly its piece. The alternative, padding every chunk to world*s in the full buffer, would
// put gaps into the trainer's tensor layout, and staging through a padded copy would cost a
// buffer and a copy per chunk; the per-root reduces move the same bytes as a ring reduce-scatter
// ((world-1)*s sent per rank), need no padding anywhere, and NCCL runs the group as one launch.
template <class T>
void reduce_scatter_chunks(const Distributed& d, const std::vector<ShardedChunk<T>>& chunks, ReduceOp op,
                           cudaStream_t stream) {
    for (const ShardedChunk<T>& c : chunks) {
        check_sharded_chunk(d, c, "reduce_scatter_chunks");
        if ((d.world == 1 || c.rank_local) && c.n > 0 && c.slot != c.full)
            cudaCheck(cudaMemcpyAsync(c.slot, c.full, c.n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    }
    if (d.world == 1) return;
#ifdef USE_MPI
    const ncclDataType_t type = NcclType<T>::value;
    ncclCheck(ncclGroupStart());
    for (const ShardedChunk<T>& c : chunks) {
        if (c.rank_local) continue;
        if (c.n == c.s * (size_t)d.world) {
            ncclCheck(ncclReduceScatter(c.full, c.slot, c.s, type, nccl_op(op), d.comm, stream));
            continue;
        }
        for (int r = 0; r < d.world; r++) {
            size_t begin = std::min(c.n, (size_t)r * c.s), len = std::min(c.n, begin + c.s) - begin;
            if (len > 0)
                ncclCheck(ncclReduce(c.full + begin, r == d.rank ? c.slot : nullptr, len, type, nccl_op(op), r, d.comm,
                                     stream));
        }
    }
    ncclCheck(ncclGroupEnd());
#endif
}

// Every rank's full buffer receives, for every chunk, piece r from rank r's slot (after each rank
// updated its own pieces): the inverse of reduce_scatter_chunks, with ncclAllGather when n is
// exactly world*s and one ncclBroadcast per owner rank otherwise (same reasons as above).
template <class T>
void all_gather_chunks(const Distributed& d, const std::vector<ShardedChunk<T>>& chunks, cudaStream_t stream) {
    for (const ShardedChunk<T>& c : chunks) {
        check_sharded_chunk(d, c, "all_gather_chunks");
        if ((d.world == 1 || c.rank_local) && c.n > 0 && c.slot != c.full)
            cudaCheck(cudaMemcpyAsync(c.full, c.slot, c.n * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    }
    if (d.world == 1) return;
#ifdef USE_MPI
    const ncclDataType_t type = NcclType<T>::value;
    ncclCheck(ncclGroupStart());
    for (const ShardedChunk<T>& c : chunks) {
        if (c.rank_local) continue;
        if (c.n == c.s * (size_t)d.world) {
            ncclCheck(ncclAllGather(c.slot, c.full, c.s, type, d.comm, stream));
            continue;
        }
        for (int r = 0; r < d.world; r++) {
            size_t begin = std::min(c.n, (size_t)r * c.s), len = std::min(c.n, begin + c.s) - begin;
            if (len > 0) ncclCheck(ncclBroadcast(c.slot, c.full + begin, len, type, r, d.comm, stream));
        }
    }
    ncclCheck(ncclGroupEnd());
#endif
}

// full (blocks * world * block_elems) receives every rank's local (blocks * block_elems) interleaved
// by block: block b of rank r lands at (b * world + r) * block_elems — e.g. each MoE block's experts,
// E_l per rank, gathered into that block's E in global order. Every rank calls it.
template <class T>
void all_gather_blocks(const Distributed& d, const T* local, T* full, size_t blocks, size_t block_elems,
                       cudaStream_t stream) {
    if (d.world == 1) {
        if (blocks * block_elems > 0)
            cudaCheck(cudaMemcpyAsync(full, local, blocks * block_elems * sizeof(T), cudaMemcpyDeviceToDevice, stream));
        return;
    }
#ifdef USE_MPI
    ncclCheck(ncclGroupStart());
    for (size_t b = 0; b < blocks; b++)
        if (block_elems > 0)
            ncclCheck(ncclAllGather(local + b * block_elems, full + b * d.world * block_elems, block_elems,
                                    NcclType<T>::value, d.comm, stream));
    ncclCheck(ncclGroupEnd());
#endif
}
