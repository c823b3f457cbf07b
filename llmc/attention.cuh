// llmc/attention.cuh — multi-head self-attention as flash attention, forward and backward, causal or padded (BERT).
//
// The T×T score matrix never lives in global memory.
//
// Layout (GPT-2's, as llm.c): each token's row of qkv (B,T,3C) holds [q (C) | k (C) | v (C)]; head h
// uses columns h*HS .. h*HS+HS-1 of each part (HS = C/NH), and of out (B,T,C). Scores are scaled by
// 1/sqrt(HS). Head sizes 16, 32, 64, 128 (a template parameter, dispatched at run time).
//
// Two implementations share the semantics below: for bf16/fp16, FlashAttention-2 on tensor cores
// through mma.sync m16n8k16 (llmc/tensor_core.cuh); for fp32, plain FMAs on CUDA cores, an exact
// reference (no tensor cores, no tf32). dev/cuda/attention.cu keeps a third, the fp32 kernels with
// their tile products on WMMA, as the simpler tensor-core variant to compare against.
//
// Algorithm (FlashAttention-2). The forward walks the key tiles a block of query rows sees, keeping a
// running row max m and row sum l (online softmax), rescaling the accumulated output when m grows, and
// saves lse = m + log(l) per query row, from which the backward recomputes P = exp(S - lse) tile by
// tile.
//
// The 16-bit kernels (AttnMmaTile). Blocks of 4 warps; a warp owns 16-row tiles. Fragment layouts are the
// PTX ISA's, so every row-wise step works on registers: a lane holds rows g = lane/4 and g+8 of each
// 16×8 accumulator tile, the 4 lanes of a quad share a row (row max and sum: 2 xor-shuffles), and the
// accumulators of two adjacent 8-column tiles, rounded to floatX, are exactly the A fragment of the
// next product's 16-wide k slice (P for P V, dS for dS Q): no shared-memory round trip.
//   Forward: block = 64 queries, 16 per warp; Q's fragments are loaded once (ldmatrix) and stay in
//   registers; K and V stream in 64-key tiles through two shared-memory stages, cp.async filling one
//   while the warps compute on the other; S = Q K^T, the softmax, P and the output accumulator O live
//   in registers. (The kernel also takes two row tiles per warp, each K and V fragment then feeding
//   two mma; on an H100 that was slower under a causal mask: AttnMmaTile says why it is not used.)
//   Backward: one kernel, block = 64 keys (K, V in shared memory); it streams the query tiles that
//   see them (64 queries, 32 at HS = 128 for registers; Q, dO, lse, D double-buffered) and computes 5
//   products per tile pair: S^T = K Q^T, dV += P^T dO, dP^T = V dO^T, dK += dS^T Q in registers, and
//   dQ = dS K after parking dS^T (64 × 64) in shared memory, each warp taking 32 query rows and a
//   quarter or half of the columns. Without dropout at HS <= 64 the warp's K and V fragments stay in
//   registers for the whole key tile.
//   On Hopper (sm_90a), attention_backward_wgmma_kernel does the same backward at HS = 64 without
//   dropout with its products on warpgroup MMA (llmc/wgmma.cuh): on an H200 13% faster at GPT-2
//   124M's shape (attention_backward_wgmma; the trainers' --attention-backward mma turns it off).
//   attention_forward_wgmma_kernel is the forward on it, off until timed on a GPU
//   (attention_forward_wgmma), as are the wgmma backward's registers for 3 blocks per SM instead of
//   2 (attention_backward_wgmma_blocks) and its dQ rows added by reductions in L2
//   (attention_backward_wgmma_red_dq). attention_backward_tune instead times a kernel's forms at each
//   shape's first call and keeps the fastest (the trainers' --attention-backward tune).
//   Shared memory per block, bf16/fp16 at HS = 64 (128): forward 36 (68) KiB, backward 64 (74) KiB; all
//   fit the 99 KiB of sm_86/sm_89 GPUs, and at HS <= 64 two blocks fit per SM on an A100 (164 KiB) and
//   an H100 (228 KiB); registers without spills: the backward's for 2 blocks per SM (<= 255 per
//   thread), the forward's at HS <= 64 without dropout for 4 (<= 128; AttnMmaTile::fwd_min_blocks; 3 on
//   Blackwell, where 128 spilled). On Blackwell (nvcc 13) the backward with dropout still spills 4 to
//   16 bytes at HS = 128, and on sm_120 at HS = 64 too.
// The fp32 kernels (AttnTile). A block owns 64 rows (queries, or keys in the dK/dV kernel), 16 per
// warp (32 or 16 on GPUs with less shared memory: attn_compact_warps), keeps them in shared memory and
// streams 64-row tiles of the other operand through shared memory; the lane layout is the
// "warp lane layout" of AttnTile. The backward runs a dK/dV kernel and a dQ kernel (7 tile products
// per tile pair: S and dP are computed by both).
//
// Masks. causal: key j > query i gets zero weight; tiles entirely above the diagonal are never
// visited, and the mask is evaluated only on tiles that cross the diagonal or the valid length.
// valid_len (B ints, device memory, or nullptr = all T valid): keys j >= valid_len[b] get zero weight;
// query rows i >= valid_len[b] produce out = 0 and lse = 0 and pass no gradient (their dq, dk, dv rows
// are 0); tiles entirely in padding are not computed. Values above T count as T.
//
// Precision. bf16/fp16: tensor-core products with fp32 accumulation; P and dS are rounded to floatX
// before their products, as FlashAttention does; scores, softmax statistics, lse, D and all
// accumulations (dQ's slices included) stay fp32. In fp16 the stored values are what can overflow: P
// <= 1 cannot, but dS = P (dP - D) and the outputs can under a large loss scale, and then become inf
// (never clamped), which the trainer's overflow check must see; small P and dS round to fp16
// subnormals (absolute error <= 2^-25).
//
// Dropout (AttentionDropout, off by default), with FlashAttention's semantics: the softmax statistics
// and lse are those of the undropped scores; out = (P∘M/(1-p)) V; the backward uses D = rowsum(dO∘O) of
// that (dropped) output, dV = (P∘M)^T dO / (1-p) and dS = P∘(dP∘M/(1-p) - D). M is never stored: every
// kernel regenerates it per (b, h, query, key) from the counter-based generator of llmc/dropout.cuh
// (dropout_attention_keep is the reference), each lane computing the keep bits of its 32 elements of a
// 16×64 tile with 8 Philox calls: the 2×2 groups {q, q^8} × {k, k^8} of llmc/dropout.cuh lie in one
// lane in every kernel (rows g and g+8 of a fragment; columns c and c+8 of two adjacent n8 tiles).
// M is applied as a select on P before it is rounded (l sums the undropped weights, in fp32) and
// 1/(1-p) is folded into the final row scaling of out and dV: no extra pass. The kernels are compiled
// with and without dropout (a template flag) and p = 0 launches the variant without, in which none of
// this code exists: attention without dropout (GPT-2, BERT's eval passes) pays nothing for it.
//
// Determinism. No float atomics decide a result. FlashAttention-2 adds each key tile's dQ
// contribution with fp32 atomics, so its dQ depends on the order blocks finish. Here the 16-bit
// backward's grid is (splits, NH, B): block s takes the key tiles s, s + splits, ... of its head and
// accumulates their dQ contributions into its own fp32 slice of the scratch (plain loads and stores:
// no other block touches it), and a small kernel sums the slices in split order. splits =
// attention_dq_splits(B, T, NH) (enough blocks for a large GPU: B·NH·splits >= 1024 where the
// sequence allows); the result is a function of the inputs and of (B, T, NH), bit for bit under any
// scheduling. Cost: the scratch, splits · B·T·C fp32 (GPT-2 124M at B = 8, T = 1024: 8 slices,
// 201 MB, reused by every layer; as splits · B·NH < 2048 + B·NH, always below (2048 + B·NH)·T·HS
// floats: one fp32 copy of a (B,T,C) activation plus 2048·T·HS floats), and a read-modify-write of
// the query tile's dQ rows (kColsB × HS fp32 per block) per tile pair where FlashAttention-2 issues
// atomics: fire-and-forget for the atomics, a load the adds wait for here, so the rows are prefetched
// into L2 as the pair begins and its products hide the trip to DRAM. The fp32 backward instead runs a separate dQ kernel over query
// tiles (7 products).
#pragma once
#include "cuda_common.h"
#include "dropout.cuh"
#include "precision.cuh"
#include "tensor_core.cuh"
#include "wgmma.cuh"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

// ----------------------------------------------------------------------------
// CUDA kernels

// Shapes and shared-memory layout of the CUDA-core kernels (fp32; dev/cuda/attention.cu instantiates
// them for bf16/fp16 with WMMA products) for storage type floatX, head size HS and kWarps warps per
// block (the row strides and the streamed tile do not depend on kWarps).
// The warp lane layout used for every row-wise step (every Math policy agrees on it): lane = 8*rg + cg
// holds rows rg + 4*i (i < 4) of its warp's 16 rows and columns cg + 8*j (j < 8) of a 64-column
// tile; the 8 lanes sharing a row are consecutive, so a row reduction is 3 xor-shuffles.
template <class floatX, int HS, int kWarps_ = 4>
struct AttnTile {
    static_assert(HS == 16 || HS == 32 || HS == 64 || HS == 128, "head sizes 16, 32, 64, 128");
    static constexpr int kWarps = kWarps_;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kRows = 16 * kWarps;  // rows a block owns (queries; keys in dK/dV)
    static constexpr int kCols = 64;           // rows of the streamed operand per tile
    // Row strides in shared memory. kLd adds 16 bytes to a row, so that the 8 rows the lanes of one
    // 128-bit access phase read (fp32 scores) fall in distinct banks, and WMMA rows are skewed; kLdP
    // and kLdX add 8 elements, so that the 4 rows the 4 row groups access at once start in distinct
    // banks. All keep WMMA's 16-byte multiple for ldm.
    static constexpr int kLd = HS + 16 / (int)sizeof(floatX);  // (rows, HS) operand tiles
    static constexpr int kLdP = kCols + 8;                     // a warp's (16, 64) P or dS tile
    static constexpr int kLdX = (HS > kCols ? HS : kCols) + 8; // a warp's fp32 scratch (16, max(64,HS))
    static constexpr float kScale = HS == 16 ? 0.25f : HS == 32 ? 0.17677669529663688f
                                  : HS == 64 ? 0.125f : 0.088388347648318440f;  // 1/sqrt(HS)
    static constexpr float kScaleLog2 = kScale * 1.4426950408889634f;  // scores in log2 units: exp2
    static constexpr size_t kOwnTileBytes = (size_t)kRows * kLd * sizeof(floatX);     // (kRows, HS)
    static constexpr size_t kStreamTileBytes = (size_t)kCols * kLd * sizeof(floatX);  // (kCols, HS)
    static constexpr size_t kWarpPBytes = (size_t)16 * kLdP * sizeof(floatX);
    static constexpr size_t kWarpScratchBytes = (size_t)16 * kLdX * sizeof(float);
    static constexpr size_t kWarpBytes = kWarpPBytes + kWarpScratchBytes;
    static constexpr size_t kAlign = 128;  // slack for aligning the dynamic shared memory (attn_smem_base)
    // Forward: the own Q tile, streamed K, V tiles + per warp P and scratch + the dropout keep bits (one
    // word per thread). Backward: two own tiles (K, V; Q, dO in the dQ kernel), two streamed (Q, dO; K, V)
    // + per warp P/dS and scratch + lse and D of the current query tile (dK/dV kernel) + the keep bits.
    static constexpr size_t kMaskBytes = kThreads * sizeof(uint32_t);
    static constexpr size_t kForwardWarpMem = kOwnTileBytes + 2 * kStreamTileBytes;  // offsets of warp 0's memory
    static constexpr size_t kBackwardWarpMem = 2 * kOwnTileBytes + 2 * kStreamTileBytes;
    static constexpr size_t kForwardMask = kForwardWarpMem + kWarps * kWarpBytes;  // offsets of the keep bits
    static constexpr size_t kBackwardMask = kBackwardWarpMem + kWarps * kWarpBytes + 2 * kCols * sizeof(float);
    static constexpr size_t kForwardSmem = kAlign + kForwardMask + kMaskBytes;
    static constexpr size_t kBackwardSmem = kAlign + kBackwardMask + kMaskBytes;
};

// The dynamic shared memory, rounded up to 128 bytes: WMMA needs 32-byte aligned pointers, and
// dynamic_shared<T>() promises only 16 (the launch asks for kAlign extra bytes). The offset is added
// to the shared pointer itself, so the compiler still knows it addresses shared memory.
__device__ inline unsigned char* attn_smem_base() {
    unsigned char* base = dynamic_shared<unsigned char>();
    return base + ((128 - reinterpret_cast<uintptr_t>(base) % 128) % 128);
}

// Number of valid (unpadded) tokens of sequence b.
__device__ inline int attn_valid_length(const int* valid_len, int b, int T) {
    if (!valid_len) return T;
    int v = valid_len[b];
    return v < 0 ? 0 : (v > T ? T : v);
}

// Copies rows [0, n) of a (rows, HS) tile from global memory (row stride `stride` elements) to shared
// memory (row stride kLd) with 128-bit loads, and zero-fills rows [n, rows): rows past the end or in
// padding are multiplied by zero probabilities, so they must be finite (0 * NaN is NaN).
template <class floatX, int HS>
__device__ void attn_load_tile(floatX* dst, const floatX* src, size_t stride, int n, int rows) {
    using Tile = AttnTile<floatX, HS>;
    constexpr int V = Packed128<floatX>::size, kPackets = HS / V;
    for (int idx = threadIdx.x; idx < rows * kPackets; idx += blockDim.x) {
        int r = idx / kPackets, c = (idx % kPackets) * V;
        Packed128<floatX> v = r < n ? load128(src + r * stride + c) : Packed128<floatX>::zeros();
        store128(dst + r * Tile::kLd + c, v);
    }
}

// Writes zeros to `rows` rows of HS elements (row stride `stride`): the outputs of a block that lies
// entirely in padding.
template <class floatX, int HS>
__device__ void attn_zero_rows(floatX* dst, size_t stride, int rows) {
    constexpr int V = Packed128<floatX>::size, kPackets = HS / V;
    for (int idx = threadIdx.x; idx < rows * kPackets; idx += blockDim.x)
        store128(dst + (idx / kPackets) * stride + (idx % kPackets) * V, Packed128<floatX>::zeros());
}

// A forward block's place in the tensors. Grid (ceil(T/kRows), NH, B): block x owns query rows
// q0 .. q0+rows-1 of head blockIdx.y of sequence blockIdx.z, the last query blocks first (under a
// causal mask they have the most key tiles, and starting the longest blocks first shortens the tail
// of the grid).
template <class floatX>
struct AttnForwardBlock {
    int bh;               // b * NH + h: the (sequence, head) pair, which keys dropout's random stream
    int q0, valid, rows;  // first query row, valid keys of the sequence, query rows of the block
    size_t stride;        // row stride of qkv: 3C
    const floatX* q;      // (B,T,3C) at (b, q0, q part)
    const floatX* k;      // (B,T,3C) at (b, 0, k part)
    const floatX* v;      // (B,T,3C) at (b, 0, v part)
    floatX* o;            // (B,T,C) at (b, q0)
    float* lse;           // (B,NH,T) at (b, h, q0)
};

template <class floatX, int HS, int kRows>
__device__ inline AttnForwardBlock<floatX> attn_forward_block(floatX* out, float* lse, const floatX* qkv, int T,
                                                              int C, int NH, const int* valid_len) {
    const int b = blockIdx.z, h = blockIdx.y;
    AttnForwardBlock<floatX> blk;
    blk.bh = b * NH + h;
    blk.q0 = (gridDim.x - 1 - blockIdx.x) * kRows;
    blk.valid = attn_valid_length(valid_len, b, T);
    blk.rows = min(kRows, T - blk.q0);
    blk.stride = 3 * (size_t)C;
    blk.q = qkv + ((size_t)b * T + blk.q0) * blk.stride + h * HS;
    blk.k = qkv + (size_t)b * T * blk.stride + C + h * HS;
    blk.v = blk.k + C;
    blk.o = out + ((size_t)b * T + blk.q0) * C + h * HS;
    blk.lse = lse + ((size_t)b * NH + h) * T + blk.q0;
    return blk;
}

// A block whose query rows are all padding writes zeros (and logsumexp 0) and computes nothing:
// returns true when it did.
template <class floatX, int HS>
__device__ inline bool attn_forward_padding_block(const AttnForwardBlock<floatX>& blk, int C) {
    if (blk.q0 < blk.valid) return false;
    attn_zero_rows<floatX, HS>(blk.o, C, blk.rows);
    for (int r = threadIdx.x; r < blk.rows; r += blockDim.x) blk.lse[r] = 0.f;
    return true;
}

// Writes a warp's 16 rows of fp32 results from its scratch (row stride kLdX) to global memory as
// floatX with 128-bit stores, the lane's row i multiplied by factor[i]. row0 is the global index of
// the warp's first row; rows >= valid are written as zeros, rows >= end not at all.
template <class floatX, int HS>
__device__ void attn_store_rows(floatX* dst, size_t stride, const float* scratch, int row0, int valid, int end,
                                const float (&factor)[4]) {
    using Tile = AttnTile<floatX, HS>;
    constexpr int V = Packed128<floatX>::size;
    int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
    for (int i = 0; i < 4; i++) {
        int r = rg + 4 * i, row = row0 + r;
        if (row >= end) continue;
        for (int c = cg * V; c < HS; c += 8 * V) {
            Packed128<floatX> out;
            for (int e = 0; e < V; e++)
                out[e] = from_float<floatX>(row < valid ? scratch[r * Tile::kLdX + c + e] * factor[i] : 0.f);
            store128(dst + (size_t)r * stride + c, out);
        }
    }
}

// The fp32 path's Math policy: tile products as plain FMAs, accumulators in registers in the warp lane
// layout. The CUDA-core kernels below take their products from a Math policy (Acc, zero, scores,
// accumulate, scale_rows, store); dev/cuda/attention.cu plugs in one on WMMA, whose accumulators need
// the warp's scratch, hence the scratch arguments this one ignores.
template <int HS>
struct AttnSimtMath {
    using Tile = AttnTile<float, HS>;
    // A (16, HS) accumulator: this lane's rows rg + 4*i, columns cg + 8*c.
    struct Acc {
        float v[4][HS / 8];
    };

    __device__ static void zero(Acc& acc) {
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < HS / 8; c++) acc.v[i][c] = 0.f;
    }

    // Computes the warp's (16, 64) tile of A B^T, for the warp's 16 rows of A and the 64 rows of B
    // (both with row stride kLd), and calls visit(i, j, value) for this lane's elements (row rg + 4i,
    // column cg + 8j). 128-bit shared loads along HS: the 8 lanes of a row group read one row of A (a
    // broadcast) and 8 rows of B, which the kLd padding puts in distinct banks.
    template <class Visit>
    __device__ static void scores(const float* A, const float* B, float* /*scratch*/, Visit visit) {
        int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
        float s[4][8];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) s[i][j] = 0.f;
        for (int d = 0; d < HS; d += 4) {
            float4 a[4];
            for (int i = 0; i < 4; i++) a[i] = *reinterpret_cast<const float4*>(A + (rg + 4 * i) * Tile::kLd + d);
            for (int j = 0; j < 8; j++) {
                float4 b = *reinterpret_cast<const float4*>(B + (cg + 8 * j) * Tile::kLd + d);
                for (int i = 0; i < 4; i++)
                    s[i][j] += a[i].x * b.x + a[i].y * b.y + a[i].z * b.z + a[i].w * b.w;
            }
        }
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) visit(i, j, s[i][j]);
    }

    // acc += X Y, X the warp's (16, 64) tile (row stride kLdP), Y a (64, HS) tile (row stride kLd).
    // Per k, the 4 row groups read 4 values of X (kLdP puts them in distinct banks) and all read the
    // same 8 consecutive values of a row of Y.
    __device__ static void accumulate(Acc& acc, const float* X, const float* Y) {
        int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
        for (int k = 0; k < Tile::kCols; k++) {
            float x[4];
            for (int i = 0; i < 4; i++) x[i] = X[(rg + 4 * i) * Tile::kLdP + k];
            const float* y = Y + k * Tile::kLd + cg;
            for (int c = 0; c < HS / 8; c++) {
                float yc = y[8 * c];
                for (int i = 0; i < 4; i++) acc.v[i][c] += x[i] * yc;
            }
        }
    }

    // Multiplies the lane's accumulator row i by f[i] (the rows are in registers: no round trip).
    __device__ static void scale_rows(Acc& acc, const float (&f)[4], float* /*scratch*/) {
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < HS / 8; c++) acc.v[i][c] *= f[i];
    }

    // Writes the accumulator to the warp's (16, HS) fp32 scratch (row stride kLdX).
    __device__ static void store(const Acc& acc, float* scratch) {
        int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < HS / 8; c++) scratch[(rg + 4 * i) * Tile::kLdX + cg + 8 * c] = acc.v[i][c];
    }
};

// Sum over the 8 lanes of a row group (lanes 8*rg .. 8*rg+7); every lane gets the same bits.
__device__ inline float attn_row_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    return x;
}
// Max over the 8 lanes of a row group.
__device__ inline float attn_row_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
    return x;
}

// One online-softmax step on a warp's (16, 64) tile of scores s (log2 units, -inf where masked):
// raises the running row max m, writes P = exp2(s - m) rounded to floatX into the warp's P tile, or 0
// where bit 8i + j of the dropout keep bits is clear, rescales this lane's partial row sums l by
// alpha = exp2(m_old - m_new) and adds its share of the rounded, undropped P (so that l normalizes
// exactly the weights the PV product uses, before dropout); returns alpha, the factor for the output
// accumulator. A row with every score masked so far keeps m = -inf and P = 0.
template <class floatX, int HS>
__device__ void attn_online_softmax(const float (&s)[4][8], float (&m)[4], float (&l)[4], float (&alpha)[4],
                                    floatX* P, uint32_t keep) {
    int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
    for (int i = 0; i < 4; i++) {
        float tile_max = s[i][0];
        for (int j = 1; j < 8; j++) tile_max = fmaxf(tile_max, s[i][j]);
        float m_new = fmaxf(m[i], attn_row_max(tile_max));
        float m_ref = m_new == -INFINITY ? 0.f : m_new;  // avoids (-inf) - (-inf)
        alpha[i] = exp2f(m[i] - m_ref);
        m[i] = m_new;
        float sum = 0.f;
        for (int j = 0; j < 8; j++) {
            floatX p = from_float<floatX>(exp2f(s[i][j] - m_ref));
            bool kept = (keep >> (8 * i + j)) & 1;
            P[(rg + 4 * i) * AttnTile<floatX, HS>::kLdP + cg + 8 * j] = kept ? p : from_float<floatX>(0.f);
            sum += to_float(p);
        }
        l[i] = l[i] * alpha[i] + sum;
    }
}

// Dropout keep bits of this lane's 32 elements of a warp's (16, 64) tile, in the warp lane layout: bit
// 8i + j for row r0 + rg + 4i, column c0 + cg + 8j. Rows are queries and columns keys, or the reverse
// (kRowsAreKeys: the dK/dV kernel's P^T). r0 and c0 are multiples of 16, so for i < 2 and even j
// row i + 2 is row i with bit 3 set and column j + 1 is column j with bit 3 set: each of the 8 Philox
// calls gives the 4 words of one group {q, q^8} × {k, k^8} of dropout_attention_keep, all this lane's.
template <bool kRowsAreKeys>
__device__ inline uint32_t attn_dropout_bits(const DropoutArgs& d, uint32_t bh, int r0, int c0) {
    int lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
    uint32_t bits = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 8; j += 2) {
            int r = r0 + rg + 4 * i, c = c0 + cg + 8 * j;
            uint4 w = dropout_random4(d.seed, d.offset,
                                      dropout_attention_index(bh, kRowsAreKeys ? c : r, kRowsAreKeys ? r : c));
            // Words x (q, k), y (q, k+8), z (q+8, k), w (q+8, k+8): which is the next column's depends
            // on whether columns are keys or queries.
            uint32_t next_col = kRowsAreKeys ? w.z : w.y, next_row = kRowsAreKeys ? w.y : w.z;
            bits |= (uint32_t)(w.x >= d.threshold) << (8 * i + j) |
                    (uint32_t)(next_col >= d.threshold) << (8 * i + j + 1) |
                    (uint32_t)(next_row >= d.threshold) << (8 * i + 16 + j) |
                    (uint32_t)(w.w >= d.threshold) << (8 * i + 16 + j + 1);
        }
    return bits;
}

// Forward. Grid (ceil(T/kRows), NH, B), kThreads threads; block x owns query rows q0 .. q0+kRows-1 of
// head blockIdx.y of sequence blockIdx.z and streams the key/value tiles its rows can see. kDropout:
// dropout on P as `drop` says.
template <class floatX, int HS, int kWarps, bool kDropout, class Math>
__global__ void __launch_bounds__(32 * kWarps, 1)
    attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int T, int C, int NH, bool causal,
                             const int* valid_len, DropoutArgs drop) {
    using Tile = AttnTile<floatX, HS, kWarps>;
    if (kDropout) drop = dropout_resolve(drop);  // a pass offset in device memory (llmc/dropout.cuh)
    const AttnForwardBlock<floatX> blk =
        attn_forward_block<floatX, HS, Tile::kRows>(out, lse, qkv, T, C, NH, valid_len);
    if (attn_forward_padding_block<floatX, HS>(blk, C)) return;
    const int q0 = blk.q0, valid = blk.valid, rows = blk.rows;
    const size_t stride = blk.stride;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
    unsigned char* smem = attn_smem_base();
    floatX* Qs = reinterpret_cast<floatX*>(smem);  // (kRows, HS)
    floatX* Ks = Qs + Tile::kRows * Tile::kLd;      // (64, HS) each
    floatX* Vs = Ks + Tile::kCols * Tile::kLd;
    unsigned char* warp_mem = smem + Tile::kForwardWarpMem + warp * Tile::kWarpBytes;
    floatX* P = reinterpret_cast<floatX*>(warp_mem);                         // (16, 64)
    float* scratch = reinterpret_cast<float*>(warp_mem + Tile::kWarpPBytes);  // (16, max(64, HS))
    uint32_t* keep_s = reinterpret_cast<uint32_t*>(smem + Tile::kForwardMask);  // (kThreads) dropout keep bits

    attn_load_tile<floatX, HS>(Qs, blk.q, stride, min(rows, valid - q0), Tile::kRows);
    const int kend = causal ? min(valid, q0 + Tile::kRows) : valid;  // keys any row of the block sees
    const int row0 = q0 + 16 * warp;  // this warp's first query row
    const bool active = row0 < valid;  // warp-uniform: a warp entirely in padding skips the math
    typename Math::Acc acc;
    Math::zero(acc);
    float m[4], l[4];
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
    }

    for (int k0 = 0; k0 < kend; k0 += Tile::kCols) {
        __syncthreads();  // every warp is done with the previous K, V tiles
        attn_load_tile<floatX, HS>(Ks, blk.k + k0 * stride, stride, min(Tile::kCols, kend - k0), Tile::kCols);
        attn_load_tile<floatX, HS>(Vs, blk.v + k0 * stride, stride, min(Tile::kCols, kend - k0), Tile::kCols);
        // The dropout keep bits of this lane's 32 elements of the tile, computed next to the tile loads and
        // parked in shared memory until the softmax reads them (in a register through the score product
        // they pushed the backward kernels, at 255 registers for HS = 64 and 128, into spills).
        if (kDropout && active) keep_s[threadIdx.x] = attn_dropout_bits<false>(drop, blk.bh, row0, k0);
        __syncthreads();
        if (!active) continue;
        float s[4][8];  // scaled scores in log2 units, -inf where masked
        Math::scores(Qs + 16 * warp * Tile::kLd, Ks, scratch, [&](int i, int j, float dot) {
            int qi = row0 + rg + 4 * i, kj = k0 + cg + 8 * j;
            bool keep = kj < valid && (!causal || kj <= qi);
            s[i][j] = keep ? dot * Tile::kScaleLog2 : -INFINITY;
        });
        float alpha[4];
        attn_online_softmax<floatX, HS>(s, m, l, alpha, P, kDropout ? keep_s[threadIdx.x] : ~0u);
        Math::scale_rows(acc, alpha, scratch);
        __syncwarp();  // the P tile is complete
        Math::accumulate(acc, P, Vs);
    }

    // out = acc / l (times 1/(1-p) with dropout); lse = (m + log2 l) * ln 2 (m is in log2 units).
    float inv_l[4];
    for (int i = 0; i < 4; i++) {
        l[i] = attn_row_sum(l[i]);
        inv_l[i] = l[i] > 0.f ? 1.f / l[i] : 0.f;
        if (kDropout) inv_l[i] *= drop.scale;
    }
    __syncwarp();
    Math::store(acc, scratch);
    __syncwarp();
    attn_store_rows<floatX, HS>(blk.o + 16 * warp * C, C, scratch, row0, valid, T, inv_l);
    if (cg == 0)
        for (int i = 0; i < 4; i++) {
            int qi = row0 + rg + 4 * i;
            if (qi < T) blk.lse[qi - q0] = qi < valid ? (m[i] + log2f(l[i])) * 0.69314718055994531f : 0.f;
        }
}

// Backward, step 1: D = rowsum(dO ∘ O) per (b, h, t) in fp32, (B,NH,T); 0 for padded rows. It only
// streams 2·B·T·C elements, so it is about coalescing: a head's row is kLanes = HS/V packs of 128
// bits, and kLanes consecutive lanes take one pack each, so a warp's load covers 32 consecutive
// packs (rows (b, t, h) with h fastest are consecutive in memory). Each lane sums its pack's V
// products in order, then the row's lanes are added by a fixed butterfly of shuffles.
template <class floatX, int HS>
__global__ void attention_backward_preprocess_kernel(float* D, const floatX* dout, const floatX* out, int B, int T,
                                                     int C, int NH, const int* valid_len) {
    constexpr int V = Packed128<floatX>::size, kLanes = HS / V;
    static_assert(HS % V == 0 && 32 % kLanes == 0, "a head's row is whole packs, and a warp holds whole rows");
    size_t thread = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t idx = thread / kLanes;  // (b, t, h), h fastest
    int part = (int)(thread % kLanes);
    bool row = idx < (size_t)B * T * NH;  // no early return: every lane takes part in the shuffles
    int h = (int)(idx % NH), t = (int)((idx / NH) % T), b = (int)(idx / ((size_t)NH * T));
    float d = 0.f;
    if (row && t < attn_valid_length(valid_len, b, T)) {
        size_t offset = ((size_t)b * T + t) * C + h * HS + part * V;
        Packed128<floatX> g = load128cs(dout + offset), y = load128cs(out + offset);
        for (int e = 0; e < V; e++) d += to_float(g[e]) * to_float(y[e]);
    }
    for (int s = kLanes / 2; s > 0; s /= 2) d += __shfl_xor_sync(0xffffffffu, d, s);
    if (row && part == 0) D[((size_t)b * NH + h) * T + t] = d;
}

// Backward, step 2: dK and dV. Grid (ceil(T/kRows), NH, B), kThreads threads; block x owns key rows
// k0 .. k0+kRows-1 and streams the 64-row query tiles that see them (causal: from the one holding query
// k0 on, so that every block size sums over the same tiles in the same order: the same bits), recomputing
// P^T = exp(K Q^T * scale - lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T ∘ (dP^T - D), dK += dS^T Q
// (with dropout: dV += (P∘M)^T dO, dP^T ∘ M / (1-p) in dS^T, and dV scaled by 1/(1-p) at the end).
template <class floatX, int HS, int kWarps, bool kDropout, class Math>
__global__ void __launch_bounds__(32 * kWarps, 1)
    attention_backward_dkdv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                   const float* D, int T, int C, int NH, bool causal, const int* valid_len,
                                   DropoutArgs drop) {
    using Tile = AttnTile<floatX, HS, kWarps>;
    if (kDropout) drop = dropout_resolve(drop);  // a pass offset in device memory (llmc/dropout.cuh)
    const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * Tile::kRows;  // under a causal mask the
    const int valid = attn_valid_length(valid_len, b, T);                    // first blocks are longest
    const int rows = min(Tile::kRows, T - k0);
    const size_t stride = 3 * (size_t)C;
    const floatX* q = qkv + (size_t)b * T * stride + h * HS;          // (B,T,3C) at (b, 0, q part)
    const floatX* k = qkv + ((size_t)b * T + k0) * stride + C + h * HS;  // at (b, k0, k part)
    const floatX* do_ = dout + (size_t)b * T * C + h * HS;            // (B,T,C) at (b, 0)
    floatX* dk = dqkv + ((size_t)b * T + k0) * stride + C + h * HS;
    floatX* dv = dk + C;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;  // (B,NH,T) at (b, h, 0)
    const float* D_bh = D + ((size_t)b * NH + h) * T;
    if (k0 >= valid) {  // every key row is padding: zero gradients, no compute
        attn_zero_rows<floatX, HS>(dk, stride, rows);
        attn_zero_rows<floatX, HS>(dv, stride, rows);
        return;
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
    unsigned char* smem = attn_smem_base();
    floatX* Ks = reinterpret_cast<floatX*>(smem);  // (kRows, HS) each
    floatX* Vs = Ks + Tile::kRows * Tile::kLd;
    floatX* Qs = Vs + Tile::kRows * Tile::kLd;     // (64, HS) each
    floatX* dOs = Qs + Tile::kCols * Tile::kLd;
    unsigned char* warp_mem = smem + Tile::kBackwardWarpMem + warp * Tile::kWarpBytes;
    floatX* X = reinterpret_cast<floatX*>(warp_mem);                          // (16, 64): P^T, then dS^T
    float* scratch = reinterpret_cast<float*>(warp_mem + Tile::kWarpPBytes);  // (16, max(64, HS))
    float* lse2_s = reinterpret_cast<float*>(smem + Tile::kBackwardWarpMem + Tile::kWarps * Tile::kWarpBytes);
    float* D_s = lse2_s + Tile::kCols;  // lse (in log2 units) and D of the current query tile
    uint32_t* keep_s = reinterpret_cast<uint32_t*>(smem + Tile::kBackwardMask);  // (kThreads) dropout keep bits

    attn_load_tile<floatX, HS>(Ks, k, stride, min(rows, valid - k0), Tile::kRows);
    attn_load_tile<floatX, HS>(Vs, k + C, stride, min(rows, valid - k0), Tile::kRows);
    const int key0 = k0 + 16 * warp;  // this warp's first key row
    const bool active = key0 < valid;
    typename Math::Acc dk_acc, dv_acc;
    Math::zero(dk_acc);
    Math::zero(dv_acc);

    for (int q0 = causal ? k0 / Tile::kCols * Tile::kCols : 0; q0 < valid; q0 += Tile::kCols) {
        const int nq = min(Tile::kCols, valid - q0);
        __syncthreads();  // every warp is done with the previous Q, dO tiles
        attn_load_tile<floatX, HS>(Qs, q + q0 * stride, stride, nq, Tile::kCols);
        attn_load_tile<floatX, HS>(dOs, do_ + q0 * (size_t)C, C, nq, Tile::kCols);
        for (int r = threadIdx.x; r < Tile::kCols; r += blockDim.x) {
            lse2_s[r] = r < nq ? lse_bh[q0 + r] * 1.4426950408889634f : 0.f;
            D_s[r] = r < nq ? D_bh[q0 + r] : 0.f;
        }
        if (kDropout && active)  // as in the forward
            keep_s[threadIdx.x] = attn_dropout_bits<true>(drop, b * NH + h, key0, q0);
        __syncthreads();
        if (!active) continue;
        float p[4][8];  // P^T (undropped): rows keys key0 + rg + 4i, columns queries q0 + cg + 8j
        Math::scores(Ks + 16 * warp * Tile::kLd, Qs, scratch, [&](int i, int j, float dot) {
            int kj = key0 + rg + 4 * i, qc = cg + 8 * j, qi = q0 + qc;
            bool keep = qi < valid && kj < valid && (!causal || kj <= qi);
            p[i][j] = keep ? exp2f(dot * Tile::kScaleLog2 - lse2_s[qc]) : 0.f;
            bool kept = !kDropout || (keep_s[threadIdx.x] >> (8 * i + j)) & 1;
            X[(rg + 4 * i) * Tile::kLdP + qc] = from_float<floatX>(kept ? p[i][j] : 0.f);
        });
        __syncwarp();
        Math::accumulate(dv_acc, X, dOs);
        __syncwarp();  // every lane's reads of P^T are done before dS^T overwrites it
        Math::scores(Vs + 16 * warp * Tile::kLd, dOs, scratch, [&](int i, int j, float dp) {  // dP^T
            int qc = cg + 8 * j;
            if (kDropout) dp *= (keep_s[threadIdx.x] >> (8 * i + j)) & 1 ? drop.scale : 0.f;  // dP^T ∘ M / (1-p)
            X[(rg + 4 * i) * Tile::kLdP + qc] = from_float<floatX>(p[i][j] * (dp - D_s[qc]));
        });
        __syncwarp();
        Math::accumulate(dk_acc, X, Qs);
    }

    // dV = sum P^T dO (times 1/(1-p) with dropout); dK = scale * sum dS^T Q (dS is the gradient of the
    // scaled scores).
    const float dv_factor = kDropout ? drop.scale : 1.f;
    const float dv_scale[4] = {dv_factor, dv_factor, dv_factor, dv_factor};
    const float scale[4] = {Tile::kScale, Tile::kScale, Tile::kScale, Tile::kScale};
    __syncwarp();
    Math::store(dv_acc, scratch);
    __syncwarp();
    attn_store_rows<floatX, HS>(dv + 16 * warp * stride, stride, scratch, key0, valid, T, dv_scale);
    __syncwarp();
    Math::store(dk_acc, scratch);
    __syncwarp();
    attn_store_rows<floatX, HS>(dk + 16 * warp * stride, stride, scratch, key0, valid, T, scale);
}

// Backward, step 3: dQ. Grid (ceil(T/kRows), NH, B), kThreads threads; block x owns query rows
// q0 .. q0+kRows-1 and streams the key tiles they see, recomputing P = exp(Q K^T * scale - lse), dP = dO V^T,
// dS = P ∘ (dP - D), dQ += dS K (with dropout: dP ∘ M / (1-p) in place of dP).
template <class floatX, int HS, int kWarps, bool kDropout, class Math>
__global__ void __launch_bounds__(32 * kWarps, 1)
    attention_backward_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                 const float* D, int T, int C, int NH, bool causal, const int* valid_len,
                                 DropoutArgs drop) {
    using Tile = AttnTile<floatX, HS, kWarps>;
    if (kDropout) drop = dropout_resolve(drop);  // a pass offset in device memory (llmc/dropout.cuh)
    const int b = blockIdx.z, h = blockIdx.y;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * Tile::kRows;  // longest blocks first, as in the forward
    const int valid = attn_valid_length(valid_len, b, T);
    const int rows = min(Tile::kRows, T - q0);
    const size_t stride = 3 * (size_t)C;
    const floatX* q = qkv + ((size_t)b * T + q0) * stride + h * HS;  // (B,T,3C) at (b, q0, q part)
    const floatX* k = qkv + (size_t)b * T * stride + C + h * HS;     // at (b, 0, k part)
    const floatX* v = k + C;
    const floatX* do_ = dout + ((size_t)b * T + q0) * C + h * HS;    // (B,T,C) at (b, q0)
    floatX* dq = dqkv + ((size_t)b * T + q0) * stride + h * HS;
    if (q0 >= valid) {
        attn_zero_rows<floatX, HS>(dq, stride, rows);
        return;
    }

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rg = lane / 8, cg = lane % 8;
    unsigned char* smem = attn_smem_base();
    floatX* Qs = reinterpret_cast<floatX*>(smem);  // (kRows, HS) each
    floatX* dOs = Qs + Tile::kRows * Tile::kLd;
    floatX* Ks = dOs + Tile::kRows * Tile::kLd;    // (64, HS) each
    floatX* Vs = Ks + Tile::kCols * Tile::kLd;
    unsigned char* warp_mem = smem + Tile::kBackwardWarpMem + warp * Tile::kWarpBytes;
    floatX* dS = reinterpret_cast<floatX*>(warp_mem);                         // (16, 64)
    float* scratch = reinterpret_cast<float*>(warp_mem + Tile::kWarpPBytes);  // (16, max(64, HS))
    uint32_t* keep_s = reinterpret_cast<uint32_t*>(smem + Tile::kBackwardMask);  // (kThreads) dropout keep bits

    attn_load_tile<floatX, HS>(Qs, q, stride, min(rows, valid - q0), Tile::kRows);
    attn_load_tile<floatX, HS>(dOs, do_, C, min(rows, valid - q0), Tile::kRows);
    const int kend = causal ? min(valid, q0 + Tile::kRows) : valid;
    const int row0 = q0 + 16 * warp;
    const bool active = row0 < valid;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;  // (B,NH,T) at (b, h, 0)
    const float* D_bh = D + ((size_t)b * NH + h) * T;
    float lse2[4], Drow[4];  // of this lane's rows
    for (int i = 0; i < 4; i++) {
        int qi = row0 + rg + 4 * i;
        lse2[i] = qi < valid ? lse_bh[qi] * 1.4426950408889634f : 0.f;
        Drow[i] = qi < valid ? D_bh[qi] : 0.f;
    }
    typename Math::Acc dq_acc;
    Math::zero(dq_acc);

    for (int k0 = 0; k0 < kend; k0 += Tile::kCols) {
        __syncthreads();  // every warp is done with the previous K, V tiles
        attn_load_tile<floatX, HS>(Ks, k + k0 * stride, stride, min(Tile::kCols, kend - k0), Tile::kCols);
        attn_load_tile<floatX, HS>(Vs, v + k0 * stride, stride, min(Tile::kCols, kend - k0), Tile::kCols);
        if (kDropout && active)  // as in the forward
            keep_s[threadIdx.x] = attn_dropout_bits<false>(drop, b * NH + h, row0, k0);
        __syncthreads();
        if (!active) continue;
        float p[4][8];  // rows: queries row0 + rg + 4i; columns: keys k0 + cg + 8j
        Math::scores(Qs + 16 * warp * Tile::kLd, Ks, scratch, [&](int i, int j, float dot) {
            int qi = row0 + rg + 4 * i, kj = k0 + cg + 8 * j;
            bool keep = qi < valid && kj < valid && (!causal || kj <= qi);
            p[i][j] = keep ? exp2f(dot * Tile::kScaleLog2 - lse2[i]) : 0.f;
        });
        Math::scores(dOs + 16 * warp * Tile::kLd, Vs, scratch, [&](int i, int j, float dp) {
            if (kDropout) dp *= (keep_s[threadIdx.x] >> (8 * i + j)) & 1 ? drop.scale : 0.f;
            dS[(rg + 4 * i) * Tile::kLdP + cg + 8 * j] = from_float<floatX>(p[i][j] * (dp - Drow[i]));
        });
        __syncwarp();
        Math::accumulate(dq_acc, dS, Ks);
    }

    const float scale[4] = {Tile::kScale, Tile::kScale, Tile::kScale, Tile::kScale};
    __syncwarp();
    Math::store(dq_acc, scratch);
    __syncwarp();
    attn_store_rows<floatX, HS>(dq + 16 * warp * stride, stride, scratch, row0, valid, T, scale);
}

// ----------------------------------------------------------------------------
// The 16-bit kernels: mma.sync m16n8k16 with the PTX fragment layouts (llmc/tensor_core.cuh)

// Shapes and shared-memory layout of the mma.sync kernels for storage type floatX and head size HS. A
// block has 4 warps. In the forward each owns kFwdTiles = 1 16-row tile of queries. Two
// (FlashAttention-2's block of 128 queries at head size 64) would make every K and V fragment a
// warp reads from shared memory feed two mma instead of one, but on an H100 that forward ran 9%
// slower under GPT-2's causal mask (158 vs 173 TFLOP/s, B=8 T=1024 NH=12 HS=64; 3 to 4% faster
// without a mask: dev/cuda/attention.cu's variant 3 times it), and at HS = 128 the output
// accumulator (64 floats per lane and tile) leaves no registers for a second. The forward streams
// kCols = 64 keys per tile. In the backward each warp owns 16 keys (kRows = 64 per block) and the
// block streams kColsB queries per tile, 32 at HS = 128, where the dK and dV accumulators (2 × 64
// floats per lane) leave no room for two 64-wide score tiles in 255 registers. Row stride kLd = HS + 8
// elements: every row is 16 bytes longer than a multiple of 128, so the 8 row addresses of one
// ldmatrix phase fall in 8 distinct 16-byte bank groups (as they do with the (64, kColsB) dS^T
// tile's stride kLdS: 144 or 80 bytes).
template <class floatX, int HS>
struct AttnMmaTile {
    static_assert(HS % 16 == 0 && HS <= 128, "head sizes 16, 32, 64, 128");
    static constexpr int kWarps = 4;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kRows = 16 * kWarps;
    static constexpr int kFwdTiles = 1;
    // The forward's registers are capped for 4 resident blocks per SM (128 registers) at HS <= 64
    // without dropout: on an H100 that ran it 3 to 5% faster than 2 (146 registers, 3 blocks). With
    // dropout the cap spills on sm_90, and at HS = 128 shared memory allows 3 blocks: those keep 2.
    // (Blackwell's device code caps 4 as 3: LLMC_ATTN_FWD_MIN_BLOCKS.)
    static constexpr int fwd_min_blocks(bool dropout) { return HS <= 64 && !dropout ? 4 : 2; }
    static constexpr int kCols = 64;
    static constexpr int kColsB = HS == 128 ? 32 : 64;
    static constexpr int kLd = HS + 8;
    static constexpr int kLdS = kColsB + 8;
    static constexpr float kScale = AttnTile<floatX, HS>::kScale;
    static constexpr float kScaleLog2 = AttnTile<floatX, HS>::kScaleLog2;
    static constexpr size_t kOwnTile = (size_t)kRows * kLd;      // elements of a (64, HS) tile
    static constexpr size_t kStreamTile = (size_t)kCols * kLd;   // elements of a (64, HS) tile
    static constexpr size_t kStreamTileB = (size_t)kColsB * kLd; // elements of a (kColsB, HS) tile
    // Forward: 2 stages of (K, V); Q (at most 128 rows) passes through the second stage on its way to
    // registers, and the output rows through a free stage on their way out. Backward: K, V + 2 stages
    // of (Q, dO) + dS^T + 2 stages of (lse, D) of the streamed queries. (+ 128: slack to align the
    // dynamic shared memory.)
    static constexpr size_t kForwardSmem = 128 + 4 * kStreamTile * sizeof(floatX);
    static constexpr size_t kBackwardStats =  // byte offset of the (lse, D) stages
        (2 * kOwnTile + 4 * kStreamTileB + (size_t)kRows * kLdS) * sizeof(floatX);
    static constexpr size_t kBackwardSmem = 128 + kBackwardStats + 4 * kColsB * sizeof(float);
};

// Starts cp.async copies of rows [0, n) of a (kTileRows, HS) tile (global row stride `stride0`
// elements) into shared memory at dst (row stride kLd), and with kGap > 0 of a second tile with the
// same rows (src1, row stride stride1) into dst + kGap: K and V, or Q and dO, in one loop. Rows
// [n, kTileRows) are zero-filled by the same copies (src-size 0, nothing read): rows past the end or
// in padding meet zero probabilities, so they must be finite (0 * NaN is NaN). No branch around a
// copy. Each thread copies the same 16-byte column of every kThreads / kPackets-th row, so its
// addresses only step by constants from one turn to the next (a rolled loop: unrolled, the compiler
// keeps every turn's 64-bit addresses live at once, and the HS = 128 backward with dropout, at the
// register limit, spills). The caller commits.
template <class floatX, int HS, int kTileRows, size_t kGap = 0>
__device__ void attn_async_tiles(floatX* dst, int n, const floatX* src0, size_t stride0,
                                 const floatX* src1 = nullptr, size_t stride1 = 0) {
    using Tile = AttnMmaTile<floatX, HS>;
    constexpr int V = 16 / (int)sizeof(floatX), kPackets = HS / V;
    constexpr int kRowStep = Tile::kThreads / kPackets;  // rows a turn of the block covers
    static_assert(Tile::kThreads % kPackets == 0 && kTileRows % kRowStep == 0, "whole turns");
    int r = threadIdx.x / kPackets, c = (threadIdx.x % kPackets) * V;
    const floatX* from0 = src0 + (size_t)r * stride0 + c;
    const floatX* from1 = kGap ? src1 + (size_t)r * stride1 + c : nullptr;
    floatX* to = dst + r * Tile::kLd + c;
#pragma unroll 1
    for (; r < kTileRows; r += kRowStep, to += kRowStep * Tile::kLd) {
        bool in = r < n;
        cp_async_16_zfill(to, in ? from0 : src0, in ? 16 : 0);
        from0 += kRowStep * stride0;
        if constexpr (kGap > 0) {
            cp_async_16_zfill(to + kGap, in ? from1 : src1, in ? 16 : 0);
            from1 += kRowStep * stride1;
        }
    }
}

// Two floats rounded to floatX and packed into one .b32 register of an mma fragment, the first in the
// low 16 bits (the lower-indexed element, as the PTX layouts put it); by the paired conversion (one
// F2FP instruction on the GPU, where two scalar conversions and a byte permute are three).
template <class floatX>
__device__ inline uint32_t attn_pack2f(float lo, float hi) {
    uint32_t u;
    if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        memcpy(&u, &v, 4);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        memcpy(&u, &v, 4);
    }
    return u;
}

// mma's A fragment of the 16×16 block at `tile` (row stride ld) of a row-major matrix: ldmatrix_x4,
// lane l addressing row l % 16, column 8 (l / 16).
template <class floatX>
__device__ inline void attn_ldsm_a(uint32_t (&a)[4], const floatX* tile, int ld) {
    int lane = threadIdx.x % 32;
    ldmatrix_x4(a, tile + (lane % 16) * ld + 8 * (lane / 16));
}

// s[mt][j] += A_mt B^T for the NC/8 n8 tiles j of MT (16, NC) products over KD that share B: A_mt's
// fragments from fetch_a(mt, kk) (its 16×16 block kk), B the NC rows of a (NC, KD) shared tile (row
// stride ld). B^T's fragment b[0] = B^T(2t.., g) = B(g, 2t..) is a row of B, so the non-transposing
// ldmatrix gives it; one ldmatrix_x4 (lane l: row 8 (l / 16) + l % 8, column 16 kk + 8 ((l / 8) % 2))
// gives those of two n8 tiles, and each feeds all MT products: MT row tiles per warp cut the
// shared-memory reads per mma by MT. kk is the outer loop, so an A fetched from shared memory costs
// 4 registers per row tile.
template <class floatX, int KD, int NC, int MT, class FetchA>
__device__ inline void attn_mma_abt(float (&s)[MT][NC / 8][4], FetchA fetch_a, const floatX* B, int ld) {
    int lane = threadIdx.x % 32;
    for (int kk = 0; kk < KD / 16; kk++) {
        uint32_t a[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const uint32_t(&f)[4] = fetch_a(mt, kk);
            for (int i = 0; i < 4; i++) a[mt][i] = f[i];
        }
        for (int np = 0; np < NC / 16; np++) {
            uint32_t r[4];
            ldmatrix_x4(r, B + (16 * np + lane % 8 + 8 * (lane / 16)) * ld + 16 * kk + 8 * ((lane / 8) % 2));
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_m16n8k16<floatX>(s[mt][2 * np], a[mt], {r[0], r[1]}, s[mt][2 * np]);
                mma_m16n8k16<floatX>(s[mt][2 * np + 1], a[mt], {r[2], r[3]}, s[mt][2 * np + 1]);
            }
        }
    }
}

// acc[mt][n] += X_mt Y for the N/8 n8 tiles n of MT (16, N) products over KD that share Y: X_mt's
// fragments from fetch_x(mt, kk), Y a row-major (KD, N) shared tile (row stride ld), whose b fragments
// the transposing ldmatrix gives; one ldmatrix_x4_trans (lane l: row 16 kk + l % 8 + 8 ((l / 8) % 2),
// column 16 np + 8 (l / 16)) gives those of two n8 tiles, for all MT products.
template <class floatX, int KD, int N, int MT, class FetchX>
__device__ inline void attn_mma_xy(float (&acc)[MT][N / 8][4], FetchX fetch_x, const floatX* Y, int ld) {
    int lane = threadIdx.x % 32;
    for (int kk = 0; kk < KD / 16; kk++) {
        uint32_t x[MT][4];
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const uint32_t(&f)[4] = fetch_x(mt, kk);
            for (int i = 0; i < 4; i++) x[mt][i] = f[i];
        }
        for (int np = 0; np < N / 16; np++) {
            uint32_t r[4];
            ldmatrix_x4_trans(r, Y + (16 * kk + lane % 8 + 8 * ((lane / 8) % 2)) * ld + 16 * np + 8 * (lane / 16));
            #pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                mma_m16n8k16<floatX>(acc[mt][2 * np], x[mt], {r[0], r[1]}, acc[mt][2 * np]);
                mma_m16n8k16<floatX>(acc[mt][2 * np + 1], x[mt], {r[2], r[3]}, acc[mt][2 * np + 1]);
            }
        }
    }
}

// The C fragments of a (16, NC) product, holding values of floatX, as the A fragments of the next
// product: C's n8 tiles 2kk and 2kk+1 hold rows g, g+8 and columns 2t.., 8+2t.. of the k16 slice kk,
// exactly A's a[0] (g, 2t..), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..). No data moves.
template <class floatX, int NC>
__device__ inline void attn_c_to_a(uint32_t (&x)[NC / 16][4], const float (&c)[NC / 8][4]) {
    for (int kk = 0; kk < NC / 16; kk++)
        for (int half = 0; half < 2; half++) {
            const float* e = c[2 * kk + half];
            x[kk][2 * half] = attn_pack2f<floatX>(e[0], e[1]);
            x[kk][2 * half + 1] = attn_pack2f<floatX>(e[2], e[3]);
        }
}

// Sum and max over the 4 lanes of a quad (lanes 4g .. 4g+3: the lanes sharing a row of a C fragment).
__device__ inline float attn_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ inline float attn_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Dropout keep bits of this lane's 4 NC/8 elements of a (16, NC) C-fragment tile: bit 4j + e for
// register e of n8 tile j, i.e. row r0 + g + 8 (e / 2), column c0 + 8j + 2t + e % 2. Rows are queries
// and columns keys, or the reverse (kRowsAreKeys: the backward's P^T). r0 and c0 are multiples of 16,
// so row g + 8 is row g with bit 3 set and tile 2jj + 1's column is tile 2jj's with bit 3 set: each of
// the NC/8 Philox calls gives the 4 words of one group {q, q^8} × {k, k^8} of dropout_attention_keep,
// all this lane's.
template <bool kRowsAreKeys, int NC>
__device__ inline uint32_t attn_mma_dropout_bits(const DropoutArgs& d, uint32_t bh, int r0, int c0) {
    static_assert(NC <= 64, "32 bits");
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t bits = 0;
    for (int jj = 0; jj < NC / 16; jj++)
        for (int e = 0; e < 2; e++) {
            int r = r0 + g, c = c0 + 16 * jj + 2 * t + e;
            uint4 w = dropout_random4(d.seed, d.offset,
                                      dropout_attention_index(bh, kRowsAreKeys ? c : r, kRowsAreKeys ? r : c));
            // Words x (q, k), y (q, k^8), z (q^8, k), w (q^8, k^8).
            uint32_t next_col = kRowsAreKeys ? w.z : w.y, next_row = kRowsAreKeys ? w.y : w.z;
            int j = 2 * jj;
            bits |= (uint32_t)(w.x >= d.threshold) << (4 * j + e) |
                    (uint32_t)(next_col >= d.threshold) << (4 * (j + 1) + e) |
                    (uint32_t)(next_row >= d.threshold) << (4 * j + 2 + e) |
                    (uint32_t)(w.w >= d.threshold) << (4 * (j + 1) + 2 + e);
        }
    return bits;
}

// Writes a warp's 16 rows of results (C fragments acc, row g + 8r scaled by factor[r]) to global
// memory as floatX: through the warp's own 16 rows of a shared tile `stage` (row stride kLd; no other
// warp reads them now), then 128-bit stores of whole rows. row0 is the global index of the warp's first
// row; rows >= valid are written as zeros, rows >= end not at all.
template <class floatX, int HS>
__device__ void attn_mma_store_rows(floatX* dst, size_t stride, floatX* stage, const float (&acc)[HS / 8][4],
                                    const float (&factor)[2], int row0, int valid, int end) {
    constexpr int kLd = AttnMmaTile<floatX, HS>::kLd, V = Packed128<floatX>::size;
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    __syncwarp();  // every lane is done reading these rows
    for (int n = 0; n < HS / 8; n++)
        for (int r = 0; r < 2; r++)
            *reinterpret_cast<uint32_t*>(stage + (g + 8 * r) * kLd + 8 * n + 2 * t) =
                attn_pack2f<floatX>(acc[n][2 * r] * factor[r], acc[n][2 * r + 1] * factor[r]);
    __syncwarp();
    for (int idx = lane; idx < 16 * (HS / V); idx += 32) {
        int r = idx / (HS / V), c = (idx % (HS / V)) * V, row = row0 + r;
        if (row >= end) continue;
        store128(dst + (size_t)r * stride + c, row < valid ? load128(stage + r * kLd + c) : Packed128<floatX>::zeros());
    }
    __syncwarp();  // the rows are free again
}

// Forward, 16-bit types (FlashAttention-2). Grid (ceil(T/kRows), NH, B), 128 threads, kRows = 64·MT;
// block x owns query rows q0 .. q0+kRows-1, 16·MT per warp (MT row tiles: AttnMmaTile::kFwdTiles),
// whose Q fragments stay in registers for the whole pass, and streams the (K, V) tiles its rows can
// see through two shared-memory stages: while the warps compute on tile i, cp.async fills the other
// stage with tile i+1. S = Q K^T, the softmax and P stay in registers (C fragments: this lane holds
// rows g, g+8 of each n8 tile; the 4 lanes of a quad share a row, so row max and sum are 2
// xor-shuffles), and P's C fragments are the A fragments of O += P V. The masks are evaluated only on
// tiles that need them (the diagonal tiles, the tile holding the last valid key); under a causal mask
// a warp skips the tiles entirely above its own rows. kMinBlocks: the resident blocks per SM the
// registers are capped for (AttnMmaTile::fwd_min_blocks).
// On Blackwell (sm_100, sm_120) nvcc 13 gives the forward a few more registers than the 128 of 4 blocks
// per SM (it spilled 4 and 12 bytes there): its cap is 3 blocks instead (168 registers). Only the device
// code's cap differs by architecture; the kernel's name, and so the host's view of it, does not.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define LLMC_ATTN_FWD_MIN_BLOCKS(n) ((n) > 3 ? 3 : (n))
#else
#define LLMC_ATTN_FWD_MIN_BLOCKS(n) (n)
#endif
template <class floatX, int HS, bool kDropout, int MT,
          int kMinBlocks = AttnMmaTile<floatX, HS>::fwd_min_blocks(kDropout)>
__global__ void __launch_bounds__(128, LLMC_ATTN_FWD_MIN_BLOCKS(kMinBlocks))
    attention_forward_mma_kernel(floatX* out, float* lse, const floatX* qkv, int T, int C, int NH, bool causal,
                                 const int* valid_len, DropoutArgs drop) {
    using Tile = AttnMmaTile<floatX, HS>;
    constexpr int kRows = 16 * MT * Tile::kWarps, kWarpRows = 16 * MT;
    if (kDropout) drop = dropout_resolve(drop);  // a pass offset in device memory (llmc/dropout.cuh)
    const AttnForwardBlock<floatX> blk = attn_forward_block<floatX, HS, kRows>(out, lse, qkv, T, C, NH, valid_len);
    if (attn_forward_padding_block<floatX, HS>(blk, C)) return;
    const int q0 = blk.q0, valid = blk.valid, rows = blk.rows;
    const size_t stride = blk.stride;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    floatX* KVs = reinterpret_cast<floatX*>(attn_smem_base());  // stage s: K at 2s, V at 2s+1, (64, HS) each
    // Q's (kRows, HS) tile lands in stage 1, which tile 1 fills only after every warp has taken its
    // fragments (the loop's first barrier).
    static_assert(kRows <= 2 * Tile::kCols, "Q fits in a stage");
    floatX* Qs = KVs + 2 * Tile::kStreamTile;
    const int kend = causal ? min(valid, q0 + kRows) : valid;  // keys any row of the block sees
    const int tiles = CEIL_DIV(kend, Tile::kCols);
    attn_async_tiles<floatX, HS, kRows>(Qs, min(rows, valid - q0), blk.q, stride);
    attn_async_tiles<floatX, HS, Tile::kCols, Tile::kStreamTile>(KVs, min(Tile::kCols, kend), blk.k, stride, blk.v,
                                                                 stride);
    cp_async_commit();

    const int row0 = q0 + kWarpRows * warp;  // this warp's first query row; tile mt starts at row0 + 16 mt
    const bool active = row0 < valid;        // warp-uniform: a warp entirely in padding skips the math
    const int wend = causal ? min(valid, row0 + kWarpRows) : valid;  // keys this warp's rows see
    uint32_t qa[MT][HS / 16][4];          // Q's A fragments
    cp_async_wait<0>();
    __syncthreads();  // Q and tile 0 are visible to all
    if (active) {
        #pragma unroll
        for (int mt = 0; mt < MT; mt++)
            for (int kk = 0; kk < HS / 16; kk++)
                attn_ldsm_a(qa[mt][kk], Qs + (kWarpRows * warp + 16 * mt) * Tile::kLd + 16 * kk, Tile::kLd);
    }
    float acc[MT][HS / 8][4] = {};        // O, unnormalized: rows g, g+8 of each n8 tile of HS
    float m[MT][2], l[MT][2];             // running row max (log2 units) and this lane's share of the row sum
    #pragma unroll
    for (int mt = 0; mt < MT; mt++)
        for (int r = 0; r < 2; r++) m[mt][r] = -INFINITY, l[mt][r] = 0.f;

    for (int it = 0; it < tiles; it++) {
        const int k0 = it * Tile::kCols;
        const floatX* Ks = KVs + (it % 2) * 2 * Tile::kStreamTile;
        const floatX* Vs = Ks + Tile::kStreamTile;
        cp_async_wait<0>();
        __syncthreads();  // tile it is visible to all, and every warp is done with the other stage (and Q)
        if (it + 1 < tiles) {
            floatX* next = KVs + ((it + 1) % 2) * 2 * Tile::kStreamTile;
            const int k1 = k0 + Tile::kCols, n = min(Tile::kCols, kend - k1);
            attn_async_tiles<floatX, HS, Tile::kCols, Tile::kStreamTile>(next, n, blk.k + k1 * stride, stride,
                                                                         blk.v + k1 * stride, stride);
        }
        cp_async_commit();
        if (!active || k0 >= wend) continue;  // no row of this warp sees these keys (and the later ones)

        // scores of rows g, g+8 (registers 0-1, 2-3) of row tile mt, keys k0 + 8j + 2t + {0, 1}
        float s[MT][8][4] = {};
        attn_mma_abt<floatX, HS, 64, MT>(s, [&](int mt, int kk) -> const uint32_t(&)[4] { return qa[mt][kk]; }, Ks,
                                         Tile::kLd);
        uint32_t pa[MT][4][4];  // P's A fragments (the 4 k16 slices of the tile's 64 keys)
        #pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int r0 = row0 + 16 * mt;  // the row tile's first query
            if (k0 + Tile::kCols > valid || (causal && k0 + Tile::kCols - 1 > r0))
                for (int j = 0; j < 8; j++)
                    for (int e = 0; e < 4; e++) {
                        int qi = r0 + g + 8 * (e / 2), kj = k0 + 8 * j + 2 * t + e % 2;
                        s[mt][j][e] = kj >= valid || (causal && kj > qi) ? -INFINITY : s[mt][j][e];
                    }
            const uint32_t keep = kDropout ? attn_mma_dropout_bits<false, 64>(drop, blk.bh, r0, k0) : ~0u;
            // Online softmax in log2 units (exp2): the scores stay unscaled, the row max m is kept
            // scaled (the scale is positive, so the max of the scaled scores is the scaled max), and
            // each exponent s·scale - m is one fused multiply-add. Raise m, rescale O and l by alpha =
            // exp2(m_old - m_new), P = exp2(s·scale - m); l sums P in fp32, before rounding and
            // dropout (as FlashAttention-2 does: the sum of the rounded weights would differ from it by
            // their rounding errors, about eps/sqrt(keys) relative), and PV takes P rounded to floatX,
            // dropped elements as 0. A row with every score masked so far keeps m = -inf.
            for (int r = 0; r < 2; r++) {
                float mx = -INFINITY;
                for (int j = 0; j < 8; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
                float m_new = fmaxf(m[mt][r], attn_quad_max(mx) * Tile::kScaleLog2);
                float m_ref = m_new == -INFINITY ? 0.f : m_new;  // avoids (-inf) - (-inf)
                float alpha = exp2f(m[mt][r] - m_ref);
                m[mt][r] = m_new;
                l[mt][r] *= alpha;
                for (int n = 0; n < HS / 8; n++) {
                    acc[mt][n][2 * r] *= alpha;
                    acc[mt][n][2 * r + 1] *= alpha;
                }
                // Rounded once, straight into the packed pairs of P's A fragments (n8 tile j = 2kk +
                // half, row g + 8r: pa[mt][kk][2 half + r]).
                for (int j = 0; j < 8; j++) {
                    float lo = exp2f(fmaf(s[mt][j][2 * r], Tile::kScaleLog2, -m_ref));
                    float hi = exp2f(fmaf(s[mt][j][2 * r + 1], Tile::kScaleLog2, -m_ref));
                    l[mt][r] += lo;
                    l[mt][r] += hi;
                    if (kDropout) {  // dropped elements become 0
                        lo = (keep >> (4 * j + 2 * r)) & 1 ? lo : 0.f;
                        hi = (keep >> (4 * j + 2 * r + 1)) & 1 ? hi : 0.f;
                    }
                    pa[mt][j / 2][2 * (j % 2) + r] = attn_pack2f<floatX>(lo, hi);
                }
            }
        }
        attn_mma_xy<floatX, 64, HS, MT>(acc, [&](int mt, int kk) -> const uint32_t(&)[4] { return pa[mt][kk]; }, Vs,
                                        Tile::kLd);
    }
    cp_async_wait<0>();  // the last (empty) group: no copy outlives the block

    // out = acc / l (times 1/(1-p) with dropout); lse = (m + log2 l) * ln 2 (m is in log2 units). The
    // rows go out through stage tiles % 2: since the last iteration's barrier no warp reads it.
    floatX* Os = KVs + (tiles % 2) * 2 * Tile::kStreamTile;
    #pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int r0 = row0 + 16 * mt;
        float inv_l[2];
        for (int r = 0; r < 2; r++) {
            l[mt][r] = attn_quad_sum(l[mt][r]);
            inv_l[r] = l[mt][r] > 0.f ? 1.f / l[mt][r] : 0.f;
            if (kDropout) inv_l[r] *= drop.scale;
        }
        const int local = kWarpRows * warp + 16 * mt;  // the row tile's first row in the block
        attn_mma_store_rows<floatX, HS>(blk.o + local * C, C, Os + local * Tile::kLd, acc[mt], inv_l, r0, valid, T);
        if (t == 0)
            for (int r = 0; r < 2; r++) {
                int qi = r0 + g + 8 * r;
                if (qi < T) blk.lse[qi - q0] = qi < valid ? (m[mt][r] + log2f(l[mt][r])) * 0.69314718055994531f : 0.f;
            }
    }
}

// The lse (in log2 units) and D of the backward's streamed query tiles, NQ rows, staged through two
// shared-memory stages (stage s: lse2 at 2s·NQ, D at (2s+1)·NQ). Thread r < NQ loads row r into
// registers (fetch) and stores it to a stage later (store).
template <int NQ>
struct AttnQueryStats {
    const float* lse;  // (T) of this head
    const float* D;
    float* stages;
    float lse_next = 0.f, D_next = 0.f;
    __device__ void fetch(int q0, int n) {
        const int r = threadIdx.x;
        if (r < NQ) {
            lse_next = r < n ? lse[q0 + r] : 0.f;
            D_next = r < n ? D[q0 + r] : 0.f;
        }
    }
    __device__ void store(int st) {
        const int r = threadIdx.x;
        if (r < NQ) {
            stages[2 * st * NQ + r] = lse_next * 1.4426950408889634f;
            stages[(2 * st + 1) * NQ + r] = D_next;
        }
    }
};

// The dQ slices summed where they are written (kSumDq), instead of by attention_backward_dq_reduce_kernel
// afterwards: each (sequence, head, query tile) has a counter (zeroed before the launch), and the block
// that adds the last contribution to a query tile's rows sums the tile from every slice while the rows
// are fresh in L2. No block waits for another. The slices adding to tile m of a sequence with `valid`
// keys are 0 .. attn_dq_tile_writers - 1: those whose first key tile s holds keys (64 s < valid) and,
// causal, sees the tile (s <= m) — the reduce kernel's rule.
__device__ inline int attn_dq_tile_writers(int splits, int valid, bool causal, int m) {
    const int n = min(splits, CEIL_DIV(valid, 64));
    return causal ? min(n, m + 1) : n;
}

// One 128-bit packet of dQ: dst[0 .. V) = scale · the sum of the first `writers` slices' elements at
// src (slice s at src + s · slice_step), added in slice order. The one place dQ's slices are summed, by
// attention_backward_dq_reduce_kernel or by the last block to write a tile (kSumDq), so both give the
// same bits. kBatch: slices whose loads are issued together before their adds. The reduce kernel,
// thousands of warps deep, takes 1; a block summing a tile alone takes 2, so that its 4 warps wait for
// one round trip to L2 per 2 slices instead of one per slice (4 spills in the wgmma kernel capped for 3
// blocks per SM).
template <class floatX, int HS, int kBatch = 1>
__device__ inline void attn_dq_sum_packet(floatX* dst, const float* src, size_t slice_step, int writers) {
    constexpr int V = Packed128<floatX>::size;
    constexpr float kScale = AttnMmaTile<floatX, HS>::kScale;
    float sum[V] = {};
    for (int s0 = 0; s0 < writers; s0 += kBatch) {
        float4 x[kBatch][V / 4];
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            for (int e = 0; e < V / 4; e++)
                if (s0 + j < writers) x[j][e] = reinterpret_cast<const float4*>(src + (s0 + j) * slice_step)[e];
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            for (int e = 0; e < V / 4 && s0 + j < writers; e++) {
                sum[4 * e] += x[j][e].x;
                sum[4 * e + 1] += x[j][e].y;
                sum[4 * e + 2] += x[j][e].z;
                sum[4 * e + 3] += x[j][e].w;
            }
    }
    Packed128<floatX> out;
    for (int e = 0; e < V; e++) out[e] = from_float<floatX>(sum[e] * kScale);
    store128(dst, out);
}

// Block-wide, once the block's last contribution to query tile m (rows q0 .. q0 + 63) is added to its
// slice: counts the block in (`count`: the tile's counter; `writers`: attn_dq_tile_writers) and, if it
// is the last, writes the tile's dQ rows to dq (B,T,3C at (b, 0, q part of head h)): the slices summed
// in slice order and scaled, as attention_backward_dq_reduce_kernel does, so the same bits; the
// sequence's last valid tile also writes zeros to the rows from `valid` to T. slice0: slice 0 at (b, h,
// 0); slice_step: elements from one slice to the next.
template <class floatX, int HS>
__device__ void attn_dq_sum_tile(floatX* dq, size_t stride, const float* slice0, size_t slice_step, int* count,
                                 int writers, int q0, int valid, int T) {
    __shared__ int last;
    __syncthreads();  // every thread's adds to the tile are issued
    if (threadIdx.x == 0) {
        last = atomic_add_release(count, 1) == writers - 1;  // our adds are visible to whoever is last
        if (last) fence_acquire();                           // theirs to us
    }
    __syncthreads();
    if (!last) return;
    constexpr int V = Packed128<floatX>::size;
    const int end = q0 + 64 >= valid ? T : q0 + 64;
    for (int i = threadIdx.x; i < (end - q0) * (HS / V); i += blockDim.x) {
        const int t = q0 + i / (HS / V), c = i % (HS / V) * V;
        attn_dq_sum_packet<floatX, HS, 2>(dq + (size_t)t * stride + c, slice0 + (size_t)t * HS + c, slice_step,
                                          t < valid ? writers : 0);
    }
}

// Key tile of round `round` for block `split` of S (the backward kernels' snake order, below).
__device__ inline int attn_key_tile(int round, int S, int split) {
    return round * S + (round % 2 ? S - 1 - split : split);
}

// kSumDq's view of one block's (sequence, head): where its dQ rows go (dq: B,T,3C at (b, 0, q part of
// head h), row stride `stride`), its slices (slice0, slice_step), its query tiles' counters, and the
// sequence's valid keys.
template <class floatX, int HS>
struct AttnDqSum {
    floatX* dq;
    size_t stride;
    const float* slice0;
    size_t slice_step;
    int* count;
    int splits, valid, T;
    bool causal;
    // A sequence without valid keys has no tile to count: slice 0's block writes its zeros.
    __device__ void zero_if_no_keys(int split) const {
        if (valid == 0 && split == 0) attn_zero_rows<floatX, HS>(dq, stride, T);
    }
    // The block's next key tile holding keys after round `round`, or -1 (rounds only go up).
    __device__ int next_key_tile(int round, int split, int key_tiles) const {
        const int kt = attn_key_tile(round + 1, splits, split);
        return kt < key_tiles && kt * 64 < valid ? kt : -1;
    }
    // Block-wide, once the block's contribution to query tile q0 (64 rows) in this round is added: if the
    // block adds nothing more to it (next_kt, its next key tile, does not see the tile), counts the block
    // in, and the tile's last writer sums it.
    __device__ void added(int q0, int next_kt) const {
        const int m = q0 / 64;
        if (next_kt < 0 || (causal && next_kt > m))
            attn_dq_sum_tile<floatX, HS>(dq, stride, slice0, slice_step, count + m,
                                         attn_dq_tile_writers(splits, valid, causal, m), q0, valid, T);
    }
};

// Backward, 16-bit types, 5 tile products per (key tile, query tile) (FlashAttention-2's), with dQ made
// deterministic. Grid (splits, NH, B), 128 threads; block x takes the key tiles x, 2·splits-1-x,
// 2·splits+x, ... of head blockIdx.y of sequence blockIdx.z. For a key tile (64 keys, 16 per warp,
// in shared memory) it streams the query tiles that see it (kColsB rows of Q and dO, double-buffered
// through cp.async, with their lse and D) and, per tile, computes in registers
//   S^T = K Q^T,  P^T = exp(S^T * scale - lse),  dV += (P∘M)^T dO,  dP^T = V dO^T,
//   dS^T = P^T ∘ (dP^T ∘ M / (1-p) - D),  dK += dS^T Q
// (M, 1/(1-p): dropout; P^T's and dS^T's C fragments are the A fragments of their products), then
// parks dS^T in shared memory and the 4 warps compute the key tile's contribution dS K to the tile's
// dQ rows, each a (32, HS·kColsB/128) slice ((16, 16) at HS = 16), which the block adds to its own
// fp32 dQ slice in dq_part (splits, B, NH, T, HS): plain loads and stores, no atomics, as only this
// block touches that slice (its first key tile writes, the later ones add, in tile order);
// attention_backward_dq_reduce_kernel then sums the slices in split order. The results depend on
// splits (a function of B, T, NH) and on nothing else: not on timing. (kDqAtomics: dev/cuda/attention.cu's
// variant 4, FlashAttention-2's way, for timing: every block adds its dQ rows to one fp32 buffer by
// float atomics, in an order that depends on timing.)
template <class floatX, int HS, bool kDropout, bool kDqAtomics = false, bool kSumDq = false>
__global__ void __launch_bounds__(128, 2)
    attention_backward_mma_kernel(floatX* dqkv, float* dq_part, int* dq_count, const floatX* dout, const floatX* qkv,
                                  const float* lse, const float* D, int T, int C, int NH, bool causal,
                                  const int* valid_len, DropoutArgs drop) {
    using Tile = AttnMmaTile<floatX, HS>;
    static_assert(!kSumDq || (Tile::kColsB == 64 && !kDqAtomics), "kSumDq counts 64-row query tiles of slices");
    if (kDropout) drop = dropout_resolve(drop);  // a pass offset in device memory (llmc/dropout.cuh)
    constexpr int NQ = Tile::kColsB, kLd = Tile::kLd;
    // The dQ product's split among the warps: kGroups groups of kDqTiles 16-row tiles of queries,
    // each shared by 4 / kGroups warps taking NCW columns of HS. Two row tiles per warp (where HS
    // leaves at least 16 columns per warp) read 16 fragments of dS and K for 32 mma, where one
    // 16-row tile with twice the columns reads 20.
    constexpr int kDqTiles = HS >= 32 ? 2 : 1, kGroups = NQ / (16 * kDqTiles), NCW = HS * kGroups / 4;
    static_assert(NCW % 16 == 0 && kGroups * (HS / NCW) == Tile::kWarps, "the warps cover dQ's tile");
    const int b = blockIdx.z, h = blockIdx.y, split = blockIdx.x, bh = b * NH + h;
    const int valid = attn_valid_length(valid_len, b, T);
    const size_t stride = 3 * (size_t)C;
    const floatX* qb = qkv + (size_t)b * T * stride + h * HS;  // (B,T,3C) at (b, 0, q part)
    const floatX* dob = dout + (size_t)b * T * C + h * HS;      // (B,T,C) at (b, 0)
    floatX* dkb = dqkv + (size_t)b * T * stride + C + h * HS;   // (B,T,3C) at (b, 0, k part)
    const float* lse_bh = lse + (size_t)bh * T;                 // (B,NH,T) at (b, h, 0)
    const float* D_bh = D + (size_t)bh * T;
    float* dq_bh = dq_part + ((size_t)(kDqAtomics ? 0 : split) * gridDim.z * NH + bh) * T * HS;  // (S,B,NH,T,HS)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    unsigned char* smem = attn_smem_base();
    floatX* Ks = reinterpret_cast<floatX*>(smem);  // (64, HS) each
    floatX* Vs = Ks + Tile::kOwnTile;
    floatX* QdO = Vs + Tile::kOwnTile;             // stage s: Q at 2s, dO at 2s+1, (NQ, HS) each
    floatX* dSt = QdO + 4 * Tile::kStreamTileB;    // (64 keys, NQ queries), row stride kLdS
    float* stats = reinterpret_cast<float*>(smem + Tile::kBackwardStats);  // stage s: lse2 at 2s, D at 2s+1, (NQ)
    // Query tile q0's (n valid rows) loads into stage st. Q and dO go by cp.async (load_queries); lse
    // (in log2 units) and D, whose rows are 4 bytes and not 16-byte aligned, by plain loads into
    // registers, thread r < NQ taking row r (fetch_stats), and stores to the stage (store_stats). The
    // main loop fetches the next tile's as a pair begins and stores them as it ends, so that no warp
    // waits for the loads.
    static_assert(NQ <= Tile::kThreads, "a row of lse and D per thread");
    auto load_queries = [&](int st, int q0, int n) {
        floatX* dst = QdO + 2 * st * Tile::kStreamTileB;
        attn_async_tiles<floatX, HS, NQ, Tile::kStreamTileB>(dst, n, qb + q0 * stride, stride, dob + (size_t)q0 * C, C);
    };
    AttnQueryStats<NQ> qstats{lse_bh, D_bh, stats};
    auto fetch_stats = [&](int q0, int n) { qstats.fetch(q0, n); };
    auto store_stats = [&](int st) { qstats.store(st); };

    // The block's key tiles: one per round of S = gridDim.x tiles, in a snake order (round r takes
    // tile rS + split when r is even, rS + S-1-split when odd), so that under a causal mask, where key
    // tile k is seen by the query tiles from k on, the blocks' shares of the work are nearly equal
    // (T = 1024, S = 6: 25 to 21 query tiles per block, where tiles split, split + S, ... gave 30 to
    // 16). The first is tile `split` in either order, and the later ones come in increasing order.
    const int key_tiles = CEIL_DIV(T, Tile::kRows), S = gridDim.x;
    const AttnDqSum<floatX, HS> dq_sum{dkb - C, stride, dq_part + (size_t)bh * T * HS, (size_t)gridDim.z * NH * T * HS,
                                       dq_count + (size_t)bh * key_tiles, S, valid, T, causal};
    if constexpr (kSumDq) dq_sum.zero_if_no_keys(split);
    for (int round = 0; round * S < key_tiles; round++) {
        const int kt = attn_key_tile(round, S, split);
        if (kt >= key_tiles) continue;
        const int next_kt = kSumDq ? dq_sum.next_key_tile(round, split, key_tiles) : -1;
        const int k0 = kt * Tile::kRows, rows = min(Tile::kRows, T - k0);
        const bool adds = !kDqAtomics && kt != split;  // past the block's first key tile: dQ adds to the slice
        if (k0 >= valid) {  // every key row is padding: zero gradients, no compute
            attn_zero_rows<floatX, HS>(dkb + k0 * stride, stride, rows);
            attn_zero_rows<floatX, HS>(dkb + C + k0 * stride, stride, rows);
            continue;
        }
        __syncthreads();  // every warp is done with the previous key tile's K, V and dS^T
        attn_async_tiles<floatX, HS, Tile::kRows, Tile::kOwnTile>(Ks, min(Tile::kRows, valid - k0), qb + C + k0 * stride,
                                                                  stride, qb + 2 * C + k0 * stride, stride);
        const int qstart = causal ? k0 : 0;  // causal: queries before k0 see no key of the tile
        const int tiles = CEIL_DIV(valid - qstart, NQ);
        load_queries(0, qstart, min(NQ, valid - qstart));
        cp_async_commit();
        fetch_stats(qstart, min(NQ, valid - qstart));
        store_stats(0);
        const int key0 = k0 + 16 * warp;   // this warp's first key
        const bool active = key0 < valid;  // warp-uniform
        const floatX* Kw = Ks + 16 * warp * kLd;
        const floatX* Vw = Vs + 16 * warp * kLd;
        // Without dropout at HS <= 64 the registers hold the warp's K and V fragments for the whole key
        // tile (2 × HS/4 registers), read once instead of once per query tile.
        constexpr bool kKVInRegisters = !kDropout && HS <= 64;
        constexpr int kKVFrags = kKVInRegisters ? HS / 16 : 1;
        uint32_t ka[kKVFrags][4], va[kKVFrags][4];
        // rows: keys key0 + g, key0 + g + 8 (one 16-row tile each: the products' MT = 1)
        float dk1[1][HS / 8][4] = {}, dv1[1][HS / 8][4] = {};
        float(&dk)[HS / 8][4] = dk1[0];
        float(&dv)[HS / 8][4] = dv1[0];

        for (int it = 0; it < tiles; it++) {
            const int q0 = qstart + it * NQ, st = it % 2;
            const floatX* Qs = QdO + 2 * st * Tile::kStreamTileB;
            const floatX* dOs = Qs + Tile::kStreamTileB;
            const float* lse2_s = stats + 2 * st * NQ;
            const float* D_s = lse2_s + NQ;
            cp_async_wait<0>();
            __syncthreads();  // tile it is visible to all, every warp is done with the other stage
            if (it + 1 < tiles) {  // the next tile's loads (its lse and D stored when this pair ends)
                load_queries(st ^ 1, q0 + NQ, min(NQ, valid - q0 - NQ));
                fetch_stats(q0 + NQ, min(NQ, valid - q0 - NQ));
            }
            cp_async_commit();
            // Past the block's first key tile, this iteration ends by adding to the tile's dQ rows in
            // the block's slice (NQ·HS contiguous floats): start bringing them into L2 now, one 128-byte
            // line per thread, so that the adds find them there instead of waiting for DRAM.
            static_assert(NQ * HS / 32 <= Tile::kThreads, "a line per thread at most");
            if (adds && (int)threadIdx.x < NQ * HS / 32 && q0 + (int)threadIdx.x * 32 / HS < valid)
                prefetch_l2(dq_bh + (size_t)q0 * HS + 32 * threadIdx.x);
            uint32_t abuf[4];  // an A fragment fetched from shared memory
            if (active) {
                const uint32_t keep = kDropout ? attn_mma_dropout_bits<true, NQ>(drop, bh, key0, q0) : ~0u;
                // P^T (undropped, fp32): keys key0 + g + 8 (e / 2), queries q0 + 8j + 2t + e % 2.
                float p1[1][NQ / 8][4] = {};
                float(&p)[NQ / 8][4] = p1[0];
                if (kKVInRegisters && it == 0)
                    for (int kk = 0; kk < kKVFrags; kk++) {
                        attn_ldsm_a(ka[kk], Kw + 16 * kk, kLd);
                        attn_ldsm_a(va[kk], Vw + 16 * kk, kLd);
                    }
                attn_mma_abt<floatX, HS, NQ>(p1, [&](int, int kk) -> const uint32_t(&)[4] {
                    if constexpr (kKVInRegisters) return ka[kk];
                    attn_ldsm_a(abuf, Kw + 16 * kk, kLd);
                    return abuf;
                }, Qs, kLd);
                // exp2 of every element, then (tiles that need it) a select of 0 for the masked ones:
                // a select per element, not a branch around each exp2 (which would cost the loop a
                // convergence barrier per element).
                for (int j = 0; j < NQ / 8; j++) {
                    const float2 lse2 = *reinterpret_cast<const float2*>(lse2_s + 8 * j + 2 * t);  // queries 2t, 2t+1
                    for (int e = 0; e < 4; e++)
                        p[j][e] = exp2f(p[j][e] * Tile::kScaleLog2 - (e % 2 ? lse2.y : lse2.x));
                }
                if (q0 + NQ > valid || key0 + 16 > valid || (causal && key0 + 15 > q0))
                    for (int j = 0; j < NQ / 8; j++)
                        for (int e = 0; e < 4; e++) {
                            const int kj = key0 + g + 8 * (e / 2), qi = q0 + 8 * j + 2 * t + e % 2;
                            p[j][e] = qi >= valid || kj >= valid || (causal && kj > qi) ? 0.f : p[j][e];
                        }
                float pm[NQ / 8][4];  // P^T ∘ M (attn_c_to_a rounds it to floatX)
                for (int j = 0; j < NQ / 8; j++)
                    for (int e = 0; e < 4; e++) pm[j][e] = (keep >> (4 * j + e)) & 1 ? p[j][e] : 0.f;
                uint32_t xa[NQ / 16][4];
                attn_c_to_a<floatX, NQ>(xa, pm);
                attn_mma_xy<floatX, NQ, HS>(dv1, [&](int, int kk) -> const uint32_t(&)[4] { return xa[kk]; }, dOs,
                                            kLd);
                float ds1[1][NQ / 8][4] = {};
                float(&ds)[NQ / 8][4] = ds1[0];  // dP^T, then dS^T (attn_c_to_a rounds it to floatX)
                attn_mma_abt<floatX, HS, NQ>(ds1, [&](int, int kk) -> const uint32_t(&)[4] {
                    if constexpr (kKVInRegisters) return va[kk];
                    attn_ldsm_a(abuf, Vw + 16 * kk, kLd);
                    return abuf;
                }, dOs, kLd);
                for (int j = 0; j < NQ / 8; j++) {
                    const float2 Dq = *reinterpret_cast<const float2*>(D_s + 8 * j + 2 * t);  // queries 2t, 2t+1
                    for (int e = 0; e < 4; e++) {
                        float dp = ds[j][e];
                        if (kDropout) dp *= (keep >> (4 * j + e)) & 1 ? drop.scale : 0.f;  // dP^T ∘ M / (1-p)
                        ds[j][e] = p[j][e] * (dp - (e % 2 ? Dq.y : Dq.x));
                    }
                }
                attn_c_to_a<floatX, NQ>(xa, ds);
                attn_mma_xy<floatX, NQ, HS>(dk1, [&](int, int kk) -> const uint32_t(&)[4] { return xa[kk]; }, Qs,
                                            kLd);
                for (int j = 0; j < NQ / 8; j++)
                    for (int r = 0; r < 2; r++)
                        *reinterpret_cast<uint32_t*>(dSt + (16 * warp + g + 8 * r) * Tile::kLdS + 8 * j + 2 * t) =
                            xa[j / 2][2 * (j % 2) + r];
            } else {  // keys in padding: dS^T = 0
                for (int j = 0; j < NQ / 8; j++)
                    for (int r = 0; r < 2; r++)
                        *reinterpret_cast<uint32_t*>(dSt + (16 * warp + g + 8 * r) * Tile::kLdS + 8 * j + 2 * t) = 0u;
            }
            __syncthreads();  // dS^T of all 64 keys is complete

            // This key tile's dQ rows: dS (the kDqTiles 16-query tiles of group qg, 64 keys) K (64
            // keys, NCW columns from cpart·NCW). dS's A fragments come from dS^T with the transposing
            // ldmatrix (lane l: key 16 kk + l % 8 + 8 (l / 16), query 16 qt + 8 ((l / 8) % 2) of query
            // tile qt).
            const int qg = warp % kGroups, cpart = warp / kGroups;
            float dq[kDqTiles][NCW / 8][4] = {};
            attn_mma_xy<floatX, 64, NCW, kDqTiles>(dq, [&](int mt, int kk) -> const uint32_t(&)[4] {
                const int qt = kDqTiles * qg + mt;
                ldmatrix_x4_trans(abuf, dSt + (16 * kk + lane % 8 + 8 * (lane / 16)) * Tile::kLdS + 16 * qt +
                                            8 * ((lane / 8) % 2));
                return abuf;
            }, Ks + cpart * NCW, kLd);
            #pragma unroll
            for (int mt = 0; mt < kDqTiles; mt++)
                for (int r = 0; r < 2; r++) {
                    const int qi = q0 + 16 * (kDqTiles * qg + mt) + g + 8 * r;
                    if (qi >= valid) continue;
                    float* row = dq_bh + (size_t)qi * HS + cpart * NCW + 2 * t;
                    for (int n = 0; n < NCW / 8; n++) {
                        float2 x = make_float2(dq[mt][n][2 * r], dq[mt][n][2 * r + 1]);
                        if constexpr (kDqAtomics) {
                            atomicAdd(row + 8 * n, x.x);
                            atomicAdd(row + 8 * n + 1, x.y);
                        } else {
                            if (adds) {  // add to the block's partial sum
                                float2 old = *reinterpret_cast<const float2*>(row + 8 * n);
                                x.x += old.x;
                                x.y += old.y;
                            }
                            *reinterpret_cast<float2*>(row + 8 * n) = x;
                        }
                    }
                }
            if constexpr (kSumDq) dq_sum.added(q0, next_kt);
            // Stage st ^ 1's lse and D: the other warps read it after the next iteration's barrier, and
            // read its previous tile's before this iteration's.
            if (it + 1 < tiles) store_stats(st ^ 1);
        }
        cp_async_wait<0>();  // the last (empty) group
        __syncthreads();     // every warp is done reading K (dQ) before the warps stage dK in it
        // dV = sum (P∘M)^T dO (times 1/(1-p) with dropout); dK = scale * sum dS^T Q (dS is the gradient
        // of the scaled scores).
        const float dv_factor[2] = {kDropout ? drop.scale : 1.f, kDropout ? drop.scale : 1.f};
        const float dk_factor[2] = {Tile::kScale, Tile::kScale};
        attn_mma_store_rows<floatX, HS>(dkb + C + (size_t)key0 * stride, stride, Vs + 16 * warp * kLd, dv, dv_factor,
                                        key0, valid, T);
        attn_mma_store_rows<floatX, HS>(dkb + (size_t)key0 * stride, stride, Ks + 16 * warp * kLd, dk, dk_factor,
                                        key0, valid, T);
    }
}

// Backward, 16-bit types at HS = 64, on Hopper's warpgroup MMA (llmc/wgmma.cuh, sm_90a): the work,
// grid, key-tile order and dQ slices of attention_backward_mma_kernel (without dropout), the block of
// 128 threads being one warpgroup that computes each of the 5 products of a tile pair as a chain of 4
// wgmma over k16 steps, every warp holding 16 rows of the 64 (warp w: keys, or queries for dQ,
// 16w + g and 16w + g + 8, as mma.sync's C fragments). All tiles are (64, 64) in shared memory with
// the 128-byte swizzle (a row of 64 16-bit values is 128 bytes; row r's 16-byte chunk c is stored at
// chunk c ^ (r % 8): attn_sw128), which serves a tile both K-major and MN-major: Q is Sᵀ's B (K-major)
// and dK's B (MN-major), dO likewise for dPᵀ and dV, K is Sᵀ's A and dQ's B, V dPᵀ's A, and dSᵀ dQ's A
// (MN-major). Pᵀ and dSᵀ go from the accumulators into the A registers of dV's and dK's products
// (wgmma_rs; C's n8 tiles 2kk and 2kk + 1 are A's k16 slice kk, as attn_c_to_a). Per query tile: Sᵀ
// and dPᵀ are issued as two commit groups and the exponentials computed while dPᵀ runs; dSᵀ is stored
// for dQ while dV's and dK's products run. kDeferDq (dev/cuda/attention.cu's variant 7, not production's:
// on an H200 no faster): a query tile's dQ product is issued behind the next tile's Sᵀ and dPᵀ, and its
// rows added to the dQ slice while that tile's dV and dK products run, so that the tensor cores have
// work while the rows make their round trip to L2 (dSᵀ then takes two tiles: the next query tile's is
// stored while the dQ product still reads this one's). kMinBlocks: the resident blocks per SM its
// registers are capped for (attention_backward_wgmma_blocks). kRedDq: a query tile's dQ rows are added
// to the slice by reductions in L2 (red_add_f32x2) instead of a load, add and store that waits for
// the load (attention_backward_wgmma_red_dq); the slice has one writer, so the same sums in the same
// order: the same bits. kSumDq: once a block has added its last contribution to a query tile, it counts
// itself in, and the tile's last writer sums the slices into dQ (attn_dq_sum_tile, below), so that no
// reduce kernel runs after this one (attention_backward_sum_dq).
template <bool kDeferDq>
struct AttnWgmmaTile {
    static constexpr int kRows = 64, kCols = 64;      // keys of the block's tile; queries per streamed tile
    static constexpr uint32_t kTileBytes = 64 * 128;  // a (64, 64) 16-bit tile
    // Byte offsets from the block's 1024-aligned base (the 128-byte swizzle repeats every 1024 bytes):
    // K, V, 2 stages of (Q, dO), dSᵀ (keys, queries; 2 with kDeferDq), then 2 stages of (lse2, D) of
    // the streamed queries.
    static constexpr uint32_t kK = 0, kV = kTileBytes, kQdO = 2 * kTileBytes, kDSt = 6 * kTileBytes,
                              kStats = (kDeferDq ? 8 : 7) * kTileBytes;
    static constexpr size_t kSmem = 1024 + kStats + 4 * kCols * sizeof(float);  // + slack to align the base
};

// Byte offset of element (row, col) in a (rows, 64) 16-bit tile with the 128-byte swizzle.
__device__ inline uint32_t attn_sw128(int row, int col) {
    return row * 128 + ((((col >> 3) ^ (row & 7)) << 4) | ((col & 7) * 2));
}

// Starts cp.async copies of rows [0, n) of a (64, 64) tile (global row stride `stride` elements) into a
// swizzled shared tile, zero-filling rows [n, 64) (see attn_async_tiles). Thread i copies chunk i % 8
// of rows i / 8 + 16j. The caller commits.
template <class floatX>
__device__ void attn_sw128_async_tile(char* dst, int n, const floatX* src, size_t stride) {
    const int c = threadIdx.x % 8;
#pragma unroll 1
    for (int r = threadIdx.x / 8; r < 64; r += 16) {
        const bool in = r < n;
        cp_async_16_zfill(dst + attn_sw128(r, 8 * c), in ? src + (size_t)r * stride + 8 * c : src, in ? 16 : 0);
    }
}

// Descriptors of k16 slice kk of a swizzled (64, 64) tile: K-major (the slice is columns 16kk ..,
// 32 bytes into the first row; sbo steps 8 rows) or MN-major (the slice is rows 16kk ..; the 64
// columns are one swizzle atom, so lbo, the step to the next, is not used).
__device__ inline uint64_t attn_desc_k(const char* tile, int kk) {
    return wgmma_descriptor(tile + 32 * kk, WgmmaSwizzle::B128, 16, 1024);
}
__device__ inline uint64_t attn_desc_mn(const char* tile, int kk) {
    return wgmma_descriptor(tile + 2048 * kk, WgmmaSwizzle::B128, 64 * 128, 1024);
}

template <class floatX, bool kDeferDq, int kMinBlocks = 2, bool kRedDq = false, bool kSumDq = false>
__global__ void __launch_bounds__(128, kMinBlocks)
    attention_backward_wgmma_kernel(floatX* dqkv, float* dq_part, int* dq_count, const floatX* dout,
                                    const floatX* qkv, const float* lse, const float* D, int T, int C, int NH,
                                    bool causal, const int* valid_len) {
    static_assert(!(kSumDq && kDeferDq), "kSumDq counts a tile in right after its dQ is added, which kDeferDq delays");
    using Tile = AttnWgmmaTile<kDeferDq>;
    constexpr int HS = 64, NQ = Tile::kCols;
    constexpr uint32_t kTile = Tile::kTileBytes;
    constexpr float kScale = AttnTile<floatX, HS>::kScale, kScaleLog2 = AttnTile<floatX, HS>::kScaleLog2;
    const int b = blockIdx.z, h = blockIdx.y, split = blockIdx.x, bh = b * NH + h;
    const int valid = attn_valid_length(valid_len, b, T);
    const size_t stride = 3 * (size_t)C;
    const floatX* qb = qkv + (size_t)b * T * stride + h * HS;  // (B,T,3C) at (b, 0, q part)
    const floatX* dob = dout + (size_t)b * T * C + h * HS;      // (B,T,C) at (b, 0)
    floatX* dkb = dqkv + (size_t)b * T * stride + C + h * HS;   // (B,T,3C) at (b, 0, k part)
    const float* lse_bh = lse + (size_t)bh * T;                 // (B,NH,T) at (b, h, 0)
    const float* D_bh = D + (size_t)bh * T;
    float* dq_bh = dq_part + ((size_t)split * gridDim.z * NH + bh) * T * HS;  // (S,B,NH,T,HS)

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    char* raw = dynamic_shared<char>();
    char* smem = raw + (1024 - shared_address(raw) % 1024) % 1024;
    char* Ks = smem + Tile::kK;
    char* Vs = smem + Tile::kV;
    char* QdO = smem + Tile::kQdO;  // stage s: Q at 2s, dO at 2s + 1
    char* dSt0 = smem + Tile::kDSt;  // dSᵀ of the even query tiles, with kDeferDq the odd ones' next to it
    float* stats = reinterpret_cast<float*>(smem + Tile::kStats);  // stage s: lse2 at 2s, D at 2s+1
    // The query tiles' loads, as attention_backward_mma_kernel's.
    auto load_queries = [&](int st, int q0, int n) {
        attn_sw128_async_tile(QdO + 2 * st * kTile, n, qb + q0 * stride, stride);
        attn_sw128_async_tile(QdO + (2 * st + 1) * kTile, n, dob + (size_t)q0 * C, (size_t)C);
    };
    AttnQueryStats<NQ> qstats{lse_bh, D_bh, stats};
    auto fetch_stats = [&](int q0, int n) { qstats.fetch(q0, n); };
    auto store_stats = [&](int st) { qstats.store(st); };
    // Adds dQ (queries, HS) of query tile q0 to the block's dQ slice (as attention_backward_mma_kernel):
    // element i of this lane is query q0 + 16 warp + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2t + i % 2.
    auto add_dq = [&](const float(&dq)[HS / 2], int q0, bool adds) {
        for (int r = 0; r < 2; r++) {
            const int qi = q0 + 16 * warp + g + 8 * r;
            if (qi >= valid) continue;
            float* row = dq_bh + (size_t)qi * HS + 2 * t;
            for (int n = 0; n < HS / 8; n++) {
                float2 x = make_float2(dq[4 * n + 2 * r], dq[4 * n + 2 * r + 1]);
                if (adds && kRedDq) {
                    red_add_f32x2(row + 8 * n, x.x, x.y);
                } else {
                    if (adds) {
                        const float2 old = *reinterpret_cast<const float2*>(row + 8 * n);
                        x.x += old.x;
                        x.y += old.y;
                    }
                    *reinterpret_cast<float2*>(row + 8 * n) = x;
                }
            }
        }
    };

    const int key_tiles = CEIL_DIV(T, Tile::kRows), S = gridDim.x;
    const AttnDqSum<floatX, HS> dq_sum{dkb - C, stride, dq_part + (size_t)bh * T * HS, (size_t)gridDim.z * NH * T * HS,
                                       dq_count + (size_t)bh * key_tiles, S, valid, T, causal};
    if constexpr (kSumDq) dq_sum.zero_if_no_keys(split);
    for (int round = 0; round * S < key_tiles; round++) {  // the snake order of attention_backward_mma_kernel
        const int kt = attn_key_tile(round, S, split);
        if (kt >= key_tiles) continue;
        const int next_kt = kSumDq ? dq_sum.next_key_tile(round, split, key_tiles) : -1;
        const int k0 = kt * Tile::kRows, rows = min(Tile::kRows, T - k0);
        const bool adds = kt != split;  // past the block's first key tile: dQ adds to the slice
        if (k0 >= valid) {
            attn_zero_rows<floatX, HS>(dkb + k0 * stride, stride, rows);
            attn_zero_rows<floatX, HS>(dkb + C + k0 * stride, stride, rows);
            continue;
        }
        __syncthreads();  // every warp is done with the previous key tile's tiles and staging
        const int keys = min(Tile::kRows, valid - k0);
        attn_sw128_async_tile(Ks, keys, qb + C + k0 * stride, stride);
        attn_sw128_async_tile(Vs, keys, qb + 2 * C + k0 * stride, stride);
        const int qstart = causal ? k0 : 0;
        const int tiles = CEIL_DIV(valid - qstart, NQ);
        load_queries(0, qstart, min(NQ, valid - qstart));
        cp_async_commit();
        fetch_stats(qstart, min(NQ, valid - qstart));
        store_stats(0);
        const int key_g = k0 + 16 * warp + g;  // this lane's keys: key_g and key_g + 8
        float dk[HS / 2] = {}, dv[HS / 2] = {};  // accumulator layout: keys as rows, HS as columns
        float dq[HS / 2];                         // a query tile's dQ (queries as rows): see add_dq

        // dQ (queries, HS) = dS K for the query tile whose dSᵀ is in dSt: dS is dSᵀ read MN-major, K
        // MN-major (keys are the reduction).
        auto issue_dq = [&](const char* dSt) {
            wgmma_fence_operand(dq);
            wgmma_fence();
            for (int kk = 0; kk < Tile::kRows / 16; kk++)
                wgmma_ss<HS, floatX, true, true>(dq, attn_desc_mn(dSt, kk), attn_desc_mn(Ks, kk), kk > 0);
            wgmma_commit();
        };
        for (int it = 0; it < tiles; it++) {
            const int q0 = qstart + it * NQ, st = it % 2;
            const char* Qs = QdO + 2 * st * kTile;
            const char* dOs = Qs + kTile;
            char* dSt = dSt0 + (kDeferDq ? st * kTile : 0);
            const float* lse2_s = stats + 2 * st * NQ;
            const float* D_s = lse2_s + NQ;
            cp_async_wait<0>();
            fence_proxy_async_shared();  // this thread's copies are visible to wgmma (the async proxy)
            __syncthreads();             // everyone's are; every warp is done with the other stage (deferred:
                                         // and has stored its rows of the last tile's dSᵀ)
            if (it + 1 < tiles) {
                load_queries(st ^ 1, q0 + NQ, min(NQ, valid - q0 - NQ));
                fetch_stats(q0 + NQ, min(NQ, valid - q0 - NQ));
            }
            cp_async_commit();
            if (adds && (int)threadIdx.x < NQ * HS / 32 && q0 + (int)threadIdx.x * 32 / HS < valid)
                prefetch_l2(dq_bh + (size_t)q0 * HS + 32 * threadIdx.x);

            // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (keys, queries): element i of this lane is key key_g + 8 ((i / 2) % 2),
            // query q0 + 8 (i / 4) + 2t + i % 2. Deferred, the last tile's dQ product runs behind them (the
            // first tile commits an empty group in its place, so that every wait below counts alike).
            float s[NQ / 2], dp[NQ / 2];
            wgmma_fence_operand(s);
            wgmma_fence_operand(dp);
            wgmma_fence();
            for (int kk = 0; kk < HS / 16; kk++) wgmma_ss<NQ, floatX>(s, attn_desc_k(Ks, kk), attn_desc_k(Qs, kk), kk > 0);
            wgmma_commit();
            for (int kk = 0; kk < HS / 16; kk++) wgmma_ss<NQ, floatX>(dp, attn_desc_k(Vs, kk), attn_desc_k(dOs, kk), kk > 0);
            wgmma_commit();
            if constexpr (kDeferDq) {
                if (it > 0)
                    issue_dq(dSt0 + (st ^ 1) * kTile);
                else
                    wgmma_commit();
            }
            wgmma_wait<kDeferDq ? 2 : 1>();
            wgmma_fence_operand(s);
            for (int i = 0; i < NQ / 2; i += 2) {  // Pᵀ = exp2(Sᵀ · scale · log2 e - lse2)
                const float2 lse2 = *reinterpret_cast<const float2*>(lse2_s + 8 * (i / 4) + 2 * t);
                s[i] = exp2f(s[i] * kScaleLog2 - lse2.x);
                s[i + 1] = exp2f(s[i + 1] * kScaleLog2 - lse2.y);
            }
            if (q0 + NQ > valid || k0 + Tile::kRows > valid || (causal && k0 + Tile::kRows - 1 > q0)) {
                // Element i is key key_g + kd and query q0 + 2t + qd (kd, qd constants once unrolled), so
                // each test compares one of three per-tile values with a constant.
                const int to_query_end = valid - q0 - 2 * t, to_key_end = valid - key_g;
                const int past_diagonal = causal ? key_g - q0 - 2 * t : INT_MIN / 2;
                for (int i = 0; i < NQ / 2; i++) {
                    const int kd = 8 * ((i / 2) % 2), qd = 8 * (i / 4) + i % 2;
                    s[i] = qd >= to_query_end || kd >= to_key_end || past_diagonal + kd > qd ? 0.f : s[i];
                }
            }
            wgmma_wait<kDeferDq ? 1 : 0>();
            wgmma_fence_operand(dp);
            for (int i = 0; i < NQ / 2; i += 2) {  // dSᵀ = Pᵀ ∘ (dPᵀ - D)
                const float2 Dq = *reinterpret_cast<const float2*>(D_s + 8 * (i / 4) + 2 * t);
                dp[i] = s[i] * (dp[i] - Dq.x);
                dp[i + 1] = s[i + 1] * (dp[i + 1] - Dq.y);
            }
            // Pᵀ and dSᵀ rounded to floatX as A registers: slice kk's a[j] = C elements 8kk + 2j, + 1.
            uint32_t pa[NQ / 16][4], dsa[NQ / 16][4];
            for (int kk = 0; kk < NQ / 16; kk++)
                for (int j = 0; j < 4; j++) {
                    pa[kk][j] = attn_pack2f<floatX>(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
                    dsa[kk][j] = attn_pack2f<floatX>(dp[8 * kk + 2 * j], dp[8 * kk + 2 * j + 1]);
                }
            // dSᵀ to shared memory for dQ (a[j]: key row + 8 (j % 2), queries 16kk + 8 (j / 2) + 2t, + 1).
            for (int kk = 0; kk < NQ / 16; kk++)
                for (int j = 0; j < 4; j++)
                    *reinterpret_cast<uint32_t*>(dSt + attn_sw128(16 * warp + g + 8 * (j % 2), 16 * kk + 8 * (j / 2) + 2 * t)) =
                        dsa[kk][j];
            fence_proxy_async_shared();
            // dV += Pᵀ dO, dK += dSᵀ Q (keys, HS): the queries are the reduction, dO and Q MN-major B.
            wgmma_fence_operand(dv);
            wgmma_fence_operand(dk);
            wgmma_fence();
            for (int kk = 0; kk < NQ / 16; kk++) wgmma_rs<HS, floatX, true>(dv, pa[kk], attn_desc_mn(dOs, kk), true);
            for (int kk = 0; kk < NQ / 16; kk++) wgmma_rs<HS, floatX, true>(dk, dsa[kk], attn_desc_mn(Qs, kk), true);
            wgmma_commit();
            if constexpr (kDeferDq) {  // the last tile's dQ to the slice while dV's and dK's products run
                wgmma_wait<1>();
                wgmma_fence_operand(dq);
                if (it > 0) add_dq(dq, q0 - NQ, adds);
            } else {
                __syncthreads();  // dSᵀ of all 64 keys is stored
                issue_dq(dSt);
            }
            wgmma_wait<0>();
            wgmma_fence_operand(dv);
            wgmma_fence_operand(dk);
            if constexpr (!kDeferDq) {
                wgmma_fence_operand(dq);
                add_dq(dq, q0, adds);
            }
            if constexpr (kSumDq) dq_sum.added(q0, next_kt);
            if (it + 1 < tiles) store_stats(st ^ 1);
        }
        if constexpr (kDeferDq) {  // the last tile's dQ
            __syncthreads();  // its dSᵀ is stored
            issue_dq(dSt0 + ((tiles - 1) % 2) * kTile);
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            add_dq(dq, qstart + (tiles - 1) * NQ, adds);
        }
        cp_async_wait<0>();  // the last (empty) group
        __syncthreads();     // every warp is done with the query stages, which now stage dV and dK
        // dV = Σ Pᵀ dO; dK = scale · Σ dSᵀ Q. The accumulators are mma.sync's C fragments of 8 n8 tiles.
        const int key0 = k0 + 16 * warp;
        const float ones[2] = {1.f, 1.f}, scales[2] = {kScale, kScale};
        floatX* stage = reinterpret_cast<floatX*>(QdO);
        constexpr int kLd = AttnMmaTile<floatX, HS>::kLd;
        attn_mma_store_rows<floatX, HS>(dkb + C + (size_t)key0 * stride, stride, stage + 16 * warp * kLd,
                                        reinterpret_cast<const float(&)[HS / 8][4]>(dv), ones, key0, valid, T);
        attn_mma_store_rows<floatX, HS>(dkb + (size_t)key0 * stride, stride, stage + (64 + 16 * warp) * kLd,
                                        reinterpret_cast<const float(&)[HS / 8][4]>(dk), scales, key0, valid, T);
    }
}

// Forward, 16-bit types at HS = 64 without dropout, on Hopper's warpgroup MMA (llmc/wgmma.cuh,
// sm_90a): the grid, query rows and results of attention_forward_mma_kernel with one 16-row tile per
// warp, the block of 128 threads being one warpgroup. Q (64, 64) and two stages of (K, V) tiles sit in
// shared memory with the 128-byte swizzle (attn_sw128). S = Q Kᵀ is a chain of 4 wgmma_ss (Q and K both
// K-major), whose accumulators have mma.sync's C layout (this lane: rows 16 warp + g, + 8; a row's 64
// scores spread over the 4 lanes of a quad), so the online softmax is attention_forward_mma_kernel's;
// O += P V is 4 wgmma_rs with P's rounded values as A registers and V read MN-major. A tile's P V runs
// while the warps start the next tile's copies and wait at the barrier before its S.
struct AttnWgmmaFwdTile {
    static constexpr int kRows = 64, kCols = 64;      // queries of the block; keys per streamed tile
    static constexpr uint32_t kTileBytes = 64 * 128;  // a (64, 64) 16-bit tile
    // Byte offsets from the block's 1024-aligned base: Q, then 2 stages of (K, V).
    static constexpr uint32_t kQ = 0, kKV = kTileBytes;
    static constexpr size_t kSmem = 1024 + 5 * kTileBytes;  // + slack to align the base
};

template <class floatX>
__global__ void __launch_bounds__(128, 4)
    attention_forward_wgmma_kernel(floatX* out, float* lse, const floatX* qkv, int T, int C, int NH, bool causal,
                                   const int* valid_len) {
    using Tile = AttnWgmmaFwdTile;
    constexpr int HS = 64, NK = Tile::kCols;
    constexpr uint32_t kTile = Tile::kTileBytes;
    constexpr float kScaleLog2 = AttnTile<floatX, HS>::kScaleLog2;
    const AttnForwardBlock<floatX> blk =
        attn_forward_block<floatX, HS, Tile::kRows>(out, lse, qkv, T, C, NH, valid_len);
    if (attn_forward_padding_block<floatX, HS>(blk, C)) return;
    const int q0 = blk.q0, valid = blk.valid;
    const size_t stride = blk.stride;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    char* raw = dynamic_shared<char>();
    char* smem = raw + (1024 - shared_address(raw) % 1024) % 1024;
    const char* Qs = smem + Tile::kQ;
    char* KVs = smem + Tile::kKV;  // stage s: K at 2s, V at 2s + 1
    const int kend = causal ? min(valid, q0 + Tile::kRows) : valid;  // keys any row of the block sees
    const int tiles = CEIL_DIV(kend, NK);
    auto load_kv = [&](int st, int k0) {  // rows past kend zero-filled (finite: they meet zero weights)
        const int n = min(NK, kend - k0);
        attn_sw128_async_tile(KVs + 2 * st * kTile, n, blk.k + k0 * stride, stride);
        attn_sw128_async_tile(KVs + (2 * st + 1) * kTile, n, blk.v + k0 * stride, stride);
    };
    attn_sw128_async_tile(smem + Tile::kQ, min(blk.rows, valid - q0), blk.q, stride);
    load_kv(0, 0);
    cp_async_commit();

    // This lane's rows: row0 + g and row0 + g + 8. A warp whose rows are all padding computes with the
    // others (a wgmma takes the whole warpgroup) and writes zeros.
    const int row0 = q0 + 16 * warp;
    // O unnormalized: element i is row row0 + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2t + i % 2.
    float acc[HS / 2] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // as attention_forward_mma_kernel's
    // P's A registers (slice kk: a[2 half + r] = row g + 8r of n8 tile 2kk + half). Declared outside the
    // loop: a tile's P V reads them until the next tile's wait, and they must hold until then.
    uint32_t pa[NK / 16][4];
    for (int it = 0; it < tiles; it++) {
        const int k0 = it * NK, st = it % 2;
        const char* Ks = KVs + 2 * st * kTile;
        const char* Vs = Ks + kTile;
        wgmma_wait<0>();  // the last tile's P V is done: O may be rescaled, its stage refilled
        wgmma_fence_operand(acc);
        cp_async_wait<0>();
        fence_proxy_async_shared();  // this thread's copies are visible to wgmma (the async proxy)
        __syncthreads();             // everyone's are, and every warp is done with the other stage
        if (it + 1 < tiles) load_kv(st ^ 1, k0 + NK);
        cp_async_commit();

        // S (queries, keys): element i is query row0 + g + 8 ((i / 2) % 2), key k0 + 8 (i / 4) + 2t + i % 2.
        float s[NK / 2];
        wgmma_fence_operand(s);
        wgmma_fence();
        for (int kk = 0; kk < HS / 16; kk++) wgmma_ss<NK, floatX>(s, attn_desc_k(Qs, kk), attn_desc_k(Ks, kk), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_operand(s);
        if (k0 + NK > valid || (causal && k0 + NK - 1 > row0))
            for (int i = 0; i < NK / 2; i++) {
                const int qi = row0 + g + 8 * ((i / 2) % 2), kj = k0 + 8 * (i / 4) + 2 * t + i % 2;
                s[i] = kj >= valid || (causal && kj > qi) ? -INFINITY : s[i];
            }
        // The online softmax of attention_forward_mma_kernel (which says why each step is so), P rounded
        // once into pa (the last tile's P V is done: the wait above).
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
            for (int j = 0; j < NK / 8; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
            const float m_new = fmaxf(m[r], attn_quad_max(mx) * kScaleLog2);
            const float m_ref = m_new == -INFINITY ? 0.f : m_new;
            const float alpha = exp2f(m[r] - m_ref);
            m[r] = m_new;
            l[r] *= alpha;
            for (int n = 0; n < HS / 8; n++) {
                acc[4 * n + 2 * r] *= alpha;
                acc[4 * n + 2 * r + 1] *= alpha;
            }
            for (int j = 0; j < NK / 8; j++) {
                const float lo = exp2f(fmaf(s[4 * j + 2 * r], kScaleLog2, -m_ref));
                const float hi = exp2f(fmaf(s[4 * j + 2 * r + 1], kScaleLog2, -m_ref));
                l[r] += lo;
                l[r] += hi;
                pa[j / 2][2 * (j % 2) + r] = attn_pack2f<floatX>(lo, hi);
            }
        }
        // O += P V (queries, HS): the keys are the reduction, V MN-major.
        wgmma_fence_operand(acc);
        wgmma_fence();
        for (int kk = 0; kk < NK / 16; kk++) wgmma_rs<HS, floatX, true>(acc, pa[kk], attn_desc_mn(Vs, kk), true);
        wgmma_commit();
    }
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    cp_async_wait<0>();  // the last (empty) group

    // out = O / l; lse = (m + log2 l) · ln 2. The rows go out through stage tiles % 2, which no warp has
    // read since the last iteration's barrier.
    float inv_l[2];
    for (int r = 0; r < 2; r++) {
        l[r] = attn_quad_sum(l[r]);
        inv_l[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    }
    floatX* Os = reinterpret_cast<floatX*>(KVs + 2 * (tiles % 2) * kTile);
    constexpr int kLd = AttnMmaTile<floatX, HS>::kLd;
    attn_mma_store_rows<floatX, HS>(blk.o + 16 * warp * C, C, Os + 16 * warp * kLd,
                                    reinterpret_cast<const float(&)[HS / 8][4]>(acc), inv_l, row0, valid, T);
    if (t == 0)
        for (int r = 0; r < 2; r++) {
            const int qi = row0 + g + 8 * r;
            if (qi < T) blk.lse[qi - q0] = qi < valid ? (m[r] + log2f(l[r])) * 0.69314718055994531f : 0.f;
        }
}

// Whether attention_forward runs attention_forward_wgmma_kernel where it applies (bf16/fp16, HS = 64,
// no dropout, a device with wgmma) instead of attention_forward_mma_kernel. Off until timed on a GPU
// (dev/cuda/attention.cu's variant 8); test_attention turns it on.
inline bool& attention_forward_wgmma() {
    static bool on = false;
    return on;
}

// Whether attention_backward runs attention_backward_wgmma_kernel where it applies (bf16/fp16, HS =
// 64, no dropout, a device with wgmma: wgmma_supported()) instead of attention_backward_mma_kernel.
// On by default: it computes the same gradients (the same dQ slices added in the same order; only the
// products' fp32 sums run in another order) faster: on an H200, 144 TFLOP/s against mma.sync's 128 at
// GPT-2 124M's shape (dev/cuda/attention.cu). The trainers' --attention-backward mma turns it off.
inline bool& attention_backward_wgmma() {
    static bool on = true;
    return on;
}

// Whether the wgmma kernel defers each query tile's dQ (AttnWgmmaTile's kDeferDq; the same bits as
// adding it at once). Off: on an H200 it was 1-2% slower alone (dev/cuda/attention.cu's variant 7) and
// no faster in GPT-2 124M's step. test_attention runs both.
inline bool& attention_backward_wgmma_defer_dq() {
    static bool on = false;
    return on;
}

// The resident blocks per SM the wgmma kernel's registers are capped for (its __launch_bounds__) when
// it adds dQ at once: 2 (180 registers) or 3 (168, still without spills: 12 warps per SM instead of 8
// to hide the latency of its waits and barriers, where an H200's profile showed the kernel at 33% of
// its issue slots). 2 until 3 is timed (dev/cuda/attention.cu's variant 9, the trainers'
// --attention-backward wgmma-3). The kernel deferring dQ always takes 2: capped for 3 it spills.
inline int& attention_backward_wgmma_blocks() {
    static int blocks = 2;
    return blocks;
}

// Whether the wgmma kernel adding dQ at once adds a query tile's rows to its dQ slice by reductions
// in L2 (red.global.add.v2.f32: issued, not waited for) instead of loading them, adding and storing
// (the warpgroup waiting for the loads at the end of every tile pair, where an H200's profile showed
// it idle two thirds of the time): 16 instructions per thread and tile pair instead of 64, the same
// bits. Off until timed (dev/cuda/attention.cu's variants 10 and 11, the trainers'
// --attention-backward wgmma-red and wgmma-3-red).
inline bool& attention_backward_wgmma_red_dq() {
    static bool on = false;
    return on;
}

// Whether the backward kernel sums each query tile's dQ from its slices, in the block that adds the
// tile's last contribution (kSumDq; the same bits), instead of attention_backward_dq_reduce_kernel after
// it: the slices are read while fresh in L2 rather than from DRAM (at GPT-2 124M's shape, B = 16, 400 MB
// a layer: 1.05 ms of an H200's 30 ms step went to that kernel), and a launch less. The wgmma kernel
// adding dQ at once, and the mma.sync kernel at head size 64 (its query tiles of 64 rows). Off until
// timed (dev/cuda/attention.cu's variants 12 to 14, the trainers' --attention-backward mma-sum and the
// wgmma -sum forms).
inline bool& attention_backward_sum_dq() {
    static bool on = false;
    return on;
}

// A form of the 16-bit attention backward: which kernel, and how it adds dQ. The forms of one kernel
// give the same bits and differ in speed only. attention_backward_default_form() is the knobs' above.
struct AttnBackwardForm {
    bool wgmma = true;   // the wgmma kernel where it applies (HS = 64, no dropout, sm_90a), else mma.sync
    bool defer = false;  // wgmma: each query tile's dQ deferred
    int blocks = 2;      // wgmma adding dQ at once: registers capped for 2 or 3 blocks per SM
    bool red = false;    // wgmma adding dQ at once: by reductions in L2
    bool sum = false;    // dQ's slices summed by the tiles' last writers (wgmma at once; mma.sync at HS = 64)
};
inline AttnBackwardForm attention_backward_default_form() {
    return {attention_backward_wgmma(), attention_backward_wgmma_defer_dq(), attention_backward_wgmma_blocks(),
            attention_backward_wgmma_red_dq(), attention_backward_sum_dq()};
}

// Whether attention_backward takes the wgmma kernel for a 16-bit type at this head size and dropout on
// this device (the trainers print it).
inline bool attention_backward_takes_wgmma(int head_size, bool dropout,
                                           const AttnBackwardForm& form = attention_backward_default_form()) {
    return head_size == 64 && !dropout && form.wgmma && wgmma_supported();
}

// A form's name as the trainers' --attention-backward takes it: mma, mma-sum, wgmma[-3][-red][-sum]
// (wgmma-defer has none there).
inline std::string attention_backward_form_name(const AttnBackwardForm& f) {
    if (!f.wgmma) return f.sum ? "mma-sum" : "mma";
    if (f.defer) return "wgmma-defer";
    return std::string("wgmma") + (f.blocks == 3 ? "-3" : "") + (f.red ? "-red" : "") + (f.sum ? "-sum" : "");
}

// The forms of the default form's kernel at this head size and dropout on this device, which give its
// bits: where it is the wgmma kernel, its 8 forms adding dQ at once (3 blocks, reductions, sum: each on
// or off); else at HS = 64 the mma.sync kernel with and without the sum; one form elsewhere. (The
// mma.sync and wgmma kernels add the products' fp32 terms in different orders: their gradients differ
// in the last bits.)
inline std::vector<AttnBackwardForm> attention_backward_forms(int head_size, bool dropout) {
    std::vector<AttnBackwardForm> forms;
    if (head_size != 64) return {AttnBackwardForm{false}};
    if (attention_backward_takes_wgmma(head_size, dropout))
        for (int bits = 0; bits < 8; bits++)
            forms.push_back({true, false, bits & 1 ? 3 : 2, (bits & 2) != 0, (bits & 4) != 0});
    else
        for (bool sum : {false, true}) forms.push_back({false, false, 2, false, sum});
    return forms;
}

// The blocks attention_backward_mma_kernel's grid aims at: enough to give every SM of a large GPU
// several waves (an H100 has 132 SMs, each holding 2 blocks at HS = 64; there 1024 ran GPT-2's
// shapes faster than 512). Tests lower it to give small shapes blocks with several key tiles;
// attention_backward_scratch_bytes depends on it.
inline int& attention_dq_target_blocks() {
    static int blocks = 1024;
    return blocks;
}

// The number of dQ slices of attention_backward_mma_kernel (its grid's x). Block s of a head takes key
// tiles s, s + splits, ..., so a block's time goes with its number of key tiles, ceil(key_tiles /
// splits), and the grid's with the most any block has. Of the counts from the least that gives the
// target's blocks (B·NH·splits >= target) up to twice that, the one whose blocks share the key tiles
// most evenly (the least splits · ceil(key_tiles / splits)), the smaller on a tie; and at most half
// the key tiles (rounded up), so that a block has two to pipeline where the sequence has them. On an
// H100, at B = 8, NH = 12, T = 1024 (16 key tiles): 8 slices of 2 tiles each ran 12% faster than 6 of
// 2 or 3, and 3% faster than 16 of one; at B = 16, NH = 32: 2 slices 9% faster than 1.
inline int attention_dq_splits(int B, int T, int NH) {
    const int key_tiles = CEIL_DIV(T, 64), most = CEIL_DIV(key_tiles, 2);
    const int want = CEIL_DIV(attention_dq_target_blocks(), B * NH);
    if (want >= most) return most;
    int best = want;
    for (int s = want + 1; s < 2 * want && s <= most; s++)
        if (s * CEIL_DIV(key_tiles, s) < best * CEIL_DIV(key_tiles, best)) best = s;
    return best;
}

// dQ = scale · the sum of the dQ slices, in split order; 0 for padded rows. One thread per 8 elements
// of dQ (a Packed128 of bf16/fp16). Slice s holds rows t < valid of sequences with a key tile s
// (64 s < valid), causal: only t >= 64 s (the rows its first key tile sees); other slices' rows are
// not read (never written).
template <class floatX, int HS>
__global__ void attention_backward_dq_reduce_kernel(floatX* dqkv, const float* dq_part, int B, int T, int C, int NH,
                                                    int splits, bool causal, const int* valid_len) {
    constexpr int V = Packed128<floatX>::size;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // (b, t, h, c / V), c fastest
    if (idx >= (size_t)B * T * NH * (HS / V)) return;
    const int c = (int)(idx % (HS / V)) * V, h = (int)(idx / (HS / V) % NH);
    const int t = (int)(idx / ((size_t)(HS / V) * NH) % T), b = (int)(idx / ((size_t)(HS / V) * NH * T));
    const int valid = attn_valid_length(valid_len, b, T);
    const int writers = t < valid ? attn_dq_tile_writers(splits, valid, causal, t / 64) : 0;
    attn_dq_sum_packet<floatX, HS>(dqkv + ((size_t)b * T + t) * 3 * C + h * HS + c,
                                   dq_part + (((size_t)b * NH + h) * T + t) * HS + c, (size_t)B * NH * T * HS, writers);
}

// ----------------------------------------------------------------------------
// kernel launchers

// Dropout on the attention probabilities, off by default (p = 0): each P_ij is dropped with
// probability p and the kept ones are scaled by 1/(1-p). The mask is a function of (seed, offset,
// b*NH + h, query, key) (dropout_attention_keep in llmc/dropout.cuh), so attention_backward, given the
// forward call's seed and offset, regenerates it. Give every call (layer, step) its own offset;
// pass_offset (device memory, added to offset as the kernels start) lets a replayed CUDA graph's
// launches draw each pass's masks (llmc/dropout.cuh).
struct AttentionDropout {
    float p = 0.f;
    uint64_t seed = 0;
    uint64_t offset = 0;
    const uint64_t* pass_offset = nullptr;
};

// The head sizes the kernels are built for (a template parameter each).
inline bool attention_head_size_supported(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }

// Checks the shapes and alignments every attention launcher needs and returns the head size; on a
// violation prints which constraint failed and exits.
inline int attention_check_shape(const char* who, int B, int T, int C, int NH,
                                 std::initializer_list<const void*> buffers) {
    const char* problem = nullptr;
    if (B < 1 || T < 1 || C < 1 || NH < 1) problem = "B, T, C and NH must be >= 1";
    else if (C % NH != 0) problem = "C must be a multiple of NH";
    else if (B > 65535 || NH > 65535) problem = "B and NH must be <= 65535 (grid y/z limits)";
    else if (!attention_head_size_supported(C / NH))
        problem = "head size HS = C/NH must be 16, 32, 64 or 128";
    if (!problem && !aligned16(buffers)) problem = "qkv, out, dout and dqkv must be 16-byte aligned (128-bit loads)";
    if (problem) {
        fprintf(stderr, "%s: unsupported shape B=%d T=%d C=%d NH=%d: %s\n", who, B, T, C, NH, problem);
        exit(EXIT_FAILURE);
    }
    return C / NH;
}

// The kernels' dropout arguments; exits with a message unless 0 <= p < 1 and, with dropout on, the
// shape fits the mask's counter (queries and keys < 2^21, B*NH < 2^22: llmc/dropout.cuh).
inline DropoutArgs attention_dropout_args(const char* who, const AttentionDropout& dropout, int B, int T, int NH) {
    DropoutArgs d = dropout_args(who, dropout.p, dropout.seed, dropout.offset, dropout.pass_offset);
    if (dropout.p > 0.f && (T > (1 << 21) || (long long)B * NH > (1 << 22))) {
        fprintf(stderr, "%s: attention dropout needs T <= 2^21 and B*NH <= 2^22 (got T=%d, B*NH=%lld)\n", who, T,
                (long long)B * NH);
        exit(EXIT_FAILURE);
    }
    return d;
}

// The shared memory per block the launchers may use: the device's opt-in limit, read once (tests
// lower it to run the compact blocks on a device that has more).
inline int& attention_smem_limit() {
    static int limit = device_smem_optin();
    return limit;
}

// Why blocks of fewer warps: at 4 warps the backward needs up to 185 KiB of shared memory (fp32,
// HS = 128), more than sm_86 and sm_89 GPUs (RTX 30xx/40xx, A10, L4: 99 KiB) or an A100 (163 KiB)
// give a block. Where the 4-warp block does not fit, a block owns fewer rows: the most warps whose
// backward fits 99 KiB, the smallest limit of the architectures the project builds for (2, or 1 for
// fp32 at HS = 128). The streamed tiles stay 64 rows, so the lane layout and every product are
// unchanged; the grid has more, smaller blocks, which read the streamed tiles more often.
constexpr size_t kAttnSmallestOptin = 99 * 1024;
template <class floatX, int HS>
constexpr int attn_compact_warps() {
    return AttnTile<floatX, HS, 4>::kBackwardSmem <= kAttnSmallestOptin   ? 4
           : AttnTile<floatX, HS, 2>::kBackwardSmem <= kAttnSmallestOptin ? 2
                                                                          : 1;
}

// Warps per block and dynamic shared memory of the attention kernels on this device.
struct AttnLaunch {
    int warps;
    size_t smem;
};

// The block shape of the forward (backward = false) or of the dK/dV and dQ kernels: 4 warps where the
// device allows it, else the compact one; exits naming the shape's needs when neither fits.
template <class floatX, int HS>
AttnLaunch attn_launch_shape(const char* who, bool backward) {
    using Wide = AttnTile<floatX, HS, 4>;
    using Compact = AttnTile<floatX, HS, attn_compact_warps<floatX, HS>()>;
    const size_t limit = (size_t)attention_smem_limit();
    const size_t wide = backward ? Wide::kBackwardSmem : Wide::kForwardSmem;
    const size_t compact = backward ? Compact::kBackwardSmem : Compact::kForwardSmem;
    if (wide <= limit) return {Wide::kWarps, wide};
    if (compact <= limit) return {Compact::kWarps, compact};
    const char* dtype = std::is_same<floatX, float>::value    ? "fp32"
                        : std::is_same<floatX, __half>::value ? "fp16"
                                                              : "bf16";
    fprintf(stderr, "%s: head size %d in %s needs %zu bytes of shared memory per block, the device allows %zu\n", who,
            HS, dtype, compact, limit);
    exit(EXIT_FAILURE);
}

template <class floatX, int HS, int kWarps, class Math>
void attention_forward_blocks(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                              const int* valid_len, DropoutArgs drop, bool dropout, cudaStream_t stream) {
    using Tile = AttnTile<floatX, HS, kWarps>;
    auto kernel = dropout ? attention_forward_kernel<floatX, HS, kWarps, true, Math>
                          : attention_forward_kernel<floatX, HS, kWarps, false, Math>;
    reserve_dynamic_smem(kernel, Tile::kForwardSmem, "attention_forward", "HS", HS);
    dim3 grid(CEIL_DIV(T, Tile::kRows), NH, B);
    cudaCheck(launch_kernel(kernel, grid, dim3(Tile::kThreads), Tile::kForwardSmem, stream, out, lse, qkv, T, C, NH,
                            causal, valid_len, drop));
}

// The 16-bit forward with MT row tiles per warp (production: AttnMmaTile::kFwdTiles) and, where
// kMinBlocks > 0, registers capped for kMinBlocks resident blocks per SM (0: production's
// AttnMmaTile::fwd_min_blocks; dev/cuda/attention.cu times the other choices too).
template <class floatX, int HS, int MT, int kMinBlocks = 0>
void attention_forward_mma(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                           const int* valid_len, DropoutArgs drop, bool dropout, cudaStream_t stream) {
    using Tile = AttnMmaTile<floatX, HS>;
    constexpr size_t smem = Tile::kForwardSmem;
    constexpr int kOn = kMinBlocks > 0 ? kMinBlocks : Tile::fwd_min_blocks(true);
    constexpr int kOff = kMinBlocks > 0 ? kMinBlocks : Tile::fwd_min_blocks(false);
    auto kernel = dropout ? attention_forward_mma_kernel<floatX, HS, true, MT, kOn>
                          : attention_forward_mma_kernel<floatX, HS, false, MT, kOff>;
    reserve_dynamic_smem(kernel, smem, "attention_forward", "HS", HS);
    dim3 grid(CEIL_DIV(T, 16 * MT * Tile::kWarps), NH, B);
    cudaCheck(launch_kernel(kernel, grid, dim3(Tile::kThreads), smem, stream, out, lse, qkv, T, C, NH, causal,
                            valid_len, drop));
}

template <class floatX, int HS>
void attention_forward_hs(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                          const int* valid_len, DropoutArgs drop, bool dropout, cudaStream_t stream) {
    if constexpr (!std::is_same<floatX, float>::value) {  // 16-bit types: the mma.sync (or wgmma) kernel
        if (HS == 64 && !dropout && attention_forward_wgmma() && wgmma_supported()) {
            auto kernel = attention_forward_wgmma_kernel<floatX>;
            reserve_dynamic_smem(kernel, AttnWgmmaFwdTile::kSmem, "attention_forward", "HS", HS);
            cudaCheck(launch_kernel(kernel, dim3(CEIL_DIV(T, AttnWgmmaFwdTile::kRows), NH, B), dim3(128),
                                    AttnWgmmaFwdTile::kSmem, stream, out, lse, qkv, T, C, NH, causal, valid_len));
            return;
        }
        attention_forward_mma<floatX, HS, AttnMmaTile<floatX, HS>::kFwdTiles>(out, lse, qkv, B, T, C, NH, causal,
                                                                              valid_len, drop, dropout, stream);
    } else {  // fp32: the CUDA-core kernels
        auto blocks = attn_launch_shape<floatX, HS>("attention_forward", false).warps == 4
                          ? attention_forward_blocks<floatX, HS, 4, AttnSimtMath<HS>>
                          : attention_forward_blocks<floatX, HS, attn_compact_warps<floatX, HS>(), AttnSimtMath<HS>>;
        blocks(out, lse, qkv, B, T, C, NH, causal, valid_len, drop, dropout, stream);
    }
}

// out (B,T,C) = softmax(Q K^T / sqrt(HS) + mask) V per head, and lse (B,NH,T) = the logsumexp of each
// query row's scaled scores (saved for the backward). qkv (B,T,3C). valid_len: (B) device ints or nullptr.
// dropout: on the softmax probabilities (AttentionDropout; lse stays the undropped softmax's).
template <class floatX>
void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, bool causal,
                       const int* valid_len, cudaStream_t stream,
                       const AttentionDropout& dropout = AttentionDropout()) {
    int HS = attention_check_shape("attention_forward", B, T, C, NH, {out, qkv});
    DropoutArgs d = attention_dropout_args("attention_forward", dropout, B, T, NH);
    bool on = dropout.p > 0.f;
    switch (HS) {
        case 16: attention_forward_hs<floatX, 16>(out, lse, qkv, B, T, C, NH, causal, valid_len, d, on, stream); break;
        case 32: attention_forward_hs<floatX, 32>(out, lse, qkv, B, T, C, NH, causal, valid_len, d, on, stream); break;
        case 64: attention_forward_hs<floatX, 64>(out, lse, qkv, B, T, C, NH, causal, valid_len, d, on, stream); break;
        default:
            attention_forward_hs<floatX, 128>(out, lse, qkv, B, T, C, NH, causal, valid_len, d, on, stream);
            break;
    }
}

// Bytes of device scratch attention_backward<floatX> needs: D = rowsum(dO ∘ O), fp32 (B,NH,T), then for
// the 16-bit types (whose mma.sync backward sums dQ from slices) the dQ slices, fp32 (splits,B,NH,T,HS):
// splits · B·T·C · 4 bytes, splits = attention_dq_splits(B, T, NH) (GPT-2 124M at B = 8, T = 1024:
// 8 · 25.2 MB), and the query tiles' counters of kSumDq, int (B,NH,ceil(T/64)). The fp32 backward
// computes dQ in its own kernel and needs D only.
inline size_t attention_dq_part_offset(int B, int T, int NH) {
    return ((size_t)B * NH * T * sizeof(float) + 255) / 256 * 256;
}
inline size_t attention_dq_count_offset(int B, int T, int C, int NH) {
    return attention_dq_part_offset(B, T, NH) + (size_t)attention_dq_splits(B, T, NH) * B * T * C * sizeof(float);
}
template <class floatX>
inline size_t attention_backward_scratch_bytes(int B, int T, int C, int NH) {
    if (std::is_same<floatX, float>::value) return attention_dq_part_offset(B, T, NH);
    return attention_dq_count_offset(B, T, C, NH) + (size_t)B * NH * CEIL_DIV(T, 64) * sizeof(int);
}

// D (B,NH,T) = rowsum(dO ∘ O), the backward's first step (attention_backward_preprocess_kernel).
template <class floatX, int HS>
void attention_backward_preprocess(float* D, const floatX* dout, const floatX* out, int B, int T, int C, int NH,
                                   const int* valid_len, cudaStream_t stream) {
    const int block = 256;
    const size_t lanes = (size_t)B * T * NH * (HS / Packed128<floatX>::size);  // kLanes per row
    cudaCheck(launch_kernel(attention_backward_preprocess_kernel<floatX, HS>, dim3((unsigned)CEIL_DIV(lanes, block)),
                            dim3(block), 0, stream, D, dout, out, B, T, C, NH, valid_len));
}

template <class floatX, int HS, int kWarps, class Math>
void attention_backward_blocks(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse, const float* D,
                               int B, int T, int C, int NH, bool causal, const int* valid_len, DropoutArgs drop,
                               bool dropout, cudaStream_t stream) {
    using Tile = AttnTile<floatX, HS, kWarps>;
    dim3 grid(CEIL_DIV(T, Tile::kRows), NH, B);
    auto dkdv = dropout ? attention_backward_dkdv_kernel<floatX, HS, kWarps, true, Math>
                        : attention_backward_dkdv_kernel<floatX, HS, kWarps, false, Math>;
    reserve_dynamic_smem(dkdv, Tile::kBackwardSmem, "attention_backward", "HS", HS);
    cudaCheck(launch_kernel(dkdv, grid, dim3(Tile::kThreads), Tile::kBackwardSmem, stream, dqkv, dout, qkv, lse, D,
                            T, C, NH, causal, valid_len, drop));
    auto dq = dropout ? attention_backward_dq_kernel<floatX, HS, kWarps, true, Math>
                      : attention_backward_dq_kernel<floatX, HS, kWarps, false, Math>;
    reserve_dynamic_smem(dq, Tile::kBackwardSmem, "attention_backward", "HS", HS);
    cudaCheck(launch_kernel(dq, grid, dim3(Tile::kThreads), Tile::kBackwardSmem, stream, dqkv, dout, qkv, lse, D, T, C,
                            NH, causal, valid_len, drop));
}

// The backward in the given form (AttnBackwardForm; the fp32 backward has one).
template <class floatX, int HS>
void attention_backward_form(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                             float* D, int B, int T, int C, int NH, bool causal, const int* valid_len,
                             DropoutArgs drop, bool dropout, const AttnBackwardForm& form, cudaStream_t stream) {
    attention_backward_preprocess<floatX, HS>(D, dout, out, B, T, C, NH, valid_len, stream);
    if constexpr (!std::is_same<floatX, float>::value) {  // 16-bit types: the mma.sync (or wgmma) kernels
        using Tile = AttnMmaTile<floatX, HS>;
        const int splits = attention_dq_splits(B, T, NH);
        float* dq_part = reinterpret_cast<float*>(reinterpret_cast<char*>(D) + attention_dq_part_offset(B, T, NH));
        int* dq_count = reinterpret_cast<int*>(reinterpret_cast<char*>(D) + attention_dq_count_offset(B, T, C, NH));
        const bool wgmma = attention_backward_takes_wgmma(HS, dropout, form), defer = form.defer;
        // dQ written by the backward kernel itself (kSumDq), its query tiles' counters zeroed first
        const bool summed = form.sum && (wgmma ? !defer : HS == 64);
        if (summed) cudaCheck(cudaMemsetAsync(dq_count, 0, (size_t)B * NH * CEIL_DIV(T, 64) * sizeof(int), stream));
        if (wgmma) {
            const bool three = form.blocks == 3, red = form.red;
            using Kernel = decltype(&attention_backward_wgmma_kernel<floatX, true>);
            // [three][red][summed]: the forms adding dQ at once
            const Kernel at_once[2][2][2] = {
                {{attention_backward_wgmma_kernel<floatX, false, 2, false, false>,
                  attention_backward_wgmma_kernel<floatX, false, 2, false, true>},
                 {attention_backward_wgmma_kernel<floatX, false, 2, true, false>,
                  attention_backward_wgmma_kernel<floatX, false, 2, true, true>}},
                {{attention_backward_wgmma_kernel<floatX, false, 3, false, false>,
                  attention_backward_wgmma_kernel<floatX, false, 3, false, true>},
                 {attention_backward_wgmma_kernel<floatX, false, 3, true, false>,
                  attention_backward_wgmma_kernel<floatX, false, 3, true, true>}}};
            auto kernel = defer ? attention_backward_wgmma_kernel<floatX, true> : at_once[three][red][summed];
            const size_t smem = defer ? AttnWgmmaTile<true>::kSmem : AttnWgmmaTile<false>::kSmem;
            reserve_dynamic_smem(kernel, smem, "attention_backward", "HS", HS);
            cudaCheck(launch_kernel(kernel, dim3(splits, NH, B), dim3(128), smem, stream, dqkv, dq_part, dq_count, dout,
                                    qkv, lse, D, T, C, NH, causal, valid_len));
        } else {
            auto kernel = dropout ? attention_backward_mma_kernel<floatX, HS, true>
                                  : attention_backward_mma_kernel<floatX, HS, false>;
            if constexpr (HS == 64)
                if (summed)
                    kernel = dropout ? attention_backward_mma_kernel<floatX, HS, true, false, true>
                                     : attention_backward_mma_kernel<floatX, HS, false, false, true>;
            reserve_dynamic_smem(kernel, Tile::kBackwardSmem, "attention_backward", "HS", HS);
            cudaCheck(launch_kernel(kernel, dim3(splits, NH, B), dim3(Tile::kThreads), Tile::kBackwardSmem, stream, dqkv,
                                    dq_part, dq_count, dout, qkv, lse, D, T, C, NH, causal, valid_len, drop));
        }
        if (!summed) {
            const int block = 256;
            const size_t n = (size_t)B * T * NH * (HS / Packed128<floatX>::size);
            cudaCheck(launch_kernel(attention_backward_dq_reduce_kernel<floatX, HS>,
                                    dim3((unsigned)CEIL_DIV(n, block)), dim3(block), 0, stream, dqkv, dq_part, B, T,
                                    C, NH, splits, causal, valid_len));
        }
    } else {  // fp32: the CUDA-core kernels, dK/dV then dQ
        auto blocks = attn_launch_shape<floatX, HS>("attention_backward", true).warps == 4
                          ? attention_backward_blocks<floatX, HS, 4, AttnSimtMath<HS>>
                          : attention_backward_blocks<floatX, HS, attn_compact_warps<floatX, HS>(), AttnSimtMath<HS>>;
        blocks(dqkv, dout, qkv, lse, D, B, T, C, NH, causal, valid_len, drop, dropout, stream);
    }
}

// --attention-backward tune (attention_backward_tune): the first call at each shape times every form
// attention_backward_forms offers there on the call's own operands (one untimed run, then
// kAttnTuneRuns timed ones each; every run overwrites dqkv and the scratch, which the real call then
// writes again) and keeps the fastest for that shape. The forms give the default's bits, so a tuned
// run's results are an untuned one's. Each trial waits for the GPU: a shape first met inside a CUDA graph
// capture takes the default form and is counted (the trainers run each graph key eagerly once first
// when tuning). The summary is for the trainers' first-step lines.
constexpr int kAttnTuneRuns = 3;
struct AttnTuneState {
    bool on = false;
    using Key = std::array<long long, 8>;  // (fp16?, B, T, NH, HS, causal, dropout, valid lengths given?)
    std::map<Key, AttnBackwardForm> chosen;
    std::vector<std::string> report;  // a line per shape timed
    std::set<Key> captured;           // shapes met during a capture before any eager call: not timed
    double host_ms = 0;               // time spent timing
};
inline AttnTuneState& attention_backward_tune() {
    static AttnTuneState state;
    return state;
}

// The form attention_backward takes for this call: the default, or under tuning the shape's fastest,
// found now if the shape is new.
template <class floatX, int HS>
AttnBackwardForm attention_backward_tuned_form(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                               const floatX* out, const float* lse, float* D, int B, int T, int C,
                                               int NH, bool causal, const int* valid_len, DropoutArgs drop,
                                               bool dropout, cudaStream_t stream) {
    AttnTuneState& tune = attention_backward_tune();
    const AttnBackwardForm fallback = attention_backward_default_form();
    if (!tune.on || std::is_same<floatX, float>::value) return fallback;
    const AttnTuneState::Key key = {std::is_same<floatX, __half>::value, B, T, NH, HS, causal, dropout,
                                    valid_len != nullptr};
    auto found = tune.chosen.find(key);
    if (found != tune.chosen.end()) return found->second;
    const std::vector<AttnBackwardForm> forms = attention_backward_forms(HS, dropout);
    if (forms.size() < 2) return fallback;
    cudaStreamCaptureStatus capture;
    cudaCheck(cudaStreamIsCapturing(stream, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
        tune.captured.insert(key);
        return fallback;
    }
    const auto t_start = std::chrono::steady_clock::now();
    std::vector<float> ms(forms.size(), 0.f);
    for (size_t i = 0; i < forms.size(); i++) {
        for (int run = 0; run <= kAttnTuneRuns; run++) {
            const float run_ms = time_on_stream(stream, [&] {
                attention_backward_form<floatX, HS>(dqkv, dout, qkv, out, lse, D, B, T, C, NH, causal, valid_len,
                                                    drop, dropout, forms[i], stream);
            });
            if (run > 0) ms[i] += run_ms / kAttnTuneRuns;
        }
    }
    size_t best = 0;
    for (size_t i = 1; i < forms.size(); i++)
        if (ms[i] < ms[best]) best = i;
    tune.chosen[key] = forms[best];
    // the line, with the default's time where the default is another of the forms timed
    char versus[96] = "";
    const std::string default_name = attention_backward_form_name(fallback);
    for (size_t i = 0; i < forms.size(); i++)
        if (i != best && attention_backward_form_name(forms[i]) == default_name)
            snprintf(versus, sizeof(versus), "; the default, %s: %.3f ms", default_name.c_str(), ms[i]);
    char line[256];
    snprintf(line, sizeof(line), "B=%d T=%d NH=%d HS=%d%s%s%s: %s, %.3f ms a call (%zu forms timed%s)", B, T, NH, HS,
             causal ? " causal" : "", dropout ? " dropout" : "", valid_len ? " padded" : "",
             attention_backward_form_name(forms[best]).c_str(), ms[best], forms.size(), versus);
    tune.report.push_back(line);
    tune.host_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
    return forms[best];
}

template <class floatX, int HS>
void attention_backward_hs(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                           float* D, int B, int T, int C, int NH, bool causal, const int* valid_len, DropoutArgs drop,
                           bool dropout, cudaStream_t stream) {
    const AttnBackwardForm form = attention_backward_tuned_form<floatX, HS>(dqkv, dout, qkv, out, lse, D, B, T, C, NH,
                                                                           causal, valid_len, drop, dropout, stream);
    attention_backward_form<floatX, HS>(dqkv, dout, qkv, out, lse, D, B, T, C, NH, causal, valid_len, drop, dropout,
                                        form, stream);
}

// dqkv (B,T,3C, overwritten) = the gradient of the loss with respect to qkv, given dout (B,T,C) and the
// forward's qkv, out and lse; scratch: attention_backward_scratch_bytes<floatX>(...) bytes of device memory.
// dropout: the forward call's (same p, seed and offset), whose mask is regenerated.
template <class floatX>
void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,
                        void* scratch, int B, int T, int C, int NH, bool causal, const int* valid_len,
                        cudaStream_t stream, const AttentionDropout& dropout = AttentionDropout()) {
    int HS = attention_check_shape("attention_backward", B, T, C, NH, {dqkv, dout, qkv, out});
    DropoutArgs d = attention_dropout_args("attention_backward", dropout, B, T, NH);
    bool on = dropout.p > 0.f;
    if (B * (long long)T * NH > 0x7fffffffLL) {
        fprintf(stderr, "attention_backward: B*T*NH = %lld exceeds 2^31-1\n", B * (long long)T * NH);
        exit(EXIT_FAILURE);
    }
    if (!scratch) {
        fprintf(stderr, "attention_backward: scratch is null (needs attention_backward_scratch_bytes<floatX>(B, T, C, NH))\n");
        exit(EXIT_FAILURE);
    }
    float* D = static_cast<float*>(scratch);
    switch (HS) {
        case 16:
            attention_backward_hs<floatX, 16>(dqkv, dout, qkv, out, lse, D, B, T, C, NH, causal, valid_len, d, on,
                                              stream);
            break;
        case 32:
            attention_backward_hs<floatX, 32>(dqkv, dout, qkv, out, lse, D, B, T, C, NH, causal, valid_len, d, on,
                                              stream);
            break;
        case 64:
            attention_backward_hs<floatX, 64>(dqkv, dout, qkv, out, lse, D, B, T, C, NH, causal, valid_len, d, on,
                                              stream);
            break;
        default:
            attention_backward_hs<floatX, 128>(dqkv, dout, qkv, out, lse, D, B, T, C, NH, causal, valid_len, d, on,
                                               stream);
            break;
    }
}
