// llmc/simt/nccl.cpp — NCCL for the CPU backend: communicators and collectives carried over MPI.
//
// The project's multi-GPU code calls NCCL exactly as on GPUs (llm.c style: the program runs
// MPI_Init, rank 0 makes an ncclUniqueId, MPI_Bcast's it, every rank calls ncclCommInitRank).
// Here a communicator is a private MPI communicator and a "device buffer" is a host pointer. A
// collective's arguments are checked when it is called; its data moves when its stream runs it —
// at once, or with SIMT_STREAMS=adversarial when the stream is forced (llmc/simt/streams.cpp).
//
// Determinism: MPI is used only to move bytes, never to do arithmetic. Every element of a
// reduction is computed by exactly one rank, from all ranks' values combined in rank order
// 0, 1, ..., n-1, then copied to whoever needs it. Results are therefore bit-identical on every
// rank and from run to run, whatever algorithm Open MPI picks internally. fp16/bf16/fp8 values
// are accumulated in fp32 and rounded once per element.
//
// Chapters: errors · communicators · element types and reductions · collectives · point-to-point and
// groups.

#include <nccl.h>  // the toolkit's real header: the prototypes below must match it exactly
#include "internal.h"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
// Only MPI's C API is used; its deprecated C++ bindings just slow the build and warn.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <type_traits>
#include <vector>

// The handle behind ncclComm_t (the header only forward-declares it).
struct ncclComm {
    MPI_Comm mpi;                         // private communicator; MPI rank == NCCL rank
    int rank, nranks, device;
    ncclResult_t async_error;             // sticky: a failed transfer leaves ranks out of step
    std::vector<unsigned char> scratch;   // reused so a per-step gradient all-reduce does not
                                          // allocate and page-fault fresh memory every time
};

// ============================================================================================
// Errors
// ============================================================================================

// NCCL keeps the message of the last error per thread (ncclGetLastError ignores its comm).
static thread_local char g_last_error[1024] = "";

// Records an error message and returns code; like NCCL, prints it only when NCCL_DEBUG asks for
// warnings, because the caller decides whether an error is fatal.
static ncclResult_t fail(ncclResult_t code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof(g_last_error), fmt, ap);
    va_end(ap);
    const char* level = getenv("NCCL_DEBUG");
    if (level && strcasecmp(level, "NONE") != 0 && strcasecmp(level, "VERSION") != 0)
        fprintf(stderr, "NCCL WARN %s\n", g_last_error);
    return code;
}

// Turns an MPI return code into ncclSystemError with MPI's own explanation, and poisons the
// communicator: after a failed transfer the ranks no longer agree on where they are.
static ncclResult_t mpi_check(ncclComm_t comm, int rc, const char* fn, const char* what) {
    if (rc == MPI_SUCCESS) return ncclSuccess;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    if (comm) comm->async_error = ncclSystemError;
    return fail(ncclSystemError, "%s: %s failed: %s", fn, what, msg);
}

// Returns NCCL's wording for each result code, so logs read the same as on GPUs.
const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

// Returns the message of this thread's last error ("" if none), with the details the code lacks.
const char* ncclGetLastError(ncclComm_t) { return g_last_error; }

// ============================================================================================
// Communicators
// ============================================================================================

// Marks ids made by ncclGetUniqueId, so an id that was never broadcast (all zeros) is caught.
static const char kIdMagic[8] = "simtMPI";

// Reports the version of the header this file was compiled against: the API it implements.
ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

// Makes a fresh id: a magic tag, then random bits plus pid and a counter so that two ids made
// anywhere in the job (even in the same process) differ.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    static std::atomic<uint64_t> counter{0};
    std::random_device rd;
    uint64_t words[3] = {((uint64_t)rd() << 32) ^ rd(), (uint64_t)getpid(), counter++};
    memset(uniqueId, 0, sizeof(*uniqueId));
    memcpy(uniqueId->internal, kIdMagic, sizeof(kIdMagic));
    memcpy(uniqueId->internal + sizeof(kIdMagic), words, sizeof(words));
    return ncclSuccess;
}

// FNV-1a of the id folded to a non-negative int, the "color" MPI_Comm_split groups ranks by.
static int id_color(const ncclUniqueId& id) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof(id.internal); i++) h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
    return (int)(h & 0x7fffffff);
}

// Finishes a communicator around an MPI communicator whose size and rank were verified.
static ncclResult_t make_comm(ncclComm_t* out, MPI_Comm mpi, int rank, int nranks, int device) {
    // Errors must come back as ncclResult_t, not kill the job (MPI's default handler aborts).
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    *out = new (std::nothrow) ncclComm{mpi, rank, nranks, device, ncclSuccess, {}};
    if (!*out) {
        MPI_Comm_free(&mpi);
        return fail(ncclSystemError, "out of host memory for a communicator");
    }
    return ncclSuccess;
}

// Builds rank `rank` of an nranks communicator from the id every member was given. This is
// collective over MPI_COMM_WORLD: all its processes must call it (llm.c's pattern), because the
// communicator is cut out of MPI_COMM_WORLD with MPI_Comm_split keyed by the id.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
    const char* fn = "ncclCommInitRank";
    if (comm) *comm = NULL;
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (!up || down)
        return fail(ncclInvalidUsage, "%s: MPI is not initialized; the CPU backend carries NCCL over MPI, "
                    "so call MPI_Init before ncclCommInitRank (and ncclCommDestroy before MPI_Finalize)", fn);
    int device = 0;
    bool cuda_ok = cudaGetDevice(&device) == cudaSuccess;
    bool id_ok = memcmp(commId.internal, kIdMagic, sizeof(kIdMagic)) == 0;
    bool args_ok = comm && nranks >= 1 && rank >= 0 && rank < nranks;
    // Every process still enters MPI_Comm_split, even with bad arguments, or the others would
    // hang in it; a bad rank opts out (MPI_UNDEFINED) and the others then fail the size check.
    MPI_Comm mpi = MPI_COMM_NULL;
    int color = (cuda_ok && id_ok && args_ok) ? id_color(commId) : MPI_UNDEFINED;
    ncclResult_t res = mpi_check(NULL, MPI_Comm_split(MPI_COMM_WORLD, color, rank, &mpi), fn, "MPI_Comm_split");
    if (res != ncclSuccess) return res;
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (!args_ok) return fail(ncclInvalidArgument, "%s: rank %d is not in [0, nranks=%d)", fn, rank, nranks);
    if (!id_ok)
        return fail(ncclInvalidArgument, "%s: the ncclUniqueId was not made by ncclGetUniqueId; rank 0 must "
                    "make it and MPI_Bcast it to every rank before ncclCommInitRank", fn);
    if (!cuda_ok) return fail(ncclUnhandledCudaError, "%s: cudaGetDevice failed", fn);
    // Members agree to keep the communicator only if all of them got what they asked for: the
    // same id (the hash could collide), nranks members, and their own rank (split orders by rank).
    int size = 0, me = 0;
    MPI_Comm_size(mpi, &size);
    MPI_Comm_rank(mpi, &me);
    ncclUniqueId root_id = commId;
    int ok = 0, all_ok = 0;
    res = mpi_check(NULL, MPI_Bcast(&root_id, sizeof(root_id), MPI_BYTE, 0, mpi), fn, "MPI_Bcast");
    if (res == ncclSuccess) {
        ok = size == nranks && me == rank && memcmp(&root_id, &commId, sizeof(commId)) == 0;
        res = mpi_check(NULL, MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, mpi), fn, "MPI_Allreduce");
    }
    if (res == ncclSuccess && !all_ok)
        res = fail(ncclInvalidArgument, "%s: this process asked to be rank %d of %d, but %d processes joined with "
                   "this ncclUniqueId and it sorted as rank %d (or another member's id/nranks differ); every "
                   "member must pass the same id (made by one rank, MPI_Bcast to all), the same nranks and a "
                   "distinct rank in [0, nranks)", fn, rank, nranks, size, me);
    if (res != ncclSuccess) {
        MPI_Comm_free(&mpi);
        return res;
    }
    return make_comm(comm, mpi, rank, nranks, device);
}

// Makes one communicator per local device from a single process. Only ndev == 1 is supported: a
// one-process clique of several devices needs several communicators progressing at once, which
// synchronous MPI calls from one thread cannot provide (run one MPI process per device instead).
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
    const char* fn = "ncclCommInitAll";
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (ndev < 1) return fail(ncclInvalidArgument, "%s: ndev=%d, expected >= 1", fn, ndev);
    if (ndev > 1)
        return fail(ncclInvalidUsage, "%s: ndev=%d is not supported on the CPU backend; run one MPI process "
                    "per device and use ncclCommInitRank", fn, ndev);
    *comm = NULL;
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (!up || down)
        return fail(ncclInvalidUsage, "%s: MPI is not initialized; the CPU backend carries NCCL over MPI, "
                    "so call MPI_Init first", fn);
    int device = devlist ? devlist[0] : 0;
    MPI_Comm mpi = MPI_COMM_NULL;
    ncclResult_t res = mpi_check(NULL, MPI_Comm_dup(MPI_COMM_SELF, &mpi), fn, "MPI_Comm_dup");
    if (res != ncclSuccess) return res;
    return make_comm(comm, mpi, 0, 1, device);
}

// Releases a communicator. Nothing can be pending (every call completes before returning). After
// MPI_Finalize there is no MPI communicator left to free, only our handle.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;  // as NCCL: destroying NULL is a no-op
    simt::synchronize_device();     // collectives still queued on a stream finish first
    int down = 0;
    MPI_Finalized(&down);
    if (!down) MPI_Comm_free(&comm->mpi);
    delete comm;
    return ncclSuccess;
}

// Releases a communicator. Queued collectives run first (NCCL would cancel them, but every rank
// issued them, so running them cannot hang), and MPI_Comm_free only marks the MPI communicator for
// deallocation, so abort is the same as destroy here.
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

// Reports the number of ranks in the communicator.
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

// Reports the CUDA device that was current when the communicator was made.
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    if (!comm || !device) return fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
    *device = comm->device;
    return ncclSuccess;
}

// Reports this process's rank in the communicator.
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

// Reports a failure that poisoned the communicator. Operations are synchronous and return their
// own errors, so this is ncclSuccess unless a transfer has failed.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    if (!comm || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    *asyncError = comm->async_error;
    return ncclSuccess;
}

// ============================================================================================
// Element types and reductions
// ============================================================================================

// The type a reduction accumulates in: fp32 for the 16- and 8-bit floats (one rounding per
// element at the end), the element type itself otherwise.
template <class T> struct Acc { using type = T; };
template <> struct Acc<__half> { using type = float; };
template <> struct Acc<__nv_bfloat16> { using type = float; };
template <> struct Acc<__nv_fp8_e4m3> { using type = float; };
template <> struct Acc<__nv_fp8_e5m2> { using type = float; };

// Widens an element to its accumulator type (the toolkit's host conversions for the small floats).
template <class T> static typename Acc<T>::type widen(T x) { return static_cast<typename Acc<T>::type>(x); }
static float widen(__half x) { return __half2float(x); }
static float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

// Rounds an accumulator back to the element type (round to nearest even; fp8 saturates to finite,
// the toolkit's default for its fp8 constructors).
template <class T> static T narrow(typename Acc<T>::type a) { return static_cast<T>(a); }
template <> __half narrow<__half>(float a) { return __float2half(a); }
template <> __nv_bfloat16 narrow<__nv_bfloat16>(float a) { return __float2bfloat16(a); }

// Integer sums and products wrap around like on the GPU; doing them in the unsigned type keeps
// that well-defined in C++ (signed overflow is undefined behaviour).
template <class A> static A add(A a, A b) {
    if constexpr (std::is_integral_v<A>) return (A)((std::make_unsigned_t<A>)a + (std::make_unsigned_t<A>)b);
    else return a + b;
}
template <class A> static A mul(A a, A b) {
    if constexpr (std::is_integral_v<A>) return (A)((std::make_unsigned_t<A>)a * (std::make_unsigned_t<A>)b);
    else return a * b;
}

// out[i] = row_0[i] ∘ row_1[i] ∘ ... ∘ row_{nrows-1}[i], combined strictly in row (= rank) order
// so that the result does not depend on anything but the inputs. Average divides the sum once at
// the end (integers truncate toward zero, as NCCL's integer average does).
template <class T, class Combine>
static void reduce_rows(const T* rows, size_t n, int nrows, bool average, T* out, Combine combine) {
    using A = typename Acc<T>::type;
    for (size_t i = 0; i < n; i++) {
        A acc = widen(rows[i]);
        for (int r = 1; r < nrows; r++) acc = combine(acc, widen(rows[(size_t)r * n + i]));
        if (average) acc = (A)(acc / nrows);
        out[i] = narrow<T>(acc);
    }
}

// Instantiates reduce_rows for one op; the op is a template argument so the inner loop has no branch.
template <class T>
static void reduce_op(const void* rows, size_t n, int nrows, ncclRedOp_t op, void* out) {
    using A = typename Acc<T>::type;
    const T* in = (const T*)rows;
    T* o = (T*)out;
    switch (op) {
        case ncclSum: reduce_rows(in, n, nrows, false, o, [](A a, A b) { return add(a, b); }); break;
        case ncclAvg: reduce_rows(in, n, nrows, true, o, [](A a, A b) { return add(a, b); }); break;
        case ncclProd: reduce_rows(in, n, nrows, false, o, [](A a, A b) { return mul(a, b); }); break;
        case ncclMax: reduce_rows(in, n, nrows, false, o, [](A a, A b) { return b > a ? b : a; }); break;
        case ncclMin: reduce_rows(in, n, nrows, false, o, [](A a, A b) { return b < a ? b : a; }); break;
        default: break;  // unreachable: check_op rejects everything else before any data moves
    }
}

// What a collective needs to know about a datatype: its size, an MPI type of that size to move
// it with (never to compute with), and its reduction.
struct TypeInfo {
    size_t size;
    MPI_Datatype mpi;
    void (*reduce)(const void* rows, size_t n, int nrows, ncclRedOp_t op, void* out);
};

// Looks up a datatype; false for values outside ncclDataType_t.
static bool type_info(ncclDataType_t t, TypeInfo* ti) {
    switch (t) {
        case ncclInt8: *ti = {1, MPI_UINT8_T, reduce_op<int8_t>}; return true;
        case ncclUint8: *ti = {1, MPI_UINT8_T, reduce_op<uint8_t>}; return true;
        case ncclInt32: *ti = {4, MPI_UINT32_T, reduce_op<int32_t>}; return true;
        case ncclUint32: *ti = {4, MPI_UINT32_T, reduce_op<uint32_t>}; return true;
        case ncclInt64: *ti = {8, MPI_UINT64_T, reduce_op<int64_t>}; return true;
        case ncclUint64: *ti = {8, MPI_UINT64_T, reduce_op<uint64_t>}; return true;
        case ncclFloat16: *ti = {2, MPI_UINT16_T, reduce_op<__half>}; return true;
        case ncclFloat32: *ti = {4, MPI_UINT32_T, reduce_op<float>}; return true;
        case ncclFloat64: *ti = {8, MPI_UINT64_T, reduce_op<double>}; return true;
        case ncclBfloat16: *ti = {2, MPI_UINT16_T, reduce_op<__nv_bfloat16>}; return true;
        case ncclFloat8e4m3: *ti = {1, MPI_UINT8_T, reduce_op<__nv_fp8_e4m3>}; return true;
        case ncclFloat8e5m2: *ti = {1, MPI_UINT8_T, reduce_op<__nv_fp8_e5m2>}; return true;
        default: return false;
    }
}

// ============================================================================================
// Collectives
// ============================================================================================

// Checks what every collective takes: a live communicator, a known datatype, and a per-call
// element count that fits MPI's int counts (2^31-1 elements, e.g. 8 GiB of fp32).
static ncclResult_t check_call(const char* fn, ncclComm_t comm, ncclDataType_t dt, size_t count, TypeInfo* ti) {
    if (!comm) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
    if (comm->async_error != ncclSuccess)
        return fail(comm->async_error, "%s: the communicator is unusable after an earlier failed transfer; "
                    "destroy it and make a new one", fn);
    if (!type_info(dt, ti)) return fail(ncclInvalidArgument, "%s: datatype %d is not an ncclDataType_t", fn, (int)dt);
    if (count > (size_t)INT_MAX)
        return fail(ncclInvalidArgument, "%s: count %zu exceeds %d elements, the most the MPI backend moves in "
                    "one call; split the operation", fn, count, INT_MAX);
    return ncclSuccess;
}

// Checks the reduction op: only the built-in ones exist (ncclRedOpCreatePreMulSum is not provided).
static ncclResult_t check_op(const char* fn, ncclRedOp_t op) {
    if (op < ncclSum || op >= ncclNumOps)
        return fail(ncclInvalidArgument, "%s: op %d is not a built-in ncclRedOp_t (sum, prod, max, min, avg)", fn,
                    (int)op);
    return ncclSuccess;
}

// Checks that a buffer the call will touch is not NULL.
static ncclResult_t check_buf(const char* fn, const void* p, size_t count, const char* name) {
    if (!p && count > 0) return fail(ncclInvalidArgument, "%s: %s is NULL", fn, name);
    return ncclSuccess;
}

// Checks a root rank.
static ncclResult_t check_root(const char* fn, ncclComm_t comm, int root) {
    if (root < 0 || root >= comm->nranks)
        return fail(ncclInvalidArgument, "%s: root %d is not in [0, nranks=%d)", fn, root, comm->nranks);
    return ncclSuccess;
}

// Returns the communicator's scratch space grown to at least bytes (NULL when out of memory). At
// least one byte, so that a rank whose share is empty (count < nranks) still gets a non-NULL pointer.
static unsigned char* scratch(ncclComm_t comm, size_t bytes) {
    try {
        if (comm->scratch.size() < std::max<size_t>(bytes, 1)) comm->scratch.resize(std::max<size_t>(bytes, 1));
    } catch (const std::bad_alloc&) {
        fail(ncclSystemError, "out of host memory for %zu bytes of collective scratch", bytes);
        return NULL;
    }
    return comm->scratch.data();
}

// Splits count elements into one contiguous chunk per rank (the first count % nranks ranks take
// one extra element), in the int counts/displacements MPI's v-collectives take.
static void split_chunks(size_t count, int nranks, std::vector<int>& counts, std::vector<int>& displs) {
    counts.resize(nranks);
    displs.resize(nranks);
    size_t base = count / nranks, extra = count % nranks, at = 0;
    for (int r = 0; r < nranks; r++) {
        counts[r] = (int)(base + ((size_t)r < extra ? 1 : 0));
        displs[r] = (int)at;
        at += counts[r];
    }
}

// The reduction shared by AllReduce and Reduce: each rank receives chunk `rank` of every rank's
// sendbuff (MPI_Alltoallv, bytes only) into scratch and reduces those rows in rank order into
// *mine, also in scratch. Sendbuff has been read completely before anything is written, which is
// what makes in-place calls (sendbuff == recvbuff) safe.
static ncclResult_t reduce_chunks(const char* fn, ncclComm_t comm, const void* sendbuff, const TypeInfo& ti,
                                  ncclRedOp_t op, const std::vector<int>& counts, const std::vector<int>& displs,
                                  void** mine) {
    int n = comm->nranks, my = counts[comm->rank];
    unsigned char* rows = scratch(comm, (size_t)(n + 1) * my * ti.size);
    if (!rows) return ncclSystemError;
    std::vector<int> rcounts(n, my), rdispls(n);
    // The largest displacement, (n-1) * my, is at most count once count >= n*n, so int holds it.
    for (int r = 0; r < n; r++) rdispls[r] = r * my;
    ncclResult_t res = mpi_check(comm, MPI_Alltoallv(sendbuff, counts.data(), displs.data(), ti.mpi, rows,
                                                     rcounts.data(), rdispls.data(), ti.mpi, comm->mpi),
                                 fn, "MPI_Alltoallv");
    if (res != ncclSuccess) return res;
    *mine = rows + (size_t)n * my * ti.size;
    ti.reduce(rows, my, n, op, *mine);
    return ncclSuccess;
}

// Runs a collective's data movement on its stream (or records it in the stream's capture). Deferred
// work reports an MPI failure through fail(), as NCCL reports asynchronous errors
// (ncclCommGetAsyncError), not as a return value.
static ncclResult_t on_stream(cudaStream_t stream, std::function<ncclResult_t()> work) {
    if (!simt::streams_deferred() && !simt::stream_capturing(stream)) {
        simt::note_host_op();
        return work();
    }
    return simt::issue(stream, [work] { work(); }) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

// recvbuff = sendbuff of all ranks combined with op, identical on every rank. Reduce-scatter in
// rank order (reduce_chunks), then all-gather the reduced chunks.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclAllReduce";
    TypeInfo ti;
    ncclResult_t res;
    if ((res = check_call(fn, comm, datatype, count, &ti)) || (res = check_op(fn, op)) ||
        (res = check_buf(fn, sendbuff, count, "sendbuff")) || (res = check_buf(fn, recvbuff, count, "recvbuff")))
        return res;
    if (count == 0) return ncclSuccess;
    return on_stream(stream, [=]() mutable -> ncclResult_t {
        std::vector<int> counts, displs;
        split_chunks(count, comm->nranks, counts, displs);
        void* mine = NULL;
        if ((res = reduce_chunks(fn, comm, sendbuff, ti, op, counts, displs, &mine))) return res;
        return mpi_check(comm, MPI_Allgatherv(mine, counts[comm->rank], ti.mpi, recvbuff, counts.data(), displs.data(),
                                              ti.mpi, comm->mpi),
                         fn, "MPI_Allgatherv");
    });
}

// recvbuff on root = sendbuff of all ranks combined with op (recvbuff may be NULL elsewhere).
// Same rank-order reduction as AllReduce, then the chunks are gathered to root only, so root's
// result is bit-identical to what AllReduce would give.
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclReduce";
    TypeInfo ti;
    ncclResult_t res;
    if ((res = check_call(fn, comm, datatype, count, &ti)) || (res = check_op(fn, op)) ||
        (res = check_root(fn, comm, root)) || (res = check_buf(fn, sendbuff, count, "sendbuff")) ||
        (comm->rank == root && (res = check_buf(fn, recvbuff, count, "recvbuff (on root)"))))
        return res;
    if (count == 0) return ncclSuccess;
    return on_stream(stream, [=]() mutable -> ncclResult_t {
        std::vector<int> counts, displs;
        split_chunks(count, comm->nranks, counts, displs);
        void* mine = NULL;
        if ((res = reduce_chunks(fn, comm, sendbuff, ti, op, counts, displs, &mine))) return res;
        return mpi_check(comm, MPI_Gatherv(mine, counts[comm->rank], ti.mpi, recvbuff, counts.data(), displs.data(),
                                           ti.mpi, root, comm->mpi),
                         fn, "MPI_Gatherv");
    });
}

// recvbuff on rank i = block i (recvcount elements) of all ranks' sendbuffs combined with op.
// In place when recvbuff == sendbuff + rank * recvcount: the blocks land in scratch first.
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclReduceScatter";
    TypeInfo ti;
    ncclResult_t res;
    if ((res = check_call(fn, comm, datatype, recvcount, &ti)) || (res = check_op(fn, op)) ||
        (res = check_buf(fn, sendbuff, recvcount, "sendbuff")) ||
        (res = check_buf(fn, recvbuff, recvcount, "recvbuff")))
        return res;
    if (recvcount == 0) return ncclSuccess;
    return on_stream(stream, [=]() mutable -> ncclResult_t {
        int n = comm->nranks;
        unsigned char* rows = scratch(comm, (size_t)n * recvcount * ti.size);
        if (!rows) return ncclSystemError;
        res = mpi_check(comm, MPI_Alltoall(sendbuff, (int)recvcount, ti.mpi, rows, (int)recvcount, ti.mpi, comm->mpi),
                        fn, "MPI_Alltoall");
        if (res != ncclSuccess) return res;
        ti.reduce(rows, recvcount, n, op, recvbuff);
        return ncclSuccess;
    });
}

// True when the byte ranges [a, a+an) and [b, b+bn) share a byte.
static bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + bn && pb < pa + an;
}

// recvbuff = every rank's sendbuff (sendcount elements each) concatenated in rank order. NCCL's
// in-place form (sendbuff == recvbuff + rank * sendcount) maps to MPI_IN_PLACE; any other overlap
// is staged through scratch, because MPI forbids aliased send and receive buffers.
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclAllGather";
    TypeInfo ti;
    ncclResult_t res;
    if ((res = check_call(fn, comm, datatype, sendcount, &ti)) ||
        (res = check_buf(fn, sendbuff, sendcount, "sendbuff")) ||
        (res = check_buf(fn, recvbuff, sendcount, "recvbuff")))
        return res;
    if (sendcount == 0) return ncclSuccess;
    return on_stream(stream, [=]() mutable -> ncclResult_t {
        size_t bytes = sendcount * ti.size;
        const void* src = sendbuff;
        if (sendbuff == (unsigned char*)recvbuff + comm->rank * bytes) {
            src = MPI_IN_PLACE;
        } else if (overlaps(sendbuff, bytes, recvbuff, bytes * comm->nranks)) {
            unsigned char* copy = scratch(comm, bytes);
            if (!copy) return ncclSystemError;
            memcpy(copy, sendbuff, bytes);
            src = copy;
        }
        return mpi_check(comm, MPI_Allgather(src, (int)sendcount, ti.mpi, recvbuff, (int)sendcount, ti.mpi, comm->mpi),
                         fn, "MPI_Allgather");
    });
}

// recvbuff on every rank = sendbuff on root (sendbuff is only read on root). In place when
// sendbuff == recvbuff; otherwise root first copies into its own recvbuff, then MPI broadcasts it.
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    const char* fn = "ncclBroadcast";
    TypeInfo ti;
    ncclResult_t res;
    if ((res = check_call(fn, comm, datatype, count, &ti)) || (res = check_root(fn, comm, root)) ||
        (comm->rank == root && (res = check_buf(fn, sendbuff, count, "sendbuff (on root)"))) ||
        (res = check_buf(fn, recvbuff, count, "recvbuff")))
        return res;
    if (count == 0) return ncclSuccess;
    return on_stream(stream, [=]() mutable -> ncclResult_t {
        if (comm->rank == root && sendbuff != recvbuff) memmove(recvbuff, sendbuff, count * ti.size);
        return mpi_check(comm, MPI_Bcast(recvbuff, (int)count, ti.mpi, root, comm->mpi), fn, "MPI_Bcast");
    });
}

// ============================================================================================
// Point-to-point and groups
// ============================================================================================
// Collectives between ncclGroupStart and ncclGroupEnd run eagerly, at issue time, instead of being
// batched until ncclGroupEnd. That gives the same results and cannot deadlock here: every rank of
// a communicator issues the same collectives in the same order, and a process drives one device
// (ncclCommInitAll is limited to ndev == 1).
//
// Point-to-point calls (ncclSend, ncclRecv) are different: ranks pair them in whatever order suits
// each (an all-to-all sends to and receives from every peer), so issuing them one at a time could
// leave two ranks both blocked in a send. They are collected and posted together when the outermost
// ncclGroupEnd closes the group: MPI_Isend / MPI_Irecv on the communicator's private MPI
// communicator, then one MPI_Waitall — MPI matches messages per (source, communicator) in posting
// order, which is NCCL's pairing rule (the k-th send to a peer meets the peer's k-th receive from
// this rank). A transfer to self is a plain copy, the k-th self-send into the k-th self-receive.
// Outside a group a call is a group of its own. The data moves when the stream runs the group's
// work; the CPU backend runs one stream's work at a time, so all point-to-point calls of a group
// must be on one stream (NCCL allows several; the emulation refuses that with ncclInvalidUsage).

static thread_local int g_group_depth = 0;  // NCCL's group nesting is per thread too

// One ncclSend or ncclRecv waiting for its group to end.
struct P2POp {
    bool send;
    void* buf;  // the receive buffer, or the send buffer (only read)
    size_t count;
    TypeInfo ti;
    int peer;
    ncclComm_t comm;
    cudaStream_t stream;
};
static thread_local std::vector<P2POp> g_p2p;  // the open group's calls, in issue order

// Moves the data of one group's point-to-point calls (all on one stream; counts already checked).
static ncclResult_t run_p2p(const std::vector<P2POp>& ops) {
    const char* fn = "ncclGroupEnd";
    std::vector<MPI_Request> reqs;
    std::vector<const P2POp*> self_sends, self_recvs;
    ncclResult_t res = ncclSuccess;
    for (const P2POp& op : ops) {
        if (op.count == 0) continue;
        if (op.peer == op.comm->rank) {
            (op.send ? self_sends : self_recvs).push_back(&op);
            continue;
        }
        MPI_Request r;
        int rc = op.send ? MPI_Isend(op.buf, (int)op.count, op.ti.mpi, op.peer, 0, op.comm->mpi, &r)
                         : MPI_Irecv(op.buf, (int)op.count, op.ti.mpi, op.peer, 0, op.comm->mpi, &r);
        if ((res = mpi_check(op.comm, rc, fn, op.send ? "MPI_Isend" : "MPI_Irecv"))) break;
        reqs.push_back(r);
    }
    // Self copies while the transfers are in flight: neither side of them is read by another rank.
    for (size_t i = 0; res == ncclSuccess && i < self_sends.size(); i++)
        memmove(self_recvs[i]->buf, self_sends[i]->buf, self_sends[i]->count * self_sends[i]->ti.size);
    if (!reqs.empty()) {
        ncclResult_t wait = mpi_check(ops[0].comm, MPI_Waitall((int)reqs.size(), reqs.data(), MPI_STATUSES_IGNORE),
                                      fn, "MPI_Waitall");
        if (res == ncclSuccess) res = wait;
    }
    return res;
}

// Posts the closed group's point-to-point calls on their stream. Checked first, before any data
// moves: one stream, and self-sends matching self-receives one for one in count and element size.
static ncclResult_t flush_p2p() {
    std::vector<P2POp> ops;
    ops.swap(g_p2p);
    if (ops.empty()) return ncclSuccess;
    const char* fn = "ncclGroupEnd";
    std::vector<const P2POp*> self_sends, self_recvs;
    for (const P2POp& op : ops) {
        if (op.stream != ops[0].stream)
            return fail(ncclInvalidUsage, "%s: the group's ncclSend/ncclRecv calls are on different streams; the "
                        "CPU backend runs a group's point-to-point calls on one stream", fn);
        if (op.peer == op.comm->rank && op.count > 0) (op.send ? self_sends : self_recvs).push_back(&op);
    }
    bool paired = self_sends.size() == self_recvs.size();
    for (size_t i = 0; paired && i < self_sends.size(); i++)
        paired = self_sends[i]->count * self_sends[i]->ti.size == self_recvs[i]->count * self_recvs[i]->ti.size;
    if (!paired)
        return fail(ncclInvalidUsage, "%s: the group's sends to self (%zu) do not match its receives from self (%zu) "
                    "one for one in size", fn, self_sends.size(), self_recvs.size());
    return on_stream(ops[0].stream, [ops]() { return run_p2p(ops); });
}

// Checks and records one point-to-point call; outside a group it is its own group.
static ncclResult_t p2p(const char* fn, bool send, void* buf, size_t count, ncclDataType_t datatype, int peer,
                        ncclComm_t comm, cudaStream_t stream) {
    TypeInfo ti;
    ncclResult_t res;
    if ((res = check_call(fn, comm, datatype, count, &ti)) ||
        (res = check_buf(fn, buf, count, send ? "sendbuff" : "recvbuff")))
        return res;
    if (peer < 0 || peer >= comm->nranks)
        return fail(ncclInvalidArgument, "%s: peer %d is not in [0, nranks=%d)", fn, peer, comm->nranks);
    g_p2p.push_back(P2POp{send, buf, count, ti, peer, comm, stream});
    return g_group_depth == 0 ? flush_p2p() : ncclSuccess;
}

// Sends count elements of sendbuff to rank peer, which receives them with a matching ncclRecv.
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

// Receives count elements from rank peer's matching ncclSend into recvbuff.
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

// Opens a (possibly nested) group.
ncclResult_t ncclGroupStart() {
    g_group_depth++;
    return ncclSuccess;
}

// Closes a group; the outermost one posts its point-to-point calls. An unmatched ncclGroupEnd is a
// usage error, as in NCCL.
ncclResult_t ncclGroupEnd() {
    if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group (no matching ncclGroupStart)");
    if (--g_group_depth > 0) return ncclSuccess;
    return flush_p2p();
}
