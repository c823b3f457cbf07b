// llmc/sgd.cuh — the SGD update (momentum, dampening, Nesterov, L2 weight decay) of every parameter in
// one launch, with torch.optim.SGD's numerics.
//
// The buffers and the tensor table are AdamW's (llmc/adamw.cuh): parameters, gradients and the
// momentum buffer each live in one contiguous buffer of N elements, and ParamTensor says where each
// tensor starts, how long it is and whether weight decay applies to it (torch needs two param groups
// for the same effect).
//
// Matching PyTorch. torch.optim.SGD's single-tensor path (the default on the CPU) does, per tensor,
// with Python-double scalars rounded to fp32 where they meet an fp32 tensor op:
//     d_p = d_p.add(param, alpha=wd)                  g = fma(p, (float)wd, g)         (L2, not decoupled)
//     buf = torch.clone(d_p)                          b = g                            (first step)
//     buf.mul_(momentum).add_(d_p, alpha=1-damp)      b = fma(g, (float)(1-damp), b * (float)momentum)
//     d_p = d_p.add(buf, alpha=momentum)              g = fma(b, (float)momentum, g)   (nesterov)
//     d_p = buf                                       g = b                            (otherwise)
//     param.add_(d_p, alpha=-lr)                      p = fma(g, (float)(-lr), p)
// torch's `a.add(b, alpha=s)` on the CPU is one fused multiply-add (vec::fmadd, and the scalar tail
// compiled with FMA) when torch runs its AVX2/AVX-512 kernels, as on every x86 CPU of the last decade;
// its DEFAULT (no-AVX2) build rounds the product and the sum separately. Gradient clipping multiplies
// the gradients by the clip factor first (g = grad * grad_scale, one rounding), as in llmc/adamw.cuh.
// The kernel does these operations in this order with explicitly rounded intrinsics (fmaf, __fmul_rn),
// so nvcc cannot fuse or reorder them: a GPU, the CPU backend and torch get the same bits, up to
// subnormals (below 2^-126), which a GPU build reads and writes as zero (llmc/adamw.cuh says why).
#pragma once
#include "adamw.cuh"

// The per-step scalars of one SGD update, rounded to fp32 as torch rounds its Python scalars.
struct SGDCoefficients {
    float neg_lr;            // -lr
    float momentum;          // 0: no momentum buffer
    float one_minus_damp;    // weight of the gradient in the momentum buffer (1 - dampening)
    float weight_decay;      // L2 coefficient added to the gradient (tensors with the flag only)
    float grad_scale;        // multiplies every gradient first (clipping, loss scaling)
    int nesterov;            // g + momentum * buf instead of buf
    int first_step;          // the momentum buffer starts as a copy of the gradient (torch's clone)
};

// ----------------------------------------------------------------------------
// CUDA kernels

// SGD over all tensors in one launch: blockIdx.y picks the tensor (its weight decay flag is then
// uniform over the block), blockIdx.x and a grid-stride loop cover the tensor; element accesses are
// scalar and coalesced, so tensors may start at any offset. The update goes to master when there is
// one and params receives it rounded to T; otherwise params (fp32) is the master. buf is read and
// written only when momentum != 0.
template <class T>
__global__ void sgd_kernel(T* params, float* master, const T* grads, float* buf, const ParamTensor* tensors,
                           SGDCoefficients c, const float* grad_scale_device) {
    const ParamTensor t = tensors[blockIdx.y];
    const bool decay = t.weight_decay && c.weight_decay != 0.0f;  // torch skips the add when wd == 0
    const float scale = grad_scale_device ? __fmul_rn(c.grad_scale, *grad_scale_device) : c.grad_scale;
    const size_t end = t.offset + t.size;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = t.offset + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < end; i += stride) {
        float p = master ? master[i] : to_float(params[i]);
        float g = __fmul_rn(to_float(grads[i]), scale);
        if (decay) g = fmaf(p, c.weight_decay, g);
        if (c.momentum != 0.0f) {
            float b = c.first_step ? g : fmaf(g, c.one_minus_damp, __fmul_rn(buf[i], c.momentum));
            buf[i] = b;
            g = c.nesterov ? fmaf(b, c.momentum, g) : b;
        }
        p = fmaf(g, c.neg_lr, p);
        if (master) master[i] = p;
        params[i] = from_float<T>(p);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// One SGD step over all N parameters. params (N) is written; master (N, fp32) holds the weights when
// T is a lower precision (nullptr when T is float: params are then the master); grads (N) are
// multiplied by grad_scale (and by *grad_scale_device when given, e.g. grad_clip_scale's output)
// before use; momentum_buf (N, fp32) is the momentum buffer (nullptr allowed when momentum == 0).
// tensors (device, num_tensors entries) partitions [0, N). step is 1-based: on step 1 the momentum
// buffer is set to the gradient (its previous content is ignored), as torch does when it has none.
template <class T>
void sgd_update(T* params, float* master, const T* grads, float* momentum_buf, const ParamTensor* tensors,
                int num_tensors, size_t N, float lr, float momentum, float dampening, float weight_decay,
                bool nesterov, float grad_scale, int step, cudaStream_t stream,
                const float* grad_scale_device = nullptr) {
    if (step < 1) {
        fprintf(stderr, "sgd_update: step must be >= 1 (1-based: step 1 initialises the momentum buffer), got %d\n",
                step);
        exit(EXIT_FAILURE);
    }
    if (num_tensors < 1 || num_tensors > 65535) {
        fprintf(stderr, "sgd_update: num_tensors must be in [1, 65535] (one grid row each), got %d\n", num_tensors);
        exit(EXIT_FAILURE);
    }
    if (master == nullptr && !std::is_same<T, float>::value) {
        fprintf(stderr, "sgd_update: %zu-byte parameters need fp32 master weights (master == nullptr): "
                "rounding every update to the storage type would lose updates smaller than half an ulp\n",
                sizeof(T));
        exit(EXIT_FAILURE);
    }
    if (momentum != 0.0f && momentum_buf == nullptr) {
        fprintf(stderr, "sgd_update: momentum %g needs a momentum buffer of N floats (momentum_buf == nullptr)\n",
                momentum);
        exit(EXIT_FAILURE);
    }
    if (nesterov && (momentum <= 0.0f || dampening != 0.0f)) {
        fprintf(stderr, "sgd_update: Nesterov momentum requires momentum > 0 and dampening 0 (as torch.optim.SGD), "
                "got momentum %g, dampening %g\n", momentum, dampening);
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    // As adamw_update: enough blocks per tensor for one tensor alone to fill every SM once.
    const int block_size = 512;
    int device, sm_count, threads_per_sm;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
    cudaCheck(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    size_t one_wave = (size_t)sm_count * (threads_per_sm / block_size);
    size_t grid_x = CEIL_DIV(N, (size_t)block_size);
    if (grid_x > one_wave) grid_x = one_wave;
    SGDCoefficients c;
    c.neg_lr = -lr;
    c.momentum = momentum;
    c.one_minus_damp = (float)(1.0 - (double)dampening);
    c.weight_decay = weight_decay;
    c.grad_scale = grad_scale;
    c.nesterov = nesterov ? 1 : 0;
    c.first_step = step == 1 ? 1 : 0;
    cudaCheck(launch_kernel(sgd_kernel<T>, dim3((unsigned)grid_x, (unsigned)num_tensors), dim3(block_size), 0,
                            stream, params, master, grads, momentum_buf, tensors, c, grad_scale_device));
}
