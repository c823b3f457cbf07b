// llmc/adamw.cuh — the AdamW update of every parameter in one launch (torch.optim.AdamW's numerics),
// and the float <-> bf16/fp16 cast that makes compute-precision copies of the fp32 master weights.
//
// Parameters, gradients and the two moments each live in one contiguous buffer of N elements; a
// device-side table of ParamTensor says where each tensor starts, how long it is and whether it
// gets weight decay (matrices do, biases and layernorm gains do not, as in GPT-2 / llm.c).
//
// Matching PyTorch. torch.optim.AdamW on the CPU (single-tensor path, the default there) computes
// the per-step scalars in Python double precision and each tensor op in fp32, in this order:
//     param.mul_(1 - lr*wd)                                  p = p * (float)(1 - lr*wd)
//     exp_avg.lerp_(grad, 1 - beta1)                         m = fma(w1, g - m, m), w1 = (float)(1 - beta1)
//     exp_avg_sq.mul_(beta2)                                 v = v * (float)beta2
//               .addcmul_(grad, grad, value=1 - beta2)       v = v + ((float)(1 - beta2) * g) * g
//     denom = (exp_avg_sq.sqrt() / sqrt(1 - beta2^t))        d = sqrt(v) / (float)sqrt(1 - beta2^t)
//             .add_(eps)                                     d = d + eps
//     param.addcdiv_(exp_avg, denom, value=-lr/(1-beta1^t))  p = p + ((float)(-lr/(1 - beta1^t)) * m) / d
// (lerp's vectorized CPU kernel is an explicit fmadd; addcmul and addcdiv evaluate left to right.)
// Gradient clipping (torch.nn.utils.clip_grad_norm_) multiplies the gradients by the clip factor
// first: g = grad * grad_scale, one rounding. The kernel does these operations in this order with
// explicitly rounded intrinsics (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, fmaf), so nvcc can
// neither contract a multiply and an add into an FMA nor, under --use_fast_math, approximate the
// division or square root: a GPU, the CPU backend and a host reference get the same bits, as long as
// no operand or result is subnormal (below 2^-126 ~ 1.2e-38). A GPU build reads and writes those as
// zero: --use_fast_math implies -ftz=true, which holds for every fp32 instruction, these intrinsics
// included, and CUDA has no per-function switch. So a gradient, moment or weight that small is 0 on a
// GPU and kept on the CPU backend and in torch; it changes a weight's bits only where nothing larger
// absorbs it (a weight at or near 0). test/test_adamw.cu checks both arithmetics.
// The scalar hyper-parameters arrive as float (0.9f is not Python's 0.9): the scalars derived from
// them differ from torch's by at most an ulp or two of fp32 when the trainer's values are not exactly
// representable.
#pragma once
#include "precision.cuh"

#include <cmath>
#include <type_traits>

// One parameter tensor inside the flat buffers: elements [offset, offset + size); weight_decay != 0
// when AdamW's decoupled weight decay applies to it.
struct ParamTensor {
    size_t offset;
    size_t size;
    int weight_decay;
};

// The per-step scalars of one update, computed once on the host in double precision as torch's
// Python code computes them, then rounded to fp32 as torch does when a Python float meets an fp32
// tensor op.
struct AdamWCoefficients {
    float decay;                  // 1 - lr*wd: decoupled weight decay factor
    float one_minus_beta1;        // lerp weight of the first moment
    float beta2;                  // second-moment decay
    float one_minus_beta2;        // weight of g^2 in the second moment
    float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
    float eps;                    // added to the bias-corrected sqrt(v)
    float neg_step_size;          // -lr / (1 - beta1^step)
    float grad_scale;             // multiplies every gradient first (clipping, loss scaling)
};

// Computes the per-step scalars from the hyper-parameters; step is 1-based.
inline AdamWCoefficients adamw_coefficients(float lr, float beta1, float beta2, float eps,
                                            float weight_decay, float grad_scale, int step) {
    double bias_correction1 = 1.0 - std::pow((double)beta1, (double)step);
    double bias_correction2 = 1.0 - std::pow((double)beta2, (double)step);
    AdamWCoefficients c;
    c.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    c.one_minus_beta1 = (float)(1.0 - (double)beta1);
    c.beta2 = beta2;
    c.one_minus_beta2 = (float)(1.0 - (double)beta2);
    c.bias_correction2_sqrt = (float)std::sqrt(bias_correction2);
    c.eps = eps;
    c.neg_step_size = (float)(-((double)lr / bias_correction1));
    c.grad_scale = grad_scale;
    return c;
}

// ----------------------------------------------------------------------------
// CUDA kernels

// Updates one element in fp32: weight p, moments m and v, scaled gradient g, weight decay factor
// decay (1 for tensors without weight decay: p * 1.0f is p, bit for bit, as skipping it is).
__device__ inline void adamw_element(float& p, float& m, float& v, float g, float decay,
                                     const AdamWCoefficients& c) {
    p = __fmul_rn(p, decay);
    m = fmaf(c.one_minus_beta1, g - m, m);
    v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bias_correction2_sqrt), c.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step_size, m), denom));
}

// The gradient multiplier of this launch: the host's grad_scale, times the device scalar when the
// trainer computed the clip factor on the device (so no host round trip sits between backward and
// update).
__device__ inline float adamw_grad_scale(const AdamWCoefficients& c, const float* grad_scale_device) {
    return grad_scale_device ? __fmul_rn(c.grad_scale, *grad_scale_device) : c.grad_scale;
}

// AdamW over all tensors in one launch: blockIdx.y picks the tensor (its weight decay flag is then
// uniform over the block), blockIdx.x and a grid-stride loop cover the tensor. Element accesses are
// scalar, so tensors may start at any offset (no alignment or size constraints); consecutive threads
// touch consecutive elements, so every access is coalesced. The update goes to master when there is
// one and params receives it rounded to T (nearest even); otherwise params (fp32) is the master.
template <class T>
__global__ void adamw_kernel(T* params, float* master, const T* grads, float* m, float* v,
                             const ParamTensor* tensors, AdamWCoefficients c,
                             const float* grad_scale_device) {
    const ParamTensor t = tensors[blockIdx.y];
    const float decay = t.weight_decay ? c.decay : 1.0f;
    const float scale = adamw_grad_scale(c, grad_scale_device);
    const size_t end = t.offset + t.size;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = t.offset + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < end; i += stride) {
        float p = master ? master[i] : to_float(params[i]);
        float g = __fmul_rn(to_float(grads[i]), scale);
        float mi = m[i], vi = v[i];
        adamw_element(p, mi, vi, g, decay, c);
        m[i] = mi;
        v[i] = vi;
        if (master) master[i] = p;
        params[i] = from_float<T>(p);
    }
}

// out[i] = in[i] converted through fp32 (float -> bf16 or fp16 rounds to nearest even, and to fp16's
// subnormals or inf outside its normal range; bf16/fp16 -> float is exact).
template <class Tout, class Tin>
__global__ void cast_kernel(Tout* out, const Tin* in, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = from_float<Tout>(to_float(in[i]));
}

// ----------------------------------------------------------------------------
// kernel launchers

// One AdamW step over all N parameters. params (N) is written; master (N, fp32) holds the weights
// when T is a lower precision (nullptr when T is float: params are then the master); grads (N) are
// multiplied by grad_scale (and by *grad_scale_device when given, e.g. grad_clip_scale's output)
// before use; m, v (N, fp32) are the moments. tensors (device, num_tensors entries) partitions
// [0, N). step is 1-based (bias correction).
template <class T>
void adamw_update(T* params, float* master, const T* grads, float* m, float* v,
                  const ParamTensor* tensors, int num_tensors, size_t N, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int step,
                  cudaStream_t stream, const float* grad_scale_device = nullptr) {
    if (step < 1) {
        fprintf(stderr, "adamw_update: step must be >= 1 (1-based, for bias correction), got %d\n", step);
        exit(EXIT_FAILURE);
    }
    if (num_tensors < 1 || num_tensors > 65535) {
        fprintf(stderr, "adamw_update: num_tensors must be in [1, 65535] (one grid row each), got %d\n",
                num_tensors);
        exit(EXIT_FAILURE);
    }
    if (master == nullptr && !std::is_same<T, float>::value) {
        fprintf(stderr, "adamw_update: %zu-byte parameters need fp32 master weights (master == nullptr): "
                "rounding every update to the storage type would lose updates smaller than half an ulp\n",
                sizeof(T));
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    // Enough blocks per tensor for one tensor alone to fill every SM once; blocks past the end of a
    // smaller tensor exit at once (for a table of a few dozen tensors that costs microseconds).
    const int block_size = 512;
    int device, sm_count, threads_per_sm;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    cudaCheck(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    size_t one_wave = (size_t)sm_count * (threads_per_sm / block_size);
    size_t grid_x = CEIL_DIV(N, (size_t)block_size);
    if (grid_x > one_wave) grid_x = one_wave;
    AdamWCoefficients c = adamw_coefficients(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    cudaCheck(launch_kernel(adamw_kernel<T>, dim3((unsigned)grid_x, (unsigned)num_tensors), dim3(block_size),
                            0, stream, params, master, grads, m, v, tensors, c, grad_scale_device));
}

// Converts N elements from Tin to Tout (float <-> __nv_bfloat16 or __half, or a plain copy): start-up
// copies of the fp32 master weights to the compute precision, and checkpoints. A weight beyond fp16's
// 65504 becomes inf (no clamping: a model that has such weights cannot run in fp16).
template <class Tout, class Tin>
void cast(Tout* out, const Tin* in, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    const int block_size = 512;
    cudaCheck(launch_kernel(cast_kernel<Tout, Tin>, dim3((unsigned)CEIL_DIV(N, (size_t)block_size)),
                            dim3(block_size), 0, stream, out, in, N));
}
