// test/simt/test_nccl.cu — NCCL collectives under MPI: every collective × dtype × op × in-place/out-of-place
// against results computed locally from the known per-rank inputs, plus groups, point-to-point
// (an all-to-all of grouped ncclSend/ncclRecv), a second communicator, argument errors and
// bit-identical results across ranks.
//
// Host code only (no kernels), so the same file tests real NCCL on GPUs (nvcc, -lnccl) and the CPU
// backend's NCCL-over-MPI (g++, llmc/simt/nccl.cpp). Run with: mpirun -np 2 ./test_nccl (or -np 3).
//
// Every rank can recompute every rank's input (input_value), so rank 0 gathers all results, builds
// the expected values itself and prints one line per test; other ranks send their failures (NCCL
// result codes, clobbered send buffers) to rank 0. Every rank exits non-zero when anything failed.

#include <cuda_runtime.h>
#define OMPI_SKIP_MPICXX 1  // C API only: MPI's deprecated C++ bindings slow the build and warn
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <cmath>
#include <cstdarg>
#include <string>
#include <type_traits>
#include <vector>

#include "../harness.h"

#define CHECK_CUDA(x)                                                                                   \
    do {                                                                                                \
        cudaError_t e_ = (x);                                                                           \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "%s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, __LINE__); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                               \
        }                                                                                               \
    } while (0)
#define CHECK_NCCL(x)                                                                                         \
    do {                                                                                                      \
        ncclResult_t r_ = (x);                                                                                \
        if (r_ != ncclSuccess) {                                                                              \
            fprintf(stderr, "%s failed: %s: %s (%s:%d)\n", #x, ncclGetErrorString(r_), ncclGetLastError(NULL), \
                    __FILE__, __LINE__);                                                                      \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                                     \
        }                                                                                                     \
    } while (0)

static int g_rank = 0, g_nranks = 1;

// ----------------------------------------------------------------------------
// Data types: how to round a value into each dtype and read it back

// eps of fp64 (the harness lists the dtypes kernels use; NCCL also moves doubles).
constexpr double EPS_FP64 = 1.0 / (1ull << 52);

template <class T> static void store_as(double v, void* p) {
    T x;
    if constexpr (std::is_same_v<T, __half>) x = __float2half((float)v);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) x = __float2bfloat16((float)v);
    else if constexpr (std::is_arithmetic_v<T>) x = (T)v;
    else x = T((float)v);  // fp8: round to nearest, saturating
    memcpy(p, &x, sizeof(T));
}
template <class T> static double load_as(const void* p) {
    T x;
    memcpy(&x, p, sizeof(T));
    if constexpr (std::is_same_v<T, __half>) return __half2float(x);
    else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
    else if constexpr (std::is_arithmetic_v<T>) return (double)x;
    else return (double)static_cast<float>(x);
}

struct Dtype {
    const char* name;
    ncclDataType_t nccl;
    size_t size;
    double eps;       // 0 for integers: their arithmetic is exact
    bool is_signed;   // integers only: selects the input range
    void (*store)(double, void*);
    double (*load)(const void*);
};
#define DTYPE(name, nccl, T, eps, sgn) Dtype{name, nccl, sizeof(T), eps, sgn, store_as<T>, load_as<T>}
static const Dtype F32 = DTYPE("f32", ncclFloat32, float, th::EPS_FP32, true);
static const Dtype BF16 = DTYPE("bf16", ncclBfloat16, __nv_bfloat16, th::EPS_BF16, true);
static const Dtype F16 = DTYPE("f16", ncclFloat16, __half, th::EPS_FP16, true);
static const Dtype F64 = DTYPE("f64", ncclFloat64, double, EPS_FP64, true);
static const Dtype E4M3 = DTYPE("e4m3", ncclFloat8e4m3, __nv_fp8_e4m3, th::EPS_E4M3, true);
static const Dtype E5M2 = DTYPE("e5m2", ncclFloat8e5m2, __nv_fp8_e5m2, th::EPS_E5M2, true);
static const Dtype I8 = DTYPE("i8", ncclInt8, int8_t, 0, true);
static const Dtype U8 = DTYPE("u8", ncclUint8, uint8_t, 0, false);
static const Dtype I32 = DTYPE("i32", ncclInt32, int32_t, 0, true);
static const Dtype U32 = DTYPE("u32", ncclUint32, uint32_t, 0, false);
static const Dtype I64 = DTYPE("i64", ncclInt64, int64_t, 0, true);
static const Dtype U64 = DTYPE("u64", ncclUint64, uint64_t, 0, false);

static const char* op_name(ncclRedOp_t op) {
    switch (op) {
        case ncclSum: return "sum";
        case ncclProd: return "prod";
        case ncclMax: return "max";
        case ncclMin: return "min";
        case ncclAvg: return "avg";
        default: return "?";
    }
}

// ----------------------------------------------------------------------------
// Reporting: one line per test, printed by rank 0

// Collects every rank's verdict on rank 0, which prints one line: rank 0's detail when all passed,
// otherwise the detail of each failing rank.
static bool report_all(const char* name, bool ok, const char* fmt, ...) {
    struct Msg { int ok; char detail[240]; } mine{ok, ""};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mine.detail, sizeof(mine.detail), fmt, ap);
    va_end(ap);
    std::vector<Msg> all(g_nranks);
    MPI_Gather(&mine, sizeof(Msg), MPI_BYTE, all.data(), sizeof(Msg), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (g_rank != 0) return ok;
    bool all_ok = true;
    std::string text;
    for (int r = 0; r < g_nranks; r++)
        if (!all[r].ok) {
            all_ok = false;
            text += "rank " + std::to_string(r) + ": " + all[r].detail + "; ";
        }
    return th::report(all_ok, name, "%s", all_ok ? mine.detail : text.c_str());
}

// ----------------------------------------------------------------------------
// One collective call: inputs, buffers in NCCL's layouts, launch, and checking

enum Coll { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast };
static const char* kCollName[] = {"allreduce", "reduce", "reducescatter", "allgather", "broadcast"};

struct Run {
    Coll coll;
    const Dtype* dt;
    ncclRedOp_t op;   // reductions only
    bool in_place;
    size_t count;     // NCCL's count argument (per rank for reducescatter/allgather)
    int root;         // reduce/broadcast only
    uint64_t seed;
    ncclComm_t comm;
    // filled by prepare()
    size_t in_n = 0, out_n = 0;                // elements in sendbuff / recvbuff
    std::vector<unsigned char> input{};        // this rank's sendbuff contents
    void* d_alloc[2] = {nullptr, nullptr};
    const void* d_send = nullptr;
    void* d_recv = nullptr;
    ncclResult_t rc = ncclSuccess;
    std::string name{};
};

static bool is_reduction(Coll c) { return c == kAllReduce || c == kReduce || c == kReduceScatter; }

// Deterministic value of element i of rank `rank`'s sendbuff, already rounded to the dtype, so
// rank 0 can recompute any rank's input. Sums, averages and products get positive floats (no
// cancellation, so relative error bounds hold); integers stay small enough never to overflow an
// int8 with up to 6 ranks (|product| <= 2^6, |sum| <= 9*6), so integer references are exact.
static double input_value(const Run& r, int rank, size_t i) {
    uint64_t z = r.seed * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull + i * 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 11) / (double)(1ull << 53);  // [0, 1)
    bool arith = is_reduction(r.coll) && (r.op == ncclSum || r.op == ncclAvg || r.op == ncclProd);
    double v;
    if (r.dt->eps > 0) {
        v = arith ? 0.5 + 1.5 * u : -2.0 + 4.0 * u;
    } else {
        bool prod = is_reduction(r.coll) && r.op == ncclProd;
        int lo = r.dt->is_signed ? (prod ? -2 : -4) : 0, hi = prod ? 2 : r.dt->is_signed ? 5 : 9;
        v = lo + std::floor(u * (hi - lo + 1));
    }
    unsigned char buf[8];
    r.dt->store(v, buf);
    return r.dt->load(buf);
}

// Expected element i of rank `rank`'s recvbuff, from all ranks' inputs, reduced in double.
static double expected(const Run& r, int rank, size_t i) {
    auto reduced = [&](size_t j) {
        double acc = input_value(r, 0, j);
        for (int s = 1; s < g_nranks; s++) {
            double x = input_value(r, s, j);
            switch (r.op) {
                case ncclSum: case ncclAvg: acc += x; break;
                case ncclProd: acc *= x; break;
                case ncclMax: acc = std::fmax(acc, x); break;
                case ncclMin: acc = std::fmin(acc, x); break;
                default: break;
            }
        }
        // NCCL's integer average truncates toward zero.
        if (r.op == ncclAvg) acc = r.dt->eps > 0 ? acc / g_nranks : std::trunc(acc / g_nranks);
        return acc;
    };
    switch (r.coll) {
        case kAllReduce: case kReduce: return reduced(i);
        case kReduceScatter: return reduced((size_t)rank * r.count + i);
        case kAllGather: return input_value(r, (int)(i / r.count), i % r.count);
        case kBroadcast: return input_value(r, r.root, i);
    }
    return 0;
}

// Tolerance of a result, from the dtype (doc/testing.md): copies (allgather, broadcast), max/min (which
// select an input) and integer arithmetic must be exact. A float sum/avg/prod may be rounded at
// most n+1 times (n-1 partial sums or products on a ring, NCCL's 1/n factor and its scaling for
// avg), each within eps/2 of a partial no larger than |ref| (positive inputs): k = (n+1)/2.
static th::Tol tolerance(const Run& r) {
    bool exact = !is_reduction(r.coll) || r.op == ncclMax || r.op == ncclMin || r.dt->eps == 0;
    return exact ? th::tol(0, 0, 0) : th::tol(r.dt->eps, (g_nranks + 1) / 2.0, 0);
}

// Fills this rank's input and lays out device buffers the way NCCL defines each call, in-place
// variants included: allreduce/reduce/broadcast use one buffer; reducescatter receives at
// sendbuff + rank*count; allgather sends from recvbuff + rank*count. Unwritten output holds 0x7F
// bytes, a value no test produces (NaN or huge for floats, 127/0x7F7F... for integers).
static void prepare(Run& r) {
    char name[160];
    snprintf(name, sizeof(name), "%s/%s%s%s/%s count=%zu", kCollName[r.coll], r.dt->name,
             is_reduction(r.coll) ? "/" : "", is_reduction(r.coll) ? op_name(r.op) : "",
             r.in_place ? "in-place" : "out-of-place", r.count);
    r.name = name;
    if (r.coll == kReduce || r.coll == kBroadcast) r.name += " root=" + std::to_string(r.root);
    size_t n = g_nranks, es = r.dt->size;
    r.in_n = r.coll == kReduceScatter ? n * r.count : r.count;
    r.out_n = r.coll == kAllGather ? n * r.count : r.count;
    r.input.resize(r.in_n * es);
    for (size_t i = 0; i < r.in_n; i++) r.dt->store(input_value(r, g_rank, i), &r.input[i * es]);
    // cudaMalloc(0) may return NULL, which NCCL treats as a missing buffer: allocate >= 1 byte.
    auto alloc = [&](size_t elems) {
        void* p = nullptr;
        CHECK_CUDA(cudaMalloc(&p, elems ? elems * es : 1));
        CHECK_CUDA(cudaMemset(p, 0x7F, elems * es));
        return p;
    };
    if (!r.in_place) {
        r.d_alloc[0] = alloc(r.in_n);
        r.d_alloc[1] = alloc(r.out_n);
        CHECK_CUDA(cudaMemcpy(r.d_alloc[0], r.input.data(), r.input.size(), cudaMemcpyHostToDevice));
        r.d_send = r.d_alloc[0];
        r.d_recv = r.d_alloc[1];
        return;
    }
    unsigned char* buf = (unsigned char*)(r.d_alloc[0] = alloc(std::max(r.in_n, r.out_n)));
    size_t my_block = (size_t)g_rank * r.count * es;
    switch (r.coll) {
        case kAllReduce: case kReduce: case kBroadcast:
            if (r.coll != kBroadcast || g_rank == r.root)
                CHECK_CUDA(cudaMemcpy(buf, r.input.data(), r.input.size(), cudaMemcpyHostToDevice));
            r.d_send = r.d_recv = buf;
            break;
        case kReduceScatter:
            CHECK_CUDA(cudaMemcpy(buf, r.input.data(), r.input.size(), cudaMemcpyHostToDevice));
            r.d_send = buf;
            r.d_recv = buf + my_block;
            break;
        case kAllGather:
            CHECK_CUDA(cudaMemcpy(buf + my_block, r.input.data(), r.input.size(), cudaMemcpyHostToDevice));
            r.d_send = buf + my_block;
            r.d_recv = buf;
            break;
    }
}

// Issues the collective on the default stream and keeps its result code.
static void launch(Run& r) {
    ncclDataType_t t = r.dt->nccl;
    switch (r.coll) {
        case kAllReduce: r.rc = ncclAllReduce(r.d_send, r.d_recv, r.count, t, r.op, r.comm, 0); break;
        case kReduce: r.rc = ncclReduce(r.d_send, r.d_recv, r.count, t, r.op, r.root, r.comm, 0); break;
        case kReduceScatter: r.rc = ncclReduceScatter(r.d_send, r.d_recv, r.count, t, r.op, r.comm, 0); break;
        case kAllGather: r.rc = ncclAllGather(r.d_send, r.d_recv, r.count, t, r.comm, 0); break;
        case kBroadcast: r.rc = ncclBroadcast(r.d_send, r.d_recv, r.count, t, r.root, r.comm, 0); break;
    }
}

// Downloads every rank's result to rank 0 and checks it against expected(): one line for the
// values (all ranks' outputs concatenated; for reduce only root's), and for allreduce one more
// that every rank holds exactly the same bytes. Returns this rank's result bytes.
static std::vector<unsigned char> verify(Run& r, const char* prefix = "") {
    size_t es = r.dt->size, out_bytes = r.out_n * es;
    std::vector<unsigned char> out(out_bytes), send_after(r.input.size());
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(out.data(), r.d_recv, out_bytes, cudaMemcpyDeviceToHost));
    int status[2] = {(int)r.rc, 1};  // NCCL result, out-of-place sendbuff left intact
    if (!r.in_place) {
        CHECK_CUDA(cudaMemcpy(send_after.data(), r.d_send, send_after.size(), cudaMemcpyDeviceToHost));
        status[1] = send_after == r.input;
    }
    for (void* p : r.d_alloc)
        if (p) CHECK_CUDA(cudaFree(p));
    std::vector<int> statuses(2 * g_nranks);
    std::vector<unsigned char> all(g_rank == 0 ? g_nranks * out_bytes : 0);
    MPI_Gather(status, 2, MPI_INT, statuses.data(), 2, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Gather(out.data(), (int)out_bytes, MPI_BYTE, all.data(), (int)out_bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (g_rank != 0) return out;

    std::string name = std::string(prefix) + r.name;
    for (int s = 0; s < g_nranks; s++) {
        if (statuses[2 * s] != ncclSuccess) {
            th::report(false, name.c_str(), "rank %d returned %s", s,
                       ncclGetErrorString((ncclResult_t)statuses[2 * s]));
            return out;
        }
        if (!statuses[2 * s + 1]) {
            th::report(false, name.c_str(), "rank %d: out-of-place call modified sendbuff", s);
            return out;
        }
    }
    std::vector<double> ref, got;
    for (int s = 0; s < g_nranks; s++) {
        if (r.coll == kReduce && s != r.root) continue;  // recvbuff is only defined on root
        for (size_t i = 0; i < r.out_n; i++) {
            ref.push_back(expected(r, s, i));
            got.push_back(r.dt->load(&all[s * out_bytes + i * es]));
        }
    }
    if (ref.empty()) {
        th::report(true, name.c_str(), "empty call: every rank returned ncclSuccess");
        return out;
    }
    th::check_close(name.c_str(), ref.data(), got.data(), ref.size(), tolerance(r));
    if (r.coll == kAllReduce) {
        std::vector<unsigned char> rank0_everywhere(all.size());
        for (int s = 0; s < g_nranks; s++) memcpy(&rank0_everywhere[s * out_bytes], all.data(), out_bytes);
        th::check_bitwise((name + " identical on all ranks").c_str(), rank0_everywhere.data(), all.data(), all.size());
    }
    return out;
}

// prepare + launch + verify for one call.
static std::vector<unsigned char> run(Coll coll, const Dtype& dt, ncclRedOp_t op, bool in_place, size_t count,
                                      int root, ncclComm_t comm, const char* prefix = "") {
    static uint64_t seed = 1;
    Run r{coll, &dt, op, in_place, count, root, seed++, comm};
    prepare(r);
    launch(r);
    return verify(r, prefix);
}

// ----------------------------------------------------------------------------
// Tests

static const ncclRedOp_t kOps[] = {ncclSum, ncclAvg, ncclMax, ncclMin, ncclProd};

// Communicator queries and the version.
static void test_queries(ncclComm_t comm, int device) {
    int count = -1, rank = -1, dev = -1, version = 0;
    ncclResult_t async = ncclInternalError;
    bool ok = ncclCommCount(comm, &count) == ncclSuccess && ncclCommUserRank(comm, &rank) == ncclSuccess &&
              ncclCommCuDevice(comm, &dev) == ncclSuccess && ncclGetVersion(&version) == ncclSuccess &&
              ncclCommGetAsyncError(comm, &async) == ncclSuccess;
    ok = ok && count == g_nranks && rank == g_rank && dev == device && version >= 20000 && async == ncclSuccess;
    report_all("comm queries", ok, "count=%d rank=%d device=%d version=%d async=%s", count, rank, dev, version,
               ncclGetErrorString(async));
}

// Every reduction × fp32/bf16/fp16 × op × in/out-of-place, and allgather/broadcast per dtype, with
// counts that do not divide by 2 or 3 ranks and a non-zero root.
static void test_matrix(ncclComm_t comm) {
    const Dtype* dtypes[] = {&F32, &BF16, &F16};
    int last = g_nranks - 1;
    for (Coll c : {kAllReduce, kReduce, kReduceScatter})
        for (const Dtype* dt : dtypes)
            for (ncclRedOp_t op : kOps)
                for (bool ip : {false, true}) run(c, *dt, op, ip, c == kReduceScatter ? 333 : 1001, last, comm);
    for (Coll c : {kAllGather, kBroadcast})
        for (const Dtype* dt : {&F32, &BF16, &F16, &I8, &F64})
            for (bool ip : {false, true}) run(c, *dt, ncclSum, ip, c == kAllGather ? 333 : 1001, last, comm);
}

// The other dtypes, every op, through allreduce. fp8 needs sm_90 with real NCCL.
static void test_other_dtypes(ncclComm_t comm, bool fp8) {
    std::vector<const Dtype*> dtypes = {&F64, &I8, &U8, &I32, &U32, &I64, &U64};
    if (fp8) dtypes.insert(dtypes.end(), {&E4M3, &E5M2});
    for (const Dtype* dt : dtypes)
        for (ncclRedOp_t op : kOps) run(kAllReduce, *dt, op, false, 1001, 0, comm);
}

// Fewer elements than ranks (some ranks own nothing), empty calls, root 0, and a large call.
static void test_edge_counts(ncclComm_t comm) {
    for (size_t n : {0, 1, 2}) run(kAllReduce, F32, ncclSum, false, n, 0, comm);
    run(kAllReduce, BF16, ncclAvg, true, 1, 0, comm);
    run(kReduce, F32, ncclSum, false, 1, 0, comm);
    run(kReduce, F16, ncclMax, true, 2, 0, comm);
    run(kReduceScatter, F32, ncclSum, false, 1, 0, comm);
    run(kReduceScatter, F32, ncclSum, true, 0, 0, comm);
    run(kAllGather, F32, ncclSum, true, 1, 0, comm);
    run(kBroadcast, BF16, ncclSum, false, 1, 0, comm);
    run(kAllReduce, F32, ncclSum, false, (1 << 20) + 3, 0, comm);
    run(kAllReduce, BF16, ncclAvg, true, (1 << 20) + 3, 0, comm);
}

// Several calls between ncclGroupStart/End (nested once), checked after the group ends.
static void test_group(ncclComm_t comm) {
    int last = g_nranks - 1;
    Run runs[] = {
        {kAllReduce, &F32, ncclSum, false, 1001, 0, 101, comm},
        {kReduceScatter, &BF16, ncclAvg, true, 333, 0, 102, comm},
        {kAllGather, &F16, ncclSum, false, 333, 0, 103, comm},
        {kBroadcast, &F32, ncclSum, true, 1001, last, 104, comm},
        {kReduce, &BF16, ncclMax, false, 1001, 0, 105, comm},
    };
    for (Run& r : runs) prepare(r);
    ncclResult_t rc[4];
    rc[0] = ncclGroupStart();
    rc[1] = ncclGroupStart();
    launch(runs[0]);
    launch(runs[1]);
    rc[2] = ncclGroupEnd();
    for (int i = 2; i < 5; i++) launch(runs[i]);
    rc[3] = ncclGroupEnd();
    bool ok = rc[0] == ncclSuccess && rc[1] == ncclSuccess && rc[2] == ncclSuccess && rc[3] == ncclSuccess;
    report_all("group start/start/end/end", ok, "%s %s %s %s", ncclGetErrorString(rc[0]), ncclGetErrorString(rc[1]),
               ncclGetErrorString(rc[2]), ncclGetErrorString(rc[3]));
    for (Run& r : runs) verify(r, "group: ");
}

// The same allreduce twice gives the same bytes (on top of the cross-rank identity check).
static void test_repeat(ncclComm_t comm) {
    Run a{kAllReduce, &BF16, ncclSum, false, 1001, 0, 200, comm}, b = a;
    prepare(a);
    launch(a);
    std::vector<unsigned char> first = verify(a, "repeat 1: ");
    prepare(b);
    launch(b);
    std::vector<unsigned char> second = verify(b, "repeat 2: ");
    report_all("allreduce/bf16/sum repeated: same bytes", first == second, "%zu bytes", first.size());
}

// A second communicator from a fresh id, used interleaved with the first one.
static void test_second_comm(ncclComm_t comm) {
    ncclUniqueId id;
    if (g_rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm2 = nullptr;
    ncclResult_t rc = ncclCommInitRank(&comm2, g_nranks, id, g_rank);
    report_all("second communicator: ncclCommInitRank", rc == ncclSuccess, "%s", ncclGetErrorString(rc));
    if (rc != ncclSuccess) return;
    run(kAllReduce, F32, ncclMax, false, 1001, 0, comm2, "comm2: ");
    run(kAllReduce, F32, ncclMin, false, 1001, 0, comm, "comm1: ");
    run(kReduceScatter, BF16, ncclSum, true, 333, 0, comm2, "comm2: ");
    rc = ncclCommDestroy(comm2);
    report_all("second communicator: ncclCommDestroy", rc == ncclSuccess, "%s", ncclGetErrorString(rc));
}

// ncclCommInitAll with one device: a one-rank communicator whose reductions return the input.
static void test_init_all() {
    ncclComm_t solo = nullptr;
    ncclResult_t rc = ncclCommInitAll(&solo, 1, nullptr);
    int count = -1;
    bool ok = rc == ncclSuccess && ncclCommCount(solo, &count) == ncclSuccess && count == 1;
    std::vector<float> in(7), out(7, -1.f);
    for (int i = 0; i < 7; i++) in[i] = 0.1f * (i + 1) * (g_rank + 1);
    if (ok) {
        void *d_in = nullptr, *d_out = nullptr;
        CHECK_CUDA(cudaMalloc(&d_in, sizeof(float) * 7));
        CHECK_CUDA(cudaMalloc(&d_out, sizeof(float) * 7));
        CHECK_CUDA(cudaMemcpy(d_in, in.data(), sizeof(float) * 7, cudaMemcpyHostToDevice));
        rc = ncclAllReduce(d_in, d_out, 7, ncclFloat32, ncclAvg, solo, 0);
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(out.data(), d_out, sizeof(float) * 7, cudaMemcpyDeviceToHost));
        CHECK_CUDA(cudaFree(d_in));
        CHECK_CUDA(cudaFree(d_out));
        ok = rc == ncclSuccess && in == out && ncclCommDestroy(solo) == ncclSuccess;
    }
    report_all("ncclCommInitAll(1 device): avg over one rank is the input", ok, "%s, count=%d",
               ncclGetErrorString(rc), count);
}

// ----------------------------------------------------------------------------
// Point-to-point: ncclSend / ncclRecv

// Elements rank s sends to rank d in the all-to-all below: uneven, and zero for d == s+1 (mod n)
// when there are 3 or more ranks (so a zero-count pair sits among non-empty ones).
static size_t a2a_count(int s, int d) {
    if (g_nranks >= 3 && d == (s + 1) % g_nranks) return 0;
    return 5 + 7 * (size_t)s + 3 * (size_t)d;
}
// Element i of what s sends to d: exact in fp32 for these sizes.
static float a2a_value(int s, int d, size_t i) { return (float)(10000 * s + 100 * d + i); }

// An all-to-all as one group of sends and receives to and from every rank, self included: each
// rank gets exactly what every peer sent it, in its own slot of one receive buffer.
static void test_send_recv(ncclComm_t comm) {
    size_t send_total = 0, recv_total = 0;
    std::vector<size_t> send_at(g_nranks), recv_at(g_nranks);
    for (int p = 0; p < g_nranks; p++) {
        send_at[p] = send_total, send_total += a2a_count(g_rank, p);
        recv_at[p] = recv_total, recv_total += a2a_count(p, g_rank);
    }
    std::vector<float> send(send_total), recv(recv_total, -1.f);
    for (int p = 0; p < g_nranks; p++)
        for (size_t i = 0; i < a2a_count(g_rank, p); i++) send[send_at[p] + i] = a2a_value(g_rank, p, i);
    float *d_send = nullptr, *d_recv = nullptr;
    CHECK_CUDA(cudaMalloc(&d_send, send_total * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_recv, recv_total * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(d_send, send.data(), send_total * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_recv, recv.data(), recv_total * sizeof(float), cudaMemcpyHostToDevice));
    bool calls_ok = ncclGroupStart() == ncclSuccess;
    for (int p = 0; p < g_nranks; p++) {  // receives first on even ranks, sends first on odd ones: order is free
        int q = g_rank % 2 ? p : g_nranks - 1 - p;
        calls_ok &= ncclRecv(d_recv + recv_at[q], a2a_count(q, g_rank), ncclFloat32, q, comm, 0) == ncclSuccess;
        calls_ok &= ncclSend(d_send + send_at[q], a2a_count(g_rank, q), ncclFloat32, q, comm, 0) == ncclSuccess;
    }
    calls_ok &= ncclGroupEnd() == ncclSuccess;
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(recv.data(), d_recv, recv_total * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int p = 0; p < g_nranks; p++)
        for (size_t i = 0; i < a2a_count(p, g_rank); i++) wrong += recv[recv_at[p] + i] != a2a_value(p, g_rank, i);
    report_all("send/recv: all-to-all in one group (self, uneven and zero counts)", calls_ok && wrong == 0,
               "%zu of %zu elements received wrong, calls %s", wrong, recv_total, calls_ok ? "ok" : "failed");

    // Outside a group each call is its own group: rank 0 sends bf16 to the last rank.
    int last = g_nranks - 1;
    std::vector<__nv_bfloat16> one(9), got(9);
    for (int i = 0; i < 9; i++) one[i] = __float2bfloat16(0.5f * i), got[i] = __float2bfloat16(-1.f);
    CHECK_CUDA(cudaMemcpy(d_send, one.data(), sizeof(one[0]) * 9, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_recv, got.data(), sizeof(got[0]) * 9, cudaMemcpyHostToDevice));
    ncclResult_t rc = ncclSuccess;
    if (g_rank == 0) rc = ncclSend(d_send, 9, ncclBfloat16, last, comm, 0);
    if (g_rank == last) rc = ncclRecv(d_recv, 9, ncclBfloat16, 0, comm, 0);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(got.data(), d_recv, sizeof(got[0]) * 9, cudaMemcpyDeviceToHost));
    bool same = g_rank != last || memcmp(got.data(), one.data(), sizeof(one[0]) * 9) == 0;
    report_all("send/recv: outside a group, rank 0 -> last rank (bf16)", rc == ncclSuccess && same, "%s%s",
               ncclGetErrorString(rc), same ? "" : ", data differ");

    // Refused before anything moves: a bad peer, a NULL buffer, a bad type.
    struct { const char* name; ncclResult_t want, got; } cases[] = {
        {"send to peer nranks", ncclInvalidArgument, ncclSend(d_send, 4, ncclFloat32, g_nranks, comm, 0)},
        {"recv from peer -1", ncclInvalidArgument, ncclRecv(d_recv, 4, ncclFloat32, -1, comm, 0)},
        {"send NULL buffer", ncclInvalidArgument, ncclSend(nullptr, 4, ncclFloat32, 0, comm, 0)},
        {"recv invalid datatype", ncclInvalidArgument,
         ncclRecv(d_recv, 4, (ncclDataType_t)ncclNumTypes, 0, comm, 0)},
    };
    for (auto& c : cases) {
        std::string name = std::string("send/recv error: ") + c.name;
        report_all(name.c_str(), c.got == c.want, "returned \"%s\"", ncclGetErrorString(c.got));
    }
    CHECK_CUDA(cudaFree(d_send));
    CHECK_CUDA(cudaFree(d_recv));
}

// Bad arguments return NCCL's error codes (checked before any data moves, so no rank hangs).
static void test_errors(ncclComm_t comm) {
    void* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, 64 * sizeof(float)));
    struct { const char* name; ncclResult_t want, got; } cases[] = {
        {"invalid datatype", ncclInvalidArgument,
         ncclAllReduce(d, d, 16, (ncclDataType_t)ncclNumTypes, ncclSum, comm, 0)},
        {"invalid op", ncclInvalidArgument, ncclAllReduce(d, d, 16, ncclFloat32, (ncclRedOp_t)ncclNumOps, comm, 0)},
        {"NULL comm", ncclInvalidArgument, ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, nullptr, 0)},
        {"NULL sendbuff", ncclInvalidArgument, ncclAllReduce(nullptr, d, 16, ncclFloat32, ncclSum, comm, 0)},
        {"NULL recvbuff", ncclInvalidArgument, ncclAllGather(d, nullptr, 4, ncclFloat32, comm, 0)},
        {"broadcast root out of range", ncclInvalidArgument,
         ncclBroadcast(d, d, 16, ncclFloat32, g_nranks, comm, 0)},
        {"reduce negative root", ncclInvalidArgument, ncclReduce(d, d, 16, ncclFloat32, ncclSum, -1, comm, 0)},
        {"ncclGroupEnd without ncclGroupStart", ncclInvalidUsage, ncclGroupEnd()},
    };
    CHECK_CUDA(cudaFree(d));
    for (auto& c : cases) {
        std::string name = std::string("error: ") + c.name;
        report_all(name.c_str(), c.got == c.want, "returned \"%s\"", ncclGetErrorString(c.got));
    }
    const char* last = ncclGetLastError(comm);
    report_all("error: ncclGetLastError explains the last error", last && last[0], "\"%s\"", last ? last : "(null)");
    ncclResult_t async = ncclInternalError;
    bool ok = ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess;
    report_all("error: argument errors leave the communicator usable", ok, "async=%s", ncclGetErrorString(async));
    run(kAllReduce, F32, ncclSum, false, 1001, 0, comm, "after errors: ");
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_nranks);

    // One device per process on each node, as llm.c picks them.
    MPI_Comm node;
    int local_rank = 0, ndev = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_free(&node);
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    int device = local_rank % ndev, cc_major = 0;
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));

    ncclUniqueId id;
    if (g_rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm = nullptr;
    CHECK_NCCL(ncclCommInitRank(&comm, g_nranks, id, g_rank));
    if (g_rank == 0) printf("test_nccl: %d ranks\n", g_nranks);

    test_queries(comm, device);
    test_matrix(comm);
    test_other_dtypes(comm, cc_major >= 9);
    test_edge_counts(comm);
    test_group(comm);
    test_repeat(comm);
    test_second_comm(comm);
    test_init_all();
    test_send_recv(comm);
    test_errors(comm);
    CHECK_NCCL(ncclCommDestroy(comm));

    // Rank 0 holds the tally; every rank exits with its verdict.
    int failed = th::n_failed();
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int rc = g_rank == 0 ? th::finish() : (failed ? 1 : 0);
    MPI_Finalize();
    return rc;
}
