// dev/cuda/fused_classifier.cu — softmax cross-entropy fused with its backward: each variant against
// a CPU reference, then timed.
//
// Variants:
//   1           one block per row, three sweeps over the row with element access: the max, the sum
//               of exp(x - max), then dlogits written in place
//   2           production with the row kept in shared memory by the first sweep, so the second
//               reads it there: one DRAM read per row by construction, where the row fits the
//               device's opt-in shared memory (bf16 and fp16 at V = 50257 everywhere, fp32 on an H100
//               or H200); elsewhere it is production. Bit-identical to production. Slower on an H200
//               (bf16, N = 8192: 0.542 ms against 0.488): its 98 KiB per block leave room for 2
//               blocks per SM, where production's second read finds the row in L2 anyway
//   production  llmc/fused_classifier.cuh: one block per row, an online max/sum in the first sweep
//               and dlogits in the second, which runs backwards over the row; 16-byte loads and
//               stores. Faster than 1: the row (100 KB in bf16 at V = 50257) is read twice instead of
//               three times, the second read starting with what the first left in cache, and a warp
//               moves 512 bytes per instruction instead of 64-128
//
// Build and run: make build/cpu/dev_fused_classifier && build/cpu/dev_fused_classifier    (CPU backend)
//                make build/gpu/dev_fused_classifier && build/gpu/dev_fused_classifier    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/fused_classifier.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <algorithm>
#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double)

// losses (N) and dlogits (N, Vp) of logits (N, Vp) against targets, as fused_classifier defines
// them (ignored rows: loss 0, dlogits 0; padding columns: dlogits 0).
void fused_classifier_cpu(double* dlogits, double* losses, const double* logits, const int* targets, int N, int V,
                          int Vp, double dloss, int ignore_index) {
    for (int n = 0; n < N; n++) {
        const double* x = logits + (size_t)n * Vp;
        double* d = dlogits + (size_t)n * Vp;
        std::fill(d, d + Vp, 0.0);
        losses[n] = 0;
        int t = targets[n];
        if (t == ignore_index) continue;
        double m = *std::max_element(x, x + V), s = 0;
        for (int i = 0; i < V; i++) s += std::exp(x[i] - m);
        losses[n] = m + std::log(s) - x[t];
        for (int i = 0; i < V; i++) d[i] = (std::exp(x[i] - m) / s - (i == t)) * dloss;
    }
}

// ----------------------------------------------------------------------------
// Variant 1

// Reduces v over the block (blockDim.x a multiple of 32) with op; every thread gets the result.
template <class Op>
__device__ float block_reduce1(float v, Op op, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = scratch[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++) v = op(v, scratch[w]);
    return v;
}

// The two reductions of variant 1.
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddOp {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// One block per row: max, sum, then dlogits (three sweeps, element access).
template <class T>
__global__ void fused_classifier_kernel1(T* logits, float* losses, const int* targets, int V, int Vp, float dloss,
                                         int ignore_index) {
    __shared__ float scratch[32];
    T* x = logits + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    bool ignored = target == ignore_index;
    float m = -FLT_MAX;
    for (int i = threadIdx.x; i < V && !ignored; i += blockDim.x) m = fmaxf(m, to_float(x[i]));
    m = block_reduce1(m, MaxOp(), scratch);
    float s = 0.f;
    for (int i = threadIdx.x; i < V && !ignored; i += blockDim.x) s += __expf(to_float(x[i]) - m);
    s = block_reduce1(s, AddOp(), scratch);
    if (threadIdx.x == 0) losses[blockIdx.x] = ignored ? 0.f : m + logf(s) - to_float(x[target]);
    __syncthreads();  // the target's logit is read before anyone overwrites it
    for (int i = threadIdx.x; i < Vp; i += blockDim.x) {
        float d = ignored || i >= V ? 0.f : (__expf(to_float(x[i]) - m) / s - (i == target ? 1.f : 0.f)) * dloss;
        x[i] = from_float<T>(d);
    }
}

// Variant 1's launcher (dlogits always written).
template <class T>
void fused_classifier1(T* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                       int ignore_index, cudaStream_t stream) {
    cudaCheck(launch_kernel(fused_classifier_kernel1<T>, dim3(N), dim3(512), 0, stream, logits, losses, targets, V, Vp,
                            dloss, ignore_index));
}

// ----------------------------------------------------------------------------
// Validation

// Random logits (uniform in [-spread, spread), rounded to T) with zero padding columns, targets
// with every 5th row ignored; returns the storage-rounded logits as doubles.
template <class T>
std::vector<double> make_logits(std::vector<T>& logits, std::vector<int>& targets, int N, int V, int Vp,
                                float spread, int ignore_index, uint64_t seed) {
    std::vector<float> u((size_t)N * Vp);
    th::fill_uniform(u.data(), u.size(), seed, -spread, spread);
    logits.resize(u.size());
    std::vector<double> x(u.size());
    for (size_t i = 0; i < u.size(); i++) {
        logits[i] = from_float<T>((int)(i % Vp) < V ? u[i] : 0.f);
        x[i] = to_float(logits[i]);
    }
    targets.resize(N);
    for (int n = 0; n < N; n++) targets[n] = n % 5 == 4 ? ignore_index : (int)((n * 2654435761u + seed) % V);
    return x;
}

// Runs variant v (3: production).
template <class T>
void run_variant(int v, T* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                 int ignore_index) {
    if (v == 1) fused_classifier1(logits, losses, targets, N, V, Vp, dloss, ignore_index, 0);
    else fused_classifier(logits, losses, targets, N, V, Vp, dloss, ignore_index, true, 0, nullptr, v == 2);
}

// Checks the variants against the double reference on one shape.
template <class T>
void validate(int N, int V, int Vp) {
    const int ignore_index = -100;
    std::vector<T> logits;
    std::vector<int> targets;
    std::vector<double> x = make_logits(logits, targets, N, V, Vp, 6.f, ignore_index, 77 + V);
    int counted = (int)std::count_if(targets.begin(), targets.end(), [&](int t) { return t != ignore_index; });
    float dloss = 1.f / std::max(counted, 1);
    std::vector<double> ref_d((size_t)N * Vp), ref_l(N);
    fused_classifier_cpu(ref_d.data(), ref_l.data(), x.data(), targets.data(), N, V, Vp, dloss, ignore_index);

    th::DeviceBuffer<T> d_logits(logits.size());
    th::DeviceBuffer<float> d_losses(N);
    th::DeviceBuffer<int> d_targets(targets);
    // Tolerances as in test/test_fused_classifier.cu: k_sum roundings along the statistics'
    // longest chain; the loss adds roundings at the magnitude of the logits (|x| <= 6, log V);
    // bf16 and fp16 dlogits add the rounding of the result (k = 1 of the type's eps; in fp16 up to
    // 2^-25 absolutely for a dlogit below the normal range).
    double k_sum = 3.0 * CEIL_DIV(V, CLASSIFIER_BLOCK) + 6 * 10 + 8;
    th::Tol loss_tol{th::EPS_FP32 * (k_sum + 3 * (12 + std::log((double)V))), 0};
    double k = k_sum + 4;
    th::Tol dtol{dloss * k * th::EPS_FP32 + (sizeof(T) == 4 ? 0 : dtype_denorm_min<T>() / 2),
                 (sizeof(T) == 4 ? 0 : dtype_eps<T>()) + k * th::EPS_FP32};
    char name[160];
    for (int v = 1; v <= 3; v++) {
        d_logits.upload(logits);
        run_variant(v, d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, dloss, ignore_index);
        snprintf(name, sizeof(name), "variant %d %s N=%d V=%d Vp=%d: losses", v, th::dtype_name<T>(), N, V, Vp);
        th::check_close(name, ref_l.data(), d_losses.host().data(), N, loss_tol);
        snprintf(name, sizeof(name), "variant %d %s N=%d V=%d Vp=%d: dlogits", v, th::dtype_name<T>(), N, V, Vp);
        th::check_close(name, ref_d.data(), d_logits.host().data(), logits.size(), dtol);
    }
}

// ----------------------------------------------------------------------------
// Benchmark

// GPT-2's step on a GPU (N = B*T = 8192 rows of V = 50257, padded to 50304, bf16); 8 rows on the
// CPU backend. Bytes counted: the compulsory traffic, one read and one write of the logits.
// Each timed call starts from the same logits (restored by a device copy outside the timing).
void benchmark() {
    using T = __nv_bfloat16;
    bool gpu = peak_gbps() > 0;
    int N = gpu ? 8192 : 8, V = 50257, Vp = 50304, reps = gpu ? 10 : 1;
    printf("benchmark, bf16, N=%d V=%d Vp=%d%s\n", N, V, Vp,
           gpu ? "" : "  (CPU-backend figures: they measure the simulator, not a GPU)");
    std::vector<T> logits;
    std::vector<int> targets;
    make_logits(logits, targets, N, V, Vp, 6.f, -100, 5);
    size_t bytes = logits.size() * sizeof(T);
    th::DeviceBuffer<T> d_logits(logits.size()), d_saved(logits);
    th::DeviceBuffer<float> d_losses(N);
    th::DeviceBuffer<int> d_targets(targets);
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    const char* names[] = {"", "variant 1 (three sweeps, elements)",
                           classifier_row_fits_on_chip<T>(V) ? "variant 2 (one read, row in shared memory)"
                                                             : "variant 2 (= production: the row does not fit)",
                           "production (online, Packed128, two reads)"};
    for (int v = 1; v <= 3; v++) {
        float total = 0;
        for (int r = 0; r <= reps; r++) {  // r == 0 warms up
            cudaCheck(cudaMemcpy(d_logits.ptr, d_saved.ptr, bytes, cudaMemcpyDeviceToDevice));
            cudaCheck(cudaEventRecord(start, 0));
            run_variant(v, d_logits.ptr, d_losses.ptr, d_targets.ptr, N, V, Vp, 1.f / N, -100);
            cudaCheck(cudaEventRecord(stop, 0));
            cudaCheck(cudaEventSynchronize(stop));
            float ms = 0;
            cudaCheck(cudaEventElapsedTime(&ms, start, stop));
            if (r > 0) total += ms;
        }
        bench_line(names[v], total / reps, 2.0 * bytes);
    }
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "Softmax cross-entropy fused with its backward: variants 1 (three sweeps) and 2 (the row in shared\n"
        "memory) and production (llmc/fused_classifier.cuh, two sweeps), timed in GB/s.\n" DEV_VALIDATES);
    // GPT-2-like scaled down (V = 500 padded to 512), a size with element access (Vp % 8 != 0 in
    // bf16 and fp16, % 4 != 0 in fp32), and the GPT-2 vocabulary at a few rows.
    validate<float>(7, 500, 512);
    validate<float>(5, 37, 45);
    validate<float>(3, 50257, 50304);
    validate<__nv_bfloat16>(7, 500, 512);
    validate<__nv_bfloat16>(5, 37, 45);
    validate<__nv_bfloat16>(3, 50257, 50304);
    validate<__half>(7, 500, 512);
    validate<__half>(5, 37, 45);
    validate<__half>(3, 50257, 50304);
    benchmark();
    return th::finish();
}
