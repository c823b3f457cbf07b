// dev/cuda/matmul.cu — the linear layer's forward pass (out = GELU(inp · Wᵀ + bias)): a CPU reference,
// two simpler variants, and the production launcher from llmc/matmul.cuh; validates each, then
// benchmarks them (TFLOP/s against the device's peak on a GPU; CPU-backend figures otherwise).
//
// variant 1: one thread per output element, fp32 loop over C — no data reuse: every input is
//            read from global memory OC (or N) times, so it is memory-bound at a few TFLOP/s.
// variant 2: cuBLASLt GEMM (tensor cores) followed by separate bias and GELU kernels — fast
//            GEMM, but the (N,OC) output makes two extra round trips through memory.
// production: cuBLASLt with the GELU_AUX_BIAS epilogue — bias and GELU applied while the tile
//            is still in registers, writing both the pre-GELU input (for backward) and the output.
#include "../../llmc/matmul.cuh"
#include "../../llmc/mfu.h"
#include "../../test/harness.h"
#include "common.h"

#include <vector>

// variant 1: out[n][o] = gelu(sum_c inp[n][c] * w[o][c] + b[o]), one thread each.
template <class T>
__global__ void matmul_naive_kernel(T* out, T* pre, const T* inp, const T* w, const T* bias, int N, int C, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x, n = blockIdx.y;
    if (o >= OC) return;
    float s = to_float(bias[o]);
    for (int c = 0; c < C; c++) s += to_float(inp[(size_t)n * C + c]) * to_float(w[(size_t)o * C + c]);
    pre[(size_t)n * OC + o] = from_float<T>(s);
    out[(size_t)n * OC + o] = from_float<T>(0.5f * s * (1.f + tanhf(0.7978845608f * (s + 0.044715f * s * s * s))));
}

// variant 2's bias kernel: x[n][o] += b[o].
template <class T>
__global__ void add_bias_kernel(T* x, const T* bias, int N, int OC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)N * OC) x[i] = from_float<T>(to_float(x[i]) + to_float(bias[i % OC]));
}

template <class T>
void run_variant(int variant, T* out, T* pre, const T* inp, const T* w, const T* b, int N, int C, int OC) {
    if (variant == 1) {
        cudaCheck(launch_kernel(matmul_naive_kernel<T>, dim3(CEIL_DIV(OC, 128), N), dim3(128), 0, 0, out, pre, inp, w, b, N, C, OC));
    } else if (variant == 2) {
        if (!cublaslt_matmul(pre, w, inp, OC, N, C, true, false, C, C, OC, 1.f, 0.f, CUBLASLT_EPILOGUE_DEFAULT,
                             (const T*)nullptr, (T*)nullptr, 0, 0)) {
            fprintf(stderr, "cuBLASLt refused the plain GEMM\n");
            exit(EXIT_FAILURE);
        }
        size_t total = (size_t)N * OC;
        cudaCheck(launch_kernel(add_bias_kernel<T>, dim3((unsigned)CEIL_DIV(total, 256)), dim3(256), 0, 0, pre, b, N, OC));
        gelu_forward(out, (const T*)pre, total, GeluKind::Tanh, 0);
    } else {
        matmul_forward(out, pre, inp, w, b, N, C, OC, GeluKind::Tanh, 0);
    }
}

template <class T>
void validate_and_bench(const char* tname, int N, int C, int OC, int reps, Precision prec) {
    std::vector<T> hi = th::random_tensor<T>((size_t)N * C, 1), hb = th::random_tensor<T>(OC, 3),
                   hw = th::random_tensor<T>((size_t)OC * C, 2, -0.1f, 0.1f);
    th::DeviceBuffer<T> inp(hi), w(hw), b(hb), out((size_t)N * OC), pre((size_t)N * OC);

    // CPU reference in double from the T-rounded inputs, on a sample of rows (all rows if small).
    int rows = std::min(N, 64);
    std::vector<double> ref((size_t)rows * OC);
    double max_mag = 0;
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < OC; o++) {
            double s = to_float(hb[o]), mag = std::fabs(s);
            for (int c = 0; c < C; c++) {
                double p = (double)to_float(hi[(size_t)n * C + c]) * to_float(hw[(size_t)o * C + c]);
                s += p;
                mag += std::fabs(p);
            }
            ref[(size_t)n * OC + o] = 0.5 * s * (1 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            max_mag = std::max(max_mag, mag);
        }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    float peak = peak_tflops(prop.name, prec, false);
    auto run = [&](int variant) {
        run_variant(variant, out.ptr, pre.ptr, (const T*)inp.ptr, (const T*)w.ptr, (const T*)b.ptr, N, C, OC);
    };
    for (int variant = 1; variant <= 3; variant++) {
        run(variant);
        cudaCheck(cudaDeviceSynchronize());
        std::vector<T> h = th::to_host(out.ptr, (size_t)rows * OC);
        char name[128];
        snprintf(name, sizeof(name), "matmul %s variant %d (N=%d C=%d OC=%d)", tname, variant, N, C, OC);
        // fp32 dot products of C terms (<= (C+4)*2^-24*sum|ab|), GELU (|gelu'| <= 1.13), output
        // rounded to T (half an ulp) plus one more ulp where an unfused path rounds pre-GELU to T.
        // Variant 2 also rounds the GEMM result to T *before* adding the bias: an error of half an
        // ulp of |inp·Wᵀ| <= max sum|ab|, which cancellation with the bias does not shrink.
        double atol = 2.3 * (C + 4) * std::ldexp(1.0, -24) * max_mag;
        if (variant == 2) atol += 1.13 * 0.5 * dtype_eps<T>() * max_mag;
        th::check_close(name, ref.data(), h.data(), h.size(), th::Tol{atol, 2 * dtype_eps<T>()});
        snprintf(name, sizeof(name), "%s variant %d", tname, variant);
        flops_line(name, time_ms([&] { run(variant); }, reps), 2.0 * N * C * OC, peak);
    }
}

int main() {
    matmul_init();
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    bool gpu = peak_tflops(prop.name, Precision::BF16, false) > 0 || strstr(prop.name, "SIMT") == nullptr;
    printf("benchmark on %s%s\n", prop.name, gpu ? "" : " (CPU-backend figures, not GPU performance)");
    // GPT-2 small's MLP up-projection at B*T = 8192 on a GPU; a small shape on the CPU backend.
    int N = gpu ? 8192 : 256, C = gpu ? 768 : 128, OC = 4 * C;
    validate_and_bench<float>("fp32", N, C, OC, gpu ? 20 : 2, Precision::FP32);
    validate_and_bench<__nv_bfloat16>("bf16", N, C, OC, gpu ? 20 : 2, Precision::BF16);
    // fp16 and bf16 share the tensor-core peak on every GPU of the table, so fp16 reads the bf16 column.
    validate_and_bench<__half>("fp16", N, C, OC, gpu ? 20 : 2, Precision::BF16);
    matmul_destroy();
    return th::finish();
}
