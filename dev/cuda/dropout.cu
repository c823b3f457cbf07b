// dev/cuda/dropout.cu — hidden-state dropout: forward, forward fused with the residual add, backward;
// each variant against a CPU reference (exact), then timed (effective bandwidth: the bytes the
// operation needs, inputs read once and output written once).
//
// Variants:
//   1           one element per thread, scalar loads and stores, one Philox call per element, the
//               mask stored as a byte per element in the forward and read back in the backward
//   production  llmc/dropout.cuh: the mask regenerated from (seed, offset, index), one Philox call per
//               4 elements, 128-bit loads and stores. Faster: no mask to write, keep and read back (25%
//               more bytes than a bf16 dropout needs), a quarter of the generator's instructions, and
//               8 bf16 per instruction.
//
// Build and run: make build/cpu/dev_dropout && build/cpu/dev_dropout    (CPU backend)
//                make build/gpu/dev_dropout && build/gpu/dev_dropout    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/dropout.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <vector>

// ----------------------------------------------------------------------------
// CPU reference

// out = [residual +] inp * (keep ? s : 0), the dropped value rounded to T before the add, with keep from
// dropout_keep (host): the kernels' formula, so the reference is exact, not approximate.
template <class T>
void dropout_cpu(std::vector<T>& out, const std::vector<T>* residual, const std::vector<T>& inp,
                 const DropoutArgs& d) {
    out.resize(inp.size());
    for (size_t i = 0; i < inp.size(); i++) {
        T x = from_float<T>(to_float(inp[i]) * (dropout_keep(d, i) ? d.scale : 0.f));
        out[i] = residual ? from_float<T>(to_float((*residual)[i]) + to_float(x)) : x;
    }
}

// ----------------------------------------------------------------------------
// Variant 1: one element per thread, scalar loads and stores, the mask stored as one byte per element
// in the forward and read back in the backward (the classic implementation: PyTorch's native dropout
// returns its mask for the backward).
//
// Why the production kernels are faster. (1) No mask in memory: variant 1 writes n bytes in the forward
// and reads them in the backward, 25% more traffic than the 4 bytes per element of a bf16 dropout (17%
// for the residual form), and holds B·T·C bytes per dropout site from forward to backward; the
// production kernels regenerate the mask from (seed, offset, index). (2) One Philox call per 4 elements
// instead of one per element (variant 1 uses one of the 4 words each call returns): ~15 instead of ~60
// integer instructions per element, which at bf16 on an H100 would make the generator, not DRAM, the
// limit. (3) 128-bit loads and stores: 8 bf16 per instruction instead of 1.

template <class T, bool kResidual>
__global__ void dropout_forward_kernel1(T* out, uint8_t* mask, const T* residual, const T* inp, size_t n,
                                        DropoutArgs d) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    bool keep = dropout_keep(d, i);
    mask[i] = keep;
    T x = from_float<T>(__fmul_rn(to_float(inp[i]), keep ? d.scale : 0.f));  // not contracted with the add below
    out[i] = kResidual ? from_float<T>(to_float(residual[i]) + to_float(x)) : x;
}

template <class T>
__global__ void dropout_backward_kernel1(T* dinp, const T* dout, const uint8_t* mask, size_t n, float scale) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    dinp[i] = from_float<T>(to_float(dout[i]) * (mask[i] ? scale : 0.f));
}

template <class T>
void dropout_forward1(T* out, uint8_t* mask, const T* residual, const T* inp, size_t n, float p, uint64_t seed,
                      uint64_t offset, cudaStream_t stream) {
    DropoutArgs d = dropout_args("dropout_forward1", p, seed, offset);
    dim3 grid((unsigned)CEIL_DIV(n, (size_t)256));
    if (residual)
        cudaCheck(launch_kernel(dropout_forward_kernel1<T, true>, grid, dim3(256), 0, stream, out, mask, residual, inp,
                                n, d));
    else
        cudaCheck(launch_kernel(dropout_forward_kernel1<T, false>, grid, dim3(256), 0, stream, out, mask, residual, inp,
                                n, d));
}

template <class T>
void dropout_backward1(T* dinp, const T* dout, const uint8_t* mask, size_t n, float p, cudaStream_t stream) {
    DropoutArgs d = dropout_args("dropout_backward1", p, 0, 0);
    cudaCheck(launch_kernel(dropout_backward_kernel1<T>, dim3((unsigned)CEIL_DIV(n, (size_t)256)), dim3(256), 0,
                            stream, dinp, dout, mask, n, d.scale));
}

// ----------------------------------------------------------------------------
// Validation

// Both variants, forward, residual forward and backward, against the reference at n elements. The
// tolerance is zero: each element is one fp32 multiply (and one add) rounded to T, computed by the same
// formula on the host, and the mask is the same function of (seed, offset, index) on both sides.
template <class T>
void validate(size_t n, float p) {
    const uint64_t seed = 1234, offset = 5;
    std::vector<T> x = th::random_tensor<T>(n, 1), res = th::random_tensor<T>(n, 2, -4.f, 4.f),
                   g = th::random_tensor<T>(n, 3);
    DropoutArgs d = dropout_args("validate", p, seed, offset);
    std::vector<T> ref, ref_res, ref_grad;
    dropout_cpu<T>(ref, nullptr, x, d);
    dropout_cpu<T>(ref_res, &res, x, d);
    dropout_cpu<T>(ref_grad, nullptr, g, d);
    const th::Tol exact{0, 0};
    char name[160];
    th::DeviceBuffer<T> d_x(x), d_res(res), d_g(g), out(n, th::Fill::NaN), out_res(n, th::Fill::NaN),
        dinp(n, th::Fill::NaN);
    th::DeviceBuffer<uint8_t> mask(n, th::Fill::Zero);
    for (int variant = 1; variant <= 2; variant++) {
        const char* vname = variant == 1 ? "variant 1 (scalar, stored mask)" : "(llmc)";
        if (variant == 1) {
            dropout_forward1(out.ptr, mask.ptr, (const T*)nullptr, (const T*)d_x.ptr, n, p, seed, offset, 0);
            dropout_forward1(out_res.ptr, mask.ptr, (const T*)d_res.ptr, (const T*)d_x.ptr, n, p, seed, offset, 0);
            dropout_backward1(dinp.ptr, (const T*)d_g.ptr, (const uint8_t*)mask.ptr, n, p, 0);
        } else {
            dropout_forward(out.ptr, (const T*)d_x.ptr, n, p, seed, offset, 0);
            dropout_residual_forward(out_res.ptr, (const T*)d_res.ptr, (const T*)d_x.ptr, n, p, seed, offset, 0);
            dropout_backward(dinp.ptr, (const T*)d_g.ptr, n, p, seed, offset, 0);
        }
        snprintf(name, sizeof(name), "dropout_forward %s %s n=%zu p=%.2f", vname, th::dtype_name<T>(), n, p);
        th::check_close(name, ref.data(), out.host().data(), n, exact);
        snprintf(name, sizeof(name), "dropout_residual_forward %s %s n=%zu p=%.2f", vname, th::dtype_name<T>(), n, p);
        th::check_close(name, ref_res.data(), out_res.host().data(), n, exact);
        snprintf(name, sizeof(name), "dropout_backward %s %s n=%zu p=%.2f", vname, th::dtype_name<T>(), n, p);
        th::check_close(name, ref_grad.data(), dinp.host().data(), n, exact);
    }
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
void benchmark(size_t n, int reps) {
    const double S = sizeof(T);
    const float p = 0.1f;
    printf("%s, n=%zu, p=%.1f:\n", th::dtype_name<T>(), n, p);
    th::DeviceBuffer<T> x(th::random_tensor<T>(n, 1)), res(th::random_tensor<T>(n, 2)), out(n, th::Fill::Zero);
    th::DeviceBuffer<uint8_t> mask(n, th::Fill::Zero);
    const T* xp = x.ptr;
    const T* rp = res.ptr;
    bench_line("dropout_forward variant 1 (scalar, stored mask)",
               time_ms([&] { dropout_forward1(out.ptr, mask.ptr, (const T*)nullptr, xp, n, p, 1, 0, 0); }, reps),
               2 * n * S);
    bench_line("dropout_forward (llmc)", time_ms([&] { dropout_forward(out.ptr, xp, n, p, 1, 0, 0); }, reps),
               2 * n * S);
    bench_line("dropout_residual variant 1 (scalar, stored mask)",
               time_ms([&] { dropout_forward1(out.ptr, mask.ptr, rp, xp, n, p, 1, 0, 0); }, reps), 3 * n * S);
    bench_line("dropout_residual (llmc)",
               time_ms([&] { dropout_residual_forward(out.ptr, rp, xp, n, p, 1, 0, 0); }, reps), 3 * n * S);
    bench_line("dropout_backward variant 1 (scalar, stored mask)",
               time_ms([&] { dropout_backward1(out.ptr, xp, (const uint8_t*)mask.ptr, n, p, 0); }, reps), 2 * n * S);
    bench_line("dropout_backward (llmc)", time_ms([&] { dropout_backward(out.ptr, xp, n, p, 1, 0, 0); }, reps),
               2 * n * S);
    bench_line("p = 0: dropout_forward (llmc, a copy)", time_ms([&] { dropout_forward(out.ptr, xp, n, 0.f, 1, 0, 0); },
                                                                 reps), 2 * n * S);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "Hidden-state dropout (forward, fused with the residual add, backward): variant 1 (a stored\n"
        "mask) and production (llmc/dropout.cuh, the mask regenerated), exact, timed in GB/s.\n" DEV_VALIDATES);
    // Validation: a size that is not a multiple of the pack (4 fp32 / 8 bf16, fp16) or the block.
    for (float p : {0.1f, 0.5f}) {
        validate<float>(100003, p);
        validate<__nv_bfloat16>(100003, p);
        validate<__half>(100003, p);
    }

    // Benchmark: BERT-base's hidden states at B=32, T=512 (C=768) on a GPU; a slice on the CPU backend.
#if defined(SIMT_CPU)
    printf("benchmark (CPU backend: times are for the simulator, not for any GPU)\n");
    benchmark<__nv_bfloat16>((size_t)64 * 768, 2);
#else
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("benchmark on %s\n", prop.name);
    benchmark<__nv_bfloat16>((size_t)32 * 512 * 768, 50);
    benchmark<float>((size_t)32 * 512 * 768, 50);
#endif
    return th::finish();
}
