// dev/cuda/bench_simt.cu — what the CPU backend costs: each kernel's time against the same work as a
// plain C++ loop, and the per-launch overhead. Not a kernel family: no variants and no validation, and
// make test does not run it. CPU-backend figures only (on a GPU it times the GPU against the host
// loop, which is a different question).
//
// Build and run: make bench    (then scripts/bench_gpt2.sh; one worker, SIMT_THREADS=1, the default:
//                               the ratio is what llmc/simt/README.md records)
//                make build/cpu/bench_simt && build/cpu/bench_simt    (this file alone)
#include "../../llmc/cuda_common.h"
#include "common.h"

#include <mma.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

using namespace nvcuda;

// ----------------------------------------------------------------------------
// Kernels

// One element per thread, as llm.c writes element-wise kernels: the worst case for fibers,
// since every element pays a thread switch.
__global__ void axpb_kernel(const float* x, float* y, float a, float b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}

// Grid-stride element-wise: each thread handles many elements, as kernels sized by SM count do.
__global__ void axpb_stride_kernel(const float* x, float* y, float a, float b, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) y[i] = a * x[i] + b;
}

// Row sums: strided partial sums, warp shuffles, a block reduction through shared memory
// (the shape of layernorm / softmax / global-norm reductions).
__global__ void row_sum_kernel(const float* x, float* out, int cols) {
    __shared__ float partial[32];
    const float* row = x + (size_t)blockIdx.x * cols;
    float s = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) s += row[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) partial[warp] = s;
    __syncthreads();
    s = lane < (int)blockDim.x / 32 ? partial[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Mean and reciprocal standard deviation of each row, one warp per row, as llm.c's layernorm
// forward does: each lane sums a strided share of the row, then a shuffle reduction, twice.
__global__ void row_stats_kernel(const float* x, float* mean, float* rstd, int rows, int cols) {
    int warps_per_block = blockDim.x / 32;
    int r = blockIdx.x * warps_per_block + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const float* row = x + (size_t)r * cols;
    float s = 0.f;
    for (int i = lane; i < cols; i += 32) s += row[i];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float m = s / cols;
    float v = 0.f;
    for (int i = lane; i < cols; i += 32) v += (row[i] - m) * (row[i] - m);
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rsqrtf(v / cols + 1e-5f);
    }
}

// One warp per 16x16 output tile of C = A·B (A row-major M×K, B col-major K×N, bf16, fp32 accumulate).
__global__ void wmma_gemm_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N, int K) {
    int tile_m = blockIdx.y, tile_n = blockIdx.x;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::fill_fragment(c, 0.f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(a, A + (size_t)tile_m * 16 * K + k, K);
        wmma::load_matrix_sync(b, B + (size_t)tile_n * 16 * K + k, K);
        wmma::mma_sync(c, a, b, c);
    }
    wmma::store_matrix_sync(C + (size_t)tile_m * 16 * N + tile_n * 16, c, N, wmma::mem_row_major);
}

__global__ void empty_kernel() {}

// ----------------------------------------------------------------------------
// Timing

// Best wall time of `reps` runs of f, in milliseconds.
double best_ms(const std::function<void()>& f, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        auto t1 = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    return best;
}

void row(const char* name, double kernel_ms, double plain_ms) {
    printf("%-44s %10.3f ms %10.3f ms %8.1fx\n", name, kernel_ms, plain_ms, kernel_ms / plain_ms);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "What the CPU backend costs: each kernel's time beside the same work as a plain C++ loop, and the\n"
        "per-launch overhead, one row each. No validation. The sizes are fixed in main(); SIMT_THREADS sets\n"
        "the backend's workers (llmc/simt/README.md records the ratios with one).\n");
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s\n", prop.name);
    printf("%-44s %13s %13s %9s\n", "kernel", "kernel", "plain C++", "ratio");

    // Element-wise, 4M floats.
    int n = 1 << 22;
    std::vector<float> hx(n), hy(n);
    for (int i = 0; i < n; i++) hx[i] = (float)(i % 1000) * 1e-3f;
    float *x, *y;
    cudaMallocCheck(&x, n * sizeof(float));
    cudaMallocCheck(&y, n * sizeof(float));
    cudaCheck(cudaMemcpy(x, hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    volatile float sink = 0;
    auto plain_axpb = [&] {
        for (int i = 0; i < n; i++) hy[i] = 1.5f * hx[i] + 0.5f;
        sink = sink + hy[n / 2];
    };
    double plain = best_ms(plain_axpb, 5);
    double k1 = best_ms([&] { cudaCheck(launch_kernel(axpb_kernel, dim3(CEIL_DIV(n, 256)), dim3(256), 0, 0, (const float*)x, y, 1.5f, 0.5f, n)); }, 3);
    row("elementwise, 1 element/thread (4M)", k1, plain);
    double k2 = best_ms([&] { cudaCheck(launch_kernel(axpb_stride_kernel, dim3(prop.multiProcessorCount * 2), dim3(256), 0, 0, (const float*)x, y, 1.5f, 0.5f, n)); }, 5);
    row("elementwise, grid-stride (4M)", k2, plain);

    // Row reductions: 1024 rows of 4096 (long rows) and 8192 rows of 768 (GPT-2 channel count).
    for (auto shape : {std::make_pair(64, 65536), std::make_pair(1024, 4096), std::make_pair(4096, 768)}) {
        int rows = shape.first, cols = shape.second;
        float* out;
        cudaMallocCheck(&out, rows * sizeof(float));
        std::vector<float> hout(rows);
        auto plain_sum = [&] {
            for (int r = 0; r < rows; r++) {
                float s = 0.f;
                const float* p = hx.data() + (size_t)r * cols;
                for (int c = 0; c < cols; c++) s += p[c];
                hout[r] = s;
            }
            sink = sink + hout[0];
        };
        double p = best_ms(plain_sum, 5);
        double k = best_ms([&] { cudaCheck(launch_kernel(row_sum_kernel, dim3(rows), dim3(256), 0, 0, (const float*)x, out, cols)); }, 3);
        char name[64];
        snprintf(name, sizeof(name), "block reduction, %d rows x %d", rows, cols);
        row(name, k, p);
        cudaCheck(cudaFree(out));
    }

    // Row statistics, one warp per row: B*T = 4096 rows of C = 768 (GPT-2 small's layernorm).
    {
        int rows = 4096, cols = 768;
        float *mean, *rstd;
        cudaMallocCheck(&mean, rows * sizeof(float));
        cudaMallocCheck(&rstd, rows * sizeof(float));
        std::vector<float> hm(rows), hr(rows);
        auto plain_stats = [&] {
            for (int r = 0; r < rows; r++) {
                const float* p = hx.data() + (size_t)r * cols;
                float s = 0.f;
                for (int c = 0; c < cols; c++) s += p[c];
                float m = s / cols, v = 0.f;
                for (int c = 0; c < cols; c++) v += (p[c] - m) * (p[c] - m);
                hm[r] = m;
                hr[r] = 1.f / std::sqrt(v / cols + 1e-5f);
            }
            sink = sink + hr[0];
        };
        double p = best_ms(plain_stats, 5);
        double k = best_ms([&] { cudaCheck(launch_kernel(row_stats_kernel, dim3(CEIL_DIV(rows, 8)), dim3(256), 0, 0, (const float*)x, mean, rstd, rows, cols)); }, 3);
        row("layernorm stats, warp per row, 4096 x 768", k, p);
        cudaCheck(cudaFree(mean));
        cudaCheck(cudaFree(rstd));
    }

    // WMMA GEMM 256x256x256 against a plain fp32 loop over the same bf16 inputs.
    int M = 256, N = 256, K = 256;
    std::vector<__nv_bfloat16> ha(M * K), hb(N * K);
    std::vector<float> fa(M * K), fb(N * K), hc(M * N);
    for (int i = 0; i < M * K; i++) { ha[i] = __float2bfloat16((i % 17) * 0.0625f); fa[i] = __bfloat162float(ha[i]); }
    for (int i = 0; i < N * K; i++) { hb[i] = __float2bfloat16((i % 13) * 0.125f); fb[i] = __bfloat162float(hb[i]); }
    __nv_bfloat16 *da, *db;
    float* dc;
    cudaMallocCheck(&da, M * K * sizeof(__nv_bfloat16));
    cudaMallocCheck(&db, N * K * sizeof(__nv_bfloat16));
    cudaMallocCheck(&dc, M * N * sizeof(float));
    cudaCheck(cudaMemcpy(da, ha.data(), M * K * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(db, hb.data(), N * K * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    auto plain_gemm = [&] {
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                float s = 0.f;
                for (int k = 0; k < K; k++) s += fa[i * K + k] * fb[j * K + k];
                hc[i * N + j] = s;
            }
        sink = sink + hc[5];
    };
    double pg = best_ms(plain_gemm, 3);
    double kg = best_ms([&] { cudaCheck(launch_kernel(wmma_gemm_kernel, dim3(N / 16, M / 16), dim3(32), 0, 0, (const __nv_bfloat16*)da, (const __nv_bfloat16*)db, dc, M, N, K)); }, 3);
    row("WMMA bf16 GEMM 256^3 (one warp per tile)", kg, pg);

    // Launch overhead: an empty kernel of 1 thread, and of one 256-thread block.
    int launches = 2000;
    double l1 = best_ms([&] { for (int i = 0; i < launches; i++) cudaCheck(launch_kernel(empty_kernel, dim3(1), dim3(1), 0, 0)); }, 3);
    double l256 = best_ms([&] { for (int i = 0; i < launches; i++) cudaCheck(launch_kernel(empty_kernel, dim3(1), dim3(256), 0, 0)); }, 3);
    printf("launch overhead: %.2f us (1 thread), %.2f us (256 threads, %.1f ns per thread)\n",
           l1 * 1000 / launches, l256 * 1000 / launches, l256 * 1e6 / launches / 256);

    cudaCheck(cudaFree(x));
    cudaCheck(cudaFree(y));
    cudaCheck(cudaFree(da));
    cudaCheck(cudaFree(db));
    cudaCheck(cudaFree(dc));
    return 0;
}
