// dev/cuda/tanh.cu — tanh forward and in-place backward: each variant against a CPU reference
// (double), then timed.
//
// Variants:
//   1           one element per thread, scalar loads and stores, the same math
//   production  llmc/tanh.cuh: 16 bytes per operand per thread in one 128-bit instruction. Faster: 4-8x
//               fewer memory instructions and threads for the same bytes, which is what limits a
//               memory-bound element-wise kernel once its loads are coalesced.
//
// Build and run: make build/cpu/dev_tanh && build/cpu/dev_tanh    (CPU backend)
//                make build/gpu/dev_tanh && build/gpu/dev_tanh    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/tanh.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double)

// tanh'(x) = sech(x)^2 = 4e / (1 + e)^2 with e = exp(-2|x|): exact in double for every x.
double tanh_grad_cpu(double x) {
    double e = std::exp(-2 * std::fabs(x));
    return 4 * e / ((1 + e) * (1 + e));
}

// ----------------------------------------------------------------------------
// Simpler variant (the production kernels are in llmc/tanh.cuh)

// Variant 1: one element per thread, scalar loads and stores, the same math (tanh_fp32 and
// tanh_derivative from llmc/tanh.cuh). The production kernels move 16 bytes per operand per thread
// with one 128-bit instruction (4 fp32 or 8 bf16 elements): 4-8x fewer memory instructions and
// threads for the same bytes, which is what a memory-bound elementwise kernel is limited by once the
// loads are coalesced.
template <class T>
__global__ void tanh_forward_kernel1(T* out, const T* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = from_float<T>(tanh_fp32(to_float(inp[i])));
}
template <class T>
__global__ void tanh_backward_inplace_kernel1(T* d_in_out, const T* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) d_in_out[i] = from_float<T>(to_float(d_in_out[i]) * tanh_derivative(to_float(inp[i])));
}

template <class T>
void tanh_forward1(T* out, const T* inp, size_t N, cudaStream_t stream) {
    cudaCheck(launch_kernel(tanh_forward_kernel1<T>, dim3((unsigned)CEIL_DIV(N, (size_t)256)), dim3(256), 0, stream,
                            out, inp, N));
}
template <class T>
void tanh_backward_inplace1(T* d_in_out, const T* inp, size_t N, cudaStream_t stream) {
    cudaCheck(launch_kernel(tanh_backward_inplace_kernel1<T>, dim3((unsigned)CEIL_DIV(N, (size_t)256)), dim3(256), 0,
                            stream, d_in_out, inp, N));
}

// ----------------------------------------------------------------------------
// Validation

// Every variant, forward and backward, against the double reference at N elements (x in [-8, 8),
// dout in [-1, 1)), with 16-byte aligned buffers (offset 0: the production kernels' packed path)
// and with views one element off (offset 1: their scalar path). Tolerance: rtol = 16 eps_fp32 for
// fp32 (tanh_fp32 and expf are within a few ulps, plus a product and a division), or the storage
// type's eps for bf16/fp16, whose single final rounding (half an ulp) dominates the fp32 error; atol =
// half the type's smallest subnormal, the absolute error of that rounding below the normal range.
template <class T>
void validate(size_t N) {
    auto x = th::random_tensor<T>(N, 1, -8.f, 8.f), dout = th::random_tensor<T>(N, 2, -1.f, 1.f);
    th::Tol tol{dtype_denorm_min<T>() / 2, sizeof(T) == 4 ? 16 * th::EPS_FP32 : dtype_eps<T>()};
    std::vector<double> ref(N), ref_grad(N);
    for (size_t i = 0; i < N; i++) {
        double xi = to_float(x[i]);
        ref[i] = std::tanh(xi);
        ref_grad[i] = to_float(dout[i]) * tanh_grad_cpu(xi);
    }
    char name[160];
    for (size_t offset : {(size_t)0, (size_t)1}) {
        for (int variant = 1; variant <= 2; variant++) {
            const char* vname = variant == 1 ? "variant 1" : "(llmc)";
            th::DeviceView<T> d_x(x, offset), d_out(std::vector<T>(N), offset), d_grad(dout, offset);
            if (variant == 1) {
                tanh_forward1(d_out.ptr, (const T*)d_x.ptr, N, 0);
                tanh_backward_inplace1(d_grad.ptr, (const T*)d_x.ptr, N, 0);
            } else {
                tanh_forward(d_out.ptr, (const T*)d_x.ptr, N, 0);
                tanh_backward_inplace(d_grad.ptr, (const T*)d_x.ptr, N, 0);
            }
            snprintf(name, sizeof(name), "tanh_forward %s %s N=%zu offset=%zu", vname, th::dtype_name<T>(), N, offset);
            th::check_close(name, ref.data(), d_out.host().data(), N, tol);
            snprintf(name, sizeof(name), "tanh_backward_inplace %s %s N=%zu offset=%zu", vname, th::dtype_name<T>(), N,
                     offset);
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
    th::DeviceBuffer<T> x(th::random_tensor<T>(N, 1, -8.f, 8.f)), out(N, th::Fill::Zero),
        grad(th::random_tensor<T>(N, 2, -1.f, 1.f));
    bench_line("tanh_forward variant 1 (scalar)", time_ms([&] { tanh_forward1(out.ptr, (const T*)x.ptr, N, 0); }, reps),
               2.0 * N * S);
    bench_line("tanh_forward (llmc)", time_ms([&] { tanh_forward(out.ptr, (const T*)x.ptr, N, 0); }, reps),
               2.0 * N * S);
    // The gradient buffer is updated in place on every call; the values do not matter here.
    bench_line("tanh_backward_inplace variant 1 (scalar)",
               time_ms([&] { tanh_backward_inplace1(grad.ptr, (const T*)x.ptr, N, 0); }, reps), 3.0 * N * S);
    bench_line("tanh_backward_inplace (llmc)",
               time_ms([&] { tanh_backward_inplace(grad.ptr, (const T*)x.ptr, N, 0); }, reps), 3.0 * N * S);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "tanh forward and in-place backward: variant 1 (scalar) and production (llmc/tanh.cuh, 128-bit\n"
        "accesses), timed in GB/s.\n" DEV_VALIDATES);
    // Validation: a size that is not a multiple of the pack (4 fp32 / 8 bf16, fp16) or the block.
    validate<float>(100003);
    validate<__nv_bfloat16>(100003);
    validate<__half>(100003);

    // Benchmark. BERT's pooler is only (B, C), far too small to time a memory-bound kernel, so the
    // GPU figure uses an activation-sized tensor (8 x 1024 x 3072, like GPT-2's MLP); a slice on the
    // CPU backend.
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
