// test/test_wgmma.cu — tests llmc/wgmma.cuh: the descriptor's fields, the shared-memory layouts (every swizzle, K- and MN-major), the register layouts of A and D, chained k-steps and commit groups, against the PTX ISA (transcribed below) and plain math.
//
// Layouts. The host places each operand tile in a shared-memory image with tile_offset below, the
// canonical layouts of the PTX ISA ("Shared Memory Matrix Layout" of wgmma) written for a whole
// tile, independently of the per-descriptor formulas the CPU backend decodes; it packs A's
// registers and unpacks D with the register tables. A layout that differs gives wrong numbers.
// The read-outs use small integers (row or column indices, exact in bf16 and fp16) and one-hot
// selectors, so they compare bit for bit.
//
// Tolerance of the random checks: as test/test_tensor_core.cu's, K fp32 additions (K = 64 here,
// four k16 steps) each erring by at most one ulp of a partial sum bounded by S = |c| + Σ|a·b|:
// |out - ref| <= K · 2^-23 · S.
//
// On a GPU the tests need an sm_90a build on compute capability 9.0 (wgmma_supported); elsewhere
// they print one SKIP line.
#include "../llmc/wgmma.cuh"
#include "../llmc/cuda_common.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

// ----------------------------------------------------------------------------
// The PTX ISA's layouts, transcribed

struct RowCol {
    int row, col;
};

// "Register fragment layout for accumulator matrix D" of wgmma .m64nNk16: thread t of the
// warpgroup (warp w = t / 32, lane l) holds N / 2 fp32 values; d_i is at
//     row = 16w + l / 4 + 8 · ((i / 2) % 2),   col = 8 · (i / 4) + 2 · (l % 4) + i % 2
static RowCol ptx_d(int thread, int i) {
    int w = thread / 32, l = thread % 32;
    return {16 * w + l / 4 + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * (l % 4) + i % 2};
}
// "Register fragment layout for matrix A" (A in registers): warp w holds rows 16w .. 16w + 15, 4
// .b32 registers per thread, elements a0..a7 (two per register, the first in the low half):
//     row = 16w + groupID for a0, a1, a4, a5; 16w + groupID + 8 for a2, a3, a6, a7
//     col = 2 · threadID_in_group + (i & 1), + 8 for a4..a7
static RowCol ptx_a(int thread, int i) {
    int w = thread / 32, l = thread % 32, g = l / 4, t = l % 4;
    int row = 16 * w + ((i < 2 || (4 <= i && i < 6)) ? g : g + 8);
    return {row, 2 * t + (i & 1) + (i >= 4 ? 8 : 0)};
}
// "Matrix Descriptor Format": bits 13-0 the start address, encoded as (addr & 0x3FFFF) >> 4; 29-16
// the leading dimension byte offset and 45-32 the stride dimension byte offset, encoded the same
// way; 51-49 the base offset; 63-62 the swizzle mode, 0 none, 1 128-byte, 2 64-byte, 3 32-byte.
static uint64_t ptx_descriptor(uint32_t addr, int swizzle_bytes, uint32_t lbo, uint32_t sbo) {
    uint64_t mode = swizzle_bytes == 128 ? 1 : swizzle_bytes == 64 ? 2 : swizzle_bytes == 32 ? 3 : 0;
    auto enc = [](uint32_t x) { return (uint64_t)((x & 0x3FFFF) >> 4); };
    return enc(addr) | enc(lbo) << 16 | enc(sbo) << 32 | mode << 62;
}

// A whole operand tile (MN × K, 16-bit elements) in the canonical layout, at `base` (a multiple of
// 1024) of the shared-memory image. The atoms: K-major, 8 rows of MN by `row` bytes of K
// (row = 16 bytes unswizzled, else the swizzle's width); MN-major, 8 rows of K by `row` bytes of MN.
// Atoms are laid out MN first, then K. A swizzled layout permutes 16-byte chunks within each
// 128-byte line of the tile: chunk c of line l is stored at chunk c XOR (l mod (row / 16)), i.e.
// address bits 4.. XORed with bits 7.. (CUTLASS's Swizzle<1|2|3, 4, 3>).
struct Tile {
    int swizzle_bytes;  // 0 (none), 32, 64, 128
    bool mn_major;
    int MN, K;
    uint32_t base;

    uint32_t row() const { return swizzle_bytes ? swizzle_bytes : 16; }
    uint32_t elems() const { return row() / 2; }  // elements per atom row
    uint32_t atom_bytes() const { return 8 * row(); }
    uint32_t bytes() const {  // whole atoms: a K-major tile narrower than its swizzle still fills the rows
        if (!mn_major) return (K + elems() - 1) / elems() * (MN / 8) * atom_bytes();
        return (K + 7) / 8 * (MN / elems()) * atom_bytes();
    }
    uint32_t offset(int mn, int k) const {
        uint32_t off;
        if (!mn_major) {
            uint32_t atoms_mn = MN / 8;
            off = ((k / elems()) * atoms_mn + mn / 8) * atom_bytes() + (mn % 8) * row() + (k % elems()) * 2;
        } else {
            uint32_t atoms_mn = MN / elems();
            off = ((k / 8) * atoms_mn + mn / elems()) * atom_bytes() + (k % 8) * row() + (mn % elems()) * 2;
        }
        if (swizzle_bytes) {
            uint32_t line = off / 128, chunk = off % 128 / 16;
            off = off - chunk * 16 + (chunk ^ (line % (row() / 16))) * 16;
        }
        return base + off;
    }
    // The descriptor of k16 step s: its start (element (0, 16s) before swizzling, which leaves the
    // pattern's first row in place) and the two offsets.
    uint32_t start(int s) const {
        uint32_t k0 = 16 * s;
        if (!mn_major) return base + (k0 / elems()) * (MN / 8) * atom_bytes() + (k0 % elems()) * 2;
        return base + (k0 / 8) * (MN / elems()) * atom_bytes();
    }
    // K-major: sbo steps 8 rows of MN, lbo 8 columns of K (unswizzled only; 16 otherwise).
    // MN-major unswizzled: sbo steps 8 of MN, lbo 8 rows of K; swizzled: lbo steps an atom of MN,
    // sbo 8 rows of K.
    uint32_t lbo() const {
        if (!mn_major) return swizzle_bytes ? 16 : (MN / 8) * atom_bytes();
        return swizzle_bytes ? atom_bytes() : (MN / elems()) * atom_bytes();
    }
    uint32_t sbo() const {
        if (!mn_major) return atom_bytes();
        return swizzle_bytes ? (MN / elems()) * atom_bytes() : atom_bytes();
    }
    WgmmaSwizzle mode() const {
        return swizzle_bytes == 128 ? WgmmaSwizzle::B128
               : swizzle_bytes == 64 ? WgmmaSwizzle::B64
               : swizzle_bytes == 32 ? WgmmaSwizzle::B32
                                     : WgmmaSwizzle::None;
    }
};

// ----------------------------------------------------------------------------
// The kernel: copies the image to shared memory, runs KS k16 steps D = A·B (+ C) in one commit
// group, writes D's registers out.

constexpr int kMaxSteps = 4;

struct Setup {
    uint32_t a_start[kMaxSteps], b_start[kMaxSteps];
    uint32_t lbo_a, sbo_a, lbo_b, sbo_b;
    WgmmaSwizzle swizzle_a, swizzle_b;
    int accumulate;
    int image_bytes;
};

// Tiles sit at multiples of 1024 from the first such boundary of the dynamic shared memory.
__device__ inline char* aligned_shared(char* raw) { return raw + (1024 - shared_address(raw) % 1024) % 1024; }

template <int N, class T, bool TransA, bool TransB, bool RegA, int KS>
__global__ void wgmma_kernel(const uint4* image, Setup s, const uint32_t* a_regs, const float* c, float* d) {
    char* smem = aligned_shared(dynamic_shared<char>());
    for (int i = threadIdx.x; i < s.image_bytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = image[i];
    fence_proxy_async_shared();
    __syncthreads();
    int tid = threadIdx.x;
    float acc[N / 2];
    for (int i = 0; i < N / 2; i++) acc[i] = c[tid * (N / 2) + i];
    uint32_t a[KS][4];
    for (int ks = 0; ks < KS; ks++)
        for (int j = 0; j < 4; j++) a[ks][j] = RegA ? a_regs[(tid * KS + ks) * 4 + j] : 0u;
    wgmma_fence_operand(acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint64_t db = wgmma_descriptor(smem + s.b_start[ks], s.swizzle_b, s.lbo_b, s.sbo_b);
        if constexpr (RegA) {
            wgmma_rs<N, T, TransB>(acc, a[ks], db, s.accumulate || ks > 0);
        } else {
            uint64_t da = wgmma_descriptor(smem + s.a_start[ks], s.swizzle_a, s.lbo_a, s.sbo_a);
            wgmma_ss<N, T, TransA, TransB>(acc, da, db, s.accumulate || ks > 0);
        }
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    for (int i = 0; i < N / 2; i++) d[tid * (N / 2) + i] = acc[i];
}

template <class T>
static uint16_t bits_of(float x) {
    T v = from_float<T>(x);
    uint16_t b;
    memcpy(&b, &v, 2);
    return b;
}

// One configuration: element types, N, majors and swizzles of A and B, A in registers or not.
template <int N, class T, bool TransA, bool TransB, bool RegA, int KS>
struct Case {
    int swizzle_a, swizzle_b;
    Tile ta() const { return {swizzle_a, TransA, 64, 16 * KS, 0}; }
    Tile tb() const { return {swizzle_b, TransB, N, 16 * KS, (ta().bytes() + 1023) / 1024 * 1024}; }

    // D (64×N row-major) = A (64×K) · B (K×N) + (accumulate ? C : 0) on the device.
    std::vector<float> run(const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& C,
                           bool accumulate) const {
        const int K = 16 * KS;
        Tile a_tile = ta(), b_tile = tb();
        uint32_t image_bytes = b_tile.base + b_tile.bytes();
        std::vector<uint8_t> image(image_bytes, 0);
        auto put = [&](uint32_t off, float v) {
            uint16_t b = bits_of<T>(v);
            memcpy(&image[off], &b, 2);
        };
        for (int r = 0; r < 64; r++)
            for (int k = 0; k < K; k++) put(a_tile.offset(r, k), A[r * K + k]);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) put(b_tile.offset(n, k), B[k * N + n]);
        std::vector<uint32_t> regs(128 * KS * 4, 0);
        for (int t = 0; t < 128; t++)
            for (int ks = 0; ks < KS; ks++)
                for (int i = 0; i < 8; i++) {
                    RowCol rc = ptx_a(t, i);
                    regs[(t * KS + ks) * 4 + i / 2] |= (uint32_t)bits_of<T>(A[rc.row * K + 16 * ks + rc.col])
                                                       << (16 * (i % 2));
                }
        std::vector<float> c_regs(128 * (N / 2));
        for (int t = 0; t < 128; t++)
            for (int i = 0; i < N / 2; i++) c_regs[t * (N / 2) + i] = C[ptx_d(t, i).row * N + ptx_d(t, i).col];
        Setup s = {};
        for (int ks = 0; ks < KS; ks++) {
            s.a_start[ks] = a_tile.start(ks);
            s.b_start[ks] = b_tile.start(ks);
        }
        s.lbo_a = a_tile.lbo();
        s.sbo_a = a_tile.sbo();
        s.lbo_b = b_tile.lbo();
        s.sbo_b = b_tile.sbo();
        s.swizzle_a = a_tile.mode();
        s.swizzle_b = b_tile.mode();
        s.accumulate = accumulate;
        s.image_bytes = (int)image_bytes;
        std::vector<uint4> image4(image_bytes / 16);
        memcpy(image4.data(), image.data(), image_bytes);
        th::DeviceBuffer<uint4> dimage(image4);
        th::DeviceBuffer<uint32_t> dregs(regs);
        th::DeviceBuffer<float> dc(c_regs), dd(128 * (N / 2), th::Fill::NaN);
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(1);
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = image_bytes + 1024;
        cudaCheck(cudaLaunchKernelEx(&cfg, wgmma_kernel<N, T, TransA, TransB, RegA, KS>, (const uint4*)dimage.ptr, s,
                                     (const uint32_t*)dregs.ptr, (const float*)dc.ptr, dd.ptr));
        cudaCheck(cudaDeviceSynchronize());
        std::vector<float> out = dd.host(), D(64 * N);
        for (int t = 0; t < 128; t++)
            for (int i = 0; i < N / 2; i++) D[ptx_d(t, i).row * N + ptx_d(t, i).col] = out[t * (N / 2) + i];
        return D;
    }

    std::string name(const char* what) const {
        auto layout = [](bool mn, int sw) {
            return std::string(mn ? "MN/" : "K/") + (sw ? std::to_string(sw) + "B" : std::string("none"));
        };
        return "wgmma m64n" + std::to_string(N) + "k16 " + th::dtype_name<T>() + ", A " +
               (RegA ? std::string("registers") : layout(TransA, swizzle_a)) + ", B " + layout(TransB, swizzle_b) +
               ": " + what;
    }
};

// ----------------------------------------------------------------------------
// 1. Layouts: each operand read out through a one-hot selector (exact)

// D = A·B with A = row or column indices of itself and B a selector picking column n % 16 of A,
// then with A a selector picking row r % 16 of B (its row or column indices), then A = 0 with C
// accumulated (D = C), then C present but not accumulated (D = the first read-out).
template <int N, class T, bool TransA, bool TransB, bool RegA>
static void test_layouts(int swizzle_a, int swizzle_b) {
    Case<N, T, TransA, TransB, RegA, 1> c{swizzle_a, swizzle_b};
    std::vector<float> A_rows(64 * 16), A_cols(64 * 16), sel_b(16 * N, 0.f), sel_a(64 * 16, 0.f), B_rows(16 * N),
        B_cols(16 * N), zero_a(64 * 16, 0.f), zero_c(64 * N, 0.f), C(64 * N);
    for (int r = 0; r < 64; r++)
        for (int k = 0; k < 16; k++) {
            A_rows[r * 16 + k] = (float)(r + 1);
            A_cols[r * 16 + k] = (float)(k + 1);
            sel_a[r * 16 + k] = (r % 16 == k) ? 1.f : 0.f;
        }
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < N; n++) {
            sel_b[k * N + n] = (n % 16 == k) ? 1.f : 0.f;
            B_rows[k * N + n] = (float)(k + 1);
            B_cols[k * N + n] = (float)(n + 1);
        }
    for (int e = 0; e < 64 * N; e++) C[e] = (float)(e + 1);
    std::string name = c.name("layouts of A, B, D (one-hot read-outs, exact)");
    std::vector<float> got = th::run_orders(name.c_str(), [&] {
        std::vector<float> all;
        for (auto part : {c.run(A_rows, sel_b, zero_c, false), c.run(A_cols, sel_b, zero_c, false),
                          c.run(sel_a, B_rows, zero_c, false), c.run(sel_a, B_cols, zero_c, false),
                          c.run(zero_a, sel_b, C, true), c.run(A_rows, sel_b, C, false)})
            all.insert(all.end(), part.begin(), part.end());
        return all;
    });
    std::vector<float> want;
    for (int part = 0; part < 6; part++)
        for (int r = 0; r < 64; r++)
            for (int n = 0; n < N; n++) {
                float v = part == 0 || part == 5 ? (float)(r + 1)
                          : part == 1            ? (float)(n % 16 + 1)
                          : part == 2            ? (float)(r % 16 + 1)
                          : part == 3            ? (float)(n + 1)
                                                 : C[r * N + n];
                want.push_back(v);
            }
    static const char* parts[6] = {"A's rows", "A's columns", "B's rows", "B's columns", "D = C (A = 0)",
                                   "accumulate off ignores C"};
    int bad = 0, first = -1;
    for (size_t e = 0; e < want.size(); e++)
        if (got[e] != want[e] && bad++ == 0) first = (int)e;
    if (bad == 0) th::report(true, name.c_str(), "all %zu elements of 6 read-outs exact", want.size());
    else {
        int part = first / (64 * N), r = first % (64 * N) / N, n = first % N;
        th::report(false, name.c_str(), "%d wrong, first in %s: D(%d,%d)=%g want %g", bad, parts[part], r, n,
                   got[first], want[first]);
    }
}

// ----------------------------------------------------------------------------
// 2. Random inputs, four k16 steps in one group, accumulating onto C

template <int N, class T, bool TransA, bool TransB, bool RegA>
static void test_random(int swizzle_a, int swizzle_b, uint64_t seed) {
    constexpr int KS = 4, K = 16 * KS;
    Case<N, T, TransA, TransB, RegA, KS> c{swizzle_a, swizzle_b};
    std::vector<float> A(64 * K), B(K * N), C(64 * N);
    std::vector<T> a = th::random_tensor<T>(A.size(), seed), b = th::random_tensor<T>(B.size(), seed + 1);
    for (size_t e = 0; e < A.size(); e++) A[e] = (float)th::to_double(a[e]);
    for (size_t e = 0; e < B.size(); e++) B[e] = (float)th::to_double(b[e]);
    th::fill_uniform(C.data(), C.size(), seed + 2, -4.f, 4.f);
    std::string name = c.name("K=64 in 4 steps onto C, random, vs fp64 reference");
    std::vector<float> D = th::run_orders(name.c_str(), [&] { return c.run(A, B, C, true); });
    std::vector<double> ref(64 * N), budget(64 * N);
    for (int r = 0; r < 64; r++)
        for (int n = 0; n < N; n++) {
            double acc = C[r * N + n], sum_abs = std::fabs(C[r * N + n]);
            for (int k = 0; k < K; k++) {
                acc += (double)A[r * K + k] * B[k * N + n];
                sum_abs += std::fabs((double)A[r * K + k] * B[k * N + n]);
            }
            ref[r * N + n] = acc;
            budget[r * N + n] = K * th::EPS_FP32 * sum_abs;
        }
    th::check_budget(name.c_str(), ref, D, budget);
}

// ----------------------------------------------------------------------------
// 3. Descriptor fields against the PTX ISA's table

__global__ void descriptor_kernel(uint64_t* out, uint32_t* addr) {
    char* smem = aligned_shared(dynamic_shared<char>());
    const uint32_t offsets[4] = {0, 1024 + 32, 4096 + 16, 8192};
    const WgmmaSwizzle modes[4] = {WgmmaSwizzle::None, WgmmaSwizzle::B128, WgmmaSwizzle::B64, WgmmaSwizzle::B32};
    const uint32_t lbo[4] = {2048, 16, 16, 256}, sbo[4] = {128, 1024, 512, 8192};
    for (int i = 0; i < 4; i++) {
        out[i] = wgmma_descriptor(smem + offsets[i], modes[i], lbo[i], sbo[i]);
        addr[i] = shared_address(smem + offsets[i]);
    }
}

static void test_descriptor() {
    th::DeviceBuffer<uint64_t> dout(4, th::Fill::Zero);
    th::DeviceBuffer<uint32_t> daddr(4, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(1);
    cfg.dynamicSmemBytes = 16384;
    cudaCheck(cudaLaunchKernelEx(&cfg, descriptor_kernel, dout.ptr, daddr.ptr));
    cudaCheck(cudaDeviceSynchronize());
    std::vector<uint64_t> got = dout.host();
    std::vector<uint32_t> addr = daddr.host();
    const int swizzle[4] = {0, 128, 64, 32};
    const uint32_t lbo[4] = {2048, 16, 16, 256}, sbo[4] = {128, 1024, 512, 8192};
    int bad = 0;
    for (int i = 0; i < 4; i++)
        if (got[i] != ptx_descriptor(addr[i], swizzle[i], lbo[i], sbo[i])) bad++;
    th::report(bad == 0, "wgmma descriptor fields (start, LBO, SBO, swizzle) vs the PTX ISA's table",
               bad ? "%d of 4 differ, first 0x%016llx" : "4 descriptors, all swizzle modes", bad,
               (unsigned long long)got[0]);
}

// ----------------------------------------------------------------------------
// 4. Commit groups: wait<1> completes the older group only

// Two groups of one k16 step each into separate accumulators; after wait<1> the first holds its
// result; on the CPU backend the second still holds C, the latest a GPU may write it. After
// wait<0> both hold theirs.
__global__ void groups_kernel(const uint4* image, Setup s, float* early, float* late) {
    char* smem = aligned_shared(dynamic_shared<char>());
    for (int i = threadIdx.x; i < s.image_bytes / 16; i += blockDim.x) reinterpret_cast<uint4*>(smem)[i] = image[i];
    fence_proxy_async_shared();
    __syncthreads();
    float first[32], second[32];
    for (int i = 0; i < 32; i++) first[i] = second[i] = 1.f;
    uint64_t da = wgmma_descriptor(smem + s.a_start[0], s.swizzle_a, s.lbo_a, s.sbo_a);
    uint64_t db = wgmma_descriptor(smem + s.b_start[0], s.swizzle_b, s.lbo_b, s.sbo_b);
    wgmma_fence_operand(first);
    wgmma_fence_operand(second);
    wgmma_fence();
    wgmma_ss<64, __nv_bfloat16>(first, da, db, true);
    wgmma_commit();
    wgmma_ss<64, __nv_bfloat16>(second, da, db, true);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_fence_operand(first);
    for (int i = 0; i < 32; i++) early[threadIdx.x * 64 + i] = first[i];
#if defined(SIMT_CPU)
    for (int i = 0; i < 32; i++) early[threadIdx.x * 64 + 32 + i] = second[i];
#endif
    wgmma_wait<0>();
    wgmma_fence_operand(second);
    for (int i = 0; i < 32; i++) late[threadIdx.x * 32 + i] = second[i];
}

static void test_groups() {
    // A = all ones (64×16), B = all ones (16×64): every product sum is 16, plus C = 1.
    Tile a{128, false, 64, 16, 0}, b{128, false, 64, 16, 0};
    b.base = a.bytes();
    const uint32_t image_bytes = b.base + b.bytes();
    std::vector<uint8_t> image(image_bytes, 0);
    uint16_t one = bits_of<__nv_bfloat16>(1.f);
    for (int r = 0; r < 64; r++)
        for (int k = 0; k < 16; k++) {
            memcpy(&image[a.offset(r, k)], &one, 2);
            memcpy(&image[b.offset(r, k)], &one, 2);
        }
    Setup s = {};
    s.a_start[0] = a.start(0);
    s.b_start[0] = b.start(0);
    s.lbo_a = a.lbo();
    s.sbo_a = a.sbo();
    s.lbo_b = b.lbo();
    s.sbo_b = b.sbo();
    s.swizzle_a = s.swizzle_b = WgmmaSwizzle::B128;
    s.image_bytes = (int)image_bytes;
    std::vector<uint4> image4(image_bytes / 16);
    memcpy(image4.data(), image.data(), image_bytes);
    th::DeviceBuffer<uint4> dimage(image4);
    th::DeviceBuffer<float> dearly(128 * 64, th::Fill::Zero), dlate(128 * 32, th::Fill::Zero);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = image_bytes + 1024;
    cudaCheck(cudaLaunchKernelEx(&cfg, groups_kernel, (const uint4*)dimage.ptr, s, dearly.ptr, dlate.ptr));
    cudaCheck(cudaDeviceSynchronize());
    std::vector<float> early = dearly.host(), late = dlate.host();
    int bad_first = 0, bad_pending = 0, bad_late = 0;
    for (int t = 0; t < 128; t++)
        for (int i = 0; i < 32; i++) {
            bad_first += early[t * 64 + i] != 17.f;
            bad_late += late[t * 32 + i] != 17.f;
#if defined(SIMT_CPU)
            bad_pending += early[t * 64 + 32 + i] != 1.f;
#endif
        }
    th::report(bad_first == 0 && bad_pending == 0 && bad_late == 0,
               "wgmma commit groups: wait<1> completes the older group, wait<0> both",
               "wrong: %d after wait<1>, %d pending ones written early (CPU backend), %d after wait<0>", bad_first,
               bad_pending, bad_late);
}

// ----------------------------------------------------------------------------
// 5. (CPU backend) what a GPU leaves undefined stops the run with a message

#if defined(SIMT_CPU)
// Variants of a minimal wgmma: 0 no fence, 1 a tile 112 bytes into its 128B pattern, 2 lane 5
// passes another descriptor, 3 exits without waiting, 4 B past the dynamic shared memory, 5 a
// nonzero base offset, 6 a descriptor of static shared memory, 7 tiles stored without
// fence_proxy_async_shared, 8 warp 2 passes another B, 9 warp 3 skips the wgmma, 10 B overwritten
// (and fenced) before the wait. Without variant 7's stores the tiles hold the block's initial bytes.
__global__ void wgmma_fault_kernel(int variant) {
    char* smem = aligned_shared(dynamic_shared<char>());
    alignas(1024) __shared__ char static_tile[2048];
    static_tile[threadIdx.x] = 0;
    if (variant == 7) {
        for (int i = threadIdx.x; i < 16384; i += blockDim.x) smem[i] = 0;
        __syncthreads();
    }
    float acc[32] = {};
    uint32_t a_off = variant == 1 ? 112 : 0, b_off = variant == 4 ? 12288 : 8192;  // tiles of 8192 bytes
    if (variant == 2 && threadIdx.x % 32 == 5) a_off = 1024;
    if (variant == 8 && threadIdx.x / 32 == 2) b_off = 9216;
    uint64_t da = variant == 6 ? wgmma_descriptor(static_tile, WgmmaSwizzle::B128, 16, 1024)
                               : wgmma_descriptor(smem + a_off, WgmmaSwizzle::B128, 16, 1024);
    if (variant == 5) da |= 1ull << 49;
    uint64_t db = wgmma_descriptor(smem + b_off, WgmmaSwizzle::B128, 16, 1024);
    if (variant == 9 && threadIdx.x / 32 == 3) return;
    if (variant != 0) wgmma_fence();
    wgmma_ss<64, __nv_bfloat16>(acc, da, db, false);
    wgmma_commit();
    if (variant == 10) {  // each warp stores into row 0 of B, whose first 32 bytes its lane 0 reads
        smem[8192 + threadIdx.x % 32 * 2] = 0x11;
        fence_proxy_async_shared();
    }
    if (variant != 3) wgmma_wait<0>();
}
__global__ void wgmma_two_warps_kernel() {
    char* smem = aligned_shared(dynamic_shared<char>());
    float acc[32] = {};
    uint64_t d = wgmma_descriptor(smem, WgmmaSwizzle::B128, 16, 1024);
    wgmma_fence();
    wgmma_ss<64, __nv_bfloat16>(acc, d, d, false);
    wgmma_commit();
    wgmma_wait<0>();
}

static void test_faults() {
    if (!th::can_run_fault_tests()) return;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = 16384 + 1024;
    struct {
        int variant;
        const char *name, *expect;
    } cases[] = {
        {0, "fault: wgmma without wgmma_fence", "without a wgmma.fence"},
        {1, "fault: 128B-swizzled K-major tile off its pattern", "first row"},
        {2, "fault: lanes passing different descriptors", "lane 5 passes other descriptors"},
        {3, "fault: exit with a wgmma never waited for", "never waited for"},
        {4, "fault: B past the dynamic shared memory", "past the"},
        {5, "fault: descriptor with a base offset", "base offset 1"},
        {6, "fault: descriptor of static shared memory", "not in this block's dynamic shared memory"},
        {7, "fault: tiles stored without fence_proxy_async_shared", "stored without fence_proxy_async_shared()"},
        {8, "fault: one warp of the warpgroup passes another descriptor", "differs from warp"},
        {9, "fault: one warp of the warpgroup skips the wgmma", "but never by warp(s) 3"},
        {10, "fault: an operand tile overwritten before the wait", "overwritten before its wait"},
    };
    for (auto& c : cases)
        th::expect_fault(c.name, c.expect, [&] { cudaLaunchKernelEx(&cfg, wgmma_fault_kernel, c.variant); });
    cfg.blockDim = dim3(64);
    th::expect_fault("fault: wgmma by a 64-thread block", "needs all 4 warps of warpgroup 0",
                     [&] { cudaLaunchKernelEx(&cfg, wgmma_two_warps_kernel); });
}
#endif

int main() {
    if (!wgmma_supported()) {
        printf("SKIP wgmma tests: the device has no wgmma code (an sm_90a build on compute capability 9.0)\n");
        return th::finish();
    }
    test_descriptor();
    using bf16 = __nv_bfloat16;
    // Every swizzle, both majors of A and B (shared-memory A), N = 64.
    for (int sw : {0, 32, 64, 128}) {
        test_layouts<64, bf16, false, false, false>(sw, sw);
        test_layouts<64, bf16, true, true, false>(sw, sw);
    }
    test_layouts<64, bf16, false, true, false>(128, 64);
    test_layouts<64, bf16, true, false, false>(32, 128);
    // A in registers; N = 128; fp16.
    for (int sw : {0, 128}) {
        test_layouts<64, bf16, false, false, true>(0, sw);
        test_layouts<64, bf16, false, true, true>(0, sw);
    }
    test_layouts<128, bf16, false, false, false>(128, 128);
    test_layouts<128, bf16, false, true, false>(128, 128);
    test_layouts<128, bf16, false, true, true>(0, 64);
    test_layouts<64, __half, false, false, false>(128, 128);
    test_layouts<64, __half, false, true, true>(0, 128);
    // The layouts attention uses: Q·Kᵀ (K-major both), P·V and Pᵀ·dO (B MN-major), A from registers.
    test_random<64, bf16, false, false, false>(128, 128, 1);
    test_random<128, bf16, false, true, false>(128, 128, 2);
    test_random<64, bf16, false, false, true>(0, 128, 3);
    test_random<128, __half, false, true, true>(0, 128, 4);
    test_random<64, bf16, true, true, false>(64, 32, 5);
    test_groups();
#if defined(SIMT_CPU)
    test_faults();
#endif
    return th::finish();
}
