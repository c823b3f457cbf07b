// llmc/fp8.cuh — fp8 (E4M3 / E5M2) tensors for the matmuls of --precision fp8: per-tensor delayed
// scaling (amax history -> scale), the bf16/fp32 -> fp8 cast that records the amax and can write the
// transposed copy cuBLASLt's fp8 layout rule needs, and the check that the GPU has fp8 tensor cores.
//
// Delayed scaling (Transformer Engine's recipe). Each tensor that enters an fp8 GEMM (a layer's
// input, its weight, the gradient of its output) owns a scale s in device memory. The cast computes
// q = fp8(x * s), rounding to nearest even and saturating at the largest finite value, and the GEMM
// multiplies its fp32 result by 1/s (cuBLASLt's A/B_SCALE_POINTER), so the stored q only needs to
// cover the tensor's range, not its magnitude. s is chosen from the past: the cast records the
// tensor's amax = max |x| (per block, no atomics), and an update kernel run after the GEMM pushes it
// into a history of the last H amaxes and sets
//     s = (fp8_max / max(history)) / 2^margin        (fp8_max: 448 for E4M3, 57344 for E5M2)
// keeping the previous s when that maximum is 0, inf or NaN, and clamping s to [2^-126, 2^126],
// where s and 1/s are both normal floats: a flush-to-zero build (--use_fast_math) would read a
// subnormal one as 0 and zero the cast or the GEMM (Transformer Engine caps s at FLT_MAX only). The
// cap binds for an amax below fp8_max / 2^126, ~5e-36 for E4M3; the floor only with a margin of 7 or
// more (14 for E5M2). An amax below FLT_MIN (subnormal) counts as 0 on every backend, as a
// flush-to-zero GPU reads it in every fp32 instruction (its cast, too, turns a subnormal x into 0),
// so the GPU and the CPU backend keep the same scales and histories. Nothing goes through the host:
// one training step needs no synchronization for it.
// One deviation from Transformer Engine, whose scales start at 1: the first use of a state primes
// it from the tensor itself (an amax-only pass, then the update), so the first step's gradients,
// typically 1e-4 and below, are not flushed to zero by E5M2's 2^-16 floor.
//
// Formats: E4M3 (3 mantissa bits, unit roundoff 2^-4, max 448, smallest subnormal 2^-9) for
// activations and weights; E5M2 (2 mantissa bits, unit roundoff 2^-3, max 57344, smallest
// subnormal 2^-16) for gradients, whose range matters more than their precision ("HYBRID").
//
// Layouts. cuBLASLt's fp8 GEMMs accept only the "TN" form (A transposed, B not) with 16-byte
// aligned dimensions and leading dimensions. The cast therefore writes its row-major output with
// rows padded with zeros to a multiple of 16 bytes (fp8_ld), and on request the transposed copy,
// padded the same way; llmc/matmul.cuh says which GEMM needs which.
#pragma once
#include "cuda_common.h"
#include "precision.cuh"

#include <cuda_fp8.h>

#include <cfloat>
#include <cstdint>
#include <string>

// Threads per block of the cast: 32 x 8; each block casts a 64 x 64 tile, each thread 16 elements
// as 8 pairs of neighbours in a row, so a warp reads 128 contiguous bytes of a bf16 row and writes 64
// of fp8.
constexpr int FP8_TILE = 64;
constexpr int FP8_CAST_ROWS = 8;  // blockDim.y
// Threads of the scale-update kernel, the longest amax history it handles (4 entries per thread),
// and how many states one update launch can serve.
constexpr int FP8_UPDATE_THREADS = 256;
constexpr int FP8_MAX_HISTORY = 4 * FP8_UPDATE_THREADS;
constexpr int FP8_MAX_UPDATES = 4;
// Largest and smallest scale the update sets: 2^126 and 2^-126, whose inverses are normal floats too.
constexpr float FP8_MAX_SCALE = 8.507059173023462e37f;
constexpr float FP8_MIN_SCALE = FLT_MIN;

// Largest finite value of an fp8 format.
inline float fp8_max(__nv_fp8_interpretation_t format) { return format == __NV_E4M3 ? 448.f : 57344.f; }

// The format's name, for messages.
inline const char* fp8_format_name(__nv_fp8_interpretation_t format) { return format == __NV_E4M3 ? "E4M3" : "E5M2"; }

// Leading dimension of an fp8 matrix with `cols` columns: rounded up to 16 bytes, as cuBLASLt's fp8
// kernels require; the cast writes zeros into the padding, so GEMMs may run over it.
inline int fp8_ld(int cols) { return CEIL_DIV(cols, 16) * 16; }

// Delayed-scaling state of one tensor: device scalars and history, plus a host flag. Memory comes
// from the caller (fp8_scaling_bytes), so a trainer can keep every layer's states in one allocation.
struct Fp8Scaling {
    __nv_fp8_interpretation_t format = __NV_E4M3;
    int history_len = 0;
    int margin = 0;              // scale = fp8_max / amax / 2^margin
    float* scale = nullptr;      // device (1): multiplies x before the cast
    float* scale_inv = nullptr;  // device (1): 1 / scale, cuBLASLt's A/B_SCALE_POINTER (dequantizes)
    float* history = nullptr;    // device (history_len): amaxes of the last uses, newest first
    bool primed = false;         // host: whether a first use has set the scale (see the file comment)
};

// A cast's per-block amaxes waiting to be recorded into `state` by fp8_update_scales.
struct Fp8AmaxRecord {
    Fp8Scaling* state;
    const float* partials;  // (num_partials)
    int num_partials;
};

// ----------------------------------------------------------------------------
// CUDA kernels

// Two neighbouring elements of a row, read with one aligned access (4 bytes of bf16, 8 of fp32).
template <class T>
struct alignas(2 * sizeof(T)) Fp8Pair {
    T x, y;
};

// Maximum of x over the block, returned to every thread, through shuffles and `slots` (shared, one
// float per warp). The first barrier lets the slots be reused by a second call.
__device__ inline float fp8_block_max(float x, float* slots) {
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, lane = tid % 32, warps = blockDim.x * blockDim.y / 32;
    __syncthreads();
    if (lane == 0) slots[tid / 32] = x;
    __syncthreads();
    x = lane < warps ? slots[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

// Casts the 64 x 64 tile (blockIdx.y, blockIdx.x) of inp (R,S) to fp8 with scale *scale:
//   out (R, ld_out), if non-null: row-major, columns [S, ld_out) zero;
//   out_t (S, ld_t), if non-null: the transpose, columns [R, ld_t) zero;
//   amax_partials[block], if non-null: max |x| over the tile (unscaled).
// The transpose goes through shared memory so that both its reads and writes stay row-contiguous.
// ld_out and ld_t are even (they are multiples of 16), and a tile covers its padding: 64 is a
// multiple of 16. `pairs`: S even and inp aligned for Fp8Pair reads. fmaxf ignores NaN (as
// Transformer Engine's amax does) and keeps inf, which then freezes the scale (see the update).
template <__nv_fp8_interpretation_t F, class T>
__global__ void fp8_cast_kernel(__nv_fp8_storage_t* out, int ld_out, __nv_fp8_storage_t* out_t, int ld_t,
                                float* amax_partials, const T* inp, int R, int S, const float* scale, bool pairs) {
    // 64 rows of 66 bytes: the extra 2 bytes make the transposed read (rows 2tx, 2tx+1 of one column)
    // hit 32 different banks.
    __shared__ uint16_t tile[FP8_TILE][FP8_TILE / 2 + 1];
    __shared__ float slots[32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int r0 = blockIdx.y * FP8_TILE, c0 = blockIdx.x * FP8_TILE;
    const int c = c0 + 2 * tx;
    const float s = *scale;
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < FP8_TILE / FP8_CAST_ROWS; i++) {
        const int rr = ty + FP8_CAST_ROWS * i, r = r0 + rr;
        float x0 = 0.f, x1 = 0.f;
        if (r < R) {
            const T* row = inp + (size_t)r * S;
            if (pairs && c < S) {
                Fp8Pair<T> p = *reinterpret_cast<const Fp8Pair<T>*>(row + c);
                x0 = to_float(p.x);
                x1 = to_float(p.y);
            } else {
                if (c < S) x0 = to_float(row[c]);
                if (c + 1 < S) x1 = to_float(row[c + 1]);
            }
        }
        amax = fmaxf(amax, fmaxf(fabsf(x0), fabsf(x1)));
        __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(make_float2(x0 * s, x1 * s), __NV_SATFINITE, F);
        if (out && r < R && c < ld_out) *reinterpret_cast<__nv_fp8x2_storage_t*>(out + (size_t)r * ld_out + c) = q;
        tile[rr][tx] = q;
    }
    if (out_t) {
        __syncthreads();
        const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&tile[0][0]);
        constexpr int row_bytes = sizeof(tile[0]);
        const int rt = r0 + 2 * tx;  // this thread's two columns of out_t: input rows rt, rt + 1
#pragma unroll
        for (int i = 0; i < FP8_TILE / FP8_CAST_ROWS; i++) {
            const int cc = ty + FP8_CAST_ROWS * i, col = c0 + cc;
            if (col < S && rt < ld_t) {
                unsigned lo = bytes[(2 * tx) * row_bytes + cc], hi = bytes[(2 * tx + 1) * row_bytes + cc];
                *reinterpret_cast<__nv_fp8x2_storage_t*>(out_t + (size_t)col * ld_t + rt) =
                    (__nv_fp8x2_storage_t)(lo | hi << 8);
            }
        }
    }
    if (amax_partials) {
        amax = fp8_block_max(amax, slots);
        if (tx == 0 && ty == 0) amax_partials[blockIdx.y * gridDim.x + blockIdx.x] = amax;
    }
}

// What the update kernel needs of one state.
struct Fp8UpdateArgs {
    float* scale;
    float* scale_inv;
    float* history;
    const float* partials;
    int num_partials;
    int history_len;
    float scaled_max;  // fp8_max / 2^margin
};
struct Fp8UpdateBatch {
    Fp8UpdateArgs u[FP8_MAX_UPDATES];
};

// Block b updates state batch.u[b]: amax = max of its partials (0 if subnormal); history <- (amax,
// history[0..H-2]); scale = scaled_max / max(history), unless that maximum is 0 or not finite (scale
// kept), clamped to [FP8_MIN_SCALE, FP8_MAX_SCALE]; scale_inv = 1 / scale. __fdiv_rn/__frcp_rn:
// correctly rounded even under --use_fast_math, so the GPU and the host reference agree bit for bit.
__global__ void fp8_update_kernel(Fp8UpdateBatch batch) {
    __shared__ float slots[32];
    Fp8UpdateArgs a = batch.u[0];
#pragma unroll
    for (int i = 1; i < FP8_MAX_UPDATES; i++)  // constant indices: the batch stays in parameter space
        if ((int)blockIdx.x == i) a = batch.u[i];
    float amax = 0.f;
    for (int i = threadIdx.x; i < a.num_partials; i += blockDim.x) amax = fmaxf(amax, a.partials[i]);
    amax = fp8_block_max(amax, slots);
    amax = amax >= FLT_MIN ? amax : 0.f;  // explicit, for backends that keep subnormals (see the file comment)
    // Each thread keeps the entries it shifts by one; the barrier inside fp8_block_max orders every
    // read before any write.
    constexpr int K = FP8_MAX_HISTORY / FP8_UPDATE_THREADS;
    float kept[K];
    float older = 0.f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int j = threadIdx.x + k * FP8_UPDATE_THREADS;
        kept[k] = j < a.history_len - 1 ? a.history[j] : 0.f;
        older = fmaxf(older, kept[k]);
    }
    older = fp8_block_max(older, slots);
#pragma unroll
    for (int k = 0; k < K; k++) {
        const int j = threadIdx.x + k * FP8_UPDATE_THREADS;
        if (j < a.history_len - 1) a.history[j + 1] = kept[k];
    }
    if (threadIdx.x == 0) {
        a.history[0] = amax;
        const float m = fmaxf(amax, older);
        float s = *a.scale;
        if (m > 0.f && m <= FLT_MAX)  // false for inf, NaN
            s = fmaxf(fminf(__fdiv_rn(a.scaled_max, m), FP8_MAX_SCALE), FP8_MIN_SCALE);
        *a.scale = s;
        *a.scale_inv = __frcp_rn(s);
    }
}

// scale = scale_inv = 1, history all zero.
__global__ void fp8_scaling_reset_kernel(float* scale, float* scale_inv, float* history, int history_len) {
    for (int i = threadIdx.x; i < history_len; i += blockDim.x) history[i] = 0.f;
    if (threadIdx.x == 0) *scale = *scale_inv = 1.f;
}

// ----------------------------------------------------------------------------
// kernel launchers

// Whether device `device` can run fp8 matmuls, and if not why (for the trainer's refusal).
// fp8_supported_cc is the decision itself, for a given compute capability (testable anywhere).
inline bool fp8_supported_cc(int major, int minor, std::string* why) {
    // fp8 tensor cores (and cuBLASLt's fp8 kernels) start with Ada (8.9) and Hopper (9.0).
    bool ok = major > 8 || (major == 8 && minor >= 9);
    if (!ok && why) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "fp8 matmuls need a GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell); this one is "
                 "%d.%d: use --precision bf16",
                 major, minor);
        *why = msg;
    }
    return ok;
}

inline bool fp8_supported(int device, std::string* why) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    if (fp8_supported_cc(prop.major, prop.minor, why)) return true;
    if (why) *why = std::string("device ") + std::to_string(device) + " (" + prop.name + "): " + *why;
    return false;
}

// Bytes of device memory one Fp8Scaling keeps, rounded to 16: scale_inv, scale and the history, each
// starting on a 16-byte boundary (4 floats apart). cuBLASLt refuses an fp8 GEMM whose scale pointer
// is only 4- or 8-byte aligned (seen on an H100: NOT_SUPPORTED from cublasLtMatmul).
inline size_t fp8_scaling_bytes(int history_len) {
    return CEIL_DIV((8 + (size_t)history_len) * sizeof(float), 16) * 16;
}

// Points st at mem (fp8_scaling_bytes(history_len) bytes of device memory) and resets it: scale 1,
// empty history, not primed. history_len in [1, FP8_MAX_HISTORY]; Transformer Engine's default is
// 1024, 16 is plenty for a steadily trained model.
inline void fp8_scaling_init(Fp8Scaling* st, void* mem, __nv_fp8_interpretation_t format, int history_len, int margin,
                             cudaStream_t stream) {
    if (history_len < 1 || history_len > FP8_MAX_HISTORY || margin < 0) {
        fprintf(stderr, "fp8_scaling_init: history length must be in [1, %d] and margin >= 0 (got %d, %d)\n",
                FP8_MAX_HISTORY, history_len, margin);
        exit(EXIT_FAILURE);
    }
    float* f = static_cast<float*>(mem);
    *st = Fp8Scaling{format, history_len, margin, /*scale=*/f + 4, /*scale_inv=*/f, /*history=*/f + 8, false};
    cudaCheck(launch_kernel(fp8_scaling_reset_kernel, dim3(1), dim3(256), 0, stream, st->scale, st->scale_inv,
                            st->history, history_len));
}

// Number of per-block amaxes fp8_cast writes for an (R,S) input (floats of amax_partials).
inline int fp8_cast_num_partials(int R, int S) { return CEIL_DIV(S, FP8_TILE) * CEIL_DIV(R, FP8_TILE); }

// Casts inp (R,S) to st.format with *st.scale: out (R, fp8_ld(S)) row-major and/or out_t
// (S, fp8_ld(R)) its transpose (either may be null; padding columns are written as zeros), and the
// per-block amaxes into amax_partials (fp8_cast_num_partials(R,S) floats; null: not recorded).
// Any R, S and alignment; outputs must be 2-byte aligned (cudaMalloc'd or fp8_ld-strided).
template <class T>
void fp8_cast(__nv_fp8_storage_t* out, __nv_fp8_storage_t* out_t, float* amax_partials, const T* inp, int R, int S,
              const Fp8Scaling& st, cudaStream_t stream) {
    if (R < 0 || S < 0 || CEIL_DIV(R, FP8_TILE) > 65535) {
        fprintf(stderr, "fp8_cast: rows must be in [0, %d] and columns >= 0 (got R=%d S=%d)\n", 65535 * FP8_TILE, R, S);
        exit(EXIT_FAILURE);
    }
    if (R == 0 || S == 0) return;
    bool pairs = S % 2 == 0 && reinterpret_cast<uintptr_t>(inp) % sizeof(Fp8Pair<T>) == 0;
    dim3 grid(CEIL_DIV(S, FP8_TILE), CEIL_DIV(R, FP8_TILE)), block(32, FP8_CAST_ROWS);
    auto kernel = st.format == __NV_E4M3 ? fp8_cast_kernel<__NV_E4M3, T> : fp8_cast_kernel<__NV_E5M2, T>;
    cudaCheck(launch_kernel(kernel, grid, block, 0, stream, out, fp8_ld(S), out_t, fp8_ld(R), amax_partials, inp, R, S,
                            (const float*)st.scale, pairs));
}

// Records each cast's amax into its state's history and recomputes the state's scale (one launch
// for up to FP8_MAX_UPDATES states). Run it after the GEMMs that use the current scales.
inline void fp8_update_scales(const Fp8AmaxRecord* records, int count, cudaStream_t stream) {
    if (count < 1 || count > FP8_MAX_UPDATES) {
        fprintf(stderr, "fp8_update_scales: 1 to %d states per call (got %d)\n", FP8_MAX_UPDATES, count);
        exit(EXIT_FAILURE);
    }
    Fp8UpdateBatch batch = {};
    for (int i = 0; i < count; i++) {
        const Fp8Scaling& st = *records[i].state;
        batch.u[i] = Fp8UpdateArgs{st.scale,  st.scale_inv, st.history, records[i].partials, records[i].num_partials,
                                   st.history_len, ldexpf(fp8_max(st.format), -st.margin)};
    }
    cudaCheck(launch_kernel(fp8_update_kernel, dim3(count), dim3(FP8_UPDATE_THREADS), 0, stream, batch));
}

// On a state's first use, sets its scale from inp (R,S) itself: an amax-only pass into
// amax_partials (fp8_cast_num_partials(R,S) floats) and an update. Later calls do nothing.
template <class T>
void fp8_prime(Fp8Scaling& st, float* amax_partials, const T* inp, int R, int S, cudaStream_t stream) {
    if (st.primed) return;
    fp8_cast((__nv_fp8_storage_t*)nullptr, (__nv_fp8_storage_t*)nullptr, amax_partials, inp, R, S, st, stream);
    Fp8AmaxRecord rec{&st, amax_partials, fp8_cast_num_partials(R, S)};
    fp8_update_scales(&rec, 1, stream);
    st.primed = true;
}
