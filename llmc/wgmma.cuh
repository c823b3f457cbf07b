// llmc/wgmma.cuh — Hopper's warpgroup MMA for hand-written kernels: wgmma.mma_async m64nNk16 (bf16/fp16 in, fp32 accumulate, N = 64 or 128) with operands in shared memory described by matrix descriptors, or A in registers.
//
// On an H100/H200 (sm_90a) each function is its PTX instruction. On the CPU backend each is
// emulated with the PTX ISA's layouts (llmc/simt/include/wgmma_simt.h) and the asynchrony made
// strict: a wgmma computes when its thread waits for it, reading shared memory then. So kernels
// written against the documented layouts run and are tested there; test/test_wgmma.cu checks the
// descriptor fields, the shared-memory layouts and the register layouts against the PTX ISA. The
// build compiles compute capability 9.0 as sm_90a (the Makefile), the one target that has wgmma;
// wgmma_supported() tells the host whether the running device got that code.
//
// A warpgroup is 4 consecutive warps, the first a multiple of 4 in its block (threads 128w ..
// 128w + 127). Every function below is executed by all 128 threads of a warpgroup together.
//
//   wgmma_ss<N, T, TransA, TransB>(d, desc_a, desc_b, accumulate)
//       D (64×N, fp32) = A (64×16) · B (16×N) + (accumulate ? D : 0), T = __nv_bfloat16 or __half,
//       A and B in shared memory, given by descriptors (below). TransA/TransB false: the operand is
//       "K-major" (A row-major M×K; B stored as N rows of K, e.g. the K of attention's Q·Kᵀ);
//       true: "MN-major" (A stored as K rows of M; B row-major K×N, e.g. V in P·V).
//   wgmma_rs<N, T, TransB>(d, a, desc_b, accumulate)
//       the same with A in registers: warp w of the warpgroup holds rows 16w .. 16w + 15 in the
//       layout of mma.sync m16n8k16's A (llmc/tensor_core.cuh): a[0] A(g, 2t..2t+1), a[1] A(g+8,
//       2t..), a[2] A(g, 2t+8..), a[3] A(g+8, 2t+8..), with g = lane / 4, t = lane % 4.
//   d: N / 2 floats per thread. Warp w, lane (g, t): d[i] is D(16w + g + 8·(i/2 % 2), 8·(i/4) + 2t
//       + i % 2), i.e. mma.sync's C layout repeated over the N / 8 column blocks.
//   wgmma_fence()        before the first wgmma of a batch, and whenever d or a were touched by
//       other instructions since the last wait (the PTX ISA's rule; the CPU backend requires one
//       since the thread's last wait).
//   wgmma_commit()       closes the wgmmas issued since the last commit into a group.
//   wgmma_wait<P>()      waits until at most the newest P groups are pending. Until their group
//       completes, a wgmma's d and a must not be read or written, nor its operand tiles overwritten.
//   wgmma_fence_operand(d)  keeps the compiler from moving accesses to d across the asynchronous
//       region: call it on the accumulators before the batch's wgmma_fence and after its wait.
//   fence_proxy_async_shared()  makes this thread's ordinary writes to shared memory (st.shared,
//       cp.async) visible to wgmma, which reads through the async proxy: after writing operand
//       tiles, before the barrier that lets the warpgroup use them (the CPU backend stops a wgmma
//       that reads bytes stored without it).
//
// Descriptors. wgmma_descriptor(tile, swizzle, lbo, sbo) describes a 16-bit operand tile. Its
// elements are grouped in "core matrices" of 8 rows × 16 bytes; with T8 = 8 elements (16 bytes):
//   K-major, no swizzle:  element (mn, k) at tile + (mn % 8)·16 + (mn / 8)·sbo + (k / 8)·lbo + (k % 8)·2
//   K-major, swizzle of W·16 bytes (W = 2, 4, 8 for 32B, 64B, 128B): rows of W·16 bytes,
//       (mn % 8)·16W + (mn / 8)·sbo + (k / 8)·16 + (k % 8)·2   (lbo unused: pass 16)
//   MN-major, no swizzle: (mn % 8)·2 + (mn / 8)·sbo + (k % 8)·16 + (k / 8)·lbo
//   MN-major, swizzled:   (mn % 8W)·2 + (mn / 8W)·lbo + (k % 8)·16W + (k / 8)·sbo
// and a swizzled layout's byte address then has its bits 4.. XORed with its bits 7.. (1, 2 or 3
// bits for 32B, 64B, 128B): the 16-byte chunks of each row permuted by the row's index within
// the 8-row pattern. A swizzled tile starts at a multiple of 8 rows' bytes (1024 for 128B), the
// k16 step of a K-major one within its first row (tile + 32·s); the CPU backend checks both.
// Operand tiles live in dynamic shared memory (dynamic_shared<T>() in llmc/cuda_common.h).
#pragma once

#include "tensor_core.cuh"

#include <cstdint>
#include <type_traits>

// The descriptor's swizzle field (PTX ISA "Matrix Descriptor Format", bits 62-63).
enum class WgmmaSwizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// The 64-bit matrix descriptor: bits 0-13 the start address, 16-29 the leading dimension byte
// offset, 32-45 the stride dimension byte offset (each in 16-byte units), 49-51 the base offset
// (0: tiles start on their swizzle pattern), 62-63 the swizzle.
__host__ __device__ constexpr uint64_t wgmma_encode_descriptor(uint32_t shared_addr, WgmmaSwizzle swizzle,
                                                               uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((shared_addr >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)swizzle << 62;
}

#if defined(SIMT_CPU)
#include <wgmma_simt.h>
#else

// wgmma exists in sm_90a code only; other device code gets a trap, which wgmma_supported()
// keeps hosts from launching.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMC_WGMMA_ASM 1
#endif

__device__ inline uint64_t wgmma_descriptor(const void* tile, WgmmaSwizzle swizzle, uint32_t lbo, uint32_t sbo) {
    return wgmma_encode_descriptor(shared_address(tile), swizzle, lbo, sbo);
}

__device__ inline void wgmma_fence() {
#if defined(LLMC_WGMMA_ASM)
    asm volatile("wgmma.fence.sync.aligned;\n" : : : "memory");
#else
    __trap();
#endif
}
__device__ inline void wgmma_commit() {
#if defined(LLMC_WGMMA_ASM)
    asm volatile("wgmma.commit_group.sync.aligned;\n" : : : "memory");
#else
    __trap();
#endif
}
template <int P>
__device__ inline void wgmma_wait() {
    static_assert(P >= 0 && P <= 7, "wgmma_wait<P>: P is how many of the newest groups may stay pending (0..7)");
#if defined(LLMC_WGMMA_ASM)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" : : "n"(P) : "memory");
#else
    __trap();
#endif
}
template <int M>
__device__ inline void wgmma_fence_operand(float (&d)[M]) {
#pragma unroll
    for (int i = 0; i < M; i++) asm volatile("" : "+f"(d[i]) : : "memory");
}
__device__ inline void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" : : : "memory");
#endif
}

// The accumulator operands of the asm statements below: "+f" for d[I] .. d[I + 3] and so on.
#define LLMC_WG_D4(I) "+f"(d[I]), "+f"(d[I + 1]), "+f"(d[I + 2]), "+f"(d[I + 3])
#define LLMC_WG_D16(I) LLMC_WG_D4(I), LLMC_WG_D4(I + 4), LLMC_WG_D4(I + 8), LLMC_WG_D4(I + 12)
#define LLMC_WG_D32 LLMC_WG_D16(0), LLMC_WG_D16(16)
#define LLMC_WG_D64 LLMC_WG_D32, LLMC_WG_D16(32), LLMC_WG_D16(48)
#define LLMC_WG_P32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define LLMC_WG_P64                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, " \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "   \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// scale-d is a predicate: set from the accumulate flag inside the statement.
#define LLMC_WG_SCALE_D(op) "{\n.reg .pred p;\nsetp.ne.b32 p, %" op ", 0;\n"

template <int N, class T, bool TransA = false, bool TransB = false>
__device__ inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
    static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "wgmma_ss: the inputs are __nv_bfloat16 or __half");
#if defined(LLMC_WGMMA_ASM)
    constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    const int scale_d = accumulate ? 1 : 0;
    if constexpr (N == 64 && bf16) {
        asm volatile(LLMC_WG_SCALE_D("34") "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LLMC_WG_P32
                     ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : LLMC_WG_D32
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(int(TransA)), "n"(int(TransB)));
    } else if constexpr (N == 64) {
        asm volatile(LLMC_WG_SCALE_D("34") "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " LLMC_WG_P32
                     ", %32, %33, p, 1, 1, %35, %36;\n}\n"
                     : LLMC_WG_D32
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(int(TransA)), "n"(int(TransB)));
    } else if constexpr (bf16) {
        asm volatile(LLMC_WG_SCALE_D("66") "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LLMC_WG_P64
                     ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : LLMC_WG_D64
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(int(TransA)), "n"(int(TransB)));
    } else {
        asm volatile(LLMC_WG_SCALE_D("66") "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " LLMC_WG_P64
                     ", %64, %65, p, 1, 1, %67, %68;\n}\n"
                     : LLMC_WG_D64
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(int(TransA)), "n"(int(TransB)));
    }
#else
    __trap();
#endif
}

template <int N, class T, bool TransB = false>
__device__ inline void wgmma_rs(float (&d)[N / 2], uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
    static_assert(N == 64 || N == 128, "wgmma_rs: N is 64 or 128");
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "wgmma_rs: the inputs are __nv_bfloat16 or __half");
#if defined(LLMC_WGMMA_ASM)
    constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
    const int scale_d = accumulate ? 1 : 0;
    if constexpr (N == 64 && bf16) {
        asm volatile(LLMC_WG_SCALE_D("37") "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " LLMC_WG_P32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : LLMC_WG_D32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(int(TransB)));
    } else if constexpr (N == 64) {
        asm volatile(LLMC_WG_SCALE_D("37") "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " LLMC_WG_P32
                     ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
                     : LLMC_WG_D32
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(int(TransB)));
    } else if constexpr (bf16) {
        asm volatile(LLMC_WG_SCALE_D("69") "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LLMC_WG_P64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                     : LLMC_WG_D64
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(int(TransB)));
    } else {
        asm volatile(LLMC_WG_SCALE_D("69") "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " LLMC_WG_P64
                     ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
                     : LLMC_WG_D64
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(int(TransB)));
    }
#else
    __trap();
#endif
}

#undef LLMC_WG_D4
#undef LLMC_WG_D16
#undef LLMC_WG_D32
#undef LLMC_WG_D64
#undef LLMC_WG_P32
#undef LLMC_WG_P64
#undef LLMC_WG_SCALE_D

#endif  // SIMT_CPU

// Writes 1 where the running code has wgmma (sm_90a, or the CPU backend), 0 elsewhere.
template <int = 0>
__global__ void wgmma_probe_kernel(int* has) {
#if defined(SIMT_CPU) || defined(LLMC_WGMMA_ASM)
    *has = 1;
#else
    *has = 0;
#endif
}

// Whether kernels built from this header can use wgmma on the current device: an sm_90a build
// running on compute capability 9.0, or the CPU backend (asked once per process, of the current
// device then).
inline bool wgmma_supported() {
    static const bool supported = [] {
        int* flag = nullptr;
        int has = 0;
        if (cudaMalloc(&flag, sizeof(int)) != cudaSuccess) return false;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(1);
        // A device with no code for the probe fails the launch (cleared here): that answers no.
        bool ran = cudaLaunchKernelEx(&cfg, wgmma_probe_kernel<>, flag) == cudaSuccess &&
                   cudaMemcpy(&has, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
        cudaGetLastError();
        cudaFree(flag);
        return ran && has == 1;
    }();
    return supported;
}
