// test/test_distributed.cu — llmc/distributed.h, run under mpirun with 2 and 3 ranks: start-up
// (rank, world, local rank, communicator), the launch checks on made-up environments, scalar
// reductions (and the ranks' agreement on a stop signal, llmc/stop_signal.h), chunked all-reduce /
// reduce-scatter / all-gather (llmc/zero.h's partition, chunk sizes that do and do not divide by the
// world; rank-local chunks copied, not communicated; the blocks of all_gather_blocks) against a
// serial computation, and the failure paths:
// after MPI_Finalize rank 0 starts this binary again — alone without a launcher (a world of one, no
// MPI at all), under a made-up srun environment (refused), and under `mpirun -np 2` in helper modes
// where rank 1 fails — and checks that the job ends, non-zero, with the rank named.
//
// Every rank can recompute every rank's inputs, so each rank checks its own results; rank 0 gathers
// the verdicts and prints one line per test. Every rank exits non-zero when anything failed.
#include "../llmc/adamw.cuh"  // ParamTensor, the table the optimizers take
#include "../llmc/distributed.h"
#include "../llmc/stop_signal.h"
#include "harness.h"
#include "harness_mpi.h"

#include <chrono>
#include <random>
#include <string>
#include <vector>

static Distributed g_d;

// ----------------------------------------------------------------------------
// Start-up

static void test_init() {
    int mpi_rank = -1, mpi_world = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mpi_world);
    const Distributed& d = g_d;
    int env_local = distributed_env_int(getenv("OMPI_COMM_WORLD_LOCAL_RANK"));
    int env_local_size = distributed_env_int(getenv("OMPI_COMM_WORLD_LOCAL_SIZE"));
    bool ok = d.mpi && d.rank == mpi_rank && d.world == mpi_world && d.local_rank == env_local &&
              d.local_world == env_local_size && d.device == 0 && d.comm_stream != nullptr;
    th::report_all(g_d, "init: rank/world from MPI, local rank/world from the node split agree with mpirun's", ok,
               "rank %d/%d, local %d/%d, device %d", d.rank, d.world, d.local_rank, d.local_world, d.device);
    int count = -1, user_rank = -1;
    bool comm_ok = d.comm && ncclCommCount(d.comm, &count) == ncclSuccess &&
                   ncclCommUserRank(d.comm, &user_rank) == ncclSuccess && count == d.world && user_rank == d.rank;
    th::report_all(g_d, "init: NCCL communicator over all ranks (ncclUniqueId broadcast by rank 0)", comm_ok,
               "ncclCommCount %d, ncclCommUserRank %d", count, user_rank);
    char want[48];
    snprintf(want, sizeof(want), "rank %d/%d: ", d.rank, d.world);
    bool prefix = strcmp(fatal_error_prefix, want) == 0 && fatal_error_hook == distributed_abort_job;
    th::report_all(g_d, "init: fatal errors are prefixed with the rank and abort the job", prefix, "prefix \"%s\"",
               fatal_error_prefix);
}

// ----------------------------------------------------------------------------
// Launch checks on made-up environments (pure functions)

using Env = std::vector<std::pair<const char*, const char*>>;
static LaunchEnv launch_of(const Env& env) {
    return distributed_launch_env([&](const char* name) -> const char* {
        for (auto& kv : env)
            if (strcmp(kv.first, name) == 0) return kv.second;
        return nullptr;
    });
}
static bool same(const LaunchEnv& e, const char* launcher, int world, int rank, int local_rank, int local_world) {
    bool l = (launcher == nullptr) == (e.launcher == nullptr) && (!launcher || strstr(e.launcher, launcher));
    return l && e.world == world && e.rank == rank && e.local_rank == local_rank && e.local_world == local_world;
}

static void test_launch_env() {
    bool ok = true;
    ok &= same(launch_of({}), nullptr, -1, -1, -1, -1);
    ok &= same(launch_of({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
               "mpirun", 4, 3, 1, 2);
    ok &= same(launch_of({{"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_PROCID", "9"}, {"SLURM_LOCALID", "1"},
                          {"SLURM_NTASKS", "16"}, {"PMIX_RANK", "9"}}),
               "srun", 16, 9, 1, -1);
    // An sbatch script itself (no srun step) is not a launch, whatever SLURM_NTASKS says.
    ok &= same(launch_of({{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "42"}}),
               nullptr, -1, -1, -1, -1);
    // mpirun inside an allocation: its daemons' srun step variables describe the daemons, not the ranks.
    ok &= same(launch_of({{"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"},
                          {"SLURM_LOCALID", "0"}}),
               "mpirun", 8, 5, 1, 4);
    ok &= same(launch_of({{"PMI_SIZE", "3"}, {"PMI_RANK", "2"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}}), "PMI",
               3, 2, 0, 1);
    ok &= same(launch_of({{"PMIX_RANK", "0"}}), "PMIx", -1, 0, -1, -1);
    ok &= same(launch_of({{"OMPI_COMM_WORLD_SIZE", "two"}, {"OMPI_COMM_WORLD_RANK", "-1"}}), "mpirun", -1, -1, -1, -1);
    th::report_all(g_d, "launch env: mpirun, srun, PMI, PMIx, sbatch without srun, mpirun inside Slurm, malformed values", ok,
               "as expected");

    LaunchEnv two = launch_of({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}});
    std::string refuse = distributed_no_mpi_refusal(two);
    bool r = refuse.find("built without MPI") != std::string::npos && refuse.find("srun started it as one of 2") !=
             std::string::npos;
    r &= distributed_no_mpi_refusal(launch_of({})).empty() &&
         distributed_no_mpi_refusal(launch_of({{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}})).empty() &&
         !distributed_no_mpi_refusal(launch_of({{"PMIX_RANK", "0"}})).empty();
    th::report_all(g_d, "launch env: a build without MPI refuses a launch of several processes (runs alone or as 1 of 1)", r,
               "\"%.120s...\"", refuse.c_str());

    std::string world_mm = distributed_launch_mismatch(two, 1, 0, 0);
    std::string local_mm = distributed_launch_mismatch(two, 2, 0, 1);
    bool m = world_mm.find("srun started 2 processes, but MPI_Init made this one part of a world of 1") !=
                 std::string::npos &&
             world_mm.find("--mpi=pmix") != std::string::npos && local_mm.find("local rank 0") != std::string::npos &&
             distributed_launch_mismatch(two, 2, 0, 0).empty() && distributed_launch_mismatch(LaunchEnv{}, 5, 3, 1).empty();
    th::report_all(g_d, "launch env: launcher and MPI disagreeing (world, rank, local rank) is named", m, "\"%.100s...\"",
               world_mm.c_str());

    std::string err;
    bool dev = distributed_pick_device(3, 4, 8, false, &err) == 3 && distributed_pick_device(2, 4, 1, false, &err) == 0 &&
               distributed_pick_device(5, 8, 8, false, &err) == 5 && distributed_pick_device(1, 2, 1, true, &err) == 0;
    err.clear();
    dev &= distributed_pick_device(3, 4, 2, false, &err) == -1 && err.find("4 ranks") != std::string::npos &&
           err.find("only 2 GPUs") != std::string::npos;
    std::array<unsigned char, 16> a{}, b{}, c{};
    b[15] = 1;
    c[0] = 7;
    dev &= distributed_shared_device({a, b, c}, 1) == -1 && distributed_shared_device({a, b, a}, 2) == 0 &&
           distributed_shared_device({a, b, a}, 0) == 2;
    th::report_all(g_d, "devices: local rank i -> GPU i; one visible GPU per process; too few GPUs and shared GPUs are named",
               dev, "\"%.100s...\"", err.c_str());
}

// ----------------------------------------------------------------------------
// Scalar reductions

static void test_scalars() {
    const Distributed& d = g_d;
    auto xd = [](int r) { return 0.1 * (r + 1) + 1e-12 * r; };
    auto xf = [](int r) { return 0.3f * (r + 1) + 1e-6f; };
    double sd = 0, sf = 0;  // in rank order, in double (as the reductions promise)
    for (int r = 0; r < d.world; r++) {
        sd += xd(r);
        sf += (double)xf(r);
    }
    const float sf_ref = (float)sf;
    double got_sd = all_reduce_sum_scalar(d, xd(d.rank));
    float got_sf = all_reduce_sum_scalar(d, xf(d.rank));
    double got_md = all_reduce_mean_scalar(d, xd(d.rank));
    float got_mf = all_reduce_mean_scalar(d, xf(d.rank));
    bool ok = got_sd == sd && got_sf == sf_ref && got_md == sd / d.world && got_mf == (float)(sf / d.world);
    th::report_all(g_d, "scalars: sum and mean (float, double) equal the rank-order serial sum, bit for bit", ok,
               "sum %.17g, mean %.9g", got_sd, got_mf);
    int mi = all_reduce_max_scalar(d, (d.rank * 7) % 5 - 2);
    int want_mi = -100;
    for (int r = 0; r < d.world; r++) want_mi = std::max(want_mi, (r * 7) % 5 - 2);
    float mf = all_reduce_max_scalar(d, 2.f - 1.5f * d.rank);
    float nan_any = all_reduce_max_scalar(d, d.rank == d.world - 1 ? NAN : 1.f);
    th::report_all(g_d, "scalars: max (int flags, float) and NaN on any rank gives NaN", mi == want_mi && mf == 2.f &&
               std::isnan(nan_any), "max int %d, max float %g, with one NaN: %g", mi, mf, nan_any);
}

// A stop signal one rank received stops every rank after the same step (llmc/stop_signal.h): the
// last rank raises SIGUSR1 on itself, and every rank's requested() says SIGUSR1 (0 before it).
static void test_stop_signal_agreement() {
    StopOnSignal stop(g_d);
    int before = stop.requested(g_d);
    if (g_d.rank == g_d.world - 1) raise(SIGUSR1);
    int after = stop.requested(g_d);
    th::report_all(g_d, "stop signal: one rank's SIGUSR1 is every rank's request to stop after the step",
                   before == 0 && after == SIGUSR1, "before %d, after %d", before, after);
}

// ----------------------------------------------------------------------------
// Device collectives on chunks

// Rank r's value at flat index i: a small integer, exact in bf16 and in any summation order.
static float grad_value(int r, size_t i) { return (float)((int)((i * 7 + (size_t)r * 3) % 11) - 5); }
// What rank r writes into the parameters it owns before the all-gather (exact in bf16).
static float param_value(int r, size_t i) { return (float)((r + 1) * 16 + (int)(i % 13)); }

template <class T> static T from_f(float x);
template <> float from_f<float>(float x) { return x; }
template <> __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

template <class T>
static void test_all_reduce_chunks() {
    const Distributed& d = g_d;
    const char* tn = th::dtype_name<T>();
    // Spans of assorted lengths (incl. 1 and primes) with untouched gaps between them.
    std::vector<size_t> lens = {1, 7, 33, 256, 997, 5, 1000};
    size_t total = 0;
    std::vector<size_t> starts;
    for (size_t n : lens) {
        starts.push_back(total + 3);
        total += 3 + n;
    }
    total += 3;
    const float sentinel = 77.f;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        std::vector<T> h(total, from_f<T>(sentinel));
        for (size_t k = 0; k < lens.size(); k++)
            for (size_t j = 0; j < lens[k]; j++) h[starts[k] + j] = from_f<T>(grad_value(d.rank, starts[k] + j));
        th::DeviceBuffer<T> buf(h);
        std::vector<DeviceSpan<T>> spans;
        for (size_t k = 0; k < lens.size(); k++) spans.push_back({buf.ptr + starts[k], lens[k]});
        all_reduce_chunks(d, spans, op, d.comm_stream);
        cudaCheck(cudaStreamSynchronize(d.comm_stream));
        std::vector<T> out = buf.host();
        // Sum: exact (small integers). Avg: NCCL may scale each term by 1/world before summing (one
        // rounding per term and per addition), so k = world + 1 roundings of the dtype.
        const double eps = std::is_same<T, float>::value ? th::EPS_FP32 : th::EPS_BF16;
        bool ok = true;
        double max_err = 0;
        std::vector<bool> in_span(total, false);
        for (size_t k = 0; k < lens.size(); k++)
            for (size_t j = 0; j < lens[k]; j++) in_span[starts[k] + j] = true;
        for (size_t i = 0; i < total; i++) {
            double got = th::to_double(out[i]);
            if (!in_span[i]) {
                ok &= got == sentinel;
                continue;
            }
            double ref = 0;
            for (int r = 0; r < d.world; r++) ref += grad_value(r, i);
            if (op == ReduceOp::Avg) ref /= d.world;
            double err = std::fabs(got - ref);
            max_err = std::max(max_err, err);
            ok &= op == ReduceOp::Sum ? got == ref : err <= (d.world + 1) * eps * std::fabs(ref);
        }
        char name[160];
        snprintf(name, sizeof(name), "all_reduce_chunks %s %s: 7 spans (1..1000 elements) = serial %s, gaps untouched", tn,
                 op == ReduceOp::Sum ? "sum" : "avg", op == ReduceOp::Sum ? "sum (exact)" : "mean");
        th::report_all(g_d, name, ok, "max |err| %.3g", max_err);
    }
}

// A model whose chunks include sizes that divide by the world (ncclReduceScatter / ncclAllGather)
// and sizes that do not (one ncclReduce / ncclBroadcast per owner).
static std::vector<ZeroTensor> test_model(int world, int L) {
    size_t w = (size_t)world;
    return {
        {97 * 5, GradReady::AfterLayers, 1},            // prime rows: not divisible
        {w * 40, GradReady::AfterLayers, 1},            // divisible
        {(size_t)L * w * 24, GradReady::PerLayer, 1},   // divisible per layer
        {(size_t)L * 13, GradReady::PerLayer, 0},       // 13 per layer
        {(size_t)L * 1, GradReady::PerLayer, 0},        // 1 per layer: trailing ranks own nothing
        {(size_t)L * 250, GradReady::PerLayer, 1},      // 250: divisible by 2, not by 3
        {w * 3 + 1, GradReady::BeforeLayers, 0},        // one past divisible
    };
}

template <class T>
static void test_reduce_scatter_all_gather(size_t align) {
    const Distributed& d = g_d;
    const char* tn = th::dtype_name<T>();
    const int L = 3;
    ZeroPlan plan;
    std::string err;
    if (!zero_plan(&plan, test_model(d.world, L), L, d.world, align, &err)) distributed_fatal("%s", err.c_str());
    int fast = 0, per_root = 0;
    for (const ZeroChunk& c : plan.chunks) (c.n == c.s * (size_t)d.world ? fast : per_root)++;
    const size_t N = plan.num_params, S = plan.shard_size;
    const float pad = -99.f;
    cudaStream_t compute;
    cudaEvent_t ready, done;
    cudaCheck(cudaStreamCreate(&compute));
    cudaCheck(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        // Gradients: full buffer of this rank's values; the shard starts as padding markers.
        std::vector<T> g(N);
        for (size_t i = 0; i < N; i++) g[i] = from_f<T>(grad_value(d.rank, i));
        th::DeviceBuffer<T> grads(g), shard(std::vector<T>(S, from_f<T>(pad)));
        // As the trainer does it: each group goes out on the communication stream once the
        // compute stream has produced it, in backward order; the optimizer then waits for all.
        for (size_t gi = 0; gi < plan.groups.size(); gi++) {
            stream_wait(d.comm_stream, compute, ready);
            reduce_scatter_chunks(d, sharded_chunks(plan, (int)gi, grads.ptr, shard.ptr), op, d.comm_stream);
        }
        stream_wait(compute, d.comm_stream, done);
        cudaCheck(cudaStreamSynchronize(compute));
        std::vector<T> got = shard.host();
        bool ok = true;
        const double eps = std::is_same<T, float>::value ? th::EPS_FP32 : th::EPS_BF16;
        std::vector<bool> owned(S, false);
        for (const ZeroShardPiece& p : zero_shard_pieces(plan, d.rank))
            for (size_t j = 0; j < p.range.size(); j++) {
                size_t i = p.flat_offset + j;
                double ref = 0;
                for (int r = 0; r < d.world; r++) ref += grad_value(r, i);
                if (op == ReduceOp::Avg) ref /= d.world;
                double v = th::to_double(got[p.shard_offset + j]);
                // Sum exact; Avg within world + 1 roundings (see test_all_reduce_chunks).
                ok &= op == ReduceOp::Sum ? v == ref : std::fabs(v - ref) <= (d.world + 1) * eps * std::fabs(ref);
                owned[p.shard_offset + j] = true;
            }
        for (size_t k = 0; k < S; k++)
            if (!owned[k]) ok &= th::to_double(got[k]) == pad;
        char name[200];
        snprintf(name, sizeof(name),
                 "reduce_scatter_chunks %s %s, align %zu: each rank's slots hold the %s of its pieces, padding untouched",
                 tn, op == ReduceOp::Sum ? "sum" : "avg", align, op == ReduceOp::Sum ? "serial sum" : "mean");
        th::report_all(g_d, name, ok, "%zu chunks in %zu groups: %d via ncclReduceScatter, %d via per-owner ncclReduce; S=%zu N=%zu",
                   plan.chunks.size(), plan.groups.size(), fast, per_root, S, N);
    }

    // Parameters: each rank fills the pieces it owns; after the all-gather every rank's full buffer
    // holds, at every index, the value its owner wrote — and nothing of any rank's padding.
    std::vector<T> sh(S, from_f<T>(pad));
    for (const ZeroShardPiece& p : zero_shard_pieces(plan, d.rank))
        for (size_t j = 0; j < p.range.size(); j++) sh[p.shard_offset + j] = from_f<T>(param_value(d.rank, p.flat_offset + j));
    th::DeviceBuffer<T> shard(sh), params(std::vector<T>(N, from_f<T>(-1.f)));
    for (size_t gi = 0; gi < plan.groups.size(); gi++)
        all_gather_chunks(d, sharded_chunks(plan, (int)gi, params.ptr, shard.ptr), d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    std::vector<T> full = params.host();
    std::vector<int> owner(N, -1);
    for (int r = 0; r < d.world; r++)
        for (const ZeroShardPiece& p : zero_shard_pieces(plan, r))
            for (size_t j = 0; j < p.range.size(); j++) owner[p.flat_offset + j] = r;
    bool ok = true;
    for (size_t i = 0; i < N; i++) ok &= owner[i] >= 0 && th::to_double(full[i]) == param_value(owner[i], i);
    char name[160];
    snprintf(name, sizeof(name), "all_gather_chunks %s, align %zu: every rank gets every owner's pieces, exactly", tn, align);
    th::report_all(g_d, name, ok, "%zu elements from %d ranks", N, d.world);

    cudaCheck(cudaEventDestroy(ready));
    cudaCheck(cudaEventDestroy(done));
    cudaCheck(cudaStreamDestroy(compute));
}

// Rank-local tensors (expert parallelism): with one appended to the model, the chunk collectives
// copy it instead of communicating it — reduce-scatter puts this rank's own values in its slot,
// all-gather puts the slot's back, the ZeRO-0 spans leave it out — and reduce the rest as before.
static void test_rank_local_chunks() {
    const Distributed& d = g_d;
    const int L = 3;
    std::vector<ZeroTensor> tensors = test_model(d.world, L);
    tensors.push_back({2 * 37, GradReady::AfterLayers, 1, true});
    ZeroPlan plan;
    std::string err;
    if (!zero_plan(&plan, tensors, L, d.world, 8, &err)) distributed_fatal("%s", err.c_str());
    const size_t N = plan.num_params, S = plan.shard_size, local = N - 2 * 37;
    std::vector<float> g(N);
    for (size_t i = 0; i < N; i++) g[i] = grad_value(d.rank, i);
    th::DeviceBuffer<float> grads(g), shard(S, th::Fill::Zero), reduced(g), back(N, th::Fill::Zero);
    for (size_t gi = 0; gi < plan.groups.size(); gi++) {
        reduce_scatter_chunks(d, sharded_chunks(plan, (int)gi, grads.ptr, shard.ptr), ReduceOp::Sum, d.comm_stream);
        all_reduce_chunks(d, chunk_spans(plan, (int)gi, reduced.ptr), ReduceOp::Sum, d.comm_stream);
    }
    for (size_t gi = 0; gi < plan.groups.size(); gi++)
        all_gather_chunks(d, sharded_chunks(plan, (int)gi, back.ptr, shard.ptr), d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    std::vector<float> sh = shard.host(), red = reduced.host(), full = back.host();
    bool slots = true, spans = true, gathered = true;
    for (const ZeroShardPiece& p : zero_shard_pieces(plan, d.rank))
        for (size_t j = 0; j < p.range.size(); j++) {
            size_t i = p.flat_offset + j;
            float sum = 0;
            for (int r = 0; r < d.world; r++) sum += grad_value(r, i);
            slots &= sh[p.shard_offset + j] == (i >= local ? grad_value(d.rank, i) : sum);
        }
    for (size_t i = 0; i < N; i++) {
        float sum = 0;
        for (int r = 0; r < d.world; r++) sum += grad_value(r, i);
        spans &= red[i] == (i >= local ? grad_value(d.rank, i) : sum);
        gathered &= full[i] == (i >= local ? grad_value(d.rank, i) : sum);
    }
    th::report_all(g_d, "rank-local chunk: reduce-scatter leaves this rank's own gradient in its slot, the rest summed",
                   slots, "%zu elements, %zu rank-local", N, N - local);
    th::report_all(g_d, "rank-local chunk: the ZeRO-0 spans (chunk_spans) leave it as it is, the rest summed", spans,
                   "%zu elements", N);
    th::report_all(g_d, "rank-local chunk: all-gather copies this rank's slot back, the rest from the owners", gathered,
                   "%zu elements", N);
}

// all_gather_blocks: block b of rank r lands at (b * world + r) * block_elems, exactly.
static void test_all_gather_blocks() {
    const Distributed& d = g_d;
    const size_t blocks = 3, per = 5, W = (size_t)d.world;
    auto value = [](int r, size_t b, size_t j) { return (float)(100 * r + 10 * b + j); };
    std::vector<float> mine(blocks * per);
    for (size_t b = 0; b < blocks; b++)
        for (size_t j = 0; j < per; j++) mine[b * per + j] = value(d.rank, b, j);
    th::DeviceBuffer<float> local(mine), full(blocks * W * per, th::Fill::Zero);
    all_gather_blocks(d, (const float*)local.ptr, full.ptr, blocks, per, d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    std::vector<float> got = full.host();
    bool ok = true;
    for (size_t b = 0; b < blocks; b++)
        for (int r = 0; r < d.world; r++)
            for (size_t j = 0; j < per; j++) ok &= got[(b * W + r) * per + j] == value(r, b, j);
    th::report_all(g_d, "all_gather_blocks: every rank's blocks interleaved by block, rank order within", ok,
                   "%zu blocks of %zu from %d ranks", blocks, per, d.world);
}

// ZeRO-0: the gradient all-reduce issued per group (chunk_spans) covers the whole buffer.
static void test_zero0_groups() {
    const Distributed& d = g_d;
    const int L = 3;
    ZeroPlan plan;
    std::string err;
    if (!zero_plan(&plan, test_model(1, L), L, 1, 1, &err)) distributed_fatal("%s", err.c_str());
    std::vector<float> g(plan.num_params);
    for (size_t i = 0; i < g.size(); i++) g[i] = grad_value(d.rank, i);
    th::DeviceBuffer<float> grads(g);
    for (size_t gi = 0; gi < plan.groups.size(); gi++)
        all_reduce_chunks(d, chunk_spans(plan, (int)gi, grads.ptr), ReduceOp::Sum, d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    std::vector<float> out = grads.host();
    bool ok = true;
    for (size_t i = 0; i < out.size(); i++) {
        float ref = 0;
        for (int r = 0; r < d.world; r++) ref += grad_value(r, i);
        ok &= out[i] == ref;
    }
    th::report_all(g_d, "ZeRO-0: all_reduce_chunks over chunk_spans of every group = serial sum of the whole buffer", ok,
               "%zu elements in %zu groups", plan.num_params, plan.groups.size());
}

// One ZeRO-1 step put together — extract the parameter shard, reduce-scatter the gradients (avg),
// update the owned elements through the shard table, all-gather — equals the single-GPU step
// p - lr * mean over ranks of g on the whole vector.
static void test_zero1_step() {
    const Distributed& d = g_d;
    const int L = 3;
    const float lr = 0.5f;
    ZeroPlan plan;
    std::string err;
    if (!zero_plan(&plan, test_model(d.world, L), L, d.world, 8, &err)) distributed_fatal("%s", err.c_str());
    const size_t N = plan.num_params, S = plan.shard_size;
    std::vector<float> p0(N), g(N);
    for (size_t i = 0; i < N; i++) {
        p0[i] = param_value(0, i);
        g[i] = grad_value(d.rank, i);
    }
    th::DeviceBuffer<float> params(p0), grads(g), p_shard(S, th::Fill::Zero), g_shard(S, th::Fill::Zero);
    extract_shard(plan, d.rank, params.ptr, p_shard.ptr, d.comm_stream);
    for (size_t gi = 0; gi < plan.groups.size(); gi++)
        reduce_scatter_chunks(d, sharded_chunks(plan, (int)gi, grads.ptr, g_shard.ptr), ReduceOp::Avg, d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    std::vector<float> ps = p_shard.host(), gs = g_shard.host();
    bool padding_zero = true;
    std::vector<bool> owned(S, false);
    for (const ParamTensor& t : zero_shard_table<ParamTensor>(plan, d.rank))
        for (size_t k = t.offset; k < t.offset + t.size; k++) {
            ps[k] -= lr * gs[k];  // the "optimizer": touches exactly the table's elements
            owned[k] = true;
        }
    for (size_t k = 0; k < S; k++)
        if (!owned[k]) padding_zero &= ps[k] == 0.f && gs[k] == 0.f;
    p_shard.upload(ps);
    for (size_t gi = 0; gi < plan.groups.size(); gi++)
        all_gather_chunks(d, sharded_chunks(plan, (int)gi, params.ptr, p_shard.ptr), d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    std::vector<float> out = params.host();
    bool ok = padding_zero;
    double max_err = 0;
    for (size_t i = 0; i < N; i++) {
        double mean = 0;
        for (int r = 0; r < d.world; r++) mean += grad_value(r, i);
        mean /= d.world;
        double ref = p0[i] - lr * mean, err = std::fabs(out[i] - ref);
        max_err = std::max(max_err, err);
        // The mean: world + 1 roundings (see test_all_reduce_chunks); the update: 2 more.
        ok &= err <= (d.world + 3) * th::EPS_FP32 * (std::fabs(ref) + lr * std::fabs(mean));
    }
    th::report_all(g_d, "ZeRO-1 step (extract_shard, reduce-scatter avg, update via shard table, all-gather) = single-GPU step",
               ok, "max |err| %.3g over %zu parameters; padding stays zero", max_err, N);
}

// ----------------------------------------------------------------------------
// Child runs (rank 0, after MPI_Finalize): this binary alone, and jobs that must fail

// This program's path, so it can start itself.
static std::string self_path() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    return n > 0 ? std::string(buf, n) : std::string("./test_distributed");
}

// "env -i" plus the variables a child needs: no MPI or launcher variables of this job leak into it.
static std::string clean_env() {
    std::string cmd = "env -i";
    for (const char* k : {"PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH", "LSAN_OPTIONS", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                          "SIMT_THREADS"})
        if (const char* v = getenv(k)) cmd += std::string(" ") + k + "='" + v + "'";
    return cmd;
}

// mpirun as scripts/run_tests.sh calls it, with a time limit in case the job fails to come down.
static std::string mpirun_cmd(int np) {
    std::string cmd = clean_env() + " timeout -k 5 30 mpirun --oversubscribe";
    if (getuid() == 0) cmd += " --allow-run-as-root";
    if (getenv("LSAN_OPTIONS")) cmd += " -x LSAN_OPTIONS";
    return cmd + " -np " + std::to_string(np) + " ";
}

// Runs cmd, returns its output and exit code, and its wall time in seconds.
static th::ChildOutput timed(const std::string& cmd, double* seconds) {
    auto t0 = std::chrono::steady_clock::now();
    th::ChildOutput out = th::run_command(cmd + " 2>&1");
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

static int exit_code(const th::ChildOutput& o) { return WIFEXITED(o.status) ? WEXITSTATUS(o.status) : -1; }

// The first line of text containing what, for the report.
static std::string line_with(const std::string& text, const std::string& what) {
    size_t at = text.find(what);
    if (at == std::string::npos) return "(not found) " + text.substr(0, 200);
    size_t b = text.rfind('\n', at), e = text.find('\n', at);
    b = b == std::string::npos ? 0 : b + 1;
    return text.substr(b, (e == std::string::npos ? text.size() : e) - b);
}

static void test_children() {
    const std::string self = self_path();
    double t = 0;

    th::ChildOutput single = timed(clean_env() + " " + self + " --single", &t);
    th::report(exit_code(single) == 0 && single.text.find("single: ok") != std::string::npos,
               "no launcher: a world of one without MPI_Init or NCCL; collectives are identities/copies", "%.1f s: %s",
               t, line_with(single.text, "single:").c_str());

    th::ChildOutput srun = timed(clean_env() + " SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 SLURM_LOCALID=0 " + self + " --single",
                                 &t);
    const std::string want_srun = "rank 0/1: srun started 2 processes, but MPI_Init made this one part of a world of 1";
    th::report(exit_code(srun) != 0 && srun.text.find(want_srun) != std::string::npos &&
                   srun.text.find("single: ok") == std::string::npos,
               "srun without MPI wiring (srun says 2 tasks, MPI a world of 1): refused, rank named", "exit %d, %.1f s: %s",
               exit_code(srun), t, line_with(srun.text, "srun started").c_str());

    th::ChildOutput fatal = timed(mpirun_cmd(2) + self + " --fatal", &t);
    th::report(exit_code(fatal) != 0 && exit_code(fatal) != 124 &&
                   fatal.text.find("rank 1/2: planted failure on rank 1") != std::string::npos &&
                   fatal.text.find("rank 0 left the collective") == std::string::npos && t < 10,
               "distributed_fatal on rank 1 while rank 0 waits in a collective: mpirun ends, non-zero, rank named",
               "exit %d, %.1f s: %s", exit_code(fatal), t, line_with(fatal.text, "planted failure").c_str());

    th::ChildOutput cuda = timed(mpirun_cmd(2) + self + " --cuda-error", &t);
    th::report(exit_code(cuda) != 0 && exit_code(cuda) != 124 &&
                   cuda.text.find("rank 1/2: [CUDA ERROR] invalid device ordinal") != std::string::npos &&
                   cuda.text.find("rank 0 left the collective") == std::string::npos && t < 10,
               "cudaCheck failing on rank 1 (through cuda_common.h's hook): mpirun ends, non-zero, rank named",
               "exit %d, %.1f s: %s", exit_code(cuda), t, line_with(cuda.text, "[CUDA ERROR]").c_str());
}

// --single: started with no launcher; prints "single: ok ..." when everything holds.
static int run_single(int argc, char** argv) {
    Distributed d = distributed_init(&argc, &argv);
    int mpi_up = 1;
    MPI_Initialized(&mpi_up);
    bool ok = d.world == 1 && d.rank == 0 && d.local_world == 1 && !d.mpi && !mpi_up && d.comm == nullptr &&
              d.comm_stream != nullptr && fatal_error_prefix[0] == 0;
    ok &= all_reduce_sum_scalar(d, 2.5) == 2.5 && all_reduce_mean_scalar(d, 1.5f) == 1.5f &&
          all_reduce_max_scalar(d, 3) == 3;
    ZeroPlan plan;
    std::string err;
    ok &= zero_plan(&plan, test_model(1, 2), 2, 1, 1, &err);
    std::vector<float> h(plan.num_params);
    for (size_t i = 0; i < h.size(); i++) h[i] = grad_value(0, i);
    th::DeviceBuffer<float> full(h), shard(plan.shard_size, th::Fill::Zero), back(plan.num_params, th::Fill::Zero);
    for (size_t g = 0; g < plan.groups.size(); g++) {
        reduce_scatter_chunks(d, sharded_chunks(plan, (int)g, full.ptr, shard.ptr), ReduceOp::Avg, d.comm_stream);
        all_gather_chunks(d, sharded_chunks(plan, (int)g, back.ptr, shard.ptr), d.comm_stream);
    }
    std::vector<DeviceSpan<float>> spans = {{full.ptr, plan.num_params}};
    all_reduce_chunks(d, spans, ReduceOp::Sum, d.comm_stream);
    cudaCheck(cudaStreamSynchronize(d.comm_stream));
    ok &= plan.shard_size == plan.num_params && shard.host() == h && back.host() == h && full.host() == h;
    distributed_finalize(d);
    printf("single: %s (world %d, MPI initialized: %d, %zu parameters copied through the shard)\n", ok ? "ok" : "FAILED",
           d.world, mpi_up, plan.num_params);
    return ok ? 0 : 1;
}

// --fatal / --cuda-error: rank 1 fails while rank 0 waits in a collective that can never complete.
static int run_failing(int argc, char** argv, bool cuda_error) {
    Distributed d = distributed_init(&argc, &argv);
    if (d.rank == 1) {
        if (cuda_error) cudaCheck(cudaSetDevice(12345));
        else distributed_fatal("planted failure on rank %d", d.rank);
    }
    all_reduce_sum_scalar(d, 1.0);
    fprintf(stderr, "rank %d left the collective\n", d.rank);  // must never print
    distributed_finalize(d);
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--single") == 0) return run_single(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--fatal") == 0) return run_failing(argc, argv, false);
    if (argc > 1 && strcmp(argv[1], "--cuda-error") == 0) return run_failing(argc, argv, true);

    auto t0 = std::chrono::steady_clock::now();
    g_d = distributed_init(&argc, &argv);
    if (!g_d.mpi) {
        printf("test_distributed: run under mpirun (scripts/run_tests.sh runs it with -np 2 and -np 3)\n");
        distributed_finalize(g_d);
        return 1;
    }
    if (g_d.rank == 0) printf("test_distributed: %d ranks\n", g_d.world);
    test_init();
    test_launch_env();
    test_scalars();
    test_stop_signal_agreement();
    test_all_reduce_chunks<float>();
    test_all_reduce_chunks<__nv_bfloat16>();
    test_reduce_scatter_all_gather<float>(1);
    test_reduce_scatter_all_gather<__nv_bfloat16>(1);
    test_reduce_scatter_all_gather<float>(8);
    test_zero0_groups();
    test_zero1_step();
    test_rank_local_chunks();
    test_all_gather_blocks();

    // Rank 0 holds the tally; every rank learns it before MPI goes away.
    int failed = th::n_failed();
    MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    int rank = g_d.rank;
    distributed_finalize(g_d);
    int down = 0;
    MPI_Finalized(&down);
    if (rank != 0) return failed || !down ? 1 : 0;
    th::report(down, "finalize: communicator, stream and MPI released");
    test_children();
    printf("test_distributed: %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return th::finish();
}
