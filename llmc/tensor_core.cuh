// llmc/tensor_core.cuh — tensor-core primitives for hand-written kernels: mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate), ldmatrix (x1/x2/x4, .trans), cp.async (16 bytes, commit/wait groups), an L2 prefetch, an fp32 reduction in L2 and the release/acquire pair of "the last block to arrive".
//
// On a GPU each function is its PTX instruction (inline asm; sm_80 or newer). On the CPU backend
// each is a warp collective that implements the PTX ISA's per-thread fragment layouts exactly
// (llmc/simt/include/tensor_core_simt.h) and cp.async keeps the copies pending until the wait
// (llmc/simt/scheduler.cpp), so kernels written against the documented layouts run and are tested
// there. test/test_tensor_core.cu checks the layouts against tables transcribed from the PTX ISA.
//
// The API (every function is called by all 32 lanes of a warp where it says "warp"):
//
//   mma_m16n8k16<T>(d, a, b, c)   warp; T = __nv_bfloat16 or __half. D = A·B + C with A 16×16 (row
//       major, 4 .b32 registers per lane, 2 elements each), B 16×8 (K×N, "col": 2 registers), C and
//       D 16×8 fp32 (4 floats). With g = lane / 4 and t = lane % 4 (PTX ISA "Matrix Fragments for
//       mma.m16n8k16 with floating point type"):
//         a[0]: A(g, 2t..2t+1)     a[1]: A(g+8, 2t..2t+1)   a[2]: A(g, 2t+8..)   a[3]: A(g+8, 2t+8..)
//         b[0]: B(2t..2t+1, g)     b[1]: B(2t+8..2t+9, g)
//         c[0..1]: C(g, 2t..2t+1)  c[2..3]: C(g+8, 2t..2t+1)
//       each register's lower-indexed element in its low 16 bits.
//   ldmatrix_x{1,2,4}(r, row)     warp; loads 1, 2 or 4 8×8 matrices of 16-bit elements from shared
//       memory: lane 8j + i passes the (16-byte aligned) address of row i of matrix j; lane l gets in
//       r[j] the elements (l / 4, 2·(l % 4)) and (l / 4, 2·(l % 4) + 1) of matrix j. The _trans
//       forms load each matrix transposed. ldmatrix_x4 of a row-major 16×16 tile (lane l: row l % 16,
//       column 8 · (l / 16)) gives mma's A registers; ldmatrix_x2_trans of a row-major K×N tile
//       (lane l < 16: row l, the tile's 8 columns) gives its B registers.
//   cp_async_16(smem, gmem)        per thread; starts a 16-byte copy global -> shared (both 16-byte
//       aligned). cp_async_16_zfill(smem, gmem, n) copies only the first n (0..16) bytes and writes
//       zeros to the rest (PTX's src-size operand; with n = 0 nothing is read): a tile's rows past
//       the end become zeros without a branch around the copy. cp_async_commit() closes the thread's copies issued since the last commit into a
//       group; cp_async_wait<N>() waits until at most the newest N of its groups are pending. A copy
//       is visible to its own thread only after the wait for its group, and to others after that
//       wait and a barrier (__syncthreads) that follows it.
//   prefetch_l2(gmem)              per thread; starts bringing the 128-byte line of global memory at
//       gmem into L2 and returns at once (no register waits for it): a later load of the line finds it
//       there instead of waiting for DRAM. A hint: it changes no value.
//   red_add_f32x2(gmem, a, b)      per thread; gmem[0] += a and gmem[1] += b (gmem 8-byte aligned,
//       global memory) as a reduction the L2 cache performs: the thread issues it and goes on, where
//       a load, add and store would wait for the load. sm_90's red.global.add.v2.f32, two scalar
//       red.global.add.f32 before. The adds round to nearest and flush subnormals to zero, as every
//       fp32 add of a --use_fast_math build does; the reductions and stores of one thread to one
//       address take effect in its program order, so a single writer's sums are bit-reproducible.
//   atomic_add_release(counter, v) per thread; adds v to the int at counter (global memory) and returns
//       the value before, as one atomic with release semantics at GPU scope
//       (atom.release.gpu.global.add.s32): every memory operation before it is visible to a thread that
//       reads the count and then acquires — the block's other threads' operations too when a
//       __syncthreads() precedes the call.
//   fence_acquire()                per thread; after a read of such a count (the atomic's return value),
//       makes what the other adders did before their adds visible to this thread, and to the block's
//       other threads after a __syncthreads() (fence.acq_rel.gpu). Together: blocks that each write part
//       of a result and count themselves in with one thread can leave the whole to whichever finds
//       itself last, and only that one pays for the acquire; no block waits for another.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#if defined(SIMT_CPU)
#include <tensor_core_simt.h>
#else

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "llmc/tensor_core.cuh needs sm_80 or newer (bf16 mma.sync m16n8k16, cp.async)"
#endif

template <class T>
__device__ inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                    const float (&c)[4]) {
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "mma_m16n8k16: the inputs are __nv_bfloat16 or __half");
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
              "f"(c[3]));
    }
}

// The 32-bit shared-state-space address of a generic pointer into shared memory, as the
// .shared forms of ldmatrix and cp.async take it.
__device__ inline uint32_t shared_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// volatile, and ldmatrix with a "memory" clobber: they read shared memory that other threads wrote
// before a barrier, so the compiler must not move them across it.
__device__ inline void ldmatrix_x1(uint32_t (&r)[1], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(shared_address(row)) : "memory");
}
__device__ inline void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)) : "memory");
}
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)) : "memory");
}
__device__ inline void ldmatrix_x1_trans(uint32_t (&r)[1], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0]) : "r"(shared_address(row)) : "memory");
}
__device__ inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(shared_address(row)) : "memory");
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(shared_address(row)) : "memory");
}

// .cg: cached in L2 only, the one form that takes 16 bytes and the right one for tiles read once
// per block.
__device__ inline void cp_async_16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(shared_address(smem)), "l"(gmem) : "memory");
}
// The src-size form: reads the first src_bytes (0..16) and fills the rest of the 16 with zeros.
__device__ inline void cp_async_16_zfill(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 : : "r"(shared_address(smem)), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" : : : "memory"); }
__device__ inline void prefetch_l2(const void* gmem) { asm volatile("prefetch.global.L2 [%0];\n" : : "l"(gmem)); }
__device__ inline void red_add_f32x2(float* gmem, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" : : "l"(gmem), "f"(a), "f"(b) : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;\n" : : "l"(gmem), "f"(a) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;\n" : : "l"(gmem + 1), "f"(b) : "memory");
#endif
}
__device__ inline int atomic_add_release(int* counter, int v) {
    int old;
    asm volatile("atom.release.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(counter), "r"(v) : "memory");
    return old;
}
__device__ inline void fence_acquire() { asm volatile("fence.acq_rel.gpu;\n" : : : "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
    static_assert(N >= 0, "cp_async_wait<N>: N is how many of the newest groups may stay pending");
    asm volatile("cp.async.wait_group %0;\n" : : "n"(N) : "memory");
}

#endif
