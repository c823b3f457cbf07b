// llmc/gelu.cuh — the GELU activation, forward and backward, in the tanh form of GPT-2 ("gelu_new")
// and the exact erf form of BERT ("gelu").
//
// Tanh: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).   Erf: 0.5 x (1 + erf(x / sqrt(2))).
// Both are evaluated in fp32 in forms that avoid the cancellation in 1 + tanh(u) and 1 + erf(..)
// for negative x (where both terms approach -1 and the difference loses every correct digit):
// 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)), and 0.5 (1 + erf(z)) = 0.5 erfc(-z).
// The results keep their relative accuracy for every x (a few fp32 ulps, growing in the far
// negative tail only as the exponential's conditioning demands), at the same cost (the kernels are
// memory-bound). Outputs are rounded once to the storage type.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cstdint>

// Which GELU: Tanh for GPT-2, Erf for BERT.
enum class GeluKind { Tanh, Erf };

// ----------------------------------------------------------------------------
// CUDA kernels

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kGeluInvSqrt2 = 0.7071067811865476f;
constexpr float kGeluInvSqrt2Pi = 0.3989422804014327f;

// sigmoid(2u) and its derivative sigmoid'(2u) = sigmoid(2u) sigmoid(-2u) for the tanh form, from
// t = exp(-2|u|) <= 1: never overflows, and neither loses relative accuracy for either sign of u.
__device__ inline void gelu_tanh_sigmoid(float x, float& sig, float& dsig) {
    float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
    float t = expf(-2.f * fabsf(u));
    float r = 1.f / (1.f + t);
    sig = u >= 0.f ? r : t * r;
    dsig = t * r * r;
}

// GELU(x).
template <GeluKind kind>
__device__ inline float gelu_value(float x) {
    if constexpr (kind == GeluKind::Tanh) {
        float sig, dsig;
        gelu_tanh_sigmoid(x, sig, dsig);
        return x * sig;
    } else {
        return 0.5f * x * erfcf(-x * kGeluInvSqrt2);
    }
}

// GELU'(x). Tanh: sigmoid(2u) + x * 2 sigmoid'(2u) du/dx. Erf: Phi(x) + x phi(x).
template <GeluKind kind>
__device__ inline float gelu_derivative(float x) {
    if constexpr (kind == GeluKind::Tanh) {
        float sig, dsig;
        gelu_tanh_sigmoid(x, sig, dsig);
        float du_dx = kGeluSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
        return sig + 2.f * x * dsig * du_dx;
    } else {
        return 0.5f * erfcf(-x * kGeluInvSqrt2) + x * kGeluInvSqrt2Pi * expf(-0.5f * x * x);
    }
}

// out = GELU(inp). Each thread handles one Packed128's worth of elements: one 128-bit access per
// operand when `packed` (pointers 16-byte aligned) and the pack lies inside N, element by element
// otherwise (the tail, or misaligned views). out may alias inp.
template <class T, GeluKind kind>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t N, bool packed) {
    constexpr int P = Packed128<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= N) return;
    if (packed && i + P <= N) {
        Packed128<T> x = load128cs(inp + i), y;
        for (int k = 0; k < P; k++) y[k] = from_float<T>(gelu_value<kind>(to_float(x[k])));
        store128(out + i, y);
    } else {
        for (size_t j = i; j < N && j < i + P; j++) out[j] = from_float<T>(gelu_value<kind>(to_float(inp[j])));
    }
}

// d_in_out = d_in_out * GELU'(inp): turns the gradient of GELU's output into that of its input,
// in place. Same work split as gelu_forward_kernel.
template <class T, GeluKind kind>
__global__ void gelu_backward_inplace_kernel(T* d_in_out, const T* inp, size_t N, bool packed) {
    constexpr int P = Packed128<T>::size;
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * P;
    if (i >= N) return;
    if (packed && i + P <= N) {
        Packed128<T> x = load128cs(inp + i), d = load128(d_in_out + i);
        for (int k = 0; k < P; k++) d[k] = from_float<T>(to_float(d[k]) * gelu_derivative<kind>(to_float(x[k])));
        store128(d_in_out + i, d);
    } else {
        for (size_t j = i; j < N && j < i + P; j++)
            d_in_out[j] = from_float<T>(to_float(d_in_out[j]) * gelu_derivative<kind>(to_float(inp[j])));
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

constexpr int kGeluBlockSize = 256;

// out = GELU(inp) over N elements (any N, any alignment; out may equal inp).
template <class T>
void gelu_forward(T* out, const T* inp, size_t N, GeluKind kind, cudaStream_t stream) {
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    dim3 grid((unsigned)CEIL_DIV(N, (size_t)kGeluBlockSize * P));
    bool packed = aligned16({out, inp});
    auto kernel = kind == GeluKind::Tanh ? gelu_forward_kernel<T, GeluKind::Tanh> : gelu_forward_kernel<T, GeluKind::Erf>;
    cudaCheck(launch_kernel(kernel, grid, dim3(kGeluBlockSize), 0, stream, out, inp, N, packed));
}

// d_in_out = d_in_out * GELU'(inp) over N elements: on entry the gradient of the GELU output
// (dout), on return that of its input (dinp); inp is the forward pass's GELU input.
template <class T>
void gelu_backward_inplace(T* d_in_out, const T* inp, size_t N, GeluKind kind, cudaStream_t stream) {
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    dim3 grid((unsigned)CEIL_DIV(N, (size_t)kGeluBlockSize * P));
    bool packed = aligned16({d_in_out, inp});
    auto kernel = kind == GeluKind::Tanh ? gelu_backward_inplace_kernel<T, GeluKind::Tanh>
                                         : gelu_backward_inplace_kernel<T, GeluKind::Erf>;
    cudaCheck(launch_kernel(kernel, grid, dim3(kGeluBlockSize), 0, stream, d_in_out, inp, N, packed));
}
