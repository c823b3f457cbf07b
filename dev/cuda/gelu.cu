// dev/cuda/gelu.cu — GELU forward and in-place backward (tanh and erf forms): each variant against a
// CPU reference (double), then timed.
//
// Variants:
//   1           one element per thread, scalar loads, the textbook formulas (as llm.c writes them)
//   production  llmc/gelu.cuh: 16 bytes per operand per thread in one 128-bit instruction. Faster:
//               fewer instructions and threads carry the same bytes. Its cancellation-free forms cost
//               the same (the kernels are memory-bound) and stay accurate for x below about -4.
//
// Build and run: make build/cpu/dev_gelu && build/cpu/dev_gelu    (CPU backend)
//                make build/gpu/dev_gelu && build/gpu/dev_gelu    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/gelu.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double)

// GELU(x) and GELU'(x), in forms without cancellation for negative x (1 + tanh(u) and 1 + erf(z)
// lose every digit there, in double too): 0.5(1 + tanh(u)) = 1 / (1 + exp(-2u)), 0.5(1 + erf(z))
// = 0.5 erfc(-z).
double gelu_cpu(double x, GeluKind kind) {
    if (kind == GeluKind::Tanh) return x / (1 + std::exp(-2 * 0.7978845608028654 * (x + 0.044715 * x * x * x)));
    return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}
double gelu_grad_cpu(double x, GeluKind kind) {
    if (kind == GeluKind::Tanh) {
        double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), sig = 1 / (1 + std::exp(-2 * u));
        return sig + 2 * x * sig * (1 - sig) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
    }
    return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// ----------------------------------------------------------------------------
// Simpler variant (the production kernels are in llmc/gelu.cuh)

// Variant 1: one element per thread, scalar loads, the textbook formulas (as llm.c writes them).
// The production kernels move 16 bytes per operand per thread with one 128-bit instruction (4 or
// 8 elements), so fewer instructions and threads carry the same bytes; they also use the
// cancellation-free forms above (same cost: the kernels are memory-bound), which keep a few ulps
// of relative accuracy where the textbook forms return 0 or noise for x below about -4.
template <class T>
__global__ void gelu_forward_kernel1(T* out, const T* inp, size_t N, GeluKind kind) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = to_float(inp[i]);
    float y = kind == GeluKind::Tanh ? 0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)))
                                     : 0.5f * x * (1.f + erff(x * 0.7071067812f));
    out[i] = from_float<T>(y);
}
template <class T>
__global__ void gelu_backward_inplace_kernel1(T* d_in_out, const T* inp, size_t N, GeluKind kind) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = to_float(inp[i]), grad;
    if (kind == GeluKind::Tanh) {
        float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
        grad = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608f * (1.f + 3.f * 0.044715f * x * x);
    } else {
        grad = 0.5f * (1.f + erff(x * 0.7071067812f)) + x * 0.3989422804f * expf(-0.5f * x * x);
    }
    d_in_out[i] = from_float<T>(to_float(d_in_out[i]) * grad);
}

template <class T>
void gelu_forward1(T* out, const T* inp, size_t N, GeluKind kind, cudaStream_t stream) {
    cudaCheck(launch_kernel(gelu_forward_kernel1<T>, dim3((unsigned)CEIL_DIV(N, (size_t)256)), dim3(256), 0, stream, out,
                            inp, N, kind));
}
template <class T>
void gelu_backward_inplace1(T* d_in_out, const T* inp, size_t N, GeluKind kind, cudaStream_t stream) {
    cudaCheck(launch_kernel(gelu_backward_inplace_kernel1<T>, dim3((unsigned)CEIL_DIV(N, (size_t)256)), dim3(256), 0,
                            stream, d_in_out, inp, N, kind));
}

// ----------------------------------------------------------------------------
// Validation

// Both variants, both kinds, against the double reference at N elements (x in [-6, 6), dout in
// [-1, 1)). One tolerance fits both variants: atol = 8 eps_fp32 * 6 covers the textbook forms'
// absolute error in the negative tail (1 + tanh(u) is off by ~eps near -1, times 0.5|x| <= 3),
// rtol = 16 eps_fp32 the fp32 evaluation elsewhere, or the type's eps for the one rounding to bf16
// or fp16 (the atol also covers fp16's absolute rounding below its normal range, at most 2^-25).
template <class T>
void validate(size_t N) {
    auto x = th::random_tensor<T>(N, 1, -6.f, 6.f), dout = th::random_tensor<T>(N, 2, -1.f, 1.f);
    th::Tol tol{8 * th::EPS_FP32 * 6, sizeof(T) == 4 ? 16 * th::EPS_FP32 : dtype_eps<T>()};
    char name[160];
    for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
        const char* kname = kind == GeluKind::Tanh ? "tanh" : "erf";
        std::vector<double> ref(N), ref_grad(N);
        for (size_t i = 0; i < N; i++) {
            double xi = to_float(x[i]);
            ref[i] = gelu_cpu(xi, kind);
            ref_grad[i] = to_float(dout[i]) * gelu_grad_cpu(xi, kind);
        }
        for (int variant = 1; variant <= 2; variant++) {
            const char* vname = variant == 1 ? "variant 1" : "(llmc)";
            th::DeviceBuffer<T> d_x(x), d_out(N, th::Fill::Zero), d_grad(dout);
            if (variant == 1) {
                gelu_forward1(d_out.ptr, (const T*)d_x.ptr, N, kind, 0);
                gelu_backward_inplace1(d_grad.ptr, (const T*)d_x.ptr, N, kind, 0);
            } else {
                gelu_forward(d_out.ptr, (const T*)d_x.ptr, N, kind, 0);
                gelu_backward_inplace(d_grad.ptr, (const T*)d_x.ptr, N, kind, 0);
            }
            snprintf(name, sizeof(name), "gelu_forward %s %s %s N=%zu", vname, kname, th::dtype_name<T>(), N);
            th::check_close(name, ref.data(), d_out.host().data(), N, tol);
            snprintf(name, sizeof(name), "gelu_backward_inplace %s %s %s N=%zu", vname, kname, th::dtype_name<T>(), N);
            th::check_close(name, ref_grad.data(), d_grad.host().data(), N, tol);
        }
    }
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
void benchmark(size_t N, int reps) {
    size_t S = sizeof(T);
    printf("%s, N=%zu:\n", th::dtype_name<T>(), N);
    th::DeviceBuffer<T> x(th::random_tensor<T>(N, 1, -6.f, 6.f)), out(N, th::Fill::Zero),
        grad(th::random_tensor<T>(N, 2, -1.f, 1.f));
    for (GeluKind kind : {GeluKind::Tanh, GeluKind::Erf}) {
        const char* kname = kind == GeluKind::Tanh ? "tanh" : "erf";
        char name[96];
        snprintf(name, sizeof(name), "gelu_forward variant 1 (scalar) %s", kname);
        bench_line(name, time_ms([&] { gelu_forward1(out.ptr, (const T*)x.ptr, N, kind, 0); }, reps), 2.0 * N * S);
        snprintf(name, sizeof(name), "gelu_forward (llmc) %s", kname);
        bench_line(name, time_ms([&] { gelu_forward(out.ptr, (const T*)x.ptr, N, kind, 0); }, reps), 2.0 * N * S);
        // The gradient buffer is updated in place on every call; the values do not matter here.
        snprintf(name, sizeof(name), "gelu_backward_inplace variant 1 (scalar) %s", kname);
        bench_line(name, time_ms([&] { gelu_backward_inplace1(grad.ptr, (const T*)x.ptr, N, kind, 0); }, reps),
                   3.0 * N * S);
        snprintf(name, sizeof(name), "gelu_backward_inplace (llmc) %s", kname);
        bench_line(name, time_ms([&] { gelu_backward_inplace(grad.ptr, (const T*)x.ptr, N, kind, 0); }, reps),
                   3.0 * N * S);
    }
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "GELU forward and in-place backward (tanh and erf forms): variant 1 (scalar) and production\n"
        "(llmc/gelu.cuh, 128-bit accesses), timed in GB/s.\n" DEV_VALIDATES);
    // Validation: a size that is not a multiple of the pack (4 fp32 / 8 bf16, fp16) or the block.
    validate<float>(100003);
    validate<__nv_bfloat16>(100003);
    validate<__half>(100003);

    // Benchmark: GPT-2 124M's MLP activation (B=8, T=1024, 4C=3072) on a GPU; a slice on the CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>((size_t)64 * 3072, 2);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>((size_t)8 * 1024 * 3072, 50);
    benchmark<float>((size_t)8 * 1024 * 3072, 50);
#endif
    return th::finish();
}
