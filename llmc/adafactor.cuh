// llmc/adafactor.cuh — the Adafactor update of every parameter (factored second moments, update
// clipping, relative step sizes) in four deterministic launches, with transformers' Adafactor numerics.
//
// Adafactor (Shazeer & Stern 2018) keeps, for a (rows, cols) matrix, running averages of the row
// means and the column means of grad^2 instead of a full second moment: O(rows + cols) state instead
// of O(rows * cols); 1-D tensors keep the full second moment. Per tensor and step (t = 1, 2, ...):
//     beta2t = 1 - t^decay_rate                                (decay_rate -0.8)
//     sq     = grad^2 + eps1
//     matrix: R = beta2t*R + (1-beta2t)*mean_cols(sq)  (rows)  C = beta2t*C + (1-beta2t)*mean_rows(sq)  (cols)
//             u = rsqrt(R_i / mean(R)) * rsqrt(C_j) * grad
//     vector: V = beta2t*V + (1-beta2t)*sq,  u = rsqrt(V) * grad
//     u     /= max(RMS(u) / clip_threshold, 1)                 (RMS over the whole tensor)
//     lr     = relative_step ? min(warmup_init ? 1e-6*t : 1e-2, 1/sqrt(t)) : lr
//              times max(eps2, RMS(param)) when scale_parameter
//     u     *= lr;  with beta1: m = beta1*m + (1-beta1)*u, u = m
//     param -= param * weight_decay * lr  (tensors with the flag);  param -= u
//
// Matching transformers. transformers.optimization.Adafactor does each of these as an fp32 torch op
// (Python-double scalars rounded to fp32 where they meet a tensor; `a.add_(b, alpha=s)` is one fused
// multiply-add on AVX2 CPUs; rsqrt is 1/sqrt, two roundings; a mean is a sum divided by the count).
// The kernels perform the same element-wise operations in the same order with explicitly rounded
// intrinsics, so they match bit for bit wherever no reduction and no subnormal is involved (a GPU
// build reads and writes subnormals as zero, llmc/adamw.cuh says why); the five reductions (row
// sums, column sums, the mean of R, RMS(param), RMS(u)) add the same terms in a different order than
// torch, which is where results can differ by a few fp32 roundings per reduction level (test/
// test_optimizers.cu derives the bound).
//
// Launches per step (4), each over every tensor at once, three passes over the gradients. Each tensor
// gets as many blocks as its own size calls for (FactoredTensor::num_blocks: one per 8192 elements,
// at most ADAFACTOR_MAX_BLOCKS), and the tensors' blocks follow one another in a 1-D grid
// (first_block), so a table of many small tensors (GPT-2's biases and layernorm gains: C elements,
// one block each) costs one block per small tensor, not a grid row each.
//   1. the matrices' sq, per tile of 32 columns x ADAFACTOR_TILE_ROWS rows, summed down each column
//      and along each row into the scratch; sum of param^2 (for RMS(param)); the 1-D tensors' V.
//   2. row statistics R from the row partials (one thread per row) and their sum; column
//      statistics C from the column partials (one thread per column). Reads no gradient.
//   3. sum of u^2 (for RMS(u)).
//   4. the update of the weights (and of m).
// Launch 2 must finish every R and C of a tensor before any u exists (u needs mean(R) and all of C),
// and launch 3 all of RMS(u) before launch 4 moves a weight, so the step needs these four launches
// (or a grid-wide barrier); launch 2 is light (about N/32 floats), the other three stream the tensor.
// Determinism: the order of every sum is fixed by the tensor's shape alone (not by the GPU, nor by
// the rest of the table): a thread adds its share (stride num_blocks blocks) in order, a block
// reduces through a fixed tree into its own partial slot, and every block of a later launch adds
// the tensor's num_blocks slots in the same fixed order (at most 256 floats a reduction, cheaper
// than another launch). No atomics: the same bits on every run and on every GPU (and on the CPU
// backend, up to the subnormals a GPU flushes).
#pragma once
#include "precision.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

// Threads per block of every Adafactor kernel (16 warps; launch 1 needs one thread per tile row). A
// 1-D tensor of C elements (GPT-2's biases and gains) gets one such block however small C is: it is
// one block of the grid, so its idle threads cost a GPU next to nothing, less than a kernel variant
// with smaller blocks for small tensors would cost in code.
constexpr int ADAFACTOR_BLOCK_SIZE = 512;
// Blocks per tensor (= partial-sum slots per tensor and reduction): at most this many, fewer for a
// small tensor, so that each thread has at least ADAFACTOR_MIN_ELEMS_PER_THREAD of its elements.
// 256 blocks of 512 threads cover an H100 (132 SMs x 4 blocks) with one large matrix alone, and
// keep the slots a later block adds to 256 per reduction.
constexpr int ADAFACTOR_MAX_BLOCKS = 256;
constexpr int ADAFACTOR_MIN_ELEMS_PER_THREAD = 16;
// Rows of a launch-1 tile (32 columns wide): the scratch holds one column partial per column per
// 256 rows and one row partial per row per 32 columns (about N/256 + N/32 floats).
constexpr int ADAFACTOR_TILE_ROWS = 256;

// One parameter tensor inside the flat buffers, built by adafactor_layout from its shape.
struct FactoredTensor {
    size_t offset;          // first element in params, grads, master and exp_avg
    int rows, cols;         // (rows, cols) row-major; a 1-D tensor of n elements is (1, n), not factored
    int factored;           // 1: row and column statistics (a matrix); 0: a full second moment (1-D)
    int weight_decay;       // 1: weight decay applies (matrices in GPT-2 / llm.c)
    size_t state_offset;    // second moment: rows row statistics then cols column statistics, or rows*cols
    size_t partial_offset;  // in the scratch: column partials (ceil(rows / TILE_ROWS), cols), then row
                            // partials (ceil(cols / 32), rows); matrices only
    float sqrt_size;        // numel ** 0.5 rounded to fp32, the divisor of transformers' RMS
    int first_block;        // its first block in every launch's grid (the tensors' blocks are consecutive)
    int num_blocks;         // its blocks (adafactor_num_blocks(rows * cols)); its per-block sums are
                            // the scratch's 3 * num_blocks floats from 3 * first_block
};

// Where every tensor's state lives and how much memory the optimizer needs, for a list of shapes.
struct AdafactorLayout {
    std::vector<FactoredTensor> tensors;
    size_t num_params = 0;          // N: elements of params / grads / master / exp_avg
    size_t second_moment_size = 0;  // floats of the second-moment state (rows + cols per matrix, n per vector)
    size_t scratch_size = 0;        // floats of scratch (per-block sums, then row and column partial sums)
    int num_blocks = 0;             // blocks working in each launch: the tensors' num_blocks added up
};

// Hyper-parameters, transformers' names and defaults; doubles, as Python computes the step scalars.
struct AdafactorConfig {
    double lr = 0.0;  // used when relative_step is false
    double eps1 = 1e-30, eps2 = 1e-3;
    double clip_threshold = 1.0;
    double decay_rate = -0.8;
    bool use_first_moment = false;  // transformers' beta1=None
    double beta1 = 0.0;
    double weight_decay = 0.0;
    bool scale_parameter = true, relative_step = true, warmup_init = false;
};

// The per-step scalars, computed once on the host from the config as transformers' Python code
// computes them, then rounded to fp32 as torch does when a Python float meets an fp32 tensor op.
// The learning rate depends on RMS(param), known only on the device: when scale_parameter picks
// RMS(param) (a tensor in Python), lr = RMS * rel_step and the decay alpha = -wd * lr are fp32
// products; otherwise lr (eps2 * rel_step or rel_step) and alpha are Python doubles, rounded once.
struct AdafactorCoefficients {
    float beta2t, one_minus_beta2t;  // second-moment decay and the weight of the new statistics
    float eps1;                      // added to grad^2
    float eps2;                      // floor of RMS(param) when scale_parameter
    float rel_step;                  // relative (or given) step size, multiplied by RMS(param)
    float neg_wd;                    // -weight_decay, multiplied by the fp32 lr
    float lr_fixed;                  // the lr when RMS(param) does not enter it
    float neg_wd_lr_fixed;           // -weight_decay * lr_fixed (in double, then rounded)
    float clip_threshold;
    float beta1, one_minus_beta1;
    int use_first_moment, scale_parameter;
    float grad_scale;                // multiplies every gradient first (clipping, loss scaling)
};

// Computes the per-step scalars from the config; step is 1-based.
inline AdafactorCoefficients adafactor_coefficients(const AdafactorConfig& cfg, float grad_scale, int step) {
    double beta2t = 1.0 - std::pow((double)step, cfg.decay_rate);
    double rel_step = cfg.lr;
    if (cfg.relative_step) {
        double min_step = cfg.warmup_init ? 1e-6 * step : 1e-2;
        rel_step = std::min(min_step, 1.0 / std::sqrt((double)step));
    }
    double lr_fixed = (cfg.scale_parameter ? cfg.eps2 : 1.0) * rel_step;
    AdafactorCoefficients c;
    c.beta2t = (float)beta2t;
    c.one_minus_beta2t = (float)(1.0 - beta2t);
    c.eps1 = (float)cfg.eps1;
    c.eps2 = (float)cfg.eps2;
    c.rel_step = (float)rel_step;
    c.neg_wd = (float)(-cfg.weight_decay);
    c.lr_fixed = (float)lr_fixed;
    c.neg_wd_lr_fixed = (float)(-cfg.weight_decay * lr_fixed);
    c.clip_threshold = (float)cfg.clip_threshold;
    c.beta1 = (float)cfg.beta1;
    c.one_minus_beta1 = (float)(1.0 - cfg.beta1);
    c.use_first_moment = cfg.use_first_moment ? 1 : 0;
    c.scale_parameter = cfg.scale_parameter ? 1 : 0;
    c.grad_scale = grad_scale;
    return c;
}

// Blocks (and partial-sum slots per reduction) of a tensor of n elements: fixed by n alone, so the
// summation order depends on the tensor's shape only, not on the device or the rest of the table.
inline int adafactor_num_blocks(size_t n) {
    size_t blocks = CEIL_DIV(n, (size_t)ADAFACTOR_BLOCK_SIZE * ADAFACTOR_MIN_ELEMS_PER_THREAD);
    if (blocks < 1) blocks = 1;
    if (blocks > (size_t)ADAFACTOR_MAX_BLOCKS) blocks = ADAFACTOR_MAX_BLOCKS;
    return (int)blocks;
}

// Lays out the tensors of the given shapes ({n} or {rows, cols}, in the order of the flat parameter
// buffer) with their weight-decay flags; stops with a message on an empty tensor or more than 2 dims.
// Split llm.c's stacked (L, rows, cols) tensors into L matrices: a Hugging Face model holds one matrix
// per layer, and transformers' Adafactor takes RMS(param) and RMS(u) per such matrix.
inline AdafactorLayout adafactor_layout(const std::vector<std::vector<size_t>>& shapes,
                                        const std::vector<int>& weight_decay) {
    if (shapes.size() != weight_decay.size()) {
        fprintf(stderr, "adafactor_layout: %zu shapes but %zu weight-decay flags\n", shapes.size(), weight_decay.size());
        exit(EXIT_FAILURE);
    }
    AdafactorLayout layout;
    size_t line_partials = 0;  // floats of row and column partial sums so far
    for (size_t k = 0; k < shapes.size(); k++) {
        const std::vector<size_t>& s = shapes[k];
        if (s.empty() || s.size() > 2 || s[0] == 0 || s.back() == 0 || s[0] > (size_t)INT32_MAX ||
            s.back() > (size_t)INT32_MAX) {
            std::string shape;
            for (size_t d : s) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
            fprintf(stderr, "adafactor_layout: tensor %zu must be 1-D or 2-D, non-empty, each dimension < 2^31 "
                    "(split stacked matrices into one entry each), got shape (%s)\n", k, shape.c_str());
            exit(EXIT_FAILURE);
        }
        FactoredTensor t;
        t.factored = s.size() == 2;
        t.rows = t.factored ? (int)s[0] : 1;
        t.cols = (int)s.back();
        const size_t size = (size_t)t.rows * t.cols;
        t.offset = layout.num_params;
        t.weight_decay = weight_decay[k];
        t.state_offset = layout.second_moment_size;
        t.partial_offset = line_partials;  // the per-block sums go first: shifted below
        t.sqrt_size = (float)std::pow((double)size, 0.5);
        t.first_block = layout.num_blocks;
        t.num_blocks = adafactor_num_blocks(size);
        layout.num_blocks += t.num_blocks;
        layout.num_params += size;
        layout.second_moment_size += t.factored ? (size_t)t.rows + t.cols : size;
        // Column partials (one per column and tile row), then row partials (one per row and strip).
        if (t.factored)
            line_partials += (size_t)t.cols * CEIL_DIV((size_t)t.rows, (size_t)ADAFACTOR_TILE_ROWS) +
                             (size_t)t.rows * CEIL_DIV((size_t)t.cols, (size_t)32);
        layout.tensors.push_back(t);
    }
    const size_t block_sums = 3 * (size_t)layout.num_blocks;
    for (FactoredTensor& t : layout.tensors) t.partial_offset += block_sums;
    layout.scratch_size = block_sums + line_partials;
    return layout;
}

// Bytes of persistent optimizer state for these shapes: the second moment (O(rows + cols) per matrix)
// and, with beta1, the first moment (N floats). The scratch (layout.scratch_size floats) comes on top.
inline size_t adafactor_state_bytes(const std::vector<std::vector<size_t>>& shapes, bool use_first_moment) {
    AdafactorLayout layout = adafactor_layout(shapes, std::vector<int>(shapes.size(), 0));
    return sizeof(float) * (layout.second_moment_size + (use_first_moment ? layout.num_params : 0));
}

// ----------------------------------------------------------------------------
// CUDA kernels

// The gradient multiplier of this launch: the host's grad_scale, times the device scalar (the clip
// factor) when given.
__device__ inline float adafactor_grad_scale(const AdafactorCoefficients& c, const float* grad_scale_device) {
    return grad_scale_device ? __fmul_rn(c.grad_scale, *grad_scale_device) : c.grad_scale;
}

// grad^2 + eps1 of one scaled gradient, as transformers computes `grad**2 + eps[0]`.
__device__ inline float adafactor_sq(float g, float eps1) { return __fadd_rn(__fmul_rn(g, g), eps1); }

// beta2t * s + (1 - beta2t) * x: `s.mul_(beta2t).add_(x, alpha=1 - beta2t)`.
__device__ inline float adafactor_ema(float s, float x, const AdafactorCoefficients& c) {
    return fmaf(x, c.one_minus_beta2t, __fmul_rn(s, c.beta2t));
}

// rsqrt as torch computes it on the CPU: 1 / sqrt(x), each correctly rounded.
__device__ inline float adafactor_rsqrt(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }

// Sum of x over the block, returned to every thread, through a fixed shuffle tree (deterministic).
// blockDim.x must be ADAFACTOR_BLOCK_SIZE; called once per kernel (its shared slots are not re-synced).
__device__ inline float adafactor_block_sum(float x) {
    __shared__ float warp_sums[ADAFACTOR_BLOCK_SIZE / 32];
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = lane < ADAFACTOR_BLOCK_SIZE / 32 ? warp_sums[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Sum of one tensor's n per-block sums of a launch, in a fixed order: lane l adds sums l, l+32, ...
// in order, then a shuffle tree. Called by a whole warp; every lane gets the sum.
__device__ inline float adafactor_sum_partials(const float* partials, int n) {
    const int lane = threadIdx.x % 32;
    float x = 0.f;
    for (int i = lane; i < n; i += 32) x += partials[i];
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// The tensor that block blockIdx.x of a launch works on, and the block's index among that tensor's
// num_blocks: the tensors' blocks are consecutive in the grid, so a binary search over first_block
// (the table is a few KB: cached after the first blocks). Blocks past the last tensor's (the grid is
// an upper bound) get an index >= its num_blocks, after one look at the last tensor.
__device__ inline int adafactor_find_tensor(const FactoredTensor* tensors, int num_tensors, int& block) {
    int lo = 0, hi = num_tensors - 1;  // tensors[lo].first_block <= blockIdx.x throughout
    if (tensors[hi].first_block <= (int)blockIdx.x) lo = hi;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tensors[mid].first_block <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    block = (int)blockIdx.x - tensors[lo].first_block;
    return lo;
}

// The per-tensor scalars of the final launches, from the partial sums of the earlier ones.
struct AdafactorTensorScalars {
    float row_mean;      // mean of the row statistics R (factored tensors)
    float lr;            // step size of this tensor
    float neg_wd_lr;     // -weight_decay * lr
    float clip_divisor;  // max(RMS(u) / clip_threshold, 1)
};

// Where tensor t's per-block sums of reduction r (0: param^2, 1: new R, 2: u^2) start in the
// scratch: num_blocks floats, one per block of the tensor.
__device__ inline size_t adafactor_slots(const FactoredTensor& t, int r) {
    return 3 * (size_t)t.first_block + (size_t)r * t.num_blocks;
}

// Computes the scalars of tensor t from its per-block sums (warp 0 adds them, the block shares them
// through shared memory); with_update_rms: RMS(u)'s sums are ready (launch 4).
__device__ inline AdafactorTensorScalars adafactor_tensor_scalars(const FactoredTensor& t, const float* scratch,
                                                                  const AdafactorCoefficients& c,
                                                                  bool with_update_rms) {
    __shared__ AdafactorTensorScalars shared;
    if (threadIdx.x < 32) {
        // The sums of R exist for matrices only, those of u^2 only once launch 3 ran.
        float param_sq = adafactor_sum_partials(scratch + adafactor_slots(t, 0), t.num_blocks);
        float row_sum = t.factored ? adafactor_sum_partials(scratch + adafactor_slots(t, 1), t.num_blocks) : 0.f;
        float update_sq = with_update_rms ? adafactor_sum_partials(scratch + adafactor_slots(t, 2), t.num_blocks)
                                          : 0.f;
        if (threadIdx.x == 0) {
            AdafactorTensorScalars s;
            s.row_mean = __fdiv_rn(row_sum, (float)t.rows);
            // lr = max(eps2, RMS(param)) * rel_step: Python's max keeps eps2 unless RMS > eps2 (fp32 compare).
            float param_rms = __fdiv_rn(__fsqrt_rn(param_sq), t.sqrt_size);
            if (c.scale_parameter && param_rms > c.eps2) {
                s.lr = __fmul_rn(param_rms, c.rel_step);
                s.neg_wd_lr = __fmul_rn(c.neg_wd, s.lr);
            } else {
                s.lr = c.lr_fixed;
                s.neg_wd_lr = c.neg_wd_lr_fixed;
            }
            float update_rms = __fdiv_rn(__fsqrt_rn(update_sq), t.sqrt_size);
            float ratio = __fdiv_rn(update_rms, c.clip_threshold);
            s.clip_divisor = ratio > 1.0f ? ratio : 1.0f;
            shared = s;
        }
    }
    __syncthreads();
    return shared;
}

// The unclipped update of element (row, col) of tensor t with scaled gradient g: rsqrt(R_row /
// mean(R)) * rsqrt(C_col) * g for a matrix (transformers' r_factor * c_factor, then * grad), or
// rsqrt(V) * g for a vector (state_index is then the element's index in V).
__device__ inline float adafactor_unclipped(const float* second_moment, const FactoredTensor& t, size_t row,
                                            size_t col, size_t state_index, float g, float row_mean) {
    if (t.factored) {
        float r_factor = adafactor_rsqrt(__fdiv_rn(second_moment[t.state_offset + row], row_mean));
        float c_factor = adafactor_rsqrt(second_moment[t.state_offset + t.rows + col]);
        return __fmul_rn(__fmul_rn(r_factor, c_factor), g);
    }
    return __fmul_rn(adafactor_rsqrt(second_moment[state_index]), g);
}

// Sum of the n floats x[0..n-1] (n a power of 2) through a fixed pairwise tree of log2(n) levels:
// the halves' sums, added.
template <int n>
__device__ inline float adafactor_tree_sum(const float* x) {
    if constexpr (n == 1) return x[0];
    else return __fadd_rn(adafactor_tree_sum<n / 2>(x), adafactor_tree_sum<n / 2>(x + n / 2));
}

// Launch 1, the one pass over the gradients that the statistics need. Matrices, per tile of 32
// columns x ADAFACTOR_TILE_ROWS rows (the tensor's tile k goes to its block k % num_blocks; lane =
// column, warp w takes the tile's rows w, w+16, ...):
//   column partial sums of sq = grad^2 + eps1: each warp adds its rows in order, then warp 0 adds the
//   16 warps' sums in order, into (tile_row, col) of the tensor's column partials;
//   row partial sums: the tile's sq, staged in shared memory, summed per row by thread r through
//   adafactor_tree_sum, into (strip, row) of the tensor's row partials (launch 2 adds the strips).
// Vectors: V updated in place. All tensors: this block's sum of param^2 (when scale_parameter).
template <class T>
__global__ void adafactor_stats_kernel(const T* params, const float* master, const T* grads, float* second_moment,
                                       float* scratch, const FactoredTensor* tensors, int num_tensors,
                                       AdafactorCoefficients c, const float* grad_scale_device) {
    constexpr int num_warps = ADAFACTOR_BLOCK_SIZE / 32;
    static_assert(ADAFACTOR_TILE_ROWS <= ADAFACTOR_BLOCK_SIZE, "one thread per row of a tile");
    // 33 floats a row: thread r reading its row's column j hits bank (r + j) % 32, no conflicts.
    __shared__ float tile_sq[ADAFACTOR_TILE_ROWS][33];
    __shared__ float warp_col_sums[num_warps][32];
    int block;
    const FactoredTensor t = tensors[adafactor_find_tensor(tensors, num_tensors, block)];
    if (block >= t.num_blocks) return;  // past the last tensor; uniform over the block (barriers below)
    const float scale = adafactor_grad_scale(c, grad_scale_device);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (t.factored) {
        const int strips = CEIL_DIV(t.cols, 32), tile_rows = CEIL_DIV(t.rows, ADAFACTOR_TILE_ROWS);
        float* col_partials = scratch + t.partial_offset;                 // (tile_rows, cols)
        float* row_partials = col_partials + (size_t)tile_rows * t.cols;  // (strips, rows)
        for (int tile = block; tile < strips * tile_rows; tile += t.num_blocks) {
            const int strip = tile % strips, tile_row = tile / strips;
            const int col = strip * 32 + lane, row0 = tile_row * ADAFACTOR_TILE_ROWS;
            const int num_rows = min(ADAFACTOR_TILE_ROWS, t.rows - row0);
            float acc = 0.f;
            for (int r = warp; r < num_rows; r += num_warps) {
                // Columns past the end count as 0 (exact in every sum).
                float sq = 0.f;
                if (col < t.cols)
                    sq = adafactor_sq(__fmul_rn(to_float(grads[t.offset + (size_t)(row0 + r) * t.cols + col]), scale),
                                      c.eps1);
                tile_sq[r][lane] = sq;
                acc = __fadd_rn(acc, sq);
            }
            warp_col_sums[warp][lane] = acc;
            __syncthreads();
            if (warp == 0 && col < t.cols) {
                float sum = 0.f;
                for (int w = 0; w < num_warps; w++) sum = __fadd_rn(sum, warp_col_sums[w][lane]);
                col_partials[(size_t)tile_row * t.cols + col] = sum;
            }
            if ((int)threadIdx.x < num_rows) {
                const int r = threadIdx.x;
                row_partials[(size_t)strip * t.rows + row0 + r] = adafactor_tree_sum<32>(tile_sq[r]);
            }
            __syncthreads();
        }
    }
    float param_sq = 0.f;
    const size_t size = (size_t)t.rows * t.cols, stride = (size_t)t.num_blocks * blockDim.x;
    for (size_t k = (size_t)block * blockDim.x + threadIdx.x; k < size; k += stride) {
        const size_t i = t.offset + k;
        if (c.scale_parameter) {
            float p = master ? master[i] : to_float(params[i]);
            param_sq = fmaf(p, p, param_sq);
        }
        if (!t.factored) {
            float sq = adafactor_sq(__fmul_rn(to_float(grads[i]), scale), c.eps1);
            second_moment[t.state_offset + k] = adafactor_ema(second_moment[t.state_offset + k], sq, c);
        }
    }
    float block_sum = adafactor_block_sum(param_sq);
    if (threadIdx.x == 0) scratch[adafactor_slots(t, 0) + block] = block_sum;
}

// Launch 2 (matrices), from launch 1's partial sums (no gradient is read again). One thread per row
// adds the row's strip partials in order, R_row = ema(R_row, sum / cols), and the block adds the new
// R into its sum of reduction 1; one thread per column adds the column's tile-row partials in order,
// C_col = ema(C_col, sum / rows).
__global__ void adafactor_rows_cols_kernel(float* second_moment, float* scratch, const FactoredTensor* tensors,
                                           int num_tensors, AdafactorCoefficients c) {
    int block;
    const FactoredTensor t = tensors[adafactor_find_tensor(tensors, num_tensors, block)];
    if (!t.factored || block >= t.num_blocks) return;  // uniform over the block (a barrier below)
    const int strips = CEIL_DIV(t.cols, 32), tile_rows = CEIL_DIV(t.rows, ADAFACTOR_TILE_ROWS);
    const float* col_partials = scratch + t.partial_offset;                 // (tile_rows, cols)
    const float* row_partials = col_partials + (size_t)tile_rows * t.cols;  // (strips, rows)
    const int first = block * blockDim.x + threadIdx.x, stride = t.num_blocks * blockDim.x;
    float row_sum = 0.f;  // the new R of this thread's rows
    for (int row = first; row < t.rows; row += stride) {
        float acc = 0.f;
        for (int s = 0; s < strips; s++) acc = __fadd_rn(acc, row_partials[(size_t)s * t.rows + row]);
        float* rstat = second_moment + t.state_offset + row;
        *rstat = adafactor_ema(*rstat, __fdiv_rn(acc, (float)t.cols), c);
        row_sum = __fadd_rn(row_sum, *rstat);
    }
    for (int col = first; col < t.cols; col += stride) {
        float acc = 0.f;
        for (int tr = 0; tr < tile_rows; tr++) acc = __fadd_rn(acc, col_partials[(size_t)tr * t.cols + col]);
        float* cstat = second_moment + t.state_offset + t.rows + col;
        *cstat = adafactor_ema(*cstat, __fdiv_rn(acc, (float)t.rows), c);
    }
    float block_sum = adafactor_block_sum(row_sum);
    if (threadIdx.x == 0) scratch[adafactor_slots(t, 1) + block] = block_sum;
}

// Launch 3: this block's sum of u^2 (the unclipped update). The loop over the tensor (stride
// num_blocks blocks) walks (row, col) incrementally, so no element needs a division.
template <class T>
__global__ void adafactor_update_rms_kernel(const T* grads, const float* second_moment, float* scratch,
                                            const FactoredTensor* tensors, int num_tensors, AdafactorCoefficients c,
                                            const float* grad_scale_device) {
    int block;
    const FactoredTensor t = tensors[adafactor_find_tensor(tensors, num_tensors, block)];
    if (block >= t.num_blocks) return;  // past the last tensor; uniform over the block (barriers below)
    const float scale = adafactor_grad_scale(c, grad_scale_device);
    const float row_mean = adafactor_tensor_scalars(t, scratch, c, false).row_mean;
    const size_t size = (size_t)t.rows * t.cols, cols = t.cols;
    const size_t stride = (size_t)t.num_blocks * blockDim.x, row_step = stride / cols, col_step = stride % cols;
    size_t k = (size_t)block * blockDim.x + threadIdx.x, row = k / cols, col = k % cols;
    float update_sq = 0.f;
    for (; k < size; k += stride) {
        float g = __fmul_rn(to_float(grads[t.offset + k]), scale);
        float u = adafactor_unclipped(second_moment, t, row, col, t.state_offset + k, g, row_mean);
        update_sq = fmaf(u, u, update_sq);
        row += row_step;
        col += col_step;
        if (col >= cols) { col -= cols; row++; }
    }
    float block_sum = adafactor_block_sum(update_sq);
    if (threadIdx.x == 0) scratch[adafactor_slots(t, 2) + block] = block_sum;
}

// The update of element k = (row, col) of tensor t (its gradient times scale): the clipped,
// RMS-scaled step, the optional first moment, weight decay, the write of the parameter (and its
// master). Shared by the production kernel and dev/cuda/adafactor.cu's simpler variant, which differ
// only in how they walk the elements.
template <class T>
__device__ inline void adafactor_apply_element(T* params, float* master, const T* grads, float* exp_avg,
                                               const float* second_moment, const FactoredTensor& t,
                                               const AdafactorCoefficients& c, const AdafactorTensorScalars& s,
                                               float scale, size_t k, size_t row, size_t col) {
    const size_t i = t.offset + k;
    float g = __fmul_rn(to_float(grads[i]), scale);
    float u = adafactor_unclipped(second_moment, t, row, col, t.state_offset + k, g, s.row_mean);
    u = __fmul_rn(__fdiv_rn(u, s.clip_divisor), s.lr);
    if (c.use_first_moment) {
        u = fmaf(u, c.one_minus_beta1, __fmul_rn(exp_avg[i], c.beta1));
        exp_avg[i] = u;
    }
    float p = master ? master[i] : to_float(params[i]);
    if (t.weight_decay && c.neg_wd != 0.0f) p = fmaf(p, s.neg_wd_lr, p);
    p = __fadd_rn(p, -u);
    if (master) master[i] = p;
    params[i] = from_float<T>(p);
}

// Launch 4: u = unclipped / clip_divisor * lr; with beta1 m = beta1*m + (1-beta1)*u and u = m; then
// param += param * (-wd*lr) (flagged tensors) and param += -u, in fp32 (master when there is one;
// params receives the result rounded to T).
template <class T>
__global__ void adafactor_apply_kernel(T* params, float* master, const T* grads, float* exp_avg,
                                       const float* second_moment, const float* scratch,
                                       const FactoredTensor* tensors, int num_tensors, AdafactorCoefficients c,
                                       const float* grad_scale_device) {
    int block;
    const FactoredTensor t = tensors[adafactor_find_tensor(tensors, num_tensors, block)];
    if (block >= t.num_blocks) return;  // past the last tensor; uniform over the block (a barrier below)
    const float scale = adafactor_grad_scale(c, grad_scale_device);
    const AdafactorTensorScalars s = adafactor_tensor_scalars(t, scratch, c, true);
    const size_t size = (size_t)t.rows * t.cols, cols = t.cols;
    const size_t stride = (size_t)t.num_blocks * blockDim.x, row_step = stride / cols, col_step = stride % cols;
    size_t k = (size_t)block * blockDim.x + threadIdx.x, row = k / cols, col = k % cols;
    for (; k < size; k += stride) {
        adafactor_apply_element(params, master, grads, exp_avg, second_moment, t, c, s, scale, k, row, col);
        row += row_step;
        col += col_step;
        if (col >= cols) { col -= cols; row++; }
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// One Adafactor step over all N parameters (4 launches). params (N) is written; master (N, fp32) holds
// the weights when T is a lower precision (nullptr when T is float); grads (N) are multiplied by
// grad_scale (and by *grad_scale_device when given, e.g. grad_clip_scale's output) before use;
// exp_avg (N, fp32) is the first moment (nullptr unless cfg.use_first_moment); second_moment
// (layout.second_moment_size floats, zero at the start) and scratch (layout.scratch_size floats) come
// from adafactor_layout, whose tensors (copied to the device: num_tensors entries) partition [0, N).
// step is 1-based.
template <class T>
void adafactor_update(T* params, float* master, const T* grads, float* exp_avg, float* second_moment,
                      float* scratch, const FactoredTensor* tensors, int num_tensors, size_t N,
                      const AdafactorConfig& cfg, float grad_scale, int step, cudaStream_t stream,
                      const float* grad_scale_device = nullptr) {
    if (step < 1) {
        fprintf(stderr, "adafactor_update: step must be >= 1 (1-based: beta2t = 1 - step^%g), got %d\n",
                cfg.decay_rate, step);
        exit(EXIT_FAILURE);
    }
    if (num_tensors < 1 || num_tensors > INT32_MAX / ADAFACTOR_MAX_BLOCKS) {
        fprintf(stderr, "adafactor_update: num_tensors must be in [1, %d] (up to %d blocks each in one grid), "
                "got %d\n", INT32_MAX / ADAFACTOR_MAX_BLOCKS, ADAFACTOR_MAX_BLOCKS, num_tensors);
        exit(EXIT_FAILURE);
    }
    if (master == nullptr && !std::is_same<T, float>::value) {
        fprintf(stderr, "adafactor_update: %zu-byte parameters need fp32 master weights (master == nullptr): "
                "rounding every update to the storage type would lose updates smaller than half an ulp\n",
                sizeof(T));
        exit(EXIT_FAILURE);
    }
    if (cfg.use_first_moment && exp_avg == nullptr) {
        fprintf(stderr, "adafactor_update: beta1 %g needs a first moment of N floats (exp_avg == nullptr)\n", cfg.beta1);
        exit(EXIT_FAILURE);
    }
    if (cfg.relative_step ? cfg.lr != 0.0 : cfg.warmup_init) {
        fprintf(stderr, "adafactor_update: %s\n", cfg.relative_step
                ? "an explicit lr cannot be combined with relative_step (transformers raises the same)"
                : "warmup_init requires relative_step");
        exit(EXIT_FAILURE);
    }
    if (N == 0) return;
    // The grid needs the layout's num_blocks, which only the device table holds; N and num_tensors
    // bound it: a tensor of n elements has fewer than n / 8192 + 1 blocks, so all of them together
    // fewer than CEIL_DIV(N, 8192) + num_tensors, and at most ADAFACTOR_MAX_BLOCKS each. Blocks past
    // the last tensor's return at once (GPT-2 124M: 15343 blocks for 10050 working ones, the cap on
    // the large matrices making the bound loose; the tiny CPU model: 937 for 388).
    const size_t bound = std::min(CEIL_DIV(N, (size_t)ADAFACTOR_BLOCK_SIZE * ADAFACTOR_MIN_ELEMS_PER_THREAD) +
                                      (size_t)num_tensors, (size_t)num_tensors * ADAFACTOR_MAX_BLOCKS);
    const dim3 grid((unsigned)bound), block(ADAFACTOR_BLOCK_SIZE);
    AdafactorCoefficients c = adafactor_coefficients(cfg, grad_scale, step);
    cudaCheck(launch_kernel(adafactor_stats_kernel<T>, grid, block, 0, stream, (const T*)params, (const float*)master,
                            grads, second_moment, scratch, tensors, num_tensors, c, grad_scale_device));
    cudaCheck(launch_kernel(adafactor_rows_cols_kernel, grid, block, 0, stream, second_moment, scratch, tensors,
                            num_tensors, c));
    cudaCheck(launch_kernel(adafactor_update_rms_kernel<T>, grid, block, 0, stream, grads,
                            (const float*)second_moment, scratch, tensors, num_tensors, c, grad_scale_device));
    cudaCheck(launch_kernel(adafactor_apply_kernel<T>, grid, block, 0, stream, params, master, grads, exp_avg,
                            (const float*)second_moment, (const float*)scratch, tensors, num_tensors, c,
                            grad_scale_device));
}
