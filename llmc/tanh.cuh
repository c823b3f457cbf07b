// llmc/tanh.cuh — the tanh activation, forward and in-place backward (BERT's pooler: tanh of a dense
// layer over the [CLS] row; the bias comes from the matmul's cuBLASLt epilogue).
//
// The forward does not call tanhf: under --use_fast_math (the project's nvcc flags) nvcc turns it
// into tanh.approx.f32, whose relative error the PTX ISA bounds only by 2^-11 (2^-16.5, ~90
// eps_fp32, measured over the positive normal floats on an H100). tanh_fp32 below is accurate under
// any flags, for about 40 instructions per element instead of a few: the fp32 forward stays
// memory-bound, the bf16 forward of an activation-sized tensor becomes issue-bound on an H100 (67% of
// peak bandwidth instead of 82%, dev/cuda/tanh.cu), and the pooler's B x C elements cost a launch.
//
// The derivative 1 - tanh(x)^2 loses its relative accuracy where tanh(x) approaches +-1 (|x| > ~2:
// the subtraction cancels the leading bits), so the backward evaluates the same quantity as
// sech(x)^2 = 4e / (1 + e)^2 with e = exp(-2|x|) <= 1 from the forward pass's input x: no
// cancellation, no overflow, a few fp32 ulps for every x. Outputs are rounded once to the storage type.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cstdint>

// ----------------------------------------------------------------------------
// CUDA kernels

// tanh(x) = sign(x) e / (e + 2) with e = expm1(2|x|) >= 0: no cancellation for any x. Relative error
// at most 2 eps_fp32: expm1f's 1 ulp (fast math changes only its subnormal results), damped by
// 2/(e + 2) <= 1 in the quotient, then half an ulp each for e + 2 and the correctly rounded division
// (1.68 eps_fp32 measured over the positive normal floats on an H100, under --use_fast_math).
// From |x| = 9.1 on tanh rounds to +-1 in fp32 (and from 44 on e would overflow). The test is
// written so that a NaN fails it and stays NaN: a model holding a NaN must show it in its loss.
__device__ inline float tanh_fp32(float x) {
    float a = fabsf(x), e = expm1f(2.f * a);
    return copysignf(a >= 9.1f ? 1.f : __fdiv_rn(e, e + 2.f), x);
}

// tanh'(x) = sech(x)^2, in the cancellation-free form above.
__device__ inline float tanh_derivative(float x) {
    float e = expf(-2.f * fabsf(x));
    float d = 1.f + e;
    return 4.f * e / (d * d);
}

// out = tanh(inp). Each thread handles one Packed128's worth of elements: one 128-bit access per
// operand when `packed` (pointers 16-byte aligned) and the pack lies inside N, element by element
// otherwise (the tail, or misaligned views). out may alias inp.
template <class T>
__global__ void tanh_forward_kernel(T* out, const T* inp, size_t N, bool packed) {
    constexpr int P = Packed128<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= N) return;
    if (packed && i + P <= N) {
        Packed128<T> x = load128(inp + i), y;
        for (int k = 0; k < P; k++) y[k] = from_float<T>(tanh_fp32(to_float(x[k])));
        store128(out + i, y);
    } else {
        for (size_t j = i; j < N && j < i + P; j++) out[j] = from_float<T>(tanh_fp32(to_float(inp[j])));
    }
}

// d_in_out = d_in_out * tanh'(inp), in place; same work split as tanh_forward_kernel.
template <class T>
__global__ void tanh_backward_inplace_kernel(T* d_in_out, const T* inp, size_t N, bool packed) {
    constexpr int P = Packed128<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= N) return;
    if (packed && i + P <= N) {
        Packed128<T> x = load128(inp + i), d = load128(d_in_out + i);
        for (int k = 0; k < P; k++) d[k] = from_float<T>(to_float(d[k]) * tanh_derivative(to_float(x[k])));
        store128(d_in_out + i, d);
    } else {
        for (size_t j = i; j < N && j < i + P; j++)
            d_in_out[j] = from_float<T>(to_float(d_in_out[j]) * tanh_derivative(to_float(inp[j])));
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

constexpr int kTanhBlockSize = 256;

// out = tanh(inp) over N elements (any N, any alignment; out may equal inp).
template <class T>
void tanh_forward(T* out, const T* inp, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    dim3 grid((unsigned)CEIL_DIV(N, (size_t)kTanhBlockSize * P));
    cudaCheck(launch_kernel(tanh_forward_kernel<T>, grid, dim3(kTanhBlockSize), 0, stream, out, inp, N,
                            aligned16({out, inp})));
}

// d_in_out = d_in_out * tanh'(inp) over N elements: on entry the gradient of tanh's output, on return
// that of its input; inp is the forward pass's input (not its output, see the top of the file).
template <class T>
void tanh_backward_inplace(T* d_in_out, const T* inp, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    dim3 grid((unsigned)CEIL_DIV(N, (size_t)kTanhBlockSize * P));
    cudaCheck(launch_kernel(tanh_backward_inplace_kernel<T>, grid, dim3(kTanhBlockSize), 0, stream, d_in_out, inp, N,
                            aligned16({d_in_out, inp})));
}
