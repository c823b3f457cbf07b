// dev/cuda/global_norm.cu — the squared global gradient norm: each variant against a CPU reference
// (double), then timed on a GPT-2 124M-sized gradient buffer.
//
// Variants:
//   1           one element per thread, a block reduction, each block's sum added with a float atomicAdd
//   production  llmc/global_norm.cuh: 128-bit loads, grid-stride, per-block partials summed in a fixed
//               order. Deterministic (the order of v1's atomics varies from run to run), and faster:
//               far fewer blocks and reductions for the same bytes.
//
// Build and run: make build/cpu/dev_global_norm && build/cpu/dev_global_norm    (CPU backend)
//                make build/gpu/dev_global_norm && build/gpu/dev_global_norm    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/global_norm.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference: the sum of squares in double.

template <class T>
static double global_norm_squared_cpu(const std::vector<T>& x) {
    double s = 0;
    for (T v : x) s += (double)to_float(v) * to_float(v);
    return s;
}

// ----------------------------------------------------------------------------
// Variant 1: one element per thread, a block reduction, then atomicAdd of each block's sum into
// *out (zeroed first). The production version is better on two counts. It is deterministic: the
// order in which blocks' atomics land varies from run to run, so v1's result (and therefore the
// clip factor and every weight after it) changes in the last bits between identical runs, which
// breaks bit-exact reproducibility and the thread-order tests; production writes one partial per
// block and sums them in a fixed order. And it reads 16 bytes per load with each thread striding
// over many of them, where v1 starts one thread per element (millions of blocks for GPT-2) that
// each load 2-4 bytes, so block scheduling and reduction overhead dominate the memory traffic.

template <class T>
__global__ void global_norm_atomic_kernel(float* out, const T* values, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    float x = i < N ? to_float(values[i]) : 0.f;
    float block_sum = global_norm_block_sum(x * x);
    if (threadIdx.x == 0) atomicAdd(out, block_sum);
}

template <class T>
static void global_norm_squared_atomic(float* out, const T* values, size_t N, cudaStream_t stream) {
    cudaCheck(cudaMemsetAsync(out, 0, sizeof(float), stream));
    if (N == 0) return;
    cudaCheck(launch_kernel(global_norm_atomic_kernel<T>, dim3((unsigned)CEIL_DIV(N, (size_t)512)), dim3(512), 0,
                            stream, out, values, N));
}

enum class Variant { Atomic, Production };
static const char* variant_name(Variant k) { return k == Variant::Atomic ? "v1 atomic" : "production"; }

template <class T>
static void run_variant(Variant k, float* out, void* scratch, const T* values, size_t N) {
    if (k == Variant::Atomic) global_norm_squared_atomic(out, values, N, 0);
    else global_norm_squared(out, scratch, values, N, 0);
}

// Longest chain of fp32 roundings from one term to the result (all terms are >= 0, so the relative
// error is at most that many unit roundoffs): v1 squares once, reduces through 10 tree levels, then
// adds up to one atomic per block; production as derived in test/test_global_norm.cu.
template <class T>
static double rounding_path(Variant k, size_t N) {
    if (k == Variant::Atomic) return 1 + 10 + (double)CEIL_DIV(N, (size_t)512);
    const size_t P = Packed128<T>::size, blocks = global_norm_num_blocks(N);
    return (double)(CEIL_DIV(N / P, blocks * GLOBAL_NORM_BLOCK_SIZE) * P + 1 + 10 +
                    CEIL_DIV(blocks, (size_t)GLOBAL_NORM_FINAL_BLOCK_SIZE) + 10);
}

// ----------------------------------------------------------------------------
// Validation

template <class T>
static void validate(Variant k, size_t N) {
    std::vector<T> x = th::random_tensor<T>(N, 17 + N);
    double ref = global_norm_squared_cpu(x);
    th::DeviceBuffer<T> d_x(x);
    th::DeviceBuffer<float> d_out(1);
    th::DeviceBuffer<char> d_scratch(global_norm_scratch_bytes(N));
    float got[3];
    for (int r = 0; r < 3; r++) {
        run_variant(k, d_out.ptr, d_scratch.ptr, d_x.ptr, N);
        got[r] = d_out.host()[0];
    }
    char name[128];
    const char* tn = th::dtype_name<T>();
    snprintf(name, sizeof(name), "%s %s N=%zu: vs double", variant_name(k), tn, N);
    th::check_close(name, &ref, &got[0], 1, th::tol(th::EPS_FP32, rounding_path<T>(k, N), 0));
    if (k == Variant::Production) {
        snprintf(name, sizeof(name), "%s %s N=%zu: same bits in 3 runs", variant_name(k), tn, N);
        th::report(memcmp(&got[0], &got[1], 4) == 0 && memcmp(&got[0], &got[2], 4) == 0, name);
    }
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
static void benchmark(Variant k, size_t N, int reps) {
    th::DeviceBuffer<T> d_x(N, th::Fill::Zero);
    th::DeviceBuffer<float> d_out(1);
    th::DeviceBuffer<char> d_scratch(global_norm_scratch_bytes(N));
    float ms = time_ms([&] { run_variant(k, d_out.ptr, d_scratch.ptr, d_x.ptr, N); }, reps);
    char name[64];
    snprintf(name, sizeof(name), "%-12s %s N=%zu", variant_name(k), th::dtype_name<T>(), N);
    bench_line(name, ms, (double)N * sizeof(T));
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "The squared global gradient norm: variant 1 (float atomics) and production\n"
        "(llmc/global_norm.cuh, deterministic), timed on a GPT-2 124M-sized gradient buffer.\n" DEV_VALIDATES);
    for (Variant k : {Variant::Atomic, Variant::Production}) {
        for (size_t N : {(size_t)1, (size_t)1000, (size_t)123457}) {
            validate<float>(k, N);
            validate<__nv_bfloat16>(k, N);
            validate<__half>(k, N);
        }
    }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const bool cpu_backend = peak_gbps() == 0;
    // GPT-2 124M's gradient buffer on a GPU; 1M values on the CPU backend, whose timings measure the
    // backend, not a GPU.
    const size_t N = cpu_backend ? 1000003 : 124475904;
    const int reps = cpu_backend ? 2 : 20;
    printf("benchmark on %s%s:\n", prop.name, cpu_backend ? " (CPU-backend figures, not GPU performance)" : "");
    for (Variant k : {Variant::Atomic, Variant::Production}) {
        benchmark<float>(k, N, reps);
        benchmark<__nv_bfloat16>(k, N, reps);
    }
    return th::finish();
}
