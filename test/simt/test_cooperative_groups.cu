// test/simt/test_cooperative_groups.cu — tests the cooperative groups subset kernels rely on: thread
// block ranks, indices and sync; thread_block_tile<N> ranks, meta groups, shuffles, votes and
// matches for N = 1..32; cg::reduce with every operator; an llm.c-style block sum; the generic
// thread_group and run-time tiled_partition. References are computed on the host with CUDA's
// documented semantics; results are integers or follow CUDA's exact operation order (tile reduce
// is the shfl_xor butterfly), so every comparison is exact (bitwise).
//
// Schedule order: each run prints a digest of every output buffer; the same stdout under
// SIMT_ORDER=forward, reverse and random shows the results do not depend on the order in which
// threads run between sync points (block.sync() is what makes the shared-memory tests correct).
//
// Build and run (CPU backend): make build/cpu/test_cooperative_groups && build/cpu/test_cooperative_groups
// nvcc (compile check): nvcc -std=c++17 -arch=sm_80 -c test/simt/test_cooperative_groups.cu
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "../harness.h"

namespace cg = cooperative_groups;

// ----------------------------------------------------------------------------
// Host helpers

static void launch_sync() {
    cudaCheck(cudaGetLastError());
    cudaCheck(cudaDeviceSynchronize());
}

// Digest of every output buffer, printed at the end to compare runs under different orders.
static uint64_t g_digest = 1469598103934665603ull;
static void digest(const void* p, size_t bytes) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; i < bytes; i++) g_digest = (g_digest ^ b[i]) * 1099511628211ull;
}

// Bitwise comparison of two arrays of T, reporting the first mismatching element (as raw words
// for non-integers) and how many differ.
template <class T>
static bool check_equal(const char* name, const std::vector<T>& ref, const std::vector<T>& out) {
    digest(out.data(), out.size() * sizeof(T));
    size_t bad = 0, first = ref.size();
    for (size_t i = 0; i < ref.size(); i++)
        if (memcmp(&ref[i], &out[i], sizeof(T)) != 0 && bad++ == 0) first = i;
    if (bad == 0) return th::report(true, name, "exact (n=%zu)", ref.size());
    long long r = 0, o = 0;
    memcpy(&r, &ref[first], sizeof(T) < 8 ? sizeof(T) : 8);
    memcpy(&o, &out[first], sizeof(T) < 8 ? sizeof(T) : 8);
    return th::report(false, name, "%zu of %zu differ, first at %zu: out=%lld ref=%lld (raw)", bad, ref.size(), first, o, r);
}

static uint64_t g_seed = 77;
static std::vector<int> random_ints(size_t n, int lo, int hi) {
    std::vector<float> f(n);
    th::fill_uniform(f.data(), n, ++g_seed, 0.f, 1.f);
    std::vector<int> v(n);
    for (size_t i = 0; i < n; i++) v[i] = lo + (int)(f[i] * (hi - lo + 1)) % (hi - lo + 1);
    return v;
}

// ----------------------------------------------------------------------------
// Test 1: thread_block — ranks, indices, dims, and block.sync() guarding shared memory

constexpr int kBlockFields = 14;

__global__ void block_kernel(int* out, int* swapped) {
    cg::thread_block block = cg::this_thread_block();
    unsigned rank = block.thread_rank();
    unsigned bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int* o = out + ((size_t)bid * block.size() + rank) * kBlockFields;
    dim3 gi = block.group_index(), ti = block.thread_index(), gd = block.group_dim(), dt = block.dim_threads();
    int vals[kBlockFields] = {(int)rank, (int)block.size(), (int)block.num_threads(), (int)gi.x, (int)gi.y, (int)gi.z,
                              (int)ti.x, (int)ti.y, (int)ti.z, (int)gd.x, (int)gd.y, (int)gd.z, (int)(dt.x * dt.y * dt.z),
                              (int)cg::group_size(block)};
    for (int i = 0; i < kBlockFields; i++) o[i] = vals[i];
    // Reverse the block's ranks through shared memory; each phase needs a barrier, in three forms.
    __shared__ int s[256];
    s[rank] = (int)(rank * 7 + bid);
    block.sync();
    int v = s[block.size() - 1 - rank];
    cg::sync(block);  // nobody overwrites s before everyone has read it
    s[rank] = v * 2;
    cg::thread_group g = block;  // the type-erased group dispatches to __syncthreads
    g.sync();
    swapped[(size_t)bid * block.size() + rank] = s[block.size() - 1 - rank] + (int)(g.thread_rank() == rank) +
                                                 (int)(g.size() == block.size()) * 1000;
}

static void test_block() {
    const dim3 grid(2, 3, 1), blk(16, 4, 2);
    const int nb = 6, nt = 128;
    th::DeviceBuffer<int> d_out((size_t)nb * nt * kBlockFields, th::Fill::Zero), d_sw((size_t)nb * nt, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = blk;
    cudaCheck(cudaLaunchKernelEx(&cfg, block_kernel, d_out.ptr, d_sw.ptr));
    launch_sync();
    std::vector<int> ref((size_t)nb * nt * kBlockFields), ref_sw((size_t)nb * nt);
    for (int bz = 0; bz < 1; bz++)
        for (int by = 0; by < 3; by++)
            for (int bx = 0; bx < 2; bx++) {
                int bid = bx + 2 * by;
                for (int r = 0; r < nt; r++) {
                    int tx = r % 16, ty = r / 16 % 4, tz = r / 64;
                    int vals[kBlockFields] = {r, nt, nt, bx, by, bz, tx, ty, tz, 16, 4, 2, nt, nt};
                    for (int i = 0; i < kBlockFields; i++) ref[((size_t)bid * nt + r) * kBlockFields + i] = vals[i];
                    // Phase 1: rank r reads what rank nt-1-r wrote; phase 2 reads its mirror's
                    // doubled phase-1 value, which is r's own original value.
                    int mirror_read = r * 7 + bid;
                    ref_sw[(size_t)bid * nt + r] = mirror_read * 2 + 1 + 1000;
                }
            }
    check_equal("block: thread_rank/size/num_threads/group_index/thread_index/group_dim/dim_threads, 16x4x2 block, 2x3 grid",
                ref, d_out.host());
    check_equal("block: sync()/cg::sync/thread_group::sync guard shared memory (rank reversal twice)", ref_sw,
                d_sw.host());
}

// ----------------------------------------------------------------------------
// Test 2: tile ranks and meta groups, for a tile of the block and a tile of that tile

constexpr int kTileFields = 9;

template <unsigned N>
__global__ void tile_props_kernel(int* out) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<N> tile = cg::tiled_partition<N>(block);  // the parent-erased type
    auto typed = cg::tiled_partition<N>(block);                       // thread_block_tile<N, thread_block>
    int* o = out + (size_t)block.thread_rank() * kTileFields;
    o[0] = (int)tile.thread_rank();
    o[1] = (int)tile.size();
    o[2] = (int)tile.num_threads();
    o[3] = (int)tile.meta_group_rank();
    o[4] = (int)tile.meta_group_size();
    o[5] = (int)typed.meta_group_rank() * 1000 + (int)typed.meta_group_size();
    if constexpr (N >= 2) {
        auto sub = cg::tiled_partition<N / 2>(typed);  // a tile of a tile: meta groups within the parent
        o[6] = (int)sub.thread_rank();
        o[7] = (int)sub.meta_group_rank();
        o[8] = (int)sub.meta_group_size();
    } else {
        auto self = cg::this_thread();
        o[6] = (int)self.thread_rank();
        o[7] = (int)self.meta_group_rank();
        o[8] = (int)self.meta_group_size() + (int)self.size() * 10;
    }
}

template <unsigned N>
static void test_tile_props() {
    const dim3 blk(8, 12);  // 96 threads: three warps, linear rank = x + 8y
    const int nt = 96;
    th::DeviceBuffer<int> d((size_t)nt * kTileFields, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = blk;
    cudaCheck(cudaLaunchKernelEx(&cfg, tile_props_kernel<N>, d.ptr));
    launch_sync();
    std::vector<int> ref((size_t)nt * kTileFields);
    for (int r = 0; r < nt; r++) {
        int* o = &ref[(size_t)r * kTileFields];
        int meta_size = (nt + N - 1) / N;
        o[0] = r % N, o[1] = N, o[2] = N, o[3] = r / N, o[4] = meta_size, o[5] = (r / N) * 1000 + meta_size;
        if constexpr (N >= 2) o[6] = r % (N / 2), o[7] = (r % N) / (N / 2), o[8] = 2;
        else o[6] = 0, o[7] = 0, o[8] = 1 + 10;
    }
    char name[160];
    snprintf(name, sizeof(name), "tile<%u>: thread_rank/size/meta_group_rank/meta_group_size (8x12 block), tiled_partition<%u> of it%s",
             N, N / 2 ? N / 2 : 1, N == 1 ? " (this_thread)" : "");
    check_equal(name, ref, d.host());
}

// ----------------------------------------------------------------------------
// Test 3: tile shuffles, votes and matches

struct Wide {  // 16 bytes: shuffled in pieces
    double d;
    int i;
    float f;
};

constexpr int kShflFields = 16;

template <unsigned N>
__global__ void tile_collectives_kernel(const int* in, int* out) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<N> tile = cg::tiled_partition<N>(block);
    unsigned r = tile.thread_rank(), g = block.thread_rank() + blockIdx.x * block.size();
    int v = in[g];
    int* o = out + (size_t)g * kShflFields;
    o[0] = tile.shfl(v, (int)((r * 5 + 3) % N));
    o[1] = tile.shfl(v, (int)(r + N + 1));  // source rank taken modulo N
    o[2] = tile.shfl_down(v, 1);
    o[3] = tile.shfl_down(v, N / 2);
    o[4] = tile.shfl_up(v, 1);
    o[5] = tile.shfl_up(v, N / 2 ? N / 2 : 1);
    o[6] = tile.shfl_xor(v, N / 2 ? N / 2 : 0);
    o[7] = tile.shfl_xor(v, N - 1);
    float f = tile.shfl((float)v * 0.25f, 0);
    o[8] = (int)(f * 4.f);
    Wide w = {v * 0.5, v + 1, (float)v * 2.f};
    Wide got = tile.shfl(w, (int)(N - 1 - r));
    o[9] = (int)(got.d * 2.0) * 3 + (got.i - 1) * 5 + (int)(got.f / 2.f) * 7;  // 15 * v of the source
    int pred = v % 3 == 0;
    o[10] = tile.any(pred);
    o[11] = tile.all(pred) + 2 * tile.all(tile.meta_group_rank() % 2 == 0);
    o[12] = (int)tile.ballot(pred);
    o[13] = (int)tile.match_any((int)(r / 3));
    int all_pred = -1;
    o[14] = (int)tile.match_all((int)tile.meta_group_rank(), all_pred) * 2 + all_pred;
    o[15] = (int)tile.match_all((int)(r == 0), all_pred) * 2 + all_pred;
}

template <unsigned N>
static void test_tile_collectives() {
    const int nb = 2, nt = 64, n = nb * nt;
    std::vector<int> in = random_ints(n, -1000, 1000);
    th::DeviceBuffer<int> d_in(in), d_out((size_t)n * kShflFields, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nb);
    cfg.blockDim = dim3(nt);
    cudaCheck(cudaLaunchKernelEx(&cfg, tile_collectives_kernel<N>, (const int*)d_in.ptr, d_out.ptr));
    launch_sync();
    std::vector<int> ref((size_t)n * kShflFields);
    unsigned full = N == 32 ? 0xffffffffu : (1u << N) - 1;
    for (int g = 0; g < n; g++) {
        int base = g / N * N, r = g % N, meta = (g % nt) / N;
        auto at = [&](int rank) { return in[base + rank]; };
        int* o = &ref[(size_t)g * kShflFields];
        o[0] = at((r * 5 + 3) % N);
        o[1] = at((r + N + 1) % N);
        o[2] = r + 1 < (int)N ? at(r + 1) : at(r);
        o[3] = r + (int)N / 2 < (int)N ? at(r + N / 2) : at(r);
        o[4] = r >= 1 ? at(r - 1) : at(r);
        int up = N / 2 ? N / 2 : 1;
        o[5] = r >= up ? at(r - up) : at(r);
        o[6] = at(r ^ (N / 2));
        o[7] = at(r ^ (N - 1));
        o[8] = at(0);
        o[9] = at(N - 1 - r) * 15;
        unsigned ballot = 0;
        bool any = false, all = true;
        for (unsigned k = 0; k < N; k++) {
            bool p = at(k) % 3 == 0;
            ballot |= (unsigned)p << k;
            any |= p, all &= p;
        }
        o[10] = any;
        o[11] = all + 2 * (meta % 2 == 0);
        o[12] = (int)ballot;
        unsigned match = 0;
        for (unsigned k = 0; k < N; k++)
            if (k / 3 == (unsigned)r / 3) match |= 1u << k;
        o[13] = (int)match;
        o[14] = (int)full * 2 + 1;
        o[15] = N == 1 ? (int)full * 2 + 1 : 0;  // ranks disagree unless the tile is one thread
    }
    char name[160];
    snprintf(name, sizeof(name), "tile<%u>: shfl/shfl_down/shfl_up/shfl_xor (int, float, 16-byte struct), any/all/ballot, match_any/match_all", N);
    check_equal(name, ref, d_out.host());
}

// ----------------------------------------------------------------------------
// Test 4: cg::reduce over tiles with every operator (and user functors on 8- and 16-byte types)

struct F2 {
    float x, y;
};
struct F2Add {  // a user functor on an 8-byte struct
    __host__ __device__ F2 operator()(F2 a, F2 b) const { return F2{a.x + b.x, a.y + b.y}; }
};
struct D2 {
    double lo, hi;
};
struct D2MinMax {  // a user functor on a 16-byte struct (shuffled in pieces)
    __host__ __device__ D2 operator()(D2 a, D2 b) const { return D2{a.lo < b.lo ? a.lo : b.lo, a.hi < b.hi ? b.hi : a.hi}; }
};
struct AbsMax {
    __host__ __device__ int operator()(int a, int b) const {
        int x = a < 0 ? -a : a, y = b < 0 ? -b : b;
        return x < y ? y : x;
    }
};

template <unsigned N, class T, class Op>
__global__ void reduce_kernel(const T* in, T* out) {
    auto block = cg::this_thread_block();
    auto tile = cg::tiled_partition<N>(block);
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = cg::reduce(tile, in[i], Op());
}

// The host reference's operator for each of cooperative groups' functors. Those are device-only in
// CUDA's headers: called from host code, nvcc's host build gives them a body that exits the
// program (seen on an H100: test_reduce<less<int>> left through exit(1) inside butterfly). The
// CPU backend's are host-callable, so this matters on a GPU only. cg::less/greater keep the lesser/
// greater operand, the first on ties, as CUDA documents them for reduce.
template <class Op> struct HostOp { using type = Op; };  // user functors: __host__ __device__ already
template <class T> struct HostPlus { T operator()(T a, T b) const { return a + b; } };
template <class T> struct HostLess { T operator()(T a, T b) const { return b < a ? b : a; } };
template <class T> struct HostGreater { T operator()(T a, T b) const { return a < b ? b : a; } };
template <class T> struct HostAnd { T operator()(T a, T b) const { return a & b; } };
template <class T> struct HostOr { T operator()(T a, T b) const { return a | b; } };
template <class T> struct HostXor { T operator()(T a, T b) const { return a ^ b; } };
template <class T> struct HostOp<cg::plus<T>> { using type = HostPlus<T>; };
template <class T> struct HostOp<cg::less<T>> { using type = HostLess<T>; };
template <class T> struct HostOp<cg::greater<T>> { using type = HostGreater<T>; };
template <class T> struct HostOp<cg::bit_and<T>> { using type = HostAnd<T>; };
template <class T> struct HostOp<cg::bit_or<T>> { using type = HostOr<T>; };
template <class T> struct HostOp<cg::bit_xor<T>> { using type = HostXor<T>; };

// CUDA's order: out = op(out, value of rank ^ m) for m = N/2 ... 1, independently on every rank.
template <class T, class Op>
static std::vector<T> butterfly(const std::vector<T>& in, unsigned N, Op op) {
    std::vector<T> out(in.size());
    for (size_t base = 0; base < in.size(); base += N) {
        std::vector<T> v(in.begin() + base, in.begin() + base + N), nv(N);
        for (unsigned m = N / 2; m > 0; m /= 2) {
            for (unsigned r = 0; r < N; r++) nv[r] = op(v[r], v[r ^ m]);
            v = nv;
        }
        for (unsigned r = 0; r < N; r++) out[base + r] = v[r];
    }
    return out;
}

template <class T> std::vector<T> reduce_inputs(size_t n);
template <> std::vector<int> reduce_inputs<int>(size_t n) { return random_ints(n, -100000, 100000); }
template <> std::vector<unsigned> reduce_inputs<unsigned>(size_t n) {
    std::vector<int> a = random_ints(n, 0, 65535), b = random_ints(n, 0, 65535);
    std::vector<unsigned> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (unsigned)a[i] << 16 | (unsigned)b[i];
    return v;
}
template <> std::vector<float> reduce_inputs<float>(size_t n) {
    std::vector<float> v(n);
    th::fill_uniform(v.data(), n, ++g_seed, -1.f, 1.f);
    return v;
}
template <> std::vector<double> reduce_inputs<double>(size_t n) {
    std::vector<float> f = reduce_inputs<float>(n), g = reduce_inputs<float>(n);
    std::vector<double> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (double)f[i] + (double)g[i] * 1e-9;
    return v;
}
template <> std::vector<F2> reduce_inputs<F2>(size_t n) {
    std::vector<float> f = reduce_inputs<float>(n), g = reduce_inputs<float>(n);
    std::vector<F2> v(n);
    for (size_t i = 0; i < n; i++) v[i] = F2{f[i], g[i] * 100.f};
    return v;
}
template <> std::vector<D2> reduce_inputs<D2>(size_t n) {
    std::vector<double> a = reduce_inputs<double>(n), b = reduce_inputs<double>(n);
    std::vector<D2> v(n);
    for (size_t i = 0; i < n; i++) v[i] = D2{a[i], b[i]};
    return v;
}

template <unsigned N, class T, class Op>
static void test_reduce(const char* op_name, bool order_free) {
    const int nb = 2, nt = 128, n = nb * nt;
    std::vector<T> in = reduce_inputs<T>(n);
    th::DeviceBuffer<T> d_in(in), d_out(n, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(nb);
    cfg.blockDim = dim3(nt);
    cudaCheck(cudaLaunchKernelEx(&cfg, reduce_kernel<N, T, Op>, (const T*)d_in.ptr, d_out.ptr));
    launch_sync();
    using Host = typename HostOp<Op>::type;
    std::vector<T> ref = butterfly(in, N, Host());
    if (order_free) {  // integer operators: the butterfly must equal a plain left fold
        for (size_t base = 0; base < (size_t)n; base += N) {
            T acc = in[base];
            for (unsigned r = 1; r < N; r++) acc = Host()(acc, in[base + r]);
            for (unsigned r = 0; r < N; r++)
                if (memcmp(&acc, &ref[base + r], sizeof(T)) != 0) {
                    th::report(false, "reduce reference self-check", "butterfly != fold at %zu", base + r);
                    return;
                }
        }
    }
    char name[128];
    snprintf(name, sizeof(name), "reduce tile<%u> %s", N, op_name);
    check_equal(name, ref, d_out.host());
}

template <unsigned N>
static void test_reduce_all_ops() {
    test_reduce<N, int, cg::plus<int>>("plus<int>", true);
    test_reduce<N, unsigned, cg::plus<unsigned>>("plus<unsigned>", true);
    test_reduce<N, float, cg::plus<float>>("plus<float> (butterfly order, bitwise)", false);
    test_reduce<N, double, cg::plus<double>>("plus<double> (butterfly order, bitwise)", false);
    test_reduce<N, int, cg::less<int>>("less<int>", true);
    test_reduce<N, int, cg::greater<int>>("greater<int>", true);
    test_reduce<N, float, cg::less<float>>("less<float>", true);
    test_reduce<N, float, cg::greater<float>>("greater<float>", true);
    test_reduce<N, unsigned, cg::bit_and<unsigned>>("bit_and<unsigned>", true);
    test_reduce<N, unsigned, cg::bit_or<unsigned>>("bit_or<unsigned>", true);
    test_reduce<N, unsigned, cg::bit_xor<unsigned>>("bit_xor<unsigned>", true);
    test_reduce<N, int, AbsMax>("user functor AbsMax<int>", true);
    test_reduce<N, F2, F2Add>("user functor on 8-byte struct (float2 sum)", false);
    test_reduce<N, D2, D2MinMax>("user functor on 16-byte struct (double min/max)", true);
}

// ----------------------------------------------------------------------------
// Test 5: an llm.c-style block sum: warp reduce, one value per warp through shared memory,
// a second warp reduce; each block sums one row, threads striding over it.

__device__ float block_sum(float v) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
    __shared__ float partial[32];
    float w = cg::reduce(warp, v, cg::plus<float>());
    if (warp.thread_rank() == 0) partial[warp.meta_group_rank()] = w;
    block.sync();
    float p = warp.thread_rank() < warp.meta_group_size() ? partial[warp.thread_rank()] : 0.f;
    float total = cg::reduce(warp, p, cg::plus<float>());
    block.sync();  // partial is reused by the next call
    return total;
}

__global__ void row_sum_kernel(const float* x, float* out, int C) {
    const float* row = x + (size_t)blockIdx.x * C;
    float s = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) s += row[i];
    float total = block_sum(s);
    float total2 = block_sum(s * 2.f);  // second call: partial must not be overwritten early
    if (threadIdx.x == 0) out[2 * blockIdx.x] = total, out[2 * blockIdx.x + 1] = total2;
}

static void test_block_sum() {
    const int rows = 5, C = 1000, threads = 192;  // 6 warps
    std::vector<float> x((size_t)rows * C);
    th::fill_uniform(x.data(), x.size(), ++g_seed);
    th::DeviceBuffer<float> d_x(x), d_out(2 * rows, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(rows);
    cfg.blockDim = dim3(threads);
    cudaCheck(cudaLaunchKernelEx(&cfg, row_sum_kernel, (const float*)d_x.ptr, d_out.ptr, C));
    launch_sync();
    // Reference in the kernel's exact order: strided thread sums, warp butterfly, warp-of-partials butterfly.
    std::vector<float> ref(2 * rows);
    for (int r = 0; r < rows; r++)
        for (int twice = 0; twice < 2; twice++) {
            std::vector<float> s(threads, 0.f);
            for (int t = 0; t < threads; t++) {
                for (int i = t; i < C; i += threads) s[t] += x[(size_t)r * C + i];
                if (twice) s[t] *= 2.f;
            }
            std::vector<float> w = butterfly(s, 32, cg::plus<float>());
            std::vector<float> p(32, 0.f);
            for (int k = 0; k < threads / 32; k++) p[k] = w[k * 32];
            ref[2 * r + twice] = butterfly(p, 32, cg::plus<float>())[0];
        }
    std::vector<float> out = d_out.host();
    check_equal("block sum (llm.c style: tile<32> reduce + shared partials + block.sync), 6 warps, bitwise", ref, out);
    // And it is a sum: compare with a double-precision sum within fp32 accumulation error.
    std::vector<double> exact(2 * rows);
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int i = 0; i < C; i++) s += x[(size_t)r * C + i];
        exact[2 * r] = s, exact[2 * r + 1] = 2 * s;
    }
    // A summation tree of depth d (ceil(C/threads) strided adds + 5 butterfly levels + 5 more)
    // makes an fp32 error of at most d * eps * sum|terms|, and sum|terms| <= 2C (|x| <= 1, doubled).
    const int depth = (C + threads - 1) / threads + 5 + 5;
    th::check_close("block sum vs double-precision sum", exact.data(), out.data(), out.size(),
                    th::tol(th::EPS_FP32, 0, depth * th::EPS_FP32 * 2.0 * C));
}

// ----------------------------------------------------------------------------
// Test 6: run-time tiled_partition into a thread_group, including a partial last tile

__global__ void dynamic_tile_kernel(int* out) {
    cg::thread_block block = cg::this_thread_block();
    cg::thread_group t16 = cg::tiled_partition(block, 16);
    cg::thread_group t32 = cg::tiled_partition(block, 32);  // the block has 40 threads: 32 + 8
    cg::thread_group t4 = cg::tiled_partition(t16, 4);
    t32.sync();  // the partial tile's mask names only its 8 threads
    t16.sync();
    cg::sync(t4);
    int* o = out + block.thread_rank() * 6;
    o[0] = (int)t16.thread_rank();
    o[1] = (int)t16.size();
    o[2] = (int)t32.thread_rank();
    o[3] = (int)t32.size();
    o[4] = (int)t4.thread_rank();
    o[5] = (int)t4.size() + (int)cg::thread_rank(t32) * 100;
}

static void test_dynamic_tiles() {
    const int nt = 40;
    th::DeviceBuffer<int> d(nt * 6, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(nt);
    cudaCheck(cudaLaunchKernelEx(&cfg, dynamic_tile_kernel, d.ptr));
    launch_sync();
    std::vector<int> ref(nt * 6);
    for (int r = 0; r < nt; r++) {
        int* o = &ref[r * 6];
        o[0] = r % 16, o[1] = r < 32 ? 16 : 8, o[2] = r % 32, o[3] = r < 32 ? 32 : 8, o[4] = r % 4, o[5] = 4 + (r % 32) * 100;
    }
    check_equal("tiled_partition(group, n) at run time: thread_group ranks/sizes/sync, partial last tile (40 threads)", ref,
                d.host());
}

// ----------------------------------------------------------------------------
// Test 7 (CPU backend only): a static 32-thread tile over a partial warp is an error a GPU would
// hang or misbehave on; the backend reports it.

#ifdef SIMT_CPU
__global__ void partial_warp_kernel(int* out) {
    auto warp = cg::tiled_partition<32>(cg::this_thread_block());
    out[threadIdx.x] = warp.shfl((int)threadIdx.x, 0);
}

static void test_faults() {
    if (!th::can_run_fault_tests()) return;
    th::DeviceBuffer<int> d(48, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(48);
    th::expect_fault("fault: tile<32> over a partial warp (48-thread block)", "which does not exist",
                     [&] { cudaLaunchKernelEx(&cfg, partial_warp_kernel, d.ptr); });
}
#endif

// ----------------------------------------------------------------------------

int main() {
    auto t0 = std::chrono::steady_clock::now();
    test_block();

    test_tile_props<32>();
    test_tile_props<16>();
    test_tile_props<8>();
    test_tile_props<4>();
    test_tile_props<2>();
    test_tile_props<1>();

    test_tile_collectives<32>();
    test_tile_collectives<16>();
    test_tile_collectives<8>();
    test_tile_collectives<4>();
    test_tile_collectives<2>();
    test_tile_collectives<1>();

    test_reduce_all_ops<32>();
    test_reduce_all_ops<16>();
    test_reduce_all_ops<8>();
    test_reduce_all_ops<4>();
    test_reduce_all_ops<2>();
    test_reduce_all_ops<1>();

    test_block_sum();
    test_dynamic_tiles();
#ifdef SIMT_CPU
    test_faults();
#endif
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("digest of all outputs: %016llx (compare across SIMT_ORDER runs)\n", (unsigned long long)g_digest);
    fprintf(stderr, "time: %.2f s\n", secs);  // stderr: stdout stays identical across runs
    return th::finish();
}
