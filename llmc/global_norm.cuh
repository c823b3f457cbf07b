// llmc/global_norm.cuh — the global gradient norm: a deterministic sum of squares over one contiguous
// buffer, and the clip factor torch.nn.utils.clip_grad_norm_ derives from it.
//
// Determinism. The partition is fixed by N alone (not by the GPU's SM count): each thread sums its
// grid-stride share in a fixed order, each block reduces through a fixed shuffle tree into its own
// slot of `scratch`, and one small block sums the slots in a fixed order. No float atomics, so the
// result is the same bits on every run and every GPU (and the CPU backend, FMA for FMA).
//
// One training step with no extra host sync:
//     global_norm_squared(norm2, scratch, grads, N, stream);   // device scalar
//     grad_clip_scale(clip, norm2, max_norm, stream);          // device scalar, torch's clip factor
//     adamw_update(..., grad_scale, step, stream, clip);       // reads *clip on the device
//     cudaMemcpyAsync(host_norm2, norm2, sizeof(float), cudaMemcpyDeviceToHost, stream);
// The norm reaches the host (pinned memory) with the loss, at the step's one synchronization, in
// time to be logged; nothing waits for it before the update.
#pragma once
#include "precision.cuh"

#include <cstdint>

// Threads per block of the partial-sum kernel, and the cap on its blocks (= scratch slots): fixed
// constants, so the partition, and therefore the rounding, does not depend on the device. 1024
// blocks of 512 threads are about two waves on an H100 (132 SMs x 4 blocks), enough to saturate HBM.
constexpr int GLOBAL_NORM_BLOCK_SIZE = 512;
constexpr int GLOBAL_NORM_MAX_BLOCKS = 1024;
// Below the cap, each thread gets at least this many elements before another block is added.
constexpr int GLOBAL_NORM_MIN_ELEMS_PER_THREAD = 16;
// Threads of the single block that sums the per-block partials.
constexpr int GLOBAL_NORM_FINAL_BLOCK_SIZE = 256;

// Number of blocks (and partial sums) global_norm_squared uses for N values.
inline int global_norm_num_blocks(size_t N) {
    size_t blocks = CEIL_DIV(N, (size_t)GLOBAL_NORM_BLOCK_SIZE * GLOBAL_NORM_MIN_ELEMS_PER_THREAD);
    if (blocks < 1) blocks = 1;
    if (blocks > (size_t)GLOBAL_NORM_MAX_BLOCKS) blocks = GLOBAL_NORM_MAX_BLOCKS;
    return (int)blocks;
}

// Bytes of device scratch global_norm_squared needs for N values (one float per block).
inline size_t global_norm_scratch_bytes(size_t N) { return (size_t)global_norm_num_blocks(N) * sizeof(float); }

// ----------------------------------------------------------------------------
// CUDA kernels

// Sum of x over the block, returned to every thread, through a fixed tree (deterministic).
// blockDim.x must be a multiple of 32; called once per kernel (its shared slots are not re-synced).
__device__ inline float global_norm_block_sum(float x) {
    __shared__ float warp_sums[32];
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = lane < (int)blockDim.x / 32 ? warp_sums[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// partials[blockIdx.x] = sum of values[i]^2 over this block's grid-stride share, read as 128-bit
// packs (values must be 16-byte aligned); the last N % pack elements go to block 0's first threads.
template <class T>
__global__ void global_norm_partials_kernel(float* partials, const T* values, size_t N) {
    constexpr int P = Packed128<T>::size;
    const size_t num_packs = N / P;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    float acc = 0.f;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < num_packs; k += stride) {
        Packed128<T> pack = load128cs(values + k * P);
        for (int j = 0; j < P; j++) {
            float x = to_float(pack[j]);
            acc = fmaf(x, x, acc);
        }
    }
    if (blockIdx.x == 0 && threadIdx.x < N - num_packs * P) {
        float x = to_float(values[num_packs * P + threadIdx.x]);
        acc = fmaf(x, x, acc);
    }
    float block_sum = global_norm_block_sum(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

// *out = sum of the num_partials partial sums, in a fixed order (one block).
__global__ void global_norm_final_kernel(float* out, const float* partials, int num_partials) {
    float acc = 0.f;
    for (int i = threadIdx.x; i < num_partials; i += blockDim.x) acc += partials[i];
    float total = global_norm_block_sum(acc);
    if (threadIdx.x == 0) *out = total;
}

// *scale = min(max_norm / (sqrt(*norm_squared) + 1e-6), 1) in fp32 as torch computes it
// (max_norm / tensor is tensor.reciprocal() * max_norm; clamp keeps a NaN, so a NaN or inf norm
// poisons the step as it does in torch).
__global__ void grad_clip_scale_kernel(float* scale, const float* norm_squared, float max_norm) {
    float norm = __fsqrt_rn(*norm_squared);
    float coef = __fmul_rn(__frcp_rn(__fadd_rn(norm, 1e-6f)), max_norm);
    *scale = coef > 1.0f ? 1.0f : coef;
}

// ----------------------------------------------------------------------------
// kernel launchers

// *out (device scalar) = sum of values[i]^2 over N values (N), accumulated in fp32, deterministically.
// scratch: global_norm_scratch_bytes(N) bytes of device memory. values must be 16-byte aligned
// (cudaMalloc'd buffers are); N is any size.
template <class T>
void global_norm_squared(float* out, void* scratch, const T* values, size_t N, cudaStream_t stream) {
    if (!aligned16({values})) {
        fprintf(stderr, "global_norm_squared: values must be 16-byte aligned (128-bit loads), got %p\n",
                (const void*)values);
        exit(EXIT_FAILURE);
    }
    float* partials = static_cast<float*>(scratch);
    const int num_blocks = global_norm_num_blocks(N);
    cudaCheck(launch_kernel(global_norm_partials_kernel<T>, dim3(num_blocks), dim3(GLOBAL_NORM_BLOCK_SIZE), 0,
                            stream, partials, values, N));
    cudaCheck(launch_kernel(global_norm_final_kernel, dim3(1), dim3(GLOBAL_NORM_FINAL_BLOCK_SIZE), 0, stream,
                            out, (const float*)partials, num_blocks));
}

// *scale (device scalar) = torch.nn.utils.clip_grad_norm_'s clip factor for the squared norm
// *norm_squared (device scalar) and max_norm; pass scale to adamw_update's grad_scale_device. With
// clipping off, skip it and pass nullptr there (max_norm = 0 would zero every gradient, as in torch).
inline void grad_clip_scale(float* scale, const float* norm_squared, float max_norm, cudaStream_t stream) {
    cudaCheck(launch_kernel(grad_clip_scale_kernel, dim3(1), dim3(1), 0, stream, scale, norm_squared, max_norm));
}
