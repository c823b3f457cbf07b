// llmc/fused_classifier.cuh — softmax cross-entropy fused with its backward: per row of logits the
// loss, and dlogits = (softmax - onehot) * dloss written over the logits in place.
//
// One block per row. The first sweep keeps a running max and a running sum of exp(x - max) (the
// online softmax: one read of the row gives both, and no exp overflows however large the logits);
// the second sweep writes dlogits. No (N, V) probability buffer exists: at GPT-2 sizes it would be
// as large as the logits themselves.
//
// The second sweep reads the row from global memory again, backwards, so that it first meets the
// part of the row the first sweep left in L2: a block's row (98.2 KiB in bf16 at V = 50257) is
// mostly still there (on an H200, 8192 rows in 0.488 ms: two reads and a write from DRAM would need
// 5.1 TB/s, more than its 4.8). Keeping the row in the block's shared memory
// instead (ROW_ON_CHIP below, dev/cuda/fused_classifier.cu's variant 2) reads it from DRAM once by
// construction, but its 98 KiB per block leave room for 2 blocks of 512 threads per SM (4 without):
// on an H200 (bf16, N = 8192, V = 50257) it took 0.542 ms against 0.488 for the two reads. Both
// compute the same values in the same order: their results are bit-identical, and deterministic.
//
// fp16. The statistics and the loss are fp32; only dlogits are stored in T. At dloss = 1/(B*T) a
// dlogit p * dloss of a typical token (p ~ 1/V) is ~1e-9: far below fp16's normal range (6.1e-5),
// so without loss scaling nearly all of them round to zero. The trainer's loss scale multiplies
// dloss and lifts them into range; (p - 1) * dloss then overflows to -inf (never clamped) once dloss
// passes 65504, which the trainer's overflow check must see.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cfloat>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

constexpr int CLASSIFIER_BLOCK = 512;  // threads per row: 12 packs each at V = 50257 in bf16

// ----------------------------------------------------------------------------
// CUDA kernels

// Loads VEC consecutive values at p as floats (one 128-bit load when VEC is the pack width).
template <int VEC, class T>
__device__ inline void classifier_load(float* out, const T* p, bool streaming) {
    if constexpr (VEC == Packed128<T>::size) {
        Packed128<T> pack = streaming ? load128cs(p) : load128(p);
        for (int k = 0; k < VEC; k++) out[k] = to_float(pack[k]);
    } else {
        for (int k = 0; k < VEC; k++) out[k] = to_float(p[k]);
    }
}

// Stores VEC floats at p, each rounded once to T.
template <int VEC, class T>
__device__ inline void classifier_store(T* p, const float* in) {
    if constexpr (VEC == Packed128<T>::size) {
        Packed128<T> pack;
        for (int k = 0; k < VEC; k++) pack[k] = from_float<T>(in[k]);
        store128(p, pack);
    } else {
        for (int k = 0; k < VEC; k++) p[k] = from_float<T>(in[k]);
    }
}

// Merges the softmax statistics (m, s) of two disjoint sets of logits: the max of both, and each
// running sum rescaled to that max. Symmetric, so the two lanes of a butterfly agree bit for bit.
__device__ inline void classifier_merge(float& m, float& s, float other_m, float other_s) {
    float new_m = fmaxf(m, other_m);
    s = s * __expf(m - new_m) + other_s * __expf(other_m - new_m);
    m = new_m;
}

// One block per row of logits (N, Vp): loss = logsumexp(row[0..V)) - row[target]; with
// write_dlogits, row = (softmax - onehot(target)) * dloss, and 0 in the padding columns V..Vp-1.
// A row whose target is ignore_index gets loss 0 and dlogits 0; a row whose target is outside
// [0, V) gets loss NaN (so the mean loss shows it) and dlogits 0. Vp % VEC == 0.
// ROW_ON_CHIP: the block's dynamic shared memory holds the row's real packs
// (classifier_row_smem_bytes), so the second sweep does not read global memory.
template <class T, int VEC, bool ROW_ON_CHIP>
__global__ void __launch_bounds__(CLASSIFIER_BLOCK)
fused_classifier_kernel(T* logits, float* losses, const int* targets, int V, int Vp, float dloss,
                        const float* dloss_device, int ignore_index, bool write_dlogits) {
    __shared__ float warp_m[32], warp_s[32];
    T* row = ROW_ON_CHIP ? dynamic_shared<T>() : nullptr;
    T* x = logits + (size_t)blockIdx.x * Vp;
    int target = targets[blockIdx.x];
    int packs = Vp / VEC;

    if (target == ignore_index || target < 0 || target >= V) {
        if (threadIdx.x == 0) losses[blockIdx.x] = target == ignore_index ? 0.f : __int_as_float(0x7fc00000);
        if (!write_dlogits) return;
        float zeros[VEC] = {};
        for (int p = threadIdx.x; p < packs; p += blockDim.x) classifier_store<VEC>(x + p * VEC, zeros);
        return;
    }

    // Sweep 1: this thread's running max and sum over its packs of the V real columns. A pack's
    // max is taken first, so the rescaling exp is paid once per pack rather than once per logit.
    float m = -FLT_MAX, s = 0.f;  // -FLT_MAX, not -inf: exp(m - new_m) stays a number (0 or 1)
    int real_packs = CEIL_DIV(V, VEC);
    for (int p = threadIdx.x; p < real_packs; p += blockDim.x) {
        float v[VEC];
        if constexpr (ROW_ON_CHIP) {
            // Read once: streaming (evict-first), and kept as stored, in T, for the second sweep.
            Packed128<T> pack = load128cs(x + p * VEC);
            store128(row + p * VEC, pack);
            for (int k = 0; k < VEC; k++) v[k] = to_float(pack[k]);
        } else {
            classifier_load<VEC>(v, x + p * VEC, false);
        }
        int n = V - p * VEC < VEC ? V - p * VEC : VEC;  // the pack that straddles V is partly padding
        float pack_m = m;
        for (int k = 0; k < n; k++) pack_m = fmaxf(pack_m, v[k]);
        s *= __expf(m - pack_m);
        for (int k = 0; k < n; k++) s += __expf(v[k] - pack_m);
        m = pack_m;
    }
    // The target's logit is read before the barrier below, so before any thread overwrites it.
    float x_target = threadIdx.x == 0 ? to_float(x[target]) : 0.f;

    // Block reduction: butterfly within each warp, then every warp reduces the warps' results, so
    // that every thread ends with the row's statistics.
    for (int o = 16; o > 0; o >>= 1)
        classifier_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
    }
    __syncthreads();
    int num_warps = blockDim.x / 32;
    m = lane < num_warps ? warp_m[lane] : -FLT_MAX;
    s = lane < num_warps ? warp_s[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1)
        classifier_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));

    // (m - x_target) first: both are logits of the row, so the difference loses nothing to their
    // size (exact when within a factor 2), and the loss is rounded at its own magnitude.
    if (threadIdx.x == 0) losses[blockIdx.x] = (m - x_target) + logf(s);
    if (!write_dlogits) return;

    // Sweep 2, from the end of the row: dlogits = (exp(x - m) / s - onehot) * dloss. The row on
    // chip was written by other threads of the block: the barrier above (before the second warp
    // reduction) orders those writes before these reads.
    float inv_s = 1.f / s;
    if (dloss_device) dloss = *dloss_device;
    for (int p = packs - 1 - (int)threadIdx.x; p >= 0; p -= blockDim.x) {
        float v[VEC] = {};
        int i0 = p * VEC;
        if (i0 < V) {  // packs wholly in the padding: not read
            if constexpr (ROW_ON_CHIP) classifier_load<VEC>(v, row + i0, false);
            else classifier_load<VEC>(v, x + i0, true);
        }
        for (int k = 0; k < VEC; k++) {
            int i = i0 + k;
            float prob = __expf(v[k] - m) * inv_s;
            v[k] = i < V ? (prob - (i == target ? 1.f : 0.f)) * dloss : 0.f;
        }
        classifier_store<VEC>(x + i0, v);
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// Dynamic shared memory that keeps a row's real packs (the first V columns, rounded up to whole
// packs) on chip.
template <class T>
size_t classifier_row_smem_bytes(int V) {
    constexpr int P = Packed128<T>::size;
    return (size_t)CEIL_DIV(V, P) * P * sizeof(T);
}

// Whether a row of V logits fits in the opt-in shared memory of the current device, next to the
// kernel's static shared memory (the two warp-statistics arrays).
template <class T>
bool classifier_row_fits_on_chip(int V) {
    constexpr size_t static_bytes = 2 * 32 * sizeof(float);
    return classifier_row_smem_bytes<T>(V) + static_bytes <= (size_t)device_smem_optin();
}

// Cross-entropy of logits (N, Vp) (the first V columns are the vocabulary, V..Vp-1 its padding)
// against targets (N): losses (N) = logsumexp - logit[target]; with write_dlogits, the logits are
// overwritten by dlogits = (softmax - onehot) * dloss (dloss: the gradient scale of a row, e.g.
// 1 / number of counted rows; read from device memory instead when dloss_device is given, for launches
// replayed from a CUDA graph whose row count changes). Rows whose target equals ignore_index (MLM, padding; -1 means none
// match) get loss 0 and dlogits 0. A target outside [0, V) that is not ignore_index is a bug of
// the caller: the dataloader validates its tokens, and should one slip through, its row gets loss
// NaN, which makes the step's mean loss NaN (visible at once, with no device printf and no
// synchronization), and dlogits 0 (nothing is read or written outside the row).
// row_in_shared_memory: the second sweep reads the row from shared memory where it fits the device
// (see the top of the file; dev/cuda/fused_classifier.cu times it), the same bits.
template <class T>
void fused_classifier(T* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                      int ignore_index, bool write_dlogits, cudaStream_t stream,
                      const float* dloss_device = nullptr, bool row_in_shared_memory = false) {
    if (N < 0 || V <= 0 || Vp < V) {
        fprintf(stderr, "fused_classifier: need N >= 0 and 0 < V <= Vp, got N=%d, V=%d, Vp=%d\n", N, V, Vp);
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    constexpr int P = Packed128<T>::size;
    bool pack = rows_pack128<T>(Vp, {logits});
    if (pack && write_dlogits && row_in_shared_memory && classifier_row_fits_on_chip<T>(V)) {
        size_t smem = classifier_row_smem_bytes<T>(V);
        reserve_dynamic_smem(fused_classifier_kernel<T, P, true>, smem, "fused_classifier", "V", V);
        cudaCheck(launch_kernel(fused_classifier_kernel<T, P, true>, dim3(N), dim3(CLASSIFIER_BLOCK), smem, stream,
                                logits, losses, targets, V, Vp, dloss, dloss_device, ignore_index, write_dlogits));
    } else if (pack) {
        cudaCheck(launch_kernel(fused_classifier_kernel<T, P, false>, dim3(N), dim3(CLASSIFIER_BLOCK), 0, stream,
                                logits, losses, targets, V, Vp, dloss, dloss_device, ignore_index, write_dlogits));
    } else {
        cudaCheck(launch_kernel(fused_classifier_kernel<T, 1, false>, dim3(N), dim3(CLASSIFIER_BLOCK), 0, stream,
                                logits, losses, targets, V, Vp, dloss, dloss_device, ignore_index, write_dlogits));
    }
}
