// test/test_tensor_core.cu — tests llmc/tensor_core.cuh: mma.sync m16n8k16, ldmatrix and cp.async against the PTX ISA's fragment layouts (transcribed below), plain fp32 math, and a 64×64×64 GEMM tile built from all three; its reduction in L2 (red_add_f32x2) and its release/acquire pair for the last block to arrive (atomic_add_release, fence_acquire).
//
// Layouts. The functions ptx_a/ptx_b/ptx_c/ptx_ldmatrix are the PTX ISA's tables, transcribed, not
// derived from the implementation: the host packs matrices into per-lane registers with them and
// unpacks results with them, so a primitive whose layout differs gives wrong numbers. Layout checks
// use small integers (exact in bf16, fp16 and fp32), so they compare bit for bit.
//
// Tolerance of the random mma checks. Each product of two bf16 or fp16 values is exact in fp32;
// the error is in the K fp32 additions of the accumulation chain (C + p0 + ... + p15 for one mma,
// 0 + p0 + ... + p63 for the GEMM). Each addition rounds a partial sum whose magnitude is at most
// S = |c| + Σ|a·b| by at most one fp32 ulp, 2^-23 relative (a round-to-nearest adder errs by half
// of that; a tensor core's truncating adder by up to a whole ulp), so
//     |out - ref| <= K · 2^-23 · S      (to first order; ref computed in double)
// with K = 16 or 64. The CPU backend adds in k order with round-to-nearest and uses a quarter of
// this at most; a GPU may add in another order and truncate, which the bound covers.
//
// cp.async. The CPU backend performs a copy when its thread waits for its group, the latest moment
// a GPU may; the early reads below (before the wait) must see the old bytes there. On a GPU an
// early read races with the copy, so only what must hold after the waits is checked.
#include "../llmc/tensor_core.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "harness.h"

// ----------------------------------------------------------------------------
// The PTX ISA's layouts, transcribed

struct RowCol {
    int row, col;
};

// PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating point type", .f16/.bf16.
// Element ai (i = 0..7) of multiplicand A is in register i / 2, the lower-indexed one in the low
// half ("Elements (low to high)"):
//     row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise
//     col = threadID_in_group * 2 + (i & 0x1) for i < 4, ... + 8 for i >= 4
static RowCol ptx_a(int lane, int i) {
    int group = lane >> 2, in_group = lane % 4;
    int row = (i < 2 || (4 <= i && i < 6)) ? group : group + 8;
    int col = i < 4 ? in_group * 2 + (i & 1) : in_group * 2 + (i & 1) + 8;
    return {row, col};
}
// Multiplicand B (16×8), elements b0..b3 in 2 registers:
//     row = threadID_in_group * 2 + (i & 0x1) for bi where i < 2, ... + 8 for i >= 2;  col = groupID
static RowCol ptx_b(int lane, int i) {
    int group = lane >> 2, in_group = lane % 4;
    int row = i < 2 ? in_group * 2 + (i & 1) : in_group * 2 + (i & 1) + 8;
    return {row, group};
}
// Accumulators C/D (16×8, .f32: c0..c3 in 4 registers):
//     row = groupID for ci where i < 2, groupID + 8 for i >= 2;  col = threadID_in_group * 2 + (i & 0x1)
static RowCol ptx_c(int lane, int i) {
    int group = lane >> 2, in_group = lane % 4;
    return {i < 2 ? group : group + 8, in_group * 2 + (i & 1)};
}
// PTX ISA 9.7.14.5.15, "Warp-level matrix load instruction: ldmatrix", .m8n8 .b16: threads 8j..8j+7
// give the addresses of rows 0..7 of matrix j; "a group of four threads loads an entire row"
// (Figure 104): thread l receives, in destination register j, elements (row l / 4, cols
// 2·(l % 4), 2·(l % 4) + 1) of matrix j, the first in the low half. .trans loads the matrix in
// column-major format: the same positions of the transposed matrix.
static RowCol ptx_ldmatrix(int lane, int half, bool trans) {
    int row = lane / 4, col = 2 * (lane % 4) + half;
    return trans ? RowCol{col, row} : RowCol{row, col};
}

// ----------------------------------------------------------------------------
// Host helpers

template <class T>
static uint16_t bits_of(float x) {
    T v = from_float<T>(x);
    uint16_t b;
    memcpy(&b, &v, 2);
    return b;
}

// A (16×16, row-major floats, each representable in T) as the 32 lanes' 4 registers, per ptx_a.
template <class T>
static std::vector<uint32_t> pack_a(const std::vector<float>& A) {
    std::vector<uint32_t> regs(32 * 4, 0);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 8; i++) {
            RowCol rc = ptx_a(lane, i);
            regs[lane * 4 + i / 2] |= (uint32_t)bits_of<T>(A[rc.row * 16 + rc.col]) << (16 * (i % 2));
        }
    return regs;
}
// B (16×8, row-major K×N) as the lanes' 2 registers, per ptx_b.
template <class T>
static std::vector<uint32_t> pack_b(const std::vector<float>& B) {
    std::vector<uint32_t> regs(32 * 2, 0);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            RowCol rc = ptx_b(lane, i);
            regs[lane * 2 + i / 2] |= (uint32_t)bits_of<T>(B[rc.row * 8 + rc.col]) << (16 * (i % 2));
        }
    return regs;
}
// C (16×8 row-major) as the lanes' 4 floats, and back, per ptx_c.
static std::vector<float> pack_c(const std::vector<float>& C) {
    std::vector<float> regs(32 * 4);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) regs[lane * 4 + i] = C[ptx_c(lane, i).row * 8 + ptx_c(lane, i).col];
    return regs;
}
static std::vector<float> unpack_c(const std::vector<float>& regs) {
    std::vector<float> C(16 * 8);
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) C[ptx_c(lane, i).row * 8 + ptx_c(lane, i).col] = regs[lane * 4 + i];
    return C;
}

// The values of a storage-type vector as floats (exact).
template <class T>
static std::vector<float> floats(const std::vector<T>& t) {
    std::vector<float> f(t.size());
    for (size_t i = 0; i < t.size(); i++) f[i] = (float)th::to_double(t[i]);
    return f;
}

static cudaLaunchConfig_t one_block(unsigned threads) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(threads);
    return cfg;
}

// ----------------------------------------------------------------------------
// 1. mma.sync m16n8k16: layouts (exact) and random inputs against plain math

// One warp: lane l passes registers a/b/c[l * count ...] and writes its D registers to d.
template <class T>
__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d) {
    int lane = threadIdx.x;
    uint32_t ra[4] = {a[lane * 4], a[lane * 4 + 1], a[lane * 4 + 2], a[lane * 4 + 3]};
    uint32_t rb[2] = {b[lane * 2], b[lane * 2 + 1]};
    float acc[4] = {c[lane * 4], c[lane * 4 + 1], c[lane * 4 + 2], c[lane * 4 + 3]};
    mma_m16n8k16<T>(acc, ra, rb, acc);
    for (int i = 0; i < 4; i++) d[lane * 4 + i] = acc[i];
}

// D = A·B + C through the primitive, every operand packed and unpacked with the PTX tables.
template <class T>
static std::vector<float> run_mma(const char* name, const std::vector<float>& A, const std::vector<float>& B,
                                  const std::vector<float>& C) {
    th::DeviceBuffer<uint32_t> da(pack_a<T>(A)), db(pack_b<T>(B));
    th::DeviceBuffer<float> dc(pack_c(C)), dd(32 * 4, th::Fill::NaN);
    return th::run_orders(name, [&] {
        cudaLaunchConfig_t cfg = one_block(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, mma_kernel<T>, (const uint32_t*)da.ptr, (const uint32_t*)db.ptr,
                                     (const float*)dc.ptr, dd.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return unpack_c(dd.host());
    });
}

// Reports whether D equals `want` exactly (small integers: no rounding anywhere).
static void check_exact(const char* name, const std::vector<float>& D, const std::vector<float>& want) {
    int bad = 0, first = -1;
    for (size_t e = 0; e < want.size(); e++)
        if (D[e] != want[e] && bad++ == 0) first = (int)e;
    if (bad == 0) th::report(true, name, "all %zu elements exact", want.size());
    else th::report(false, name, "%d wrong, first D(%d,%d)=%g want %g", bad, first / 8, first % 8, D[first], want[first]);
}

template <class T>
static void test_mma_layouts() {
    const char* tn = th::dtype_name<T>();
    char name[128];
    std::vector<float> zero_c(16 * 8, 0.f);
    // A: ids 1..256 (exact in bf16). B selects column n + 8s of A into column n of D.
    std::vector<float> A(256);
    for (int e = 0; e < 256; e++) A[e] = (float)(e + 1);
    for (int s = 0; s < 2; s++) {
        std::vector<float> B(16 * 8, 0.f), want(16 * 8);
        for (int n = 0; n < 8; n++) B[(n + 8 * s) * 8 + n] = 1.f;
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) want[r * 8 + n] = A[r * 16 + n + 8 * s];
        snprintf(name, sizeof(name), "mma %s layout of A (columns %d..%d read out by a selector B)", tn, 8 * s,
                 8 * s + 7);
        check_exact(name, run_mma<T>(name, A, B, zero_c), want);
    }
    // B: ids 1..128; A = identity (A(r, k) = [r == k]) reads B out: D = B.
    {
        std::vector<float> I(256, 0.f), B(128);
        for (int r = 0; r < 16; r++) I[r * 16 + r] = 1.f;
        for (int e = 0; e < 128; e++) B[e] = (float)(e + 1);
        snprintf(name, sizeof(name), "mma %s layout of B (read out by A = identity)", tn);
        check_exact(name, run_mma<T>(name, I, B, zero_c), B);
    }
    // C: ids 1..128 with A = 0: D = C.
    {
        std::vector<float> Z(256, 0.f), B(128, 1.f), C(128);
        for (int e = 0; e < 128; e++) C[e] = (float)(e + 1);
        snprintf(name, sizeof(name), "mma %s layout of C and D (A = 0)", tn);
        check_exact(name, run_mma<T>(name, Z, B, C), C);
    }
    // All three at once: small integers in [-3, 3], products and sums exact.
    {
        std::vector<float> A2(256), B2(128), C2(128), want(128);
        for (int e = 0; e < 256; e++) A2[e] = (float)((e * 7 + 3) % 7 - 3);
        for (int e = 0; e < 128; e++) B2[e] = (float)((e * 5 + 1) % 7 - 3);
        for (int e = 0; e < 128; e++) C2[e] = (float)(e % 11 - 5);
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                float acc = C2[r * 8 + n];
                for (int k = 0; k < 16; k++) acc += A2[r * 16 + k] * B2[k * 8 + n];
                want[r * 8 + n] = acc;
            }
        snprintf(name, sizeof(name), "mma %s D = A.B + C on small integers", tn);
        check_exact(name, run_mma<T>(name, A2, B2, C2), want);
    }
}

template <class T>
static void test_mma_random(uint64_t seed) {
    std::vector<float> A = floats(th::random_tensor<T>(256, seed)), B = floats(th::random_tensor<T>(128, seed + 1)),
                       C(128);
    th::fill_uniform(C.data(), C.size(), seed + 2, -4.f, 4.f);
    char name[128];
    snprintf(name, sizeof(name), "mma %s random inputs vs fp64 reference (16 fp32 adds)", th::dtype_name<T>());
    std::vector<float> D = run_mma<T>(name, A, B, C);
    std::vector<double> ref(128), budget(128);
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double acc = C[r * 8 + n], sum_abs = std::fabs(C[r * 8 + n]);
            for (int k = 0; k < 16; k++) {
                acc += (double)A[r * 16 + k] * B[k * 8 + n];
                sum_abs += std::fabs((double)A[r * 16 + k] * B[k * 8 + n]);
            }
            ref[r * 8 + n] = acc;
            budget[r * 8 + n] = 16 * th::EPS_FP32 * sum_abs;
        }
    th::check_budget(name, ref, D, budget);
}

// ----------------------------------------------------------------------------
// 2. ldmatrix x1/x2/x4 and .trans against the PTX table

// 32 rows of 8 16-bit elements in shared memory; lane l gives the address of row row_of[l] (lanes
// past the 8·Num that give addresses pass a misaligned one, which the instruction must ignore).
template <int Num, bool Trans>
__global__ void ldmatrix_kernel(const uint16_t* src, const int* row_of, uint32_t* out) {
    alignas(16) __shared__ uint16_t rows[32][8];
    int lane = threadIdx.x;
    for (int c = 0; c < 8; c++) rows[lane][c] = src[lane * 8 + c];
    __syncwarp();
    const void* row = lane < 8 * Num ? (const void*)rows[row_of[lane]] : (const void*)((const char*)rows[0] + 2);
    uint32_t r[Num];
    if constexpr (Num == 1) Trans ? ldmatrix_x1_trans(r, row) : ldmatrix_x1(r, row);
    if constexpr (Num == 2) Trans ? ldmatrix_x2_trans(r, row) : ldmatrix_x2(r, row);
    if constexpr (Num == 4) Trans ? ldmatrix_x4_trans(r, row) : ldmatrix_x4(r, row);
    for (int j = 0; j < Num; j++) out[lane * Num + j] = r[j];
}

template <int Num, bool Trans>
static void test_ldmatrix() {
    std::vector<uint16_t> src(32 * 8);
    for (int e = 0; e < 32 * 8; e++) src[e] = (uint16_t)(0x1000 + e * 37);  // distinct 16-bit patterns
    std::vector<int> row_of(32);
    for (int l = 0; l < 32; l++) row_of[l] = (l * 13 + 5) % 32;  // rows in scrambled order
    th::DeviceBuffer<uint16_t> dsrc(src);
    th::DeviceBuffer<int> drow(row_of);
    th::DeviceBuffer<uint32_t> dout(32 * Num);
    char name[96];
    snprintf(name, sizeof(name), "ldmatrix .x%d%s vs the PTX ISA's fragment layout", Num, Trans ? ".trans" : "");
    std::vector<uint32_t> out = th::run_orders(name, [&] {
        cudaLaunchConfig_t cfg = one_block(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, ldmatrix_kernel<Num, Trans>, (const uint16_t*)dsrc.ptr,
                                     (const int*)drow.ptr, dout.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return dout.host();
    });
    int bad = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int j = 0; j < Num; j++) {
            uint32_t want = 0;
            for (int h = 0; h < 2; h++) {
                RowCol rc = ptx_ldmatrix(lane, h, Trans);  // row rc.row of matrix j: lane 8j + rc.row's row
                want |= (uint32_t)src[row_of[8 * j + rc.row] * 8 + rc.col] << (16 * h);
            }
            bad += out[lane * Num + j] != want;
        }
    th::report(bad == 0, name, "%d of %d registers wrong", bad, 32 * Num);
}

// ----------------------------------------------------------------------------
// 3. cp.async: visibility, group semantics, copies never waited for

// Each of 32 threads: its 3 16-byte chunks of shared memory start as 0xAA bytes; it issues chunk 0
// (group 0), chunk 1 (group 1), chunk 2 (not committed), and records all three after wait<1>, after
// wait<0>, and after committing chunk 2 and wait<0>. out[thread][stage][chunk] is 1 when the chunk
// holds the copied data, 0 when the old bytes, 2 for anything else.
__global__ void cp_async_groups_kernel(const uint4* src, int* out) {
    alignas(16) __shared__ uint4 buf[32][3];
    int t = threadIdx.x;
    for (int c = 0; c < 3; c++) memset(&buf[t][c], 0xAA, 16);
    cp_async_16(&buf[t][0], &src[t * 3 + 0]);
    cp_async_commit();
    cp_async_16(&buf[t][1], &src[t * 3 + 1]);
    cp_async_commit();
    cp_async_16(&buf[t][2], &src[t * 3 + 2]);
    auto record = [&](int stage) {
        for (int c = 0; c < 3; c++) {
            uint4 v = buf[t][c], s = src[t * 3 + c];
            bool copied = v.x == s.x && v.y == s.y && v.z == s.z && v.w == s.w;
            bool old = v.x == 0xAAAAAAAAu && v.y == 0xAAAAAAAAu && v.z == 0xAAAAAAAAu && v.w == 0xAAAAAAAAu;
            out[(t * 3 + stage) * 3 + c] = copied ? 1 : old ? 0 : 2;
        }
    };
    cp_async_wait<1>();
    record(0);
    cp_async_wait<0>();
    record(1);
    cp_async_commit();
    cp_async_wait<0>();
    record(2);
}

// Warp 0 issues copies into shared memory and exits without waiting; warp 1 reads the destination
// after a barrier (which exited threads do not join). That read races with the copies on a GPU; the
// CPU backend drops them, so it sees the old bytes.
__global__ void cp_async_unwaited_kernel(const uint4* src, int* out) {
    alignas(16) __shared__ uint4 buf[32];
    int t = threadIdx.x;
    if (t < 32) memset(&buf[t], 0xAA, 16);
    __syncthreads();
    if (t < 32) {
        cp_async_16(&buf[t], &src[t]);
        cp_async_commit();
        return;
    }
    __syncthreads();
    uint4 v = buf[t - 32];
    out[t - 32] = v.x == 0xAAAAAAAAu && v.y == 0xAAAAAAAAu && v.z == 0xAAAAAAAAu && v.w == 0xAAAAAAAAu;
}

// cp_async_16_zfill: thread t copies the first t % 17 bytes of its source chunk (0..16) into a chunk
// of shared memory that starts as 0xAA bytes; after wait<0> the chunk holds those bytes and zeros
// after them. out[t] counts the bytes that are not what they should be.
__global__ void cp_async_zfill_kernel(const uint4* src, int* out) {
    alignas(16) __shared__ uint4 buf[32];
    int t = threadIdx.x, n = t % 17;
    memset(&buf[t], 0xAA, 16);
    cp_async_16_zfill(&buf[t], &src[t], n);
    cp_async_commit();
    cp_async_wait<0>();
    const unsigned char* got = reinterpret_cast<const unsigned char*>(&buf[t]);
    const unsigned char* want = reinterpret_cast<const unsigned char*>(&src[t]);
    int wrong = 0;
    for (int i = 0; i < 16; i++) wrong += got[i] != (i < n ? want[i] : 0);
    out[t] = wrong;
}

static void test_cp_async() {
    std::vector<uint32_t> words(32 * 3 * 4);
    for (size_t i = 0; i < words.size(); i++) words[i] = 0x01020304u * (uint32_t)(i + 1);
    th::DeviceBuffer<uint32_t> dsrc(words);
    th::DeviceBuffer<int> dout(32 * 3 * 3);
    std::vector<int> out = th::run_orders("cp.async groups", [&] {
        cudaLaunchConfig_t cfg = one_block(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, cp_async_groups_kernel, (const uint4*)dsrc.ptr, dout.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return dout.host();
    });
    // stage -> chunk: what must hold on every GPU (1: copied), and what the CPU backend gives for
    // the reads that race on a GPU (0: old bytes).
    const int must[3][3] = {{1, -1, -1}, {1, 1, -1}, {1, 1, 1}};
    const int cpu[3][3] = {{1, 0, 0}, {1, 1, 0}, {1, 1, 1}};
    int bad_after_wait = 0, bad_early = 0;
    for (int t = 0; t < 32; t++)
        for (int s = 0; s < 3; s++)
            for (int c = 0; c < 3; c++) {
                int got = out[(t * 3 + s) * 3 + c];
                if (must[s][c] >= 0) bad_after_wait += got != must[s][c];
                else bad_early += got != cpu[s][c];
            }
    th::report(bad_after_wait == 0, "cp.async data visible after wait<1> (older group) and wait<0> (all)",
               "%d wrong", bad_after_wait);

    th::DeviceBuffer<int> dz(32);
    std::vector<int> z = th::run_orders("cp.async src-size", [&] {
        cudaLaunchConfig_t cfg = one_block(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, cp_async_zfill_kernel, (const uint4*)dsrc.ptr, dz.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return dz.host();
    });
    int wrong = 0;
    for (int v : z) wrong += v;
    th::report(wrong == 0, "cp.async with src-size 0..16: the first src-size bytes copied, zeros after them",
               "%d of 512 bytes wrong", wrong);
#if defined(SIMT_CPU)
    th::report(bad_early == 0, "cp.async wait<1> leaves the newest group pending, wait<0> leaves uncommitted "
               "copies pending (CPU backend: early reads see the old bytes)", "%d wrong", bad_early);

    th::DeviceBuffer<int> dold(32);
    std::vector<int> old = th::run_orders("cp.async copies never waited for", [&] {
        cudaLaunchConfig_t cfg = one_block(64);
        cudaCheck(cudaLaunchKernelEx(&cfg, cp_async_unwaited_kernel, (const uint4*)dsrc.ptr, dold.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return dold.host();
    });
    int stale = 0;
    for (int v : old) stale += v;
    th::report(stale == 32, "cp.async copies of an exited thread that never waited are dropped (CPU backend)",
               "%d of 32 reads saw the old bytes", stale);
#else
    (void)bad_early;
#endif
}

// ----------------------------------------------------------------------------
// red_add_f32x2: reductions in L2. Many threads into the same pairs: every add lands (the sums are of
// small integers, exact in any order). One thread into its own pair after a store: the adds take
// effect in program order, after the store: 0, then sixteen 2^-24, then 1 sum exactly to 1 + 2^-20,
// where any other order loses the small terms to rounding (1 + 2^-24 rounds to 1).

__global__ void red_add_shared_pairs_kernel(float* sums) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    red_add_f32x2(&sums[2 * (t % 8)], (float)(t + 1), -0.5f * (float)(t + 1));
}

__global__ void red_add_program_order_kernel(float* pairs) {
    float* mine = &pairs[2 * (blockIdx.x * blockDim.x + threadIdx.x)];
    mine[0] = 0.f;
    mine[1] = 0.f;
    for (int i = 0; i < 16; i++) red_add_f32x2(mine, 0x1p-24f, 0x1p-24f);
    red_add_f32x2(mine, 1.f, 0.f);
}

// Zeroes buf, runs kernel(buf) on `blocks` blocks of 128 threads (under each thread order) and returns
// buf's contents.
template <class Kernel>
static std::vector<float> run_red_kernel(const char* name, Kernel kernel, unsigned blocks,
                                         th::DeviceBuffer<float>& buf) {
    return th::run_orders(name, [&] {
        cudaCheck(cudaMemset(buf.ptr, 0, buf.n * sizeof(float)));
        cudaLaunchConfig_t cfg = one_block(128);
        cfg.gridDim = dim3(blocks);
        cudaCheck(cudaLaunchKernelEx(&cfg, kernel, buf.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return buf.host();
    });
}

static void test_red_add() {
    th::DeviceBuffer<float> sums(16);
    std::vector<float> got = run_red_kernel("red.global.add into shared pairs", red_add_shared_pairs_kernel, 4, sums);
    int wrong = 0;
    for (int p = 0; p < 8; p++) {
        double a = 0, b = 0;
        for (int t = p; t < 512; t += 8) a += t + 1, b -= 0.5 * (t + 1);
        wrong += got[2 * p] != (float)a || got[2 * p + 1] != (float)b;
    }
    th::report(wrong == 0, "red_add_f32x2: 512 threads into 8 pairs, every add lands", "%d of 8 pairs wrong", wrong);

    th::DeviceBuffer<float> pairs(2 * 256);
    std::vector<float> mine = run_red_kernel("red.global.add in program order", red_add_program_order_kernel, 2, pairs);
    int out_of_order = 0;
    for (int t = 0; t < 256; t++) out_of_order += mine[2 * t] != 1.f + 0x1p-20f || mine[2 * t + 1] != 0x1p-20f;
    th::report(out_of_order == 0, "red_add_f32x2 after a store: one thread's adds in program order (1 + 2^-20)",
               "%d of 256 threads' pairs wrong (first: %.9g, %.9g)", out_of_order, mine[0], mine[1]);
}

// atomic_add_release and fence_acquire: the last block to arrive. Each of 12 blocks stores its 128
// threads' parts (plain stores), counts itself in with one thread after a barrier, and the block that
// finds itself last sums every block's parts: exactly one block is last, the count ends at 12, and the
// sum holds every part (small integers, exact in any order) — none read before its block arrived.

constexpr int kArrivals = 12;

__global__ void last_to_arrive_kernel(int* state, float* parts, float* total) {
    __shared__ int last;
    parts[blockIdx.x * blockDim.x + threadIdx.x] = (float)(blockIdx.x * blockDim.x + threadIdx.x + 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomic_add_release(&state[0], 1) == (int)gridDim.x - 1;
        if (last) fence_acquire();
    }
    __syncthreads();
    if (!last) return;
    if (threadIdx.x == 0) {
        atomicAdd(&state[1], 1);
        float sum = 0.f;
        for (unsigned i = 0; i < gridDim.x * blockDim.x; i++) sum += parts[i];
        *total = sum;
    }
}

static void test_last_to_arrive() {
    th::DeviceBuffer<int> state(2);
    th::DeviceBuffer<float> parts(kArrivals * 128), total(1);
    auto got = th::run_orders("atomic_add_release: the last block to arrive", [&] {
        cudaCheck(cudaMemset(state.ptr, 0, 2 * sizeof(int)));
        cudaCheck(cudaMemset(total.ptr, 0, sizeof(float)));
        cudaLaunchConfig_t cfg = one_block(128);
        cfg.gridDim = dim3(kArrivals);
        cudaCheck(cudaLaunchKernelEx(&cfg, last_to_arrive_kernel, state.ptr, parts.ptr, total.ptr));
        cudaCheck(cudaDeviceSynchronize());
        std::vector<int> st = state.host();
        return std::vector<float>{(float)st[0], (float)st[1], total.host()[0]};
    });
    const float n = kArrivals * 128.f;
    th::report(got[0] == kArrivals && got[1] == 1.f && got[2] == n * (n + 1) / 2,
               "atomic_add_release, fence_acquire: 12 blocks count in, one finds itself last and sums all 1536 parts",
               "count %g (want 12), last blocks %g (want 1), sum %.9g (want %.9g)", got[0], got[1], got[2],
               n * (n + 1) / 2);
}

// ----------------------------------------------------------------------------
// 4. All three together: a 64×64×64 GEMM tile (D = A·B, A M×K and B K×N row-major in global
// memory, D fp32 row-major). 4 warps, 2×2, each computing 32×32 of D as 2×4 m16n8 tiles. A and B
// come to shared memory by cp.async in two groups (k < 32, k >= 32), so the first half is computed
// while the second may still be in flight; A's fragments are ldmatrix_x4 of 16×16 tiles, B's
// ldmatrix_x4_trans of two 16×8 tiles at a time.

constexpr int kTile = 64;

template <class T>
__global__ void gemm_tile_kernel(const T* A, const T* B, float* D) {
    alignas(16) __shared__ T sA[kTile][kTile];  // [m][k]
    alignas(16) __shared__ T sB[kTile][kTile];  // [k][n]
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    // Each half of k: A has 64 rows × 4 chunks of 8 elements, B 32 rows × 8 chunks: 256 chunks each,
    // 2 per thread.
    for (int half = 0; half < 2; half++) {
        for (int q = 0; q < 2; q++) {
            int chunk = tid + 128 * q;
            int ar = chunk / 4, ac = 32 * half + 8 * (chunk % 4);
            cp_async_16(&sA[ar][ac], &A[ar * kTile + ac]);
            int br = 32 * half + chunk / 8, bc = 8 * (chunk % 8);
            cp_async_16(&sB[br][bc], &B[br * kTile + bc]);
        }
        cp_async_commit();
    }
    int wm = warp / 2, wn = warp % 2;
    float acc[2][4][4] = {};
    for (int half = 0; half < 2; half++) {
        if (half == 0) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();  // every thread's copies of this half are done
        for (int k0 = 32 * half; k0 < 32 * half + 32; k0 += 16) {
            uint32_t a[2][4], b[4][2];
            for (int mi = 0; mi < 2; mi++)  // lane l: row l % 16 of the 16×16 tile, column 8 · (l / 16)
                ldmatrix_x4(a[mi], &sA[32 * wm + 16 * mi + lane % 16][k0 + 8 * (lane / 16)]);
            for (int ni = 0; ni < 4; ni += 2) {
                // Matrices: k 0-7 / 8-15 of n-tile ni, then of n-tile ni + 1 (lanes 8j..8j+7 give rows).
                uint32_t r[4];
                ldmatrix_x4_trans(r, &sB[k0 + lane % 8 + 8 * ((lane / 8) % 2)][32 * wn + 8 * (ni + lane / 16)]);
                b[ni][0] = r[0];
                b[ni][1] = r[1];
                b[ni + 1][0] = r[2];
                b[ni + 1][1] = r[3];
            }
            for (int mi = 0; mi < 2; mi++)
                for (int ni = 0; ni < 4; ni++) mma_m16n8k16<T>(acc[mi][ni], a[mi], b[ni], acc[mi][ni]);
        }
    }
    int group = lane / 4, in_group = lane % 4;
    for (int mi = 0; mi < 2; mi++)
        for (int ni = 0; ni < 4; ni++)
            for (int i = 0; i < 4; i++) {
                int r = 32 * wm + 16 * mi + group + 8 * (i / 2), c = 32 * wn + 8 * ni + 2 * in_group + i % 2;
                D[r * kTile + c] = acc[mi][ni][i];
            }
}

template <class T>
static void test_gemm_tile() {
    std::vector<T> A = th::random_tensor<T>(kTile * kTile, 11), B = th::random_tensor<T>(kTile * kTile, 12);
    th::DeviceBuffer<T> dA(A), dB(B);
    th::DeviceBuffer<float> dD(kTile * kTile, th::Fill::NaN);
    char name[128];
    snprintf(name, sizeof(name), "64x64x64 %s GEMM tile (cp.async + ldmatrix + mma) vs fp64 reference",
             th::dtype_name<T>());
    std::vector<float> D = th::run_orders(name, [&] {
        cudaLaunchConfig_t cfg = one_block(128);
        cudaCheck(cudaLaunchKernelEx(&cfg, gemm_tile_kernel<T>, (const T*)dA.ptr, (const T*)dB.ptr, dD.ptr));
        cudaCheck(cudaDeviceSynchronize());
        return dD.host();
    });
    std::vector<double> a = th::widen(A), b = th::widen(B), ref(kTile * kTile), budget(kTile * kTile);
    for (int r = 0; r < kTile; r++)
        for (int c = 0; c < kTile; c++) {
            double acc = 0, sum_abs = 0;
            for (int k = 0; k < kTile; k++) {
                acc += a[r * kTile + k] * b[k * kTile + c];
                sum_abs += std::fabs(a[r * kTile + k] * b[k * kTile + c]);
            }
            ref[r * kTile + c] = acc;
            budget[r * kTile + c] = kTile * th::EPS_FP32 * sum_abs;
        }
    th::check_budget(name, ref, D, budget);
}

// ----------------------------------------------------------------------------
// 5. (CPU backend) what a GPU leaves undefined stops the run with a message

#if defined(SIMT_CPU)
__global__ void ldmatrix_misaligned_kernel(uint32_t* out) {
    alignas(16) __shared__ uint16_t rows[8][8];
    rows[threadIdx.x % 8][threadIdx.x / 8 % 8] = 0;
    __syncwarp();
    uint32_t r[1];
    ldmatrix_x1(r, (const char*)rows[threadIdx.x % 8] + (threadIdx.x == 3 ? 2 : 0));  // lane 3: 2 bytes off
    out[threadIdx.x] = r[0];
}
template <class T>
__global__ void mma_half_warp_kernel(float* out) {
    uint32_t a[4] = {}, b[2] = {};
    float acc[4] = {};
    mma_m16n8k16<T>(acc, a, b, acc);  // launched with 16 threads: the warp is not whole
    out[threadIdx.x] = acc[0];
}
__global__ void cp_async_misaligned_kernel(const char* src) {
    alignas(16) __shared__ char buf[32];
    cp_async_16(buf, src + 8);
    cp_async_commit();
    cp_async_wait<0>();
}
__global__ void cp_async_to_global_kernel(char* dst, const char* src) {
    cp_async_16(dst, src);
    cp_async_wait<0>();
}

__global__ void prefetch_shared_kernel() {
    __shared__ float buf[32];
    prefetch_l2(&buf[threadIdx.x]);  // prefetch.global.L2 of a shared-memory address
}

static void test_faults() {
    if (!th::can_run_fault_tests()) return;
    th::DeviceBuffer<uint32_t> dout(32);
    th::DeviceBuffer<float> dfloat(32);
    th::DeviceBuffer<char> dsrc(64), ddst(64);
    cudaLaunchConfig_t warp = one_block(32), half = one_block(16);
    th::expect_fault("fault: ldmatrix row address not 16-byte aligned", "lane 3's row address",
                     [&] { cudaLaunchKernelEx(&warp, ldmatrix_misaligned_kernel, dout.ptr); });
    th::expect_fault("fault: mma by a 16-thread block", "needs all 32 lanes of the warp",
                     [&] { cudaLaunchKernelEx(&half, mma_half_warp_kernel<__nv_bfloat16>, dfloat.ptr); });
    th::expect_fault("fault: cp.async from a misaligned source", "must be 16-byte aligned",
                     [&] { cudaLaunchKernelEx(&warp, cp_async_misaligned_kernel, (const char*)dsrc.ptr); });
    th::expect_fault("fault: cp.async into global memory", "it must be shared memory",
                     [&] { cudaLaunchKernelEx(&warp, cp_async_to_global_kernel, ddst.ptr, (const char*)dsrc.ptr); });
    th::expect_fault("fault: L2 prefetch of shared memory", "must be global (device) memory",
                     [&] { cudaLaunchKernelEx(&warp, prefetch_shared_kernel); });
}
#endif

int main() {
    test_mma_layouts<__nv_bfloat16>();
    test_mma_layouts<__half>();
    test_mma_random<__nv_bfloat16>(1);
    test_mma_random<__half>(2);
    test_ldmatrix<1, false>();
    test_ldmatrix<2, false>();
    test_ldmatrix<4, false>();
    test_ldmatrix<1, true>();
    test_ldmatrix<2, true>();
    test_ldmatrix<4, true>();
    test_cp_async();
    test_red_add();
    test_last_to_arrive();
    test_gemm_tile<__nv_bfloat16>();
    test_gemm_tile<__half>();
#if defined(SIMT_CPU)
    test_faults();
#endif
    return th::finish();
}
