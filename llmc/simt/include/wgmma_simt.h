// llmc/simt/include/wgmma_simt.h — the CPU backend's wgmma for llmc/wgmma.cuh: descriptors decoded into the PTX ISA's shared-memory layouts, accumulators in its register layout, each MMA computed when its thread waits for it.
//
// Where the numbers come from. Warp w of a warpgroup owns rows 16w .. 16w + 15 of D, and each of
// its lanes the N / 2 elements the register layout gives it, so a lane computes its own outputs
// from A's two rows and B's columns it needs: no warpgroup-wide exchange is necessary. Products
// of two bf16 or fp16 values are exact in fp32 and are added to the accumulator one at a time in
// k order, as llmc/simt/include/tensor_core_simt.h does for mma.sync (the same error budget).
//
// Asynchrony, strictly. Issuing records the MMA (scheduler.cpp, "wgmma"); the wait computes it,
// reading the operand tiles and A's registers then, and only then writes the accumulators. A kernel
// that reads its accumulators before the wait, changes A's registers, or overwrites a tile before
// the wait therefore gets other numbers here, as it may on a GPU. The tiles are read as the async
// proxy sees them (scheduler.cpp keeps that copy): an operand element that differs from the shared
// memory then, a store not fenced by fence_proxy_async_shared() before the issue or a tile
// overwritten before the wait, stops the run. Issuing also checks what a GPU leaves undefined: a
// warp with missing lanes, a warpgroup with missing warps, lanes or warps of one warpgroup passing
// different descriptors, shapes or flags (and a warp that skips a wgmma its warpgroup issued, when
// the block ends), descriptor fields out of range, swizzled tiles off their pattern.
//
// Addresses. A descriptor's start address is the tile's offset in the block's dynamic shared
// memory (shared_address below), so operand tiles must live there; the allocation is 1024-byte
// aligned, so that a tile's address and offset agree in the swizzle pattern's bits.
#pragma once

#include "cuda_runtime.h"
#include "tensor_core_simt.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

// The offset of a dynamic shared memory address from the start of the block's dynamic shared
// memory: the 32-bit shared-window address a descriptor holds.
inline uint32_t shared_address(const void* p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    const char* base = static_cast<const char*>(simt::dynamic_shared_memory());
    const char* q = static_cast<const char*>(p);
    size_t size = simt::dynamic_shared_memory_size();
    if (!base || q < base || q >= base + size) {
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "shared_address(%p): not in this block's dynamic shared memory (%zu bytes): the CPU backend "
                 "addresses wgmma operands there only",
                 p, size);
        simt::fault(msg, file, line);
    }
    return (uint32_t)(q - base);
}

namespace simt {
namespace wg_detail {

// A decoded descriptor: where element (mn, k) of a 16-bit operand lives.
struct Operand {
    uint32_t start = 0, lbo = 0, sbo = 0;
    int swizzle_bits = 0;  // 0: none; 1, 2, 3: 32B, 64B, 128B (the XOR's width; the row is 16 << bits bytes)
    bool mn_major = false;

    // Byte offset of element (mn, k), 0 <= k < 16, in the dynamic shared memory (llmc/wgmma.cuh's
    // formulas, then the swizzle: bits 4.. XORed with bits 7..). The lowest 4 bits are (k % 8) * 2
    // (K-major) or (mn % 8) * 2 (MN-major), as the other terms are multiples of 16 and the swizzle
    // reads and writes bits 4 and up only: elements k .. k + 7 (K-major, k % 8 = 0), resp. mn .. mn + 7
    // (MN-major), lie in 16 consecutive bytes.
    uint32_t offset(int mn, int k) const {
        const int b = swizzle_bits;  // W = 2^b: the rows are 16·W bytes, an MN-major atom 8·W elements wide
        uint32_t off;
        if (!mn_major)
            off = b == 0 ? start + (mn % 8) * 16 + (mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 2
                         : start + ((mn % 8) << (4 + b)) + (mn / 8) * sbo + (k / 8) * 16 + (k % 8) * 2;
        else
            off = b == 0 ? start + (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                         : start + (mn & ((8 << b) - 1)) * 2 + (mn >> (3 + b)) * lbo + ((k % 8) << (4 + b)) +
                               (k / 8) * sbo;
        if (b) off ^= ((off >> 7) & ((1u << b) - 1)) << 4;
        return off;
    }
};

// Decodes a descriptor, stopping the run on what the PTX ISA leaves undefined or this backend does
// not model (a nonzero base offset).
inline Operand decode(uint64_t desc, bool mn_major, const char* which, const char* file, int line) {
    char msg[320];
    const uint64_t reserved = 0x3ull << 14 | 0x3ull << 30 | 0x7ull << 46 | 0x3FFull << 52;
    if (desc & reserved) {
        snprintf(msg, sizeof(msg), "wgmma: descriptor of %s 0x%016llx has reserved bits set", which,
                 (unsigned long long)desc);
        fault(msg, file, line);
    }
    if (desc >> 49 & 0x7) {
        snprintf(msg, sizeof(msg),
                 "wgmma: descriptor of %s has matrix base offset %d; the CPU backend models base offset 0 only "
                 "(tiles that start on their swizzle pattern)",
                 which, (int)(desc >> 49 & 0x7));
        fault(msg, file, line);
    }
    Operand o;
    o.start = (uint32_t)(desc & 0x3FFF) << 4;
    o.lbo = (uint32_t)(desc >> 16 & 0x3FFF) << 4;
    o.sbo = (uint32_t)(desc >> 32 & 0x3FFF) << 4;
    static const int bits_of_mode[4] = {0, 3, 2, 1};  // field value: none, 128B, 64B, 32B
    o.swizzle_bits = bits_of_mode[desc >> 62];
    o.mn_major = mn_major;
    if (o.swizzle_bits) {
        uint32_t row = 16u << o.swizzle_bits, pattern = 8 * row, at = o.start % pattern;
        // K-major: the k16 slice (32 bytes) lies in the pattern's first row; MN-major: the tile
        // starts the pattern.
        bool ok = mn_major ? at == 0 : at + 32 <= row;
        if (!ok) {
            snprintf(msg, sizeof(msg),
                     "wgmma: %s (%s, %u-byte swizzle) starts at shared offset %u, %u bytes into its %u-byte "
                     "swizzle pattern: %s",
                     which, mn_major ? "MN-major" : "K-major", row, o.start, at, pattern,
                     mn_major ? "an MN-major swizzled tile must start on a pattern"
                              : "a K-major one's 16 columns must lie in the pattern's first row");
            fault(msg, file, line);
        }
    }
    return o;
}

// Reads n <= 8 consecutive elements of operand `which` from shared offset `off` as the async proxy sees
// them (`view`) into out[0 .. n - 1]: elements (mn, k + i) when `along_k`, else (mn + i, k). Stops the
// run when one lies past the dynamic shared memory or the shared memory holds other bytes there
// (`smem`). A decoded Operand's formulas put eight such elements in one 16-byte run (Operand::offset).
template <class T>
inline void read_run(const char* smem, const char* view, size_t size, uint32_t off, int n, float* out,
                     const char* which, int mn, int k, bool along_k, const char* file, int line) {
    if (off + 2 * (size_t)n > size) {
        char msg[256];
        int i = off + 2 > size ? 0 : (int)((size - off) / 2);
        snprintf(msg, sizeof(msg),
                 "wgmma: element (%d, %d) of %s is at shared offset %u, past the %zu bytes of dynamic shared memory",
                 along_k ? mn : mn + i, along_k ? k + i : k, which, off + 2 * i, size);
        fault(msg, file, line);
    }
    uint16_t bits[8], live[8];
    std::memcpy(bits, view + off, 2 * n);
    std::memcpy(live, smem + off, 2 * n);
    for (int i = 0; i < n; i++) {
        if (bits[i] != live[i]) {
            char msg[400];
            snprintf(msg, sizeof(msg),
                     "wgmma: element (%d, %d) of %s at shared offset %u is 0x%04x in shared memory but 0x%04x as "
                     "wgmma reads it (the async proxy): stored without fence_proxy_async_shared() before the wgmma "
                     "was issued, or overwritten before its wait",
                     along_k ? mn : mn + i, along_k ? k + i : k, which, off + 2 * i, live[i], bits[i]);
            fault(msg, file, line);
        }
        out[i] = tc_detail::from_bits<T>(bits[i]);
    }
}

// What each lane passes to a wgmma, gathered per warp (one copy per worker OS thread, as
// tensor_core_simt.h's scratch).
struct IssueArgs {
    uint64_t desc_a, desc_b;
    bool accumulate;
    const uint32_t* a;  // wgmma_rs: the lane's A registers
};
inline thread_local IssueArgs issue_args[32][32];

// Stops the run unless the caller's warp is whole and its whole warpgroup exists, all lanes pass
// the same descriptors and flag, and this is the same wgmma as the rest of its warpgroup's
// (`shape`: N, the type and the layout flags); returns the warp's A register pointers (wgmma_rs).
inline std::array<const uint32_t*, 32> check_issue(const IssueArgs& mine, uint64_t shape, const char* what,
                                                   const char* file, int line) {
    tc_detail::require_full_warp(what, file, line);
    unsigned threads = blockDim.x * blockDim.y * blockDim.z, warp = tc_detail::warp_index();
    char msg[256];
    if (threads < (warp / 4 + 1) * 128) {
        snprintf(msg, sizeof(msg),
                 "%s needs all 4 warps of warpgroup %u (threads %u..%u), but the block has %u threads", what,
                 warp / 4, warp / 4 * 128, warp / 4 * 128 + 127, threads);
        fault(msg, file, line);
    }
    IssueArgs* args = issue_args[warp];
    unsigned lane = lane_id();
    args[lane] = mine;
    __syncwarp(0xffffffffu, file, line);  // every lane's arguments are in the scratch
    std::array<const uint32_t*, 32> a{};
    for (int l = 0; l < 32; l++) {
        if (args[l].desc_a != args[0].desc_a || args[l].desc_b != args[0].desc_b ||
            args[l].accumulate != args[0].accumulate) {
            snprintf(msg, sizeof(msg), "%s: lane %d passes other descriptors or another accumulate flag than lane 0",
                     what, l);
            fault(msg, file, line);
        }
        a[l] = args[l].a;
    }
    if (lane == 0) {
        const uint64_t key[3] = {mine.desc_a, mine.desc_b, shape << 1 | (mine.accumulate ? 1 : 0)};
        warp_wgmma_issue(key, what, file, line);
    }
    __syncwarp(0xffffffffu, file, line);  // nobody overwrites the scratch while a lane still reads it
    return a;
}

// Issues D = A·B (+ D): A from a descriptor (a_regs empty) or from the warp's registers.
template <int N, class T>
inline void issue(float* d, bool reg_a, uint64_t desc_a, bool trans_a, const uint32_t* a, uint64_t desc_b,
                  bool trans_b, bool accumulate, const char* what, const char* file, int line) {
    const uint64_t shape = (uint64_t)N << 4 | (std::is_same<T, __half>::value ? 8 : 0) | (reg_a ? 4 : 0) |
                           (trans_a ? 2 : 0) | (trans_b ? 1 : 0);
    std::array<const uint32_t*, 32> a_regs = check_issue({desc_a, desc_b, accumulate, a}, shape, what, file, line);
    int row0 = 16 * (tc_detail::warp_index() % 4);
    int lane = (int)lane_id(), g = lane / 4, t = lane % 4;
    Operand A = reg_a ? Operand{} : decode(desc_a, trans_a, "A", file, line);
    Operand B = decode(desc_b, trans_b, "B", file, line);
    wgmma_issue(
        [=] {
            const char* smem = static_cast<const char*>(dynamic_shared_memory());
            const char* view = static_cast<const char*>(async_proxy_shared_memory());
            const size_t size = dynamic_shared_memory_size();
            float a_rows[2][16];  // A(row0 + g + 8h, k)
            for (int h = 0; h < 2; h++) {
                if (reg_a) {  // mma.sync's A layout within the warp's 16 rows
                    for (int k = 0; k < 16; k++) {
                        int r = g + 8 * h;
                        uint32_t reg = a_regs[(r % 8) * 4 + (k % 8) / 2][r / 8 + 2 * (k / 8)];
                        a_rows[h][k] = tc_detail::element<T>(reg, k % 2);
                    }
                    continue;
                }
                int r = row0 + g + 8 * h;
                if (!trans_a)  // K-major: k = 0 .. 7 and 8 .. 15 are runs
                    for (int k = 0; k < 16; k += 8)
                        read_run<T>(smem, view, size, A.offset(r, k), 8, &a_rows[h][k], "A", r, k, true, file, line);
                else  // MN-major: the row's elements are 16 bytes or more apart
                    for (int k = 0; k < 16; k++)
                        read_run<T>(smem, view, size, A.offset(r, k), 1, &a_rows[h][k], "A", r, k, false, file, line);
            }
            float b_cols[N / 4][16];  // B(k, 8j + 2t + e) at [2j + e][k]: the columns this lane's outputs use
            for (int j = 0; j < N / 8; j++) {
                const int col = 8 * j + 2 * t;
                if (!trans_b) {  // K-major: runs along k, as A's
                    for (int e = 0; e < 2; e++)
                        for (int k = 0; k < 16; k += 8)
                            read_run<T>(smem, view, size, B.offset(col + e, k), 8, &b_cols[2 * j + e][k], "B",
                                        col + e, k, true, file, line);
                } else {  // MN-major: columns 2t and 2t + 1 are neighbours
                    for (int k = 0; k < 16; k++) {
                        float pair[2];
                        read_run<T>(smem, view, size, B.offset(col, k), 2, pair, "B", col, k, false, file, line);
                        b_cols[2 * j][k] = pair[0];
                        b_cols[2 * j + 1][k] = pair[1];
                    }
                }
            }
            for (int i = 0; i < N / 2; i++) {
                const int h = (i / 2) % 2, c = 2 * (i / 4) + i % 2;  // rows g + 8h; column 8 (i / 4) + 2t + i % 2
                float acc = accumulate ? d[i] : 0.f;
                for (int k = 0; k < 16; k++) acc += a_rows[h][k] * b_cols[c][k];
                d[i] = acc;
            }
        },
        file, line);
}

}  // namespace wg_detail
}  // namespace simt

inline uint64_t wgmma_descriptor(const void* tile, WgmmaSwizzle swizzle, uint32_t lbo, uint32_t sbo,
                                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    char msg[256];
    if (reinterpret_cast<uintptr_t>(tile) % 16 || lbo % 16 || sbo % 16 || lbo >= (1u << 18) || sbo >= (1u << 18)) {
        snprintf(msg, sizeof(msg),
                 "wgmma_descriptor(%p, lbo %u, sbo %u): the address and both offsets must be multiples of 16 "
                 "and the offsets below 2^18 (14-bit fields in 16-byte units)",
                 tile, lbo, sbo);
        simt::fault(msg, file, line);
    }
    return wgmma_encode_descriptor(shared_address(tile, file, line), swizzle, lbo, sbo);
}

inline void wgmma_fence(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::tc_detail::require_full_warp("wgmma.fence", file, line);
    simt::wgmma_fence(file, line);
}
inline void wgmma_commit(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::tc_detail::require_full_warp("wgmma.commit_group", file, line);
    simt::wgmma_commit(file, line);
}
// All lanes arrive before any computes (a wgmma_rs reads the other lanes' A registers), and none
// leaves before all have computed.
template <int P>
inline void wgmma_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(P >= 0 && P <= 7, "wgmma_wait<P>: P is how many of the newest groups may stay pending (0..7)");
    simt::tc_detail::require_full_warp("wgmma.wait_group", file, line);
    __syncwarp(0xffffffffu, file, line);
    simt::wgmma_wait(P, file, line);
    __syncwarp(0xffffffffu, file, line);
}
template <int M>
inline void wgmma_fence_operand(float (&)[M]) {}
inline void fence_proxy_async_shared(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::fence_proxy_async(file, line);
}

template <int N, class T, bool TransA = false, bool TransB = false>
inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(N == 64 || N == 128, "wgmma_ss: N is 64 or 128");
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "wgmma_ss: the inputs are __nv_bfloat16 or __half");
    simt::wg_detail::issue<N, T>(d, false, desc_a, TransA, nullptr, desc_b, TransB, accumulate,
                                 "wgmma.mma_async (A and B in shared memory)", file, line);
}

template <int N, class T, bool TransB = false>
inline void wgmma_rs(float (&d)[N / 2], uint32_t (&a)[4], uint64_t desc_b, bool accumulate,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(N == 64 || N == 128, "wgmma_rs: N is 64 or 128");
    static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value,
                  "wgmma_rs: the inputs are __nv_bfloat16 or __half");
    simt::wg_detail::issue<N, T>(d, true, 0, false, a, desc_b, TransB, accumulate,
                                 "wgmma.mma_async (A in registers)", file, line);
}
