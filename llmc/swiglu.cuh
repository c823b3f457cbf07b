// llmc/swiglu.cuh — the SwiGLU gate of Llama/Mixtral-style MLPs, forward and backward:
// out = silu(gate) * up, silu(g) = g * sigmoid(g), with gate and up the two halves of one GEMM output.
//
// Layout. inp (R, 2H) holds, per row, the gate pre-activations in columns [0, H) and the up
// projection in [H, 2H): one GEMM with the gate and up weights stacked as (2H, C) produces it.
// out (R, H). Everything is computed in fp32 and rounded once to the storage type.
//
// Backward, with s = sigmoid(g): d gate = dout * up * silu'(g), silu'(g) = s * (1 + g * (1 - s));
// d up = dout * silu(g). sigmoid(g) = 1 / (1 + exp(-g)) saturates cleanly in fp32 (exp overflows to
// inf for g < -88, giving s = 0 and silu = -0, the limits), so no special cases are needed.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>

constexpr int kSwigluBlockSize = 256;

// ----------------------------------------------------------------------------
// CUDA kernels

// One thread per output element (r, h) of out (R, H): out = silu(inp[r, h]) * inp[r, H + h].
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, size_t R, int H) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * H) return;
    size_t r = i / H, h = i % H;
    float g = to_float(inp[r * 2 * H + h]), u = to_float(inp[r * 2 * H + H + h]);
    float s = 1.f / (1.f + expf(-g));
    out[i] = from_float<T>(g * s * u);
}

// One thread per element (r, h) of dout (R, H): writes both halves of dinp (R, 2H) at (r, h) and
// (r, H + h) from inp (R, 2H), the forward's input.
template <class T>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, size_t R, int H) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * H) return;
    size_t r = i / H, h = i % H;
    float g = to_float(inp[r * 2 * H + h]), u = to_float(inp[r * 2 * H + H + h]);
    float d = to_float(dout[i]);
    float s = 1.f / (1.f + expf(-g));
    dinp[r * 2 * H + h] = from_float<T>(d * u * s * (1.f + g * (1.f - s)));
    dinp[r * 2 * H + H + h] = from_float<T>(d * g * s);
}

// ----------------------------------------------------------------------------
// kernel launchers

// out (R, H) = silu(inp[:, :H]) * inp[:, H:] for inp (R, 2H). out must not alias inp (its rows are
// narrower, so an in-place call would overwrite inputs other threads still read).
template <class T>
void swiglu_forward(T* out, const T* inp, size_t R, int H, cudaStream_t stream) {
    if (H <= 0) {
        fprintf(stderr, "swiglu_forward: need H > 0, got %d\n", H);
        exit(EXIT_FAILURE);
    }
    size_t n = R * H;
    if (n == 0) return;
    cudaCheck(launch_kernel(swiglu_forward_kernel<T>, dim3((unsigned)CEIL_DIV(n, (size_t)kSwigluBlockSize)),
                            dim3(kSwigluBlockSize), 0, stream, out, inp, R, H));
}

// dinp (R, 2H, overwritten) = the gradients of the gate and up halves of inp (R, 2H) from dout (R, H).
template <class T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, size_t R, int H, cudaStream_t stream) {
    if (H <= 0) {
        fprintf(stderr, "swiglu_backward: need H > 0, got %d\n", H);
        exit(EXIT_FAILURE);
    }
    size_t n = R * H;
    if (n == 0) return;
    cudaCheck(launch_kernel(swiglu_backward_kernel<T>, dim3((unsigned)CEIL_DIV(n, (size_t)kSwigluBlockSize)),
                            dim3(kSwigluBlockSize), 0, stream, dinp, dout, inp, R, H));
}
