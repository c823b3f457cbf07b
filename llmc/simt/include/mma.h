// llmc/simt/include/mma.h — the CPU backend's stand-in for <mma.h>: nvcuda::wmma (warp-level matrix multiply-accumulate) with exact, documented semantics.
//
// Why this works on a CPU. CUDA keeps the mapping of a fragment's elements to lanes opaque
// ("unspecified and subject to change"; it does differ between architectures and types): a kernel
// may only load, store, fill, apply the same element-wise operation to every x[i] (also between
// fragments of the same type), and call mma_sync. So any consistent mapping is exact. Here lane l's
// element i is slot s = l * num_elements + i of the warp's 32 * num_elements slots, and slot s
// holds tile element perm(s) mod (rows * cols), counted row by row in the *logical* tile (A is m×k,
// B is k×n, accumulators m×n) whatever the memory layout; the memory layout only changes the
// addresses load/store use. Per-lane counts are CUDA's own (static_asserts in test/simt/test_wmma.cu pin
// them): where CUDA gives a lane more elements than rows*cols/32 (__half A/B fragments), each
// element has several slots, whose copies stay equal under element-wise ops.
//
// Fragment order. perm is a permutation of the slots across all lanes, one per fragment type
// (use, shape, element type, layout) and per *fragment order*, so a kernel that assumes which tile
// element x[i] holds (say, that lane 0's x[0] is element (0,0)) gets wrong results here, as it
// would on some GPU. SIMT_FRAGMENT_ORDER=identity|<seed> picks the order at start-up: identity (or
// 0) is perm(s) = s, any other decimal number seeds a scrambled permutation; the default is seed 1,
// scrambled but the same in every run, so that a failure reproduces. simt::set_fragment_order
// changes it between launches: th::run_orders (test/harness.h) runs each test under three orders
// and requires bit-identical results, which a legal kernel always gives (the arithmetic below does
// not depend on the mapping).
//
// mma_sync needs the whole A, B and C tiles, which are spread over the 32 lanes (fibers). Each lane
// writes its share into a per-warp scratch buffer, __syncwarp(), each lane computes its own
// accumulator elements, __syncwarp() again so that the next mma_sync cannot overwrite the scratch
// while a lane still reads it. Like on a GPU, all 32 lanes must therefore call it (convergently).
//
// Arithmetic. D = C + A·B in fp32: each product of two __half, __nv_bfloat16 or tf32 values is
// exact in fp32 (at most 11×11 significant bits), and the products are added to C one at a time
// in k order, rounding to fp32 after each add. A __half accumulator is widened to fp32 on entry
// and rounded (to nearest even) on exit. A GPU's tensor cores add the k products with their own
// internal ordering/rounding, so GPU results can differ from these in the last few fp32 bits;
// this is the reference semantics the CPU backend implements.
//
// Only used by the CPU backend: nvcc builds get the toolkit's real <mma.h>.
#pragma once

#include "cuda_runtime.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace nvcuda {
namespace wmma {

// ----------------------------------------------------------------------------
// tf32 conversion

// Rounds an fp32 value to tf32 (10 explicit mantissa bits), kept in a float whose low 13 bits are
// zero. Rounding is to nearest with ties *away from zero*, because CUDA implements this function
// with `cvt.rna.tf32.f32` (rna, not rn: 1 + 2^-11 rounds up to 1 + 2^-10). On the GPU that is an
// integer add of half an ulp followed by a mask, skipped for Inf/NaN, which are only masked; we do
// the same bit operations so every input, including overflow to Inf, gives the GPU's bits.
inline float __float_to_tf32(float in) {
    uint32_t u;
    std::memcpy(&u, &in, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // finite: add half a tf32 ulp
    u &= 0xffffe000u;                                     // keep sign, exponent, 10 mantissa bits
    float out;
    std::memcpy(&out, &u, 4);
    return out;
}

// ----------------------------------------------------------------------------
// Tags and layouts (declared only, as in CUDA: they are used as template arguments)

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
namespace precision {
struct tf32;
}

// Memory layout of an accumulator tile, chosen at run time in load/store_matrix_sync.
enum layout_t { mem_row_major, mem_col_major };

// Maps a fragment's element type to how it is stored (tf32 elements live in floats, as in CUDA).
template <typename T>
struct helper_traits {
    typedef T element_type;
    typedef T storage_element_type;
    typedef T fill_argument_type;
};
template <>
struct helper_traits<precision::tf32> {
    typedef precision::tf32 element_type;
    typedef float storage_element_type;
    typedef float fill_argument_type;
};

// The storage every fragment derives from: num_elements values of this lane in x[] (CUDA's layout
// of the type, so code that touches frag.x / frag.num_elements compiles the same).
template <typename T, int size, int packed_size = size>
struct alignas(8) __frag_base {
    enum { num_elements = size };
    enum { num_storage_elements = packed_size };
    typedef T element_type;
    typedef typename helper_traits<T>::storage_element_type storage_element_type;
    storage_element_type x[num_storage_elements];
};

}  // namespace wmma
}  // namespace nvcuda

// ----------------------------------------------------------------------------
// Fragment order (see the top of the file)

namespace simt {
namespace wmma_detail {

// The order SIMT_FRAGMENT_ORDER names (1 when unset); stops the program on any other value, as a
// typo would otherwise test nothing.
inline uint64_t fragment_order_from_env() {
    const char* e = getenv("SIMT_FRAGMENT_ORDER");
    if (!e || !*e) return 1;
    if (!strcmp(e, "identity")) return 0;
    char* end = nullptr;
    uint64_t seed = strtoull(e, &end, 10);
    if (*e >= '0' && *e <= '9' && *end == '\0') return seed;
    fprintf(stderr, "simt: SIMT_FRAGMENT_ORDER=%s is not identity or a seed (a decimal number)\n", e);
    exit(2);
}

// Atomic because worker threads read it while kernels run; it only changes between launches.
inline std::atomic<uint64_t>& fragment_order_setting() {
    static std::atomic<uint64_t> order{fragment_order_from_env()};
    return order;
}

}  // namespace wmma_detail

// Sets the fragment order: 0 is the identity mapping, any other value seeds a permutation. Only
// between launches: a kernel must see one order from its first load to its last store.
inline void set_fragment_order(uint64_t order) {
    wmma_detail::fragment_order_setting().store(order, std::memory_order_relaxed);
}
inline uint64_t get_fragment_order() {
    return wmma_detail::fragment_order_setting().load(std::memory_order_relaxed);
}

}  // namespace simt

// ----------------------------------------------------------------------------
// Backend internals: which fragments exist, their logical tile and slot permutation, and the
// per-warp scratch

namespace simt {
namespace wmma_detail {

namespace w = nvcuda::wmma;

template <class A, class B>
constexpr bool same = std::is_same<A, B>::value;

// Everything the backend needs to know about fragment<Use, m, n, k, T, Layout>: whether CUDA
// defines it (same set as the toolkit's crt/mma.h for fp16/bf16/tf32), the logical tile shape,
// and CUDA's per-lane element count.
template <class Use, int m, int n, int k, class T, class Layout>
struct frag_info {
    static constexpr bool is_a = same<Use, w::matrix_a>;
    static constexpr bool is_b = same<Use, w::matrix_b>;
    static constexpr bool is_acc = same<Use, w::accumulator>;
    static constexpr bool shape_16bit = (m == 16 && n == 16 && k == 16) || (m == 32 && n == 8 && k == 16) ||
                                        (m == 8 && n == 32 && k == 16);
    static constexpr bool shape_tf32 = m == 16 && n == 16 && k == 8;
    static constexpr bool layout_ok =
        is_acc ? same<Layout, void> : (same<Layout, w::row_major> || same<Layout, w::col_major>);
    static constexpr bool type_ok =
        is_acc ? ((shape_16bit && (same<T, float> || same<T, __half>)) || (shape_tf32 && same<T, float>))
               : ((shape_16bit && (same<T, __half> || same<T, __nv_bfloat16>)) ||
                  (shape_tf32 && same<T, w::precision::tf32>));
    static constexpr bool valid = (is_a || is_b || is_acc) && layout_ok && type_ok;
    static_assert(valid,
                  "nvcuda::wmma::fragment<Use, m, n, k, T, Layout>: CUDA defines no such fragment. The CPU "
                  "backend supports m16n16k16, m32n8k16, m8n32k16 with __half/__nv_bfloat16 inputs "
                  "(float or __half accumulators) and m16n16k8 with precision::tf32 (float accumulator); "
                  "matrix_a/matrix_b need row_major or col_major, accumulators no layout.");
    static constexpr int rows = is_b ? k : m;
    static constexpr int cols = is_a ? k : n;
    static constexpr int total = rows * cols;
    // CUDA gives __half A/B fragments 16 elements per lane for every shape (copies where the tile
    // has fewer than 512 elements); every other fragment holds each element exactly once.
    static constexpr int per_lane = (!is_acc && same<T, __half>) ? 16 : total / 32;
    static constexpr int slots = 32 * per_lane;
    static constexpr int slot_bits = slots == 128 ? 7 : slots == 256 ? 8 : 9;
    static_assert(slots == 1 << slot_bits, "the slot permutation needs 128, 256 or 512 slots");
    // Distinguishes the fragment types, which get independent permutations: a GPU may lay out two
    // types differently (on Volta, __half and float accumulators differ), so x[i] of one type need
    // not be the same tile element as x[i] of another.
    static constexpr uint64_t type_id =
        (is_a ? 1 : is_b ? 2 : 3) | (uint64_t)m << 2 | (uint64_t)n << 8 | (uint64_t)k << 14 |
        (uint64_t)(same<T, __half> ? 1 : same<T, __nv_bfloat16> ? 2 : same<T, float> ? 3 : 4) << 20 |
        (uint64_t)(same<Layout, w::row_major> ? 1 : same<Layout, w::col_major> ? 2 : 0) << 23;
};

// splitmix64's finalizer: a well-mixed 64-bit value from any input.
inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The permutation of fragment type Info's slots under the current fragment order, as the image
// of each slot, in [0, slots): slot s holds tile element image[s] % total (row by row in the
// logical tile), and the slots whose image is below total hold the first copy of each element.
// Each round multiplies by an odd number, xors in the value's high bits and adds a constant, all
// modulo the (power of two) slot count, so each step, and their composition, is a bijection; three
// rounds mix lane and index bits thoroughly. Order 0 leaves every slot in place. The table is
// rebuilt when the order changes, once per worker thread (thread_local: no thread reads a table
// another is rebuilding), so load, store and mma_sync only look slots up.
template <class Info>
inline const uint16_t* slot_images() {
    thread_local bool built = false;
    thread_local uint64_t built_for = 0;
    thread_local uint16_t image[Info::slots];
    uint64_t order = get_fragment_order();
    if (built && built_for == order) return image;
    unsigned mul[3], add[3];
    uint64_t key = mix64(order ^ mix64(Info::type_id));
    for (int r = 0; r < 3; r++, key = mix64(key)) {
        mul[r] = (unsigned)key | 1u;
        add[r] = (unsigned)(key >> 32);
    }
    for (unsigned s = 0; s < (unsigned)Info::slots; s++) {
        unsigned v = s;
        for (int r = 0; order != 0 && r < 3; r++) {
            v = (v * mul[r]) & (Info::slots - 1);
            v ^= v >> (Info::slot_bits / 2);
            v = (v + add[r]) & (Info::slots - 1);
        }
        image[s] = (uint16_t)v;
    }
    built = true;
    built_for = order;
    return image;
}

// Scratch for mma_sync: room for a 512-element A, a 512-element B and a 256-element C tile per
// warp, 32 warps (1024 threads). One copy per worker OS thread: the fibers of one block share it,
// and blocks on a worker run one after another, as with __shared__ memory.
constexpr int kScratchPerWarp = 512 + 512 + 256;
inline thread_local float mma_scratch[32][kScratchPerWarp];

// Index of the calling thread's warp within its block (warps are consecutive linear thread ids).
inline unsigned warp_index() {
    unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return linear / 32;
}

// Widening of a stored fragment element to the fp32 value the tensor core multiplies.
inline float operand(__half v) { return __half2float(v); }
inline float operand(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float operand(float v) { return nvcuda::wmma::__float_to_tf32(v); }  // tf32 storage
inline float acc_in(float v) { return v; }
inline float acc_in(__half v) { return __half2float(v); }
inline void acc_out(float& d, float v) { d = v; }
inline void acc_out(__half& d, float v) { d = __float2half_rn(v); }

// Checks the documented preconditions of load/store_matrix_sync: a 256-bit aligned pointer and
// an ldm that is a multiple of 16 bytes (8 16-bit elements, 4 floats). A GPU would silently load
// garbage or fault, so the backend stops with a message naming the call site.
template <class S>
inline void check_pointer_and_ldm(const char* fn, const void* p, unsigned ldm, const char* file, int line) {
    constexpr unsigned mult = 16 / sizeof(S);
    char msg[256];
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
        snprintf(msg, sizeof(msg),
                 "wmma::%s: pointer %p is not 256-bit (32-byte) aligned, which CUDA requires", fn, p);
        simt::fault(msg, file, line);
    }
    if (ldm % mult != 0) {
        snprintf(msg, sizeof(msg),
                 "wmma::%s: ldm=%u is not a multiple of %u (16 bytes of %zu-byte elements), which CUDA "
                 "requires",
                 fn, ldm, mult, sizeof(S));
        simt::fault(msg, file, line);
    }
}

// Copies this lane's elements of a tile between memory and x[] (load when Load, else store).
// Element e of the logical tile sits at (e / cols, e % cols); mem_row_major puts (r, c) at
// p[r * ldm + c], mem_col_major at p[c * ldm + r].
template <class Info, bool Load, class S>
inline void transfer(S* x, S* p, unsigned ldm, bool row_major_mem) {
    const uint16_t* image = slot_images<Info>() + simt::lane_id() * Info::per_lane;
    for (int i = 0; i < Info::per_lane; i++) {
        int e = image[i] % Info::total;
        int r = e / Info::cols, c = e % Info::cols;
        S* q = row_major_mem ? p + (size_t)r * ldm + c : p + (size_t)c * ldm + r;
        if (Load) x[i] = *q;
        else *q = x[i];
    }
}

// Writes this lane's share of a tile into the warp's scratch (row by row in the logical tile),
// each element converted by widen: the first copy of each element only, so that replicated
// fragments publish deterministically.
template <class Info, class S, class Widen>
inline void publish(float* dst, const S* x, Widen widen) {
    const uint16_t* image = slot_images<Info>() + simt::lane_id() * Info::per_lane;
    for (int i = 0; i < Info::per_lane; i++)
        if (image[i] < Info::total) dst[image[i]] = widen(x[i]);
}

}  // namespace wmma_detail
}  // namespace simt

namespace nvcuda {
namespace wmma {

// ----------------------------------------------------------------------------
// Fragments

// A lane's share of an m×n×k tile operand (matrix_a: m×k, matrix_b: k×n, accumulator: m×n).
// Invalid combinations fail to compile with a message, as they do with nvcc (no such type).
template <typename Use, int m, int n, int k, typename T, typename Layout = void>
class fragment : public __frag_base<T, simt::wmma_detail::frag_info<Use, m, n, k, T, Layout>::per_lane> {};

// ----------------------------------------------------------------------------
// Fill, load, store

// Sets every element of the fragment to v (no lane communication, as in CUDA).
template <typename Use, int m, int n, int k, typename T, typename Layout>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout>& f,
                          const typename helper_traits<T>::fill_argument_type& v) {
    for (int i = 0; i < f.num_storage_elements; i++) f.x[i] = v;
}

// Loads a matrix_a / matrix_b fragment whose memory layout is its Layout parameter. Waits for all
// 32 lanes first, as CUDA documents, so a lane's earlier writes to the tile are visible to all.
template <typename Use, int m, int n, int k, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, m, n, k, T, Layout>& a,
                             const typename helper_traits<T>::storage_element_type* p, unsigned ldm,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using Info = simt::wmma_detail::frag_info<Use, m, n, k, T, Layout>;
    using S = typename helper_traits<T>::storage_element_type;
    static_assert(!Info::is_acc, "wmma::load_matrix_sync: an accumulator fragment takes a layout_t argument");
    simt::wmma_detail::check_pointer_and_ldm<S>("load_matrix_sync", p, ldm, file, line);
    __syncwarp(0xffffffffu, file, line);
    simt::wmma_detail::transfer<Info, true>(a.x, const_cast<S*>(p), ldm, std::is_same<Layout, row_major>::value);
}

// Loads an accumulator fragment from memory in the given layout (after all 32 lanes arrive).
template <int m, int n, int k, typename T>
inline void load_matrix_sync(fragment<accumulator, m, n, k, T>& a, const T* p, unsigned ldm, layout_t layout,
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using Info = simt::wmma_detail::frag_info<accumulator, m, n, k, T, void>;
    simt::wmma_detail::check_pointer_and_ldm<T>("load_matrix_sync", p, ldm, file, line);
    if (layout != mem_row_major && layout != mem_col_major)
        simt::fault("wmma::load_matrix_sync: layout is neither mem_row_major nor mem_col_major", file, line);
    __syncwarp(0xffffffffu, file, line);
    simt::wmma_detail::transfer<Info, true>(a.x, const_cast<T*>(p), ldm, layout == mem_row_major);
}

// Stores an accumulator fragment to memory in the given layout (after all 32 lanes arrive). As
// in CUDA there is no barrier after the store: lanes that read what others stored need __syncwarp.
template <int m, int n, int k, typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, m, n, k, T>& a, unsigned ldm, layout_t layout,
                              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    using Info = simt::wmma_detail::frag_info<accumulator, m, n, k, T, void>;
    simt::wmma_detail::check_pointer_and_ldm<T>("store_matrix_sync", p, ldm, file, line);
    if (layout != mem_row_major && layout != mem_col_major)
        simt::fault("wmma::store_matrix_sync: layout is neither mem_row_major nor mem_col_major", file, line);
    __syncwarp(0xffffffffu, file, line);
    simt::wmma_detail::transfer<Info, false>(const_cast<T*>(a.x), p, ldm, layout == mem_row_major);
}

// ----------------------------------------------------------------------------
// Multiply-accumulate

// D = A·B + C for the warp's tile (d may be the same object as c). __half inputs allow any mix of
// float/__half for C and D, __nv_bfloat16 and tf32 only float, exactly CUDA's overload set.
template <int m, int n, int k, typename TD, typename TAB, typename LA, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, m, n, k, TD>& d, const fragment<matrix_a, m, n, k, TAB, LA>& a,
                     const fragment<matrix_b, m, n, k, TAB, LB>& b, const fragment<accumulator, m, n, k, TC>& c,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    namespace wd = simt::wmma_detail;
    static_assert(std::is_same<TAB, __half>::value || (std::is_same<TD, float>::value && std::is_same<TC, float>::value),
                  "wmma::mma_sync: __nv_bfloat16 and tf32 inputs need float accumulators (C and D)");
    using IA = wd::frag_info<matrix_a, m, n, k, TAB, LA>;
    using IB = wd::frag_info<matrix_b, m, n, k, TAB, LB>;
    using IC = wd::frag_info<accumulator, m, n, k, TC, void>;
    using ID = wd::frag_info<accumulator, m, n, k, TD, void>;
    float* sa = wd::mma_scratch[wd::warp_index()];  // A, m×k row by row
    float* sb = sa + IA::total;                     // B, k×n row by row
    float* sc = sb + IB::total;                     // C, m×n row by row
    static_assert(IA::total + IB::total + IC::total <= wd::kScratchPerWarp, "scratch too small");
    // Where C and D are of one type, they share a permutation: c.x[i] is the element d.x[i] gets.
    // Otherwise their permutations differ, and the lane that computes an element of D need not hold
    // that element of C, so C goes through the scratch too.
    constexpr bool c_in_place = std::is_same<TC, TD>::value;
    wd::publish<IA>(sa, a.x, [](auto v) { return wd::operand(v); });
    wd::publish<IB>(sb, b.x, [](auto v) { return wd::operand(v); });
    if (!c_in_place) wd::publish<IC>(sc, c.x, [](auto v) { return wd::acc_in(v); });
    __syncwarp(0xffffffffu, file, line);  // the whole tiles are in scratch
    const uint16_t* image = wd::slot_images<ID>() + simt::lane_id() * ID::per_lane;
    for (int i = 0; i < ID::per_lane; i++) {
        int e = image[i];  // accumulators hold each element once
        int r = e / n, col = e % n;
        float acc = c_in_place ? wd::acc_in(c.x[i]) : sc[e];
        for (int kk = 0; kk < k; kk++) acc += sa[r * k + kk] * sb[kk * n + col];  // exact product
        wd::acc_out(d.x[i], acc);
    }
    __syncwarp(0xffffffffu, file, line);  // nobody overwrites the scratch while a lane still reads
}

}  // namespace wmma
}  // namespace nvcuda
