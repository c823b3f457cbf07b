// llmc/simt/include/tensor_core_simt.h — the CPU backend's mma.sync m16n8k16, ldmatrix and cp.async for llmc/tensor_core.cuh: warp collectives with the PTX ISA's per-thread fragment layouts.
//
// Unlike WMMA (include/mma.h), whose fragment layout CUDA keeps opaque, these primitives have the
// layouts the PTX ISA documents register by register, and kernels rely on them (an ldmatrix'd
// register is an mma operand; a thread writes its accumulators to known rows and columns). So the
// backend implements exactly those layouts, no scrambling.
//
// Warp collectives. mma and ldmatrix need what the other lanes hold (their registers, their row
// addresses). Each lane writes its share into a per-warp scratch area, __syncwarp(), each lane
// computes its own result from the whole warp's shares, __syncwarp() again so that the next call
// cannot overwrite the scratch while a lane still reads it. The PTX instructions are .sync.aligned:
// all 32 lanes must execute them convergently. The backend checks it: a warp with a lane that has
// exited (or a block whose last warp has fewer than 32 threads) stops with a message, and lanes at
// different collectives are reported by the scheduler.
//
// Arithmetic of mma. D = C + A·B per element, in fp32: each product of two bf16 or two fp16 values
// is exact in fp32 (at most 8×8 or 11×11 significant bits), and the 16 products are added to C one
// at a time in k order, rounding to fp32 after each add. Tensor cores on Ampere and Hopper add the
// products in their own order with their own internal rounding (truncation, wider intermediates),
// so a GPU's result can differ from this one in the last bits: within 16 additions of at most one
// fp32 ulp each of the running sum, which is the budget test/test_tensor_core.cu allows a GPU.
//
// Only included by llmc/tensor_core.cuh on the CPU backend; cp.async lives in scheduler.cpp,
// which keeps each thread's pending copies.
#pragma once

#include "cuda_runtime.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

namespace simt {
namespace tc_detail {

// Per warp (32 warps: 1024 threads), per lane: the row address a lane gives ldmatrix, and the
// registers a lane gives mma (a0..a3 then b0, b1). One copy per worker OS thread, shared by the
// fibers of the block it runs, as __shared__ memory is.
inline thread_local const void* ldmatrix_rows[32][32];
inline thread_local uint32_t mma_regs[32][32][6];

// Index of the calling thread's warp within its block (warps are consecutive linear thread ids).
inline unsigned warp_index() {
    return (threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) / 32;
}

// Stops the run unless all 32 lanes of the caller's warp exist and have not exited (.aligned).
inline void require_full_warp(const char* what, const char* file, int line) {
    unsigned active = simt::active_mask();
    if (active == 0xffffffffu) return;
    char msg[256];
    snprintf(msg, sizeof(msg),
             "%s needs all 32 lanes of the warp (.sync.aligned), but only lanes 0x%08x exist and have not "
             "exited", what, active);
    simt::fault(msg, file, line);
}

// The value of a 16-bit element from its bits, as fp32 (exact).
template <class T>
inline float from_bits(uint16_t bits) {
    if (std::is_same<T, __nv_bfloat16>::value) {
        uint32_t u = (uint32_t)bits << 16;  // bf16 is fp32's upper half
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
    __half v;
    std::memcpy(static_cast<void*>(&v), &bits, 2);
    return __half2float(v);
}

// The 16-bit element in the low (half 0) or high (half 1) bits of a .b32 register, as fp32.
template <class T>
inline float element(uint32_t reg, int half) {
    return from_bits<T>((uint16_t)(reg >> (16 * half)));
}

}  // namespace tc_detail
}  // namespace simt

// ----------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32

// D (16×8) = A (16×16) · B (16×8) + C, every operand in the PTX ISA's fragment layout (section
// "Matrix Fragments for mma.m16n8k16 with floating point type"); d may be c.
template <class T>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4],
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "mma_m16n8k16: the inputs are __nv_bfloat16 or __half");
    namespace td = simt::tc_detail;
    td::require_full_warp("mma.sync.aligned.m16n8k16", file, line);
    unsigned lane = simt::lane_id();
    uint32_t(*regs)[6] = td::mma_regs[td::warp_index()];
    for (int i = 0; i < 4; i++) regs[lane][i] = a[i];
    regs[lane][4] = b[0];
    regs[lane][5] = b[1];
    __syncwarp(0xffffffffu, file, line);  // every lane's registers are in the scratch
    // Where an element lives (the inverse of the PTX ISA's tables): A(r, k) is in lane
    // (r % 8) * 4 + (k % 8) / 2, register r / 8 + 2 * (k / 8), half k % 2; B(k, n) is in lane
    // n * 4 + (k % 8) / 2, register k / 8, half k % 2.
    auto A = [&](int r, int k) {
        return td::element<T>(regs[(r % 8) * 4 + (k % 8) / 2][r / 8 + 2 * (k / 8)], k % 2);
    };
    auto B = [&](int k, int n) { return td::element<T>(regs[n * 4 + (k % 8) / 2][4 + k / 8], k % 2); };
    int group = lane / 4, in_group = lane % 4;
    float a_rows[2][16], b_cols[2][16];  // A(group + 8h, k), B(k, 2 * in_group + e): what this lane's outputs use
    for (int k = 0; k < 16; k++)
        for (int h = 0; h < 2; h++) {
            a_rows[h][k] = A(group + 8 * h, k);
            b_cols[h][k] = B(k, 2 * in_group + h);
        }
    float out[4];
    for (int i = 0; i < 4; i++) {  // c_i: row group + 8 * (i / 2), column 2 * in_group + i % 2
        float acc = c[i];
        for (int k = 0; k < 16; k++) acc += a_rows[i / 2][k] * b_cols[i % 2][k];  // exact product, one rounding per add
        out[i] = acc;
    }
    __syncwarp(0xffffffffu, file, line);  // nobody overwrites the scratch while a lane still reads it
    for (int i = 0; i < 4; i++) d[i] = out[i];
}

// ----------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16

namespace simt {
namespace tc_detail {

// Loads Num 8×8 matrices of 16-bit elements: lane 8j + i gives the address of row i of matrix j
// (lanes from 8·Num on give none), and lane l receives in r[j] the elements (l / 4, 2·(l % 4)) and
// (l / 4, 2·(l % 4) + 1) of matrix j, the first in the low half (PTX ISA, "Warp-level matrix load
// instruction: ldmatrix"). Trans loads the transposed matrices: element (l / 4, c) of the
// transpose is element (c, l / 4) as stored.
template <int Num, bool Trans>
inline void ldmatrix(uint32_t* r, const void* row, const char* file, int line) {
    static const char* name = Num == 1 ? (Trans ? "ldmatrix .x1.trans" : "ldmatrix .x1")
                              : Num == 2 ? (Trans ? "ldmatrix .x2.trans" : "ldmatrix .x2")
                                         : (Trans ? "ldmatrix .x4.trans" : "ldmatrix .x4");
    require_full_warp(name, file, line);
    unsigned lane = simt::lane_id();
    if (lane < 8u * Num && reinterpret_cast<uintptr_t>(row) % 16 != 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s: lane %u's row address %p is not 16-byte aligned, as the PTX ISA requires",
                 name, lane, row);
        simt::fault(msg, file, line);
    }
    const void** rows = ldmatrix_rows[warp_index()];
    rows[lane] = row;
    __syncwarp(0xffffffffu, file, line);  // every lane's row address is in the scratch
    for (int j = 0; j < Num; j++) {
        uint32_t reg = 0;
        for (int h = 0; h < 2; h++) {
            int i = lane / 4, c = 2 * (lane % 4) + h;  // element (i, c) of the matrix this lane receives
            int stored_row = Trans ? c : i, stored_col = Trans ? i : c;
            uint16_t bits;
            std::memcpy(&bits, static_cast<const char*>(rows[8 * j + stored_row]) + 2 * stored_col, 2);
            reg |= (uint32_t)bits << (16 * h);
        }
        r[j] = reg;
    }
    __syncwarp(0xffffffffu, file, line);  // nobody overwrites the scratch while a lane still reads it
}

}  // namespace tc_detail
}  // namespace simt

inline void ldmatrix_x1(uint32_t (&r)[1], const void* row, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    simt::tc_detail::ldmatrix<1, false>(r, row, file, line);
}
inline void ldmatrix_x2(uint32_t (&r)[2], const void* row, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    simt::tc_detail::ldmatrix<2, false>(r, row, file, line);
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    simt::tc_detail::ldmatrix<4, false>(r, row, file, line);
}
inline void ldmatrix_x1_trans(uint32_t (&r)[1], const void* row, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    simt::tc_detail::ldmatrix<1, true>(r, row, file, line);
}
inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    simt::tc_detail::ldmatrix<2, true>(r, row, file, line);
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    simt::tc_detail::ldmatrix<4, true>(r, row, file, line);
}

// ----------------------------------------------------------------------------
// cp.async.cg.shared.global (16 bytes, and its src-size form), commit_group, wait_group: see
// scheduler.cpp ("cp.async"); prefetch.global.L2 (a check of the address space, nothing to warm)

inline void cp_async_16(void* smem, const void* gmem, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    simt::cp_async_16(smem, gmem, 16, file, line);
}
inline void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    simt::cp_async_16(smem, gmem, src_bytes, file, line);
}
inline void prefetch_l2(const void* gmem, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::prefetch_l2(gmem, file, line);
}
// red.global.add (llmc/tensor_core.cuh's red_add_f32x2): two atomic adds, each rounded to fp32 (no
// flush of subnormals: the CPU backend's plain adds keep them too).
inline void red_add_f32x2(float* gmem, float a, float b) {
    atomicAdd(gmem, a);
    atomicAdd(gmem + 1, b);
}
// atom.release.gpu.global.add.s32 and fence.acq_rel.gpu (llmc/tensor_core.cuh's atomic_add_release,
// fence_acquire): a block runs on one worker thread, so release and acquire between worker threads
// order what whole blocks did.
inline int atomic_add_release(int* counter, int v) { return __atomic_fetch_add(counter, v, __ATOMIC_RELEASE); }
inline void fence_acquire() { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
inline void cp_async_commit(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::cp_async_commit(file, line);
}
template <int N>
inline void cp_async_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(N >= 0, "cp_async_wait<N>: N is how many of the newest groups may stay pending");
    simt::cp_async_wait(N, file, line);
}
