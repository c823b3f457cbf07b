// test/simt/test_wmma.cu — tests the WMMA API (nvcuda::wmma) kernels rely on: every shape × type ×
// layout combination against CPU references, element-wise fragment ops, a multi-tile GEMM with
// several warps per block, __float_to_tf32 rounding, and (CPU backend) the documented faults and
// the scrambled fragment order, with planted bugs that depend on it.
//
// Tolerance. With the CPU backend, mma_sync is *defined* as C plus the exact fp32 products of the
// inputs (tf32 inputs rounded as __float_to_tf32 rounds) added one at a time in k order with fp32
// rounding, then rounded to __half for __half accumulators. The references below do exactly those
// operations in that order, so any difference at all is a bug: the budget is 0 (atol = rtol = 0).
// On a GPU, tensor cores add the products in their own order and with their own rounding, so a
// GPU run (nvcc build) instead allows K·eps_fp32·max Σ|a·b| absolute, plus one ulp of the output
// type per rounding to __half.
//
// Schedule and fragment order: with the CPU backend each product test runs under three fragment
// orders (which tile element each x[i] holds, see llmc/simt/include/mma.h) and must be exact under
// each. Each run prints a digest of every output buffer; the same digest under SIMT_ORDER=forward
// and SIMT_ORDER=reverse (or two SIMT_FRAGMENT_ORDER values) shows the results do not depend on
// the order in which lanes run between sync points (or on the fragment orders).
//
// Build and run (CPU backend): make build/cpu/test_wmma && build/cpu/test_wmma
// nvcc (compile check): nvcc -std=c++17 -arch=sm_80 -c test/simt/test_wmma.cu
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../harness.h"

using namespace nvcuda;
using tf32 = wmma::precision::tf32;

// ----------------------------------------------------------------------------
// Fragment sizes: the per-lane element counts must be CUDA's (the same asserts hold under nvcc)

#define FRAG_N(use, m, n, k, T, L) wmma::fragment<wmma::use, m, n, k, T, L>::num_elements
static_assert(FRAG_N(matrix_a, 16, 16, 16, __half, wmma::row_major) == 16, "");
static_assert(FRAG_N(matrix_b, 16, 16, 16, __half, wmma::col_major) == 16, "");
static_assert(FRAG_N(matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major) == 8, "");
static_assert(FRAG_N(matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major) == 8, "");
static_assert(FRAG_N(accumulator, 16, 16, 16, float, void) == 8, "");
static_assert(FRAG_N(accumulator, 16, 16, 16, __half, void) == 8, "");
static_assert(FRAG_N(matrix_a, 32, 8, 16, __half, wmma::row_major) == 16, "");
static_assert(FRAG_N(matrix_b, 32, 8, 16, __half, wmma::row_major) == 16, "");
static_assert(FRAG_N(matrix_a, 32, 8, 16, __nv_bfloat16, wmma::col_major) == 16, "");
static_assert(FRAG_N(matrix_b, 32, 8, 16, __nv_bfloat16, wmma::col_major) == 4, "");
static_assert(FRAG_N(accumulator, 32, 8, 16, float, void) == 8, "");
static_assert(FRAG_N(matrix_a, 8, 32, 16, __half, wmma::col_major) == 16, "");
static_assert(FRAG_N(matrix_b, 8, 32, 16, __half, wmma::col_major) == 16, "");
static_assert(FRAG_N(matrix_a, 8, 32, 16, __nv_bfloat16, wmma::row_major) == 4, "");
static_assert(FRAG_N(matrix_b, 8, 32, 16, __nv_bfloat16, wmma::row_major) == 16, "");
static_assert(FRAG_N(accumulator, 8, 32, 16, __half, void) == 8, "");
static_assert(FRAG_N(matrix_a, 16, 16, 8, tf32, wmma::row_major) == 4, "");
static_assert(FRAG_N(matrix_b, 16, 16, 8, tf32, wmma::col_major) == 4, "");
static_assert(FRAG_N(accumulator, 16, 16, 8, float, void) == 8, "");
static_assert(std::is_same<wmma::fragment<wmma::matrix_a, 16, 16, 8, tf32, wmma::row_major>::storage_element_type,
                           float>::value, "tf32 elements are stored in floats");

// ----------------------------------------------------------------------------
// Element types: storage, conversions, and the value the tensor core multiplies

__host__ __device__ inline float to_f(float v) { return v; }
__host__ __device__ inline float to_f(__half v) { return __half2float(v); }
__host__ __device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class S> __host__ __device__ inline S from_f(float v);
template <> __host__ __device__ inline float from_f<float>(float v) { return v; }
template <> __host__ __device__ inline __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __host__ __device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// tf32 rounding written independently of the backend's bit trick: scale the significand to 11
// bits and round half away from zero (std::round), as cvt.rna does. Valid for normal numbers.
static float tf32_ref(float x) {
    int e;
    double m = std::frexp((double)x, &e);  // x = m * 2^e, 0.5 <= |m| < 1
    return (float)std::ldexp(std::round(m * 2048.0), e - 11);
}

// Input element T of a fragment: its storage type S and the fp32 value a stored S stands for.
template <class T> struct In {
    using S = T;
    static float operand(S v) { return to_f(v); }
};
template <> struct In<tf32> {
    using S = float;
    static float operand(float v) { return tf32_ref(v); }
};
template <class T> const char* type_name();
template <> const char* type_name<__half>() { return "half"; }
template <> const char* type_name<__nv_bfloat16>() { return "bf16"; }
template <> const char* type_name<tf32>() { return "tf32"; }
template <> const char* type_name<float>() { return "float"; }
template <class L> const char* layout_name() { return std::is_same<L, wmma::row_major>::value ? "row" : "col"; }

// ----------------------------------------------------------------------------
// Host helpers

// Lays a logical rows×cols matrix (row by row in `logical`) out in memory with leading dim ld.
template <class S> void scatter(std::vector<S>& mem, size_t off, const std::vector<S>& logical, int rows, int cols,
                                bool row_major, int ld) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) mem[off + (row_major ? (size_t)r * ld + c : (size_t)c * ld + r)] = logical[r * cols + c];
}
template <class S> std::vector<float> gather(const std::vector<S>& mem, size_t off, int rows, int cols, bool row_major,
                                             int ld) {
    std::vector<float> out((size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) out[r * cols + c] = to_f(mem[off + (row_major ? (size_t)r * ld + c : (size_t)c * ld + r)]);
    return out;
}

static uint64_t g_seed = 1000;  // each test draws fresh inputs

// Digest of every output buffer, printed at the end to compare runs under different orders.
static uint64_t g_digest = 1469598103934665603ull;
static void digest(const void* p, size_t bytes) {
    const unsigned char* b = (const unsigned char*)p;
    for (size_t i = 0; i < bytes; i++) g_digest = (g_digest ^ b[i]) * 1099511628211ull;
}

// Budget for comparing an mma result with its fp32 k-order reference (see the file comment).
static th::Tol mma_tol(double max_sum_abs, int K, int half_roundings) {
#ifdef SIMT_CPU
    (void)max_sum_abs, (void)K, (void)half_roundings;
    return th::Tol{0.0, 0.0};
#else
    return th::Tol{K * th::EPS_FP32 * max_sum_abs + half_roundings * th::EPS_FP16 * max_sum_abs,
                   half_roundings * th::EPS_FP16};
#endif
}

// The fragment orders each product test runs under. With the CPU backend, the process's
// (SIMT_FRAGMENT_ORDER) and the next two seeds, as in th::run_orders, so that every fragment type
// and layout gives the exact product under three mappings of x[i] to tile elements; on a GPU, its
// one mapping.
#ifdef SIMT_CPU
constexpr int kFragmentOrders = 3;
#define ORDERS_NOTE ", 3 fragment orders"
#else
constexpr int kFragmentOrders = 1;
#define ORDERS_NOTE ""
#endif

// Runs launch() (launches, returns the outputs as floats) under each fragment order; returns the
// outputs one after another.
template <class F>
static std::vector<float> under_fragment_orders(F launch) {
    std::vector<float> all;
#ifdef SIMT_CPU
    uint64_t order = simt::get_fragment_order();
    for (int o = 0; o < kFragmentOrders; o++) {
        simt::set_fragment_order(order + o);
        std::vector<float> out = launch();
        all.insert(all.end(), out.begin(), out.end());
    }
    simt::set_fragment_order(order);
#else
    all = launch();
#endif
    return all;
}

// v repeated `times` times, one copy after another.
static std::vector<float> repeat(const std::vector<float>& v, int times) {
    std::vector<float> out;
    for (int t = 0; t < times; t++) out.insert(out.end(), v.begin(), v.end());
    return out;
}

// ----------------------------------------------------------------------------
// Test 1: __float_to_tf32

__global__ void tf32_kernel(const float* in, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = wmma::__float_to_tf32(in[i]);
}

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void test_float_to_tf32() {
    // Hand-checked cases: ties round away from zero (cvt.rna), not to even.
    const uint32_t cases[][2] = {
        {0x3f800000u, 0x3f800000u},  // 1.0 stays
        {0x3f801000u, 0x3f802000u},  // 1 + 2^-11: a tie, away from zero -> 1 + 2^-10 (rn would give 1)
        {0xbf801000u, 0xbf802000u},  // -(1 + 2^-11) -> -(1 + 2^-10)
        {0x3f800fffu, 0x3f800000u},  // just below the tie -> down
        {0x3f801001u, 0x3f802000u},  // just above the tie -> up
        {0x3f803000u, 0x3f804000u},  // tie with odd kept mantissa -> up (rn agrees)
        {0x3f7ff000u, 0x3f800000u},  // rounds up across the exponent: 1 - 2^-12 -> 1
        {0x7f7fffffu, 0x7f800000u},  // FLT_MAX -> +Inf (no saturation, as cvt.rna without .satfinite)
        {0x7f800000u, 0x7f800000u},  // +Inf stays
        {0xff800000u, 0xff800000u},  // -Inf stays
        {0x00000000u, 0x00000000u},  // +0
        {0x80000000u, 0x80000000u},  // -0
        {0x00001fffu, 0x00002000u},  // subnormal rounds up to the tf32 subnormal grid
        {0x00000fffu, 0x00000000u},  // tiny subnormal rounds to zero
    };
    const int nc = sizeof(cases) / sizeof(cases[0]);
    const int nr = 4096;  // random normal values, checked against the independent frexp reference
    int n = nc + 1 + nr;  // + one quiet NaN
    std::vector<float> h(n);
    for (int i = 0; i < nc; i++) h[i] = bits_f(cases[i][0]);
    h[nc] = bits_f(0x7fc00123u);
    th::fill_uniform(h.data() + nc + 1, nr, 7, -1000.f, 1000.f);
    th::DeviceBuffer<float> din(h), dout(n);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((n + 127) / 128);
    cfg.blockDim = dim3(128);
    cudaCheck(cudaLaunchKernelEx(&cfg, tf32_kernel, (const float*)din.ptr, dout.ptr, n));
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> out = dout.host();
    digest(out.data(), n * sizeof(float));
    int bad = 0, first_bad = -1;
    for (int i = 0; i < nc; i++)
        if (f_bits(out[i]) != cases[i][1] && bad++ == 0) first_bad = i;
    bool nan_ok = std::isnan(out[nc]);
    int bad_rand = 0;
    for (int i = nc + 1; i < n; i++) bad_rand += f_bits(out[i]) != f_bits(tf32_ref(h[i])) || (f_bits(out[i]) & 0x1fffu);
    char detail[160];
    snprintf(detail, sizeof(detail), "%d hand-checked cases (%d wrong, first %d), NaN %s, %d random vs frexp reference (%d wrong)",
             nc, bad, first_bad, nan_ok ? "stays NaN" : "LOST", nr, bad_rand);
    th::report(bad == 0 && nan_ok && bad_rand == 0, "float_to_tf32", "%s", detail);
}

// ----------------------------------------------------------------------------
// Test 2: one tile per warp, every shape × input type × A/B layout × C/D type; the 4 warps of a
// block use the 4 combinations of C and D memory layouts (and the per-warp mma scratch).

template <int M, int N, int K, class T, class LA, class LB, class TC, class TD>
__global__ void tile_kernel(const typename In<T>::S* A, unsigned lda, const typename In<T>::S* B, unsigned ldb,
                            const TC* C, unsigned ldc, size_t c_stride, TD* D, unsigned ldd, size_t d_stride) {
    unsigned warp = threadIdx.x / 32;
    wmma::layout_t c_layout = (warp & 1) ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::layout_t d_layout = (warp & 2) ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::fragment<wmma::matrix_a, M, N, K, T, LA> a;
    wmma::fragment<wmma::matrix_b, M, N, K, T, LB> b;
    wmma::fragment<wmma::accumulator, M, N, K, TC> c;
    wmma::fragment<wmma::accumulator, M, N, K, TD> d;
    wmma::load_matrix_sync(a, A, lda);
    wmma::load_matrix_sync(b, B, ldb);
    if constexpr (std::is_same<T, tf32>::value) {  // as CUDA's samples: convert after loading
        for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);
        for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
    }
    wmma::load_matrix_sync(c, C + warp * c_stride, ldc, c_layout);
    wmma::mma_sync(d, a, b, c);
    wmma::store_matrix_sync(D + warp * d_stride, d, ldd, d_layout);
}

template <int M, int N, int K, class T, class LA, class LB, class TC, class TD>
static void test_tile() {
    using S = typename In<T>::S;
    constexpr bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    constexpr int pad = 16 / sizeof(S);  // keeps ldm a multiple of 16 bytes, but not the tile width
    const int lda = (a_row ? K : M) + pad, ldb = (b_row ? N : K) + pad;
    const int ldc = (M > N ? M : N) + 16 / (int)sizeof(TC), ldd = (M > N ? M : N) + 16 / (int)sizeof(TD);
    const size_t c_stride = (size_t)ldc * (M > N ? M : N), d_stride = (size_t)ldd * (M > N ? M : N);
    uint64_t seed = ++g_seed;
    std::vector<S> a_log = th::random_tensor<S>((size_t)M * K, seed * 3), b_log = th::random_tensor<S>((size_t)K * N, seed * 3 + 1);
    std::vector<TC> c_log = th::random_tensor<TC>((size_t)M * N, seed * 3 + 2);
    std::vector<S> a_mem((size_t)lda * (a_row ? M : K)), b_mem((size_t)ldb * (b_row ? K : N));
    scatter(a_mem, 0, a_log, M, K, a_row, lda);
    scatter(b_mem, 0, b_log, K, N, b_row, ldb);
    std::vector<TC> c_mem(4 * c_stride, from_f<TC>(0.f));
    for (int w = 0; w < 4; w++) scatter(c_mem, w * c_stride, c_log, M, N, !(w & 1), ldc);

    // Reference: C + Σ_k a·b in k order, fp32, then rounded to TD.
    std::vector<float> ref((size_t)M * N);
    double max_sum_abs = 0;
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float acc = to_f(c_log[r * N + c]);
            double sum_abs = std::fabs(acc);
            for (int k = 0; k < K; k++) {
                float p = In<T>::operand(a_log[r * K + k]) * In<T>::operand(b_log[k * N + c]);
                acc += p;
                sum_abs += std::fabs(p);
            }
            ref[r * N + c] = to_f(from_f<TD>(acc));
            if (sum_abs > max_sum_abs) max_sum_abs = sum_abs;
        }

    th::DeviceBuffer<S> dA(a_mem), dB(b_mem);
    th::DeviceBuffer<TC> dC(c_mem);
    std::vector<float> out = under_fragment_orders([&] {
        th::DeviceBuffer<TD> dD(4 * d_stride, th::Fill::Zero);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(128);
        cudaCheck(cudaLaunchKernelEx(&cfg, tile_kernel<M, N, K, T, LA, LB, TC, TD>, (const S*)dA.ptr, (unsigned)lda,
                                     (const S*)dB.ptr, (unsigned)ldb, (const TC*)dC.ptr, (unsigned)ldc, c_stride,
                                     dD.ptr, (unsigned)ldd, d_stride));
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaDeviceSynchronize());
        std::vector<TD> d_mem = dD.host();
        digest(d_mem.data(), d_mem.size() * sizeof(TD));
        std::vector<float> warps;  // the 4 warps' results, one after another
        for (int w = 0; w < 4; w++) {
            std::vector<float> o = gather(d_mem, w * d_stride, M, N, !(w & 2), ldd);
            warps.insert(warps.end(), o.begin(), o.end());
        }
        return warps;
    });
    std::vector<float> refs = repeat(ref, 4 * kFragmentOrders);
    char name[160];
    snprintf(name, sizeof(name), "tile m%dn%dk%d %s A=%s B=%s C=%s D=%s (C,D layouts row/col x4 warps" ORDERS_NOTE ")",
             M, N, K, type_name<T>(), layout_name<LA>(), layout_name<LB>(), type_name<TC>(), type_name<TD>());
    th::check_close(name, refs.data(), out.data(), out.size(),
                    mma_tol(max_sum_abs, K, std::is_same<TD, __half>::value ? 1 : 0));
}

template <int M, int N, int K, class T, class TC, class TD>
static void test_tile_layouts() {
    test_tile<M, N, K, T, wmma::row_major, wmma::row_major, TC, TD>();
    test_tile<M, N, K, T, wmma::row_major, wmma::col_major, TC, TD>();
    test_tile<M, N, K, T, wmma::col_major, wmma::row_major, TC, TD>();
    test_tile<M, N, K, T, wmma::col_major, wmma::col_major, TC, TD>();
}

template <int M, int N, int K>
static void test_tile_16bit_shape() {
    test_tile_layouts<M, N, K, __half, float, float>();
    test_tile_layouts<M, N, K, __half, __half, __half>();
    test_tile_layouts<M, N, K, __half, float, __half>();
    test_tile_layouts<M, N, K, __half, __half, float>();
    test_tile_layouts<M, N, K, __nv_bfloat16, float, float>();
}

// ----------------------------------------------------------------------------
// Test 3: element-wise operations cover every element of a fragment exactly once (copies of
// replicated __half elements included): A built as 0 + 1 per element, B filled with 1, so
// D = A·B = K everywhere iff every A element became exactly 1; then D = 2D + 1, and a second
// accumulator built by += 1 per element must store as all ones.

template <int M, int N, int K, class T>
__global__ void elementwise_kernel(float* D, float* ones) {
    using S = typename In<T>::S;
    wmma::fragment<wmma::matrix_a, M, N, K, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, M, N, K, T, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, M, N, K, float> acc, cnt;
    wmma::fill_fragment(a, from_f<S>(0.f));
    for (int i = 0; i < a.num_elements; i++) a.x[i] = from_f<S>(to_f(a.x[i]) + 1.f);
    wmma::fill_fragment(b, from_f<S>(1.f));
    wmma::fill_fragment(acc, 0.f);
    wmma::mma_sync(acc, a, b, acc);
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] = 2.f * acc.x[i] + 1.f;
    wmma::store_matrix_sync(D, acc, N, wmma::mem_row_major);
    wmma::fill_fragment(cnt, 0.f);
    for (int i = 0; i < cnt.num_elements; i++) cnt.x[i] += 1.f;
    wmma::store_matrix_sync(ones, cnt, M, wmma::mem_col_major);
}

template <int M, int N, int K, class T>
static void test_elementwise() {
    std::vector<float> out = under_fragment_orders([&] {
        th::DeviceBuffer<float> dD(M * N, th::Fill::Zero), dO(M * N, th::Fill::Zero);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, elementwise_kernel<M, N, K, T>, dD.ptr, dO.ptr));
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> d = dD.host(), o = dO.host();
        digest(d.data(), d.size() * 4);
        digest(o.data(), o.size() * 4);
        d.insert(d.end(), o.begin(), o.end());
        return d;
    });
    std::vector<float> ref((size_t)2 * M * N);
    for (int i = 0; i < M * N; i++) ref[i] = 2.f * K + 1.f, ref[M * N + i] = 1.f;
    std::vector<float> refs = repeat(ref, kFragmentOrders);
    char name[128];
    snprintf(name, sizeof(name), "elementwise m%dn%dk%d %s (each element once: D=2K+1, count=1" ORDERS_NOTE ")", M, N, K,
             type_name<T>());
    th::check_close(name, refs.data(), out.data(), out.size(), th::Tol{0.0, 0.0});  // small integers: exact anywhere
}

// ----------------------------------------------------------------------------
// Test 4: back-to-back mma_sync calls with no barrier in between, D = A0·B0 + A1·B1 + A2·B2: a
// lane may only start publishing the next A and B once every lane has read the previous ones.

template <int M, int N, int K, class T>
__global__ void chain_kernel(const typename In<T>::S* A, const typename In<T>::S* B, float* D) {
    wmma::fragment<wmma::matrix_a, M, N, K, T, wmma::row_major> a[3];
    wmma::fragment<wmma::matrix_b, M, N, K, T, wmma::row_major> b[3];
    wmma::fragment<wmma::accumulator, M, N, K, float> acc;
    for (int s = 0; s < 3; s++) {
        wmma::load_matrix_sync(a[s], A + s * M * K, K);
        wmma::load_matrix_sync(b[s], B + s * K * N, N);
    }
    wmma::fill_fragment(acc, 0.f);
    for (int s = 0; s < 3; s++) wmma::mma_sync(acc, a[s], b[s], acc);
    wmma::store_matrix_sync(D, acc, N, wmma::mem_row_major);
}

template <int M, int N, int K, class T>
static void test_chain() {
    using S = typename In<T>::S;
    uint64_t seed = ++g_seed;
    std::vector<S> a = th::random_tensor<S>((size_t)3 * M * K, seed * 3), b = th::random_tensor<S>((size_t)3 * K * N, seed * 3 + 1);
#ifndef SIMT_CPU
    // The kernel does not call __float_to_tf32. A GPU's handling of unconverted tf32 operands is
    // not documented (it may drop the low bits), so on a GPU feed values that are already tf32.
    if constexpr (std::is_same<T, tf32>::value)
        for (auto* v : {&a, &b})
            for (float& x : *v) x = tf32_ref(x);
#endif
    std::vector<float> ref((size_t)M * N);
    double max_sum_abs = 0;
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float acc = 0.f;
            double sum_abs = 0;
            for (int s = 0; s < 3; s++)
                for (int k = 0; k < K; k++) {
                    float p = In<T>::operand(a[s * M * K + r * K + k]) * In<T>::operand(b[s * K * N + k * N + c]);
                    acc += p;
                    sum_abs += std::fabs(p);
                }
            ref[r * N + c] = acc;
            if (sum_abs > max_sum_abs) max_sum_abs = sum_abs;
        }
    th::DeviceBuffer<S> dA(a), dB(b);
    std::vector<float> out = under_fragment_orders([&] {
        th::DeviceBuffer<float> dD((size_t)M * N);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, chain_kernel<M, N, K, T>, (const S*)dA.ptr, (const S*)dB.ptr, dD.ptr));
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> d = dD.host();
        digest(d.data(), d.size() * 4);
        return d;
    });
    std::vector<float> refs = repeat(ref, kFragmentOrders);
    char name[160];
    snprintf(name, sizeof(name), "chain of 3 mma_sync m%dn%dk%d %s (no barrier between calls%s" ORDERS_NOTE ")", M, N, K,
             type_name<T>(),
#ifdef SIMT_CPU
             std::is_same<T, tf32>::value ? "; unconverted fp32 operands, rounded by mma_sync" : "");
#else
             "");
#endif
    th::check_close(name, refs.data(), out.data(), out.size(), mma_tol(max_sum_abs, 3 * K, 0));
}

// ----------------------------------------------------------------------------
// Test 5: a multi-tile GEMM, D = act(alpha·A·B + beta·C), WM×WN warps per block, each warp one
// tile; A and B staged through shared memory (A row-major, B column-major, padded rows so each
// warp's tile starts 256-bit aligned), C and D in global memory in either layout.

template <int TM, int TN, int TK, int WM, int WN, class T, class TACC>
__global__ void gemm_kernel(const typename In<T>::S* A, int a_row, const typename In<T>::S* B, int b_row,
                            const TACC* C, int c_row, TACC* D, int d_row, int M, int N, int K, float alpha,
                            float beta, int relu) {
    using S = typename In<T>::S;
    constexpr int BM = WM * TM, BN = WN * TN;
    constexpr int LDS = TK + 16 / (int)sizeof(S);  // padded shared rows: a multiple of 16 bytes
    alignas(32) __shared__ S sA[BM * LDS];  // (BM, TK) row-major; alignas first: g++ rejects it after thread_local
    alignas(32) __shared__ S sB[BN * LDS];  // (TK, BN) column-major: column n at sB + n*LDS
    int warp = threadIdx.x / 32, wm = warp / WN, wn = warp % WN;
    int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    wmma::fragment<wmma::matrix_a, TM, TN, TK, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, TM, TN, TK, T, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, TM, TN, TK, TACC> acc, c;
    wmma::fill_fragment(acc, from_f<TACC>(0.f));
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int i = threadIdx.x; i < BM * TK; i += blockDim.x) {
            int r = i / TK, kk = i % TK, gm = m0 + r, gk = k0 + kk;
            sA[r * LDS + kk] = a_row ? A[(size_t)gm * K + gk] : A[(size_t)gk * M + gm];
        }
        for (int i = threadIdx.x; i < BN * TK; i += blockDim.x) {
            int n = i / TK, kk = i % TK, gn = n0 + n, gk = k0 + kk;
            sB[n * LDS + kk] = b_row ? B[(size_t)gk * N + gn] : B[(size_t)gn * K + gk];
        }
        __syncthreads();
        wmma::load_matrix_sync(a, sA + wm * TM * LDS, LDS);
        wmma::load_matrix_sync(b, sB + wn * TN * LDS, LDS);
        if constexpr (std::is_same<T, tf32>::value) {
            for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);
            for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
        }
        wmma::mma_sync(acc, a, b, acc);
        __syncthreads();  // the next k step overwrites sA/sB
    }
    int gm = m0 + wm * TM, gn = n0 + wn * TN;
    const TACC* c_tile = c_row ? C + (size_t)gm * N + gn : C + (size_t)gn * M + gm;
    wmma::load_matrix_sync(c, c_tile, c_row ? N : M, c_row ? wmma::mem_row_major : wmma::mem_col_major);
    for (int i = 0; i < acc.num_elements; i++) {
        float v = fmaf(alpha, to_f(acc.x[i]), beta * to_f(c.x[i]));
        acc.x[i] = from_f<TACC>(relu && v < 0.f ? 0.f : v);
    }
    TACC* d_tile = d_row ? D + (size_t)gm * N + gn : D + (size_t)gn * M + gm;
    wmma::store_matrix_sync(d_tile, acc, d_row ? N : M, d_row ? wmma::mem_row_major : wmma::mem_col_major);
}

template <int TM, int TN, int TK, int WM, int WN, class T, class TACC>
static void test_gemm(int M, int N, int K, bool a_row, bool b_row, bool c_row, bool d_row, bool relu) {
    using S = typename In<T>::S;
    constexpr int BM = WM * TM, BN = WN * TN;
    const float alpha = 0.75f, beta = -0.5f;
    uint64_t seed = ++g_seed;
    std::vector<S> a_log = th::random_tensor<S>((size_t)M * K, seed * 3), b_log = th::random_tensor<S>((size_t)K * N, seed * 3 + 1);
    std::vector<TACC> c_log = th::random_tensor<TACC>((size_t)M * N, seed * 3 + 2);
    std::vector<S> a_mem((size_t)M * K), b_mem((size_t)K * N);
    std::vector<TACC> c_mem((size_t)M * N);
    scatter(a_mem, 0, a_log, M, K, a_row, a_row ? K : M);
    scatter(b_mem, 0, b_log, K, N, b_row, b_row ? N : K);
    scatter(c_mem, 0, c_log, M, N, c_row, c_row ? N : M);

    // Reference: per k step of TK, acc = round_TACC(acc + Σ products in k order); then the epilogue.
    std::vector<float> ref((size_t)M * N);
    double max_sum_abs = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            TACC acc = from_f<TACC>(0.f);
            double sum_abs = 0;
            for (int k0 = 0; k0 < K; k0 += TK) {
                float s = to_f(acc);
                for (int k = k0; k < k0 + TK; k++) {
                    float p = In<T>::operand(a_log[m * K + k]) * In<T>::operand(b_log[k * N + n]);
                    s += p;
                    sum_abs += std::fabs(p);
                }
                acc = from_f<TACC>(s);
            }
            float v = std::fmaf(alpha, to_f(acc), beta * to_f(c_log[m * N + n]));
            ref[m * N + n] = to_f(from_f<TACC>(relu && v < 0.f ? 0.f : v));
            if (sum_abs > max_sum_abs) max_sum_abs = sum_abs;
        }

    th::DeviceBuffer<S> dA(a_mem), dB(b_mem);
    th::DeviceBuffer<TACC> dC(c_mem);
    std::vector<float> out = under_fragment_orders([&] {
        th::DeviceBuffer<TACC> dD((size_t)M * N, th::Fill::Zero);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(N / BN, M / BM);
        cfg.blockDim = dim3(32 * WM * WN);
        cudaCheck(cudaLaunchKernelEx(&cfg, gemm_kernel<TM, TN, TK, WM, WN, T, TACC>, (const S*)dA.ptr, (int)a_row,
                                     (const S*)dB.ptr, (int)b_row, (const TACC*)dC.ptr, (int)c_row, dD.ptr, (int)d_row,
                                     M, N, K, alpha, beta, (int)relu));
        cudaCheck(cudaGetLastError());
        cudaCheck(cudaDeviceSynchronize());
        std::vector<TACC> d_mem = dD.host();
        digest(d_mem.data(), d_mem.size() * sizeof(TACC));
        return gather(d_mem, 0, M, N, d_row, d_row ? N : M);
    });
    std::vector<float> refs = repeat(ref, kFragmentOrders);
    char name[200];
    snprintf(name, sizeof(name), "gemm %dx%dx%d m%dn%dk%d %s acc=%s, %dx%d warps/block, A=%s B=%s C=%s D=%s%s" ORDERS_NOTE,
             M, N, K, TM, TN, TK, type_name<T>(), type_name<TACC>(), WM, WN, a_row ? "row" : "col",
             b_row ? "row" : "col", c_row ? "row" : "col", d_row ? "row" : "col", relu ? " relu" : "");
    int half_roundings = std::is_same<TACC, __half>::value ? K / TK + 1 : 0;
    th::check_close(name, refs.data(), out.data(), out.size(), mma_tol(max_sum_abs, K, half_roundings));
}

// ----------------------------------------------------------------------------
// Test 6 (CPU backend only): the preconditions a GPU would not report are faults with a message.

#ifdef SIMT_CPU
__global__ void misaligned_kernel(const __half* A) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::load_matrix_sync(a, A + 8, 16);  // 16 bytes past a 256-byte boundary
}
__global__ void bad_ldm_kernel(float* D) {
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
    wmma::fill_fragment(acc, 1.f);
    wmma::store_matrix_sync(D, acc, 18, wmma::mem_row_major);  // 18 floats: not a multiple of 4
}
__global__ void divergent_mma_kernel(float* D) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(a, __float2half(1.f));
    wmma::fill_fragment(b, __float2half(1.f));
    wmma::fill_fragment(acc, 0.f);
    if (threadIdx.x < 16) wmma::mma_sync(acc, a, b, acc);  // half a warp: undefined on a GPU
    D[threadIdx.x] = acc.x[0];
}

static void test_faults() {
    if (!th::can_run_fault_tests()) return;
    th::DeviceBuffer<__half> dA(16 * 16 + 8);
    th::DeviceBuffer<float> dD(16 * 18);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    th::expect_fault("fault: misaligned load_matrix_sync", "is not 256-bit (32-byte) aligned",
                     [&] { cudaLaunchKernelEx(&cfg, misaligned_kernel, (const __half*)dA.ptr); });
    th::expect_fault("fault: store_matrix_sync ldm not a multiple of 16 bytes", "ldm=18 is not a multiple of 4",
                     [&] { cudaLaunchKernelEx(&cfg, bad_ldm_kernel, dD.ptr); });
    th::expect_fault("fault: mma_sync called by half a warp", "which has exited",
                     [&] { cudaLaunchKernelEx(&cfg, divergent_mma_kernel, dD.ptr); });
}
#endif

// ----------------------------------------------------------------------------
// Test 7 (CPU backend only): the fragment order. CUDA does not say which tile element x[i] of a
// lane holds, so the backend scrambles the mapping (SIMT_FRAGMENT_ORDER, see llmc/simt/include/mma.h).
// The slots of every accumulator type must map one-to-one onto the tile under each order, and two
// planted bugs that assume a mapping must be caught by th::run_orders, while the same product
// computed legally passes it.

#ifdef SIMT_CPU
// Writes each slot's own number (lane * num_elements + i) and stores the tile: out[e] is the slot
// that holds tile element e.
template <int M, int N, int K, class TACC>
__global__ void slot_map_kernel(TACC* D) {
    wmma::fragment<wmma::accumulator, M, N, K, TACC> acc;
    int lane = threadIdx.x % 32;
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] = from_f<TACC>((float)(lane * acc.num_elements + i));
    wmma::store_matrix_sync(D, acc, N, wmma::mem_row_major);
}

template <int M, int N, int K, class TACC>
static void test_slot_map() {
    uint64_t order = simt::get_fragment_order();
    const uint64_t orders[] = {0, order, order + 1, order + 2};  // identity, then what run_orders uses
    std::vector<std::vector<float>> maps;
    for (uint64_t o : orders) {
        simt::set_fragment_order(o);
        th::DeviceBuffer<TACC> dD((size_t)M * N, th::Fill::NaN);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(32);
        cudaCheck(cudaLaunchKernelEx(&cfg, slot_map_kernel<M, N, K, TACC>, dD.ptr));
        cudaCheck(cudaDeviceSynchronize());
        maps.push_back(gather(dD.host(), 0, M, N, true, N));  // slot numbers < 256: exact in __half
    }
    simt::set_fragment_order(order);
    bool one_to_one = true;
    for (auto& map : maps) {
        std::vector<int> seen(M * N, 0);
        for (float slot : map) one_to_one = one_to_one && slot >= 0 && slot < M * N && seen[(int)slot]++ == 0;
    }
    // The identity exactly under order 0, and a different map for each different order.
    bool distinct = true;
    for (size_t i = 0; i < maps.size(); i++) {
        bool identity = true;
        for (int e = 0; e < M * N; e++) identity = identity && maps[i][e] == (float)e;
        distinct = distinct && identity == (orders[i] == 0);
        for (size_t j = i + 1; j < maps.size(); j++)
            distinct = distinct && (maps[i] == maps[j]) == (orders[i] == orders[j]);
    }
    char name[160];
    snprintf(name, sizeof(name), "fragment order: accumulator m%dn%dk%d %s slots map onto the tile", M, N, K,
             type_name<TACC>());
    th::report(one_to_one && distinct, name,
               "under orders 0, %llu, %llu, %llu: one-to-one: %s; the identity for order 0 only, and one map per "
               "order: %s",
               (unsigned long long)orders[1], (unsigned long long)orders[2], (unsigned long long)orders[3],
               one_to_one ? "yes" : "NO", distinct ? "yes" : "NO");
}

// D = A·B for one 16×16×16 bf16 tile (A row-major, B column-major, both with leading dimension 16),
// written to D (row-major, 16×16 floats) in one of three ways.
enum Plant { kLegal, kAssumedLayout, kMixedTypes };
template <Plant P>
__global__ void plant_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* D) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(a, A, 16);
    wmma::load_matrix_sync(b, B, 16);
    wmma::fill_fragment(acc, 0.f);
    wmma::mma_sync(acc, a, b, acc);
    int lane = threadIdx.x % 32;
    if constexpr (P == kLegal) {
        wmma::store_matrix_sync(D, acc, 16, wmma::mem_row_major);
    } else if constexpr (P == kAssumedLayout) {
        // The bug: takes lane l's x[i] to be element l * 8 + i of the row-major tile.
        for (int i = 0; i < acc.num_elements; i++) D[lane * acc.num_elements + i] = acc.x[i];
    } else {
        // The bug: takes x[i] of a __half accumulator to be the same element as x[i] of a float one.
        wmma::fragment<wmma::accumulator, 16, 16, 16, __half> h;
        for (int i = 0; i < h.num_elements; i++) h.x[i] = __float2half_rn(acc.x[i]);
        alignas(32) __shared__ __half tile[16 * 16];
        wmma::store_matrix_sync(tile, h, 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 16 * 16; e += 32) D[e] = __half2float(tile[e]);
    }
}

// The planted kernels' inputs A (which = 0) and B (1): the same in every run.
static std::vector<__nv_bfloat16> plant_input(int which) { return th::random_tensor<__nv_bfloat16>(256, 71 + which); }

// Runs plant_kernel<P>; returns D.
template <Plant P>
static std::vector<float> run_plant() {
    th::DeviceBuffer<__nv_bfloat16> dA(plant_input(0)), dB(plant_input(1));
    th::DeviceBuffer<float> dD(256, th::Fill::NaN);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cudaCheck(cudaLaunchKernelEx(&cfg, plant_kernel<P>, (const __nv_bfloat16*)dA.ptr, (const __nv_bfloat16*)dB.ptr,
                                 dD.ptr));
    cudaCheck(cudaDeviceSynchronize());
    return dD.host();
}

// In a child process (test_wmma --plant NAME): the planted bug under th::run_orders, which must
// fail; returns the exit status.
static int run_planted(const std::string& name) {
    if (name == "assumed_layout") th::run_orders("planted assumed fragment layout", run_plant<kAssumedLayout>);
    else if (name == "mixed_types") th::run_orders("planted mixed fragment types", run_plant<kMixedTypes>);
    else th::report(false, "planted bug", "unknown name %s", name.c_str());
    return th::n_failed() ? 3 : 0;
}

// Each planted bug: hidden by the identity order (which was the backend's only mapping) and caught
// by run_orders under the scrambled ones.
static void test_planted(const char* self) {
    std::vector<float> legal =
        th::run_orders("fragment order: the legal kernel (store_matrix_sync)", run_plant<kLegal>);
    std::vector<double> ref(256);  // Σ_k in k order, in fp32, as mma_sync adds
    std::vector<__nv_bfloat16> a = plant_input(0), b = plant_input(1);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            float acc = 0.f;
            for (int k = 0; k < 16; k++) acc += to_f(a[r * 16 + k]) * to_f(b[c * 16 + k]);
            ref[r * 16 + c] = acc;
        }
    th::check_budget("fragment order: the legal kernel's product", ref, legal, std::vector<double>(256, 0.0));

    uint64_t order = simt::get_fragment_order();
    simt::set_fragment_order(0);
    std::vector<float> layout = run_plant<kAssumedLayout>(), mixed = run_plant<kMixedTypes>();
    simt::set_fragment_order(order);
    std::vector<float> legal_half(256);
    for (int e = 0; e < 256; e++) legal_half[e] = to_f(from_f<__half>(legal[e]));
    th::check_bitwise("planted assumed fragment layout: right under the identity order (the bug it hid)",
                      layout.data(), legal.data(), 256 * sizeof(float));
    th::check_bitwise("planted mixed fragment types: right under the identity order (the bug it hid)", mixed.data(),
                      legal_half.data(), 256 * sizeof(float));

    for (const char* plant : {"assumed_layout", "mixed_types"}) {
        th::ChildOutput child = th::run_command(std::string("timeout 60 ") + self + " --plant " + plant + " 2>&1");
        const std::string& out = child.text;
        int code = WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1;
        bool ok = code == 3 && out.find("results differ between fragment orders") != std::string::npos;
        std::string test = std::string("planted bug caught by run_orders: ") + plant;
        th::report(ok, test.c_str(), "exit %d | %s", code, out.substr(0, out.find('\n')).c_str());
    }
}
#endif

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
#ifdef SIMT_CPU
    if (argc == 3 && std::string(argv[1]) == "--plant") return run_planted(argv[2]);
#endif
    auto t0 = std::chrono::steady_clock::now();
    test_float_to_tf32();

    test_tile_16bit_shape<16, 16, 16>();
    test_tile_16bit_shape<32, 8, 16>();
    test_tile_16bit_shape<8, 32, 16>();
    test_tile_layouts<16, 16, 8, tf32, float, float>();

    test_elementwise<16, 16, 16, __half>();
    test_elementwise<16, 16, 16, __nv_bfloat16>();
    test_elementwise<32, 8, 16, __half>();
    test_elementwise<32, 8, 16, __nv_bfloat16>();
    test_elementwise<8, 32, 16, __half>();
    test_elementwise<8, 32, 16, __nv_bfloat16>();
    test_elementwise<16, 16, 8, tf32>();

    test_chain<16, 16, 16, __half>();
    test_chain<32, 8, 16, __nv_bfloat16>();
    test_chain<8, 32, 16, __half>();
    test_chain<16, 16, 8, tf32>();

    // 64x48x80 with 6 warps per block (2x3 or 2x3 tiles); m8n32k16 needs N a multiple of 32: 64x96x80.
    test_gemm<16, 16, 16, 2, 3, __half, float>(64, 48, 80, true, true, true, true, false);
    test_gemm<16, 16, 16, 2, 3, __half, float>(64, 48, 80, false, false, false, false, true);
    test_gemm<16, 16, 16, 2, 3, __half, __half>(64, 48, 80, true, false, false, true, true);
    test_gemm<16, 16, 16, 2, 3, __nv_bfloat16, float>(64, 48, 80, false, true, true, false, false);
    test_gemm<32, 8, 16, 2, 3, __half, float>(64, 48, 80, true, false, true, false, false);
    test_gemm<32, 8, 16, 2, 3, __nv_bfloat16, float>(64, 48, 80, false, true, false, true, true);
    test_gemm<8, 32, 16, 4, 1, __half, float>(64, 96, 80, false, true, true, true, false);
    test_gemm<8, 32, 16, 4, 1, __nv_bfloat16, float>(64, 96, 80, true, false, false, false, true);
    test_gemm<16, 16, 8, 2, 3, tf32, float>(64, 48, 80, true, true, true, true, false);
    test_gemm<16, 16, 8, 2, 3, tf32, float>(64, 48, 80, false, false, false, false, true);

#ifdef SIMT_CPU
    test_faults();

    test_slot_map<16, 16, 16, float>();
    test_slot_map<16, 16, 16, __half>();
    test_slot_map<32, 8, 16, float>();
    test_slot_map<32, 8, 16, __half>();
    test_slot_map<8, 32, 16, float>();
    test_slot_map<8, 32, 16, __half>();
    test_slot_map<16, 16, 8, float>();
    test_planted(argv[0]);
#endif
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("digest of all outputs: %016llx (compare across SIMT_ORDER and SIMT_FRAGMENT_ORDER runs)\n",
           (unsigned long long)g_digest);
    fprintf(stderr, "time: %.2f s\n", secs);  // stderr: stdout stays identical across runs
    return th::finish();
}
