// llmc/adamw8bit.cuh — 8-bit AdamW: both moments stored block-wise quantized (one byte per element
// plus one fp32 absmax per block of 256), updated in one launch over all parameters.
//
// The scheme (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", as in
// bitsandbytes). Each tensor's moments are cut into blocks of ADAMW8BIT_BLOCK elements; a block
// stores absmax = max |x| over its elements in fp32 and, per element, the index (code) of the map
// value nearest to x / absmax. The maps are *dynamic* (dynamic tree) quantization maps: 256 sorted
// values covering seven or eight decades, dense near +-1 and sparse near 0, so that both a block's
// large and its small values keep a few significant digits. The first moment is signed (signed
// map), the second is not (unsigned map: no sign bit, so twice the values per decade). Tensors with
// fewer than ADAMW8BIT_MIN_QUANTIZED elements (biases, layernorm gains in a per-layer table) keep
// fp32 moments: they cost little and are the most sensitive to noise in the update.
// Memory: 2 bytes of state per parameter (+ 8 bytes per 256 for the two absmax) instead of 8.
//
// One update, one launch: each warp owns one quantization block (8 elements per lane, strided by 32
// so every load is coalesced): it dequantizes m and v, runs AdamW in fp32 with exactly the
// operations and order of llmc/adamw.cuh (adamw_element, torch's order), finds the new absmax of m
// and v by a warp max (exact, so independent of thread order), requantizes and writes codes and
// absmax. The fp32 moments never touch DRAM: an element moves 16 bytes (fp32 master + bf16 params
// and gradient, or fp32 params and gradient) instead of 28-32 with 32-bit AdamW. Tensors on the
// fp32-state path run the same warps without quantization and get bit for bit what adamw_update
// gives them.
//
// One rounding rule differs from plain nearest: a positive second moment is never stored as 0 (see
// adamw8bit_quantize_v); without it, blocks whose gradients span several decades blow up updates.
//
// The state is one allocation planned on the host (adamw8bit_plan): the per-tensor slot table, both
// maps, the fp32 moments of small tensors, the absmax of each block and the codes. Zero bytes are
// the zero state (absmax 0 decodes every code to 0), so a fresh run just zeroes the buffer.
//
// Usage:
//     AdamW8bitLayout layout = adamw8bit_plan(host_tensor_table);   // layout.total_bytes of state
//     cudaMalloc(&buffer, layout.total_bytes);
//     AdamW8bitState state = adamw8bit_init(buffer, layout);        // zero moments, tables uploaded
//     adamw8bit_update(params, master, grads, state, tensors, num_tensors, N, lr, ..., step, stream);
#pragma once
#include "adamw.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

// Elements per quantization block: 256, as in bitsandbytes (the paper's blocks hold 2048): an outlier
// costs precision to fewer neighbours, the absmax overhead stays small (4 bytes per 256 = 0.016
// bytes per element and moment), and one warp covers a block with 8 elements per lane, so the
// absmax is a warp max (shuffles, no shared memory or barrier).
constexpr int ADAMW8BIT_BLOCK = 256;
constexpr int ADAMW8BIT_PER_LANE = ADAMW8BIT_BLOCK / 32;
// Warps (quantization blocks) per block of threads of the update.
constexpr int ADAMW8BIT_WARPS = 8;
// Tensors with fewer elements keep fp32 m and v (bitsandbytes' min_8bit_size).
constexpr size_t ADAMW8BIT_MIN_QUANTIZED = 4096;
// Values in each quantization map (one byte codes).
constexpr int ADAMW8BIT_MAP_SIZE = 256;

// ----------------------------------------------------------------------------
// Quantization maps (host)

// The dynamic tree map, sorted. A code is [sign bit] [E zero bits] [indicator 1] [F fraction bits]:
// the E leading zeros select the decade (10^-(E+1), 10^-E], the F remaining bits a point of a linear
// grid over that decade, value = 10^-E * (0.1 + 0.9 * (j + 1) / 2^F) for j < 2^F. Taking the upper
// end of each grid cell (rather than bitsandbytes' cell midpoints) puts 1 (and -1) in the map, so a
// block's largest element is stored exactly, and 10^-E at the top of every decade. All-zero tree bits
// are 0. Signed: 7 tree bits after the sign, decades down to 1e-6, 127 values of each sign; the code
// that would be -0 holds +1e-7 instead. Unsigned: 8 tree bits, decades down to 1e-7, 255 positive
// values and 0.
inline std::array<float, ADAMW8BIT_MAP_SIZE> adamw8bit_make_map(bool is_signed) {
    const int tree_bits = is_signed ? 7 : 8;
    std::vector<double> values = {0.0};
    for (int E = 0; E < tree_bits; E++) {
        const int F = tree_bits - 1 - E;  // the indicator bit follows the E zeros
        for (int j = 0; j < (1 << F); j++) {
            // 0.1 + 0.9 (j + 1) / 2^F as one exact ratio of integers, so that the top is exactly 1.
            double value = (double)((1 << F) + 9 * (j + 1)) / (10.0 * (1 << F)) / std::pow(10.0, E);
            values.push_back(value);
            if (is_signed) values.push_back(-value);
        }
    }
    if (is_signed) values.push_back(1e-7);
    std::sort(values.begin(), values.end());
    std::array<float, ADAMW8BIT_MAP_SIZE> map;
    for (int k = 0; k < ADAMW8BIT_MAP_SIZE; k++) map[k] = (float)values[k];
    return map;
}

// The signed (first moment) or unsigned (second moment) map, generated once.
inline const std::array<float, ADAMW8BIT_MAP_SIZE>& adamw8bit_map(bool is_signed) {
    static const std::array<float, ADAMW8BIT_MAP_SIZE> signed_map = adamw8bit_make_map(true);
    static const std::array<float, ADAMW8BIT_MAP_SIZE> unsigned_map = adamw8bit_make_map(false);
    return is_signed ? signed_map : unsigned_map;
}

// ----------------------------------------------------------------------------
// State layout (host plan, device view)

// Where one tensor's moments live (device table, one entry per ParamTensor, same order).
struct AdamW8bitSlot {
    size_t state_offset;   // quantized: index of its first code in m_codes/v_codes; else of its first m32/v32 element
    size_t absmax_offset;  // quantized: index of its first block in m_absmax/v_absmax (else 0)
    unsigned first_block;  // its first quantization block (256 elements) in the update's numbering
    int quantized;         // 1: 8-bit moments; 0: fp32 moments (fewer than ADAMW8BIT_MIN_QUANTIZED elements)
};

// The plan of one state allocation for a tensor table: the slots, the element counts of each kind
// of state, and the byte offset of each section (each 16-byte aligned) in the allocation.
struct AdamW8bitLayout {
    std::vector<AdamW8bitSlot> slots;
    size_t N = 0;              // parameters covered (sum of the tensor sizes)
    size_t num_blocks = 0;     // blocks of 256 elements the update covers (ceil(size / 256) per tensor)
    size_t num_fp32 = 0;       // elements with fp32 moments (m32 and v32 hold this many each)
    size_t num_quantized = 0;  // elements with 8-bit moments (m_codes and v_codes hold this many each)
    size_t num_absmax = 0;     // quantization blocks (m_absmax and v_absmax hold this many each)
    size_t slots_at = 0, maps_at = 0, m32_at = 0, v32_at = 0, m_absmax_at = 0, v_absmax_at = 0, m_codes_at = 0,
           v_codes_at = 0;
    size_t total_bytes = 0;  // size of the allocation
};

// Device pointers into one state allocation: what the update kernel receives (by value).
struct AdamW8bitState {
    const AdamW8bitSlot* slots;  // (num_tensors)
    const float* maps;           // (2, 256): the signed map, then the unsigned map
    float* m32;                  // (num_fp32) first moment of the small tensors
    float* v32;                  // (num_fp32) second moment of the small tensors
    float* m_absmax;             // (num_absmax) max |m| of each block
    float* v_absmax;             // (num_absmax) max v of each block
    uint8_t* m_codes;            // (num_quantized) signed-map codes of m
    uint8_t* v_codes;            // (num_quantized) unsigned-map codes of v
    int num_tensors;
    size_t num_blocks;
    size_t N;
};

// Plans the state of the tensors of a table (the host copy of the update's ParamTensor table):
// which tensors are quantized, where each one's moments go, and the bytes of the one allocation.
inline AdamW8bitLayout adamw8bit_plan(const std::vector<ParamTensor>& tensors) {
    AdamW8bitLayout L;
    for (const ParamTensor& t : tensors) {
        AdamW8bitSlot slot;
        const size_t blocks = CEIL_DIV(t.size, (size_t)ADAMW8BIT_BLOCK);
        slot.first_block = (unsigned)L.num_blocks;
        slot.quantized = t.size >= ADAMW8BIT_MIN_QUANTIZED;
        if (slot.quantized) {
            slot.state_offset = L.num_quantized;
            slot.absmax_offset = L.num_absmax;
            L.num_quantized += t.size;
            L.num_absmax += blocks;
        } else {
            slot.state_offset = L.num_fp32;
            slot.absmax_offset = 0;
            L.num_fp32 += t.size;
        }
        L.num_blocks += blocks;
        L.N += t.size;
        L.slots.push_back(slot);
    }
    if (L.num_blocks > 0xffffffffu) {
        fprintf(stderr, "adamw8bit_plan: %zu parameters need %zu blocks of %d, more than the 2^32-1 a slot numbers\n",
                L.N, L.num_blocks, ADAMW8BIT_BLOCK);
        exit(EXIT_FAILURE);
    }
    size_t at = 0;
    auto section = [&at](size_t bytes) {
        size_t start = at;
        at += CEIL_DIV(bytes, (size_t)16) * 16;
        return start;
    };
    L.slots_at = section(L.slots.size() * sizeof(AdamW8bitSlot));
    L.maps_at = section(2 * ADAMW8BIT_MAP_SIZE * sizeof(float));
    L.m32_at = section(L.num_fp32 * sizeof(float));
    L.v32_at = section(L.num_fp32 * sizeof(float));
    L.m_absmax_at = section(L.num_absmax * sizeof(float));
    L.v_absmax_at = section(L.num_absmax * sizeof(float));
    L.m_codes_at = section(L.num_quantized);
    L.v_codes_at = section(L.num_quantized);
    L.total_bytes = at;
    return L;
}

// The device pointers of a state allocation of layout.total_bytes bytes at buffer (no copies).
inline AdamW8bitState adamw8bit_view(void* buffer, const AdamW8bitLayout& layout) {
    unsigned char* base = static_cast<unsigned char*>(buffer);
    AdamW8bitState s;
    s.slots = reinterpret_cast<const AdamW8bitSlot*>(base + layout.slots_at);
    s.maps = reinterpret_cast<const float*>(base + layout.maps_at);
    s.m32 = reinterpret_cast<float*>(base + layout.m32_at);
    s.v32 = reinterpret_cast<float*>(base + layout.v32_at);
    s.m_absmax = reinterpret_cast<float*>(base + layout.m_absmax_at);
    s.v_absmax = reinterpret_cast<float*>(base + layout.v_absmax_at);
    s.m_codes = base + layout.m_codes_at;
    s.v_codes = base + layout.v_codes_at;
    s.num_tensors = (int)layout.slots.size();
    s.num_blocks = layout.num_blocks;
    s.N = layout.N;
    return s;
}

// Initializes a state allocation for a run from step 1: zero moments (zero absmax, zero codes, zero
// fp32 moments), and uploads the slot table and the two maps. Synchronous (start-up only).
inline AdamW8bitState adamw8bit_init(void* buffer, const AdamW8bitLayout& layout) {
    unsigned char* base = static_cast<unsigned char*>(buffer);
    cudaCheck(cudaMemset(buffer, 0, layout.total_bytes));
    cudaCheck(cudaMemcpy(base + layout.slots_at, layout.slots.data(), layout.slots.size() * sizeof(AdamW8bitSlot),
                         cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(base + layout.maps_at, adamw8bit_map(true).data(), ADAMW8BIT_MAP_SIZE * sizeof(float),
                         cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(base + layout.maps_at + ADAMW8BIT_MAP_SIZE * sizeof(float), adamw8bit_map(false).data(),
                         ADAMW8BIT_MAP_SIZE * sizeof(float), cudaMemcpyHostToDevice));
    return adamw8bit_view(buffer, layout);
}

// ----------------------------------------------------------------------------
// CUDA kernels

// x ~ map[code] * absmax: the value a code stands for in a block of the given absmax.
__device__ inline float adamw8bit_dequantize(const float* map, uint8_t code, float absmax) {
    return __fmul_rn(map[code], absmax);
}

// The code of the map value nearest to x / absmax (ties to the lower value); |x| <= absmax, and
// absmax 0 (an all-zero block) gives the code of 0 without dividing. A fixed 8-step binary search
// (no divergence between threads) finds the largest map[i] <= x / absmax, which needs map[0] <=
// x / absmax: the signed map starts at -1, the unsigned one at 0 (its x are >= 0).
__device__ inline uint8_t adamw8bit_quantize(const float* map, float x, float absmax) {
    const float n = absmax > 0.f ? __fdiv_rn(x, absmax) : 0.f;
    int i = 0;
    for (int step = ADAMW8BIT_MAP_SIZE / 2; step > 0; step >>= 1)
        if (map[i + step] <= n) i += step;
    if (i < ADAMW8BIT_MAP_SIZE - 1 && map[i + 1] - n < n - map[i]) i++;
    return (uint8_t)i;
}

// The code of a second moment v >= 0: the nearest one, except that a positive v never becomes 0
// (it takes the smallest positive map value, 1e-7 * absmax). The first moment keeps a few digits
// down to 1e-6 of its block's absmax, while v (about m^2) spans twice as many decades and reaches
// 0 already at 5e-8 of its absmax: a v stored as 0 under an m that is not would make the next
// update lr * m / eps, orders of magnitude too large. Rounded up, v only damps that update.
__device__ inline uint8_t adamw8bit_quantize_v(const float* map, float v, float absmax) {
    uint8_t code = adamw8bit_quantize(map, v, absmax);
    return code == 0 && v > 0.f ? (uint8_t)1 : code;
}

// The maxima of a and of b over the warp, returned to every lane (exact, so order-independent).
__device__ inline float2 adamw8bit_warp_max(float a, float b) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, offset));
        b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, offset));
    }
    return make_float2(a, b);
}

// The tensor that quantization block qb belongs to: the last slot whose first_block is <= qb
// (empty tensors own no block and share their first_block with the next tensor, which "last" picks).
__device__ inline int adamw8bit_find_tensor(const AdamW8bitSlot* slots, int num_tensors, size_t qb) {
    int lo = 0, hi = num_tensors - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (slots[mid].first_block <= qb) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// One AdamW step over all tensors: warp w of block b owns quantization block qb = b * 8 + w, i.e.
// elements [256 k, 256 k + 256) of its tensor (k = qb - first_block); lane l takes elements
// 256 k + 32 r + l, r < 8. Quantized tensors: dequantize, update in fp32, requantize with the new
// absmax. Small tensors: the plain fp32 update of adamw_kernel. The weights go to master when there
// is one, and params receives them rounded to T.
template <class T>
__global__ void __launch_bounds__(ADAMW8BIT_WARPS * 32)
    adamw8bit_kernel(T* params, float* master, const T* grads, AdamW8bitState s, const ParamTensor* tensors,
                     AdamWCoefficients c, const float* grad_scale_device) {
    // The maps go to shared memory: the binary searches read them at data-dependent addresses,
    // which constant memory would serialize across a warp.
    __shared__ float maps[2 * ADAMW8BIT_MAP_SIZE];
    for (int k = threadIdx.x; k < 2 * ADAMW8BIT_MAP_SIZE; k += blockDim.x) maps[k] = s.maps[k];
    __syncthreads();
    const float* signed_map = maps;
    const float* unsigned_map = maps + ADAMW8BIT_MAP_SIZE;

    const size_t qb = (size_t)blockIdx.x * ADAMW8BIT_WARPS + threadIdx.x / 32;
    if (qb >= s.num_blocks) return;  // whole warps only: the warp max below sees all 32 lanes
    const int lane = threadIdx.x % 32;
    const int k = adamw8bit_find_tensor(s.slots, s.num_tensors, qb);
    const ParamTensor t = tensors[k];
    const AdamW8bitSlot slot = s.slots[k];
    const size_t block_in_tensor = qb - slot.first_block;
    const size_t base = block_in_tensor * ADAMW8BIT_BLOCK;  // the block's first element in the tensor
    const float decay = t.weight_decay ? c.decay : 1.0f;
    const float scale = adamw_grad_scale(c, grad_scale_device);

    if (!slot.quantized) {  // uniform over the warp
        for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
            const size_t i = base + r * 32 + lane;  // element within the tensor
            if (i >= t.size) break;
            const size_t j = t.offset + i, e = slot.state_offset + i;
            float p = master ? master[j] : to_float(params[j]);
            float g = __fmul_rn(to_float(grads[j]), scale);
            float m = s.m32[e], v = s.v32[e];
            adamw_element(p, m, v, g, decay, c);
            s.m32[e] = m;
            s.v32[e] = v;
            if (master) master[j] = p;
            params[j] = from_float<T>(p);
        }
        return;
    }

    const size_t q = slot.absmax_offset + block_in_tensor;  // this block's absmax
    const float m_absmax = s.m_absmax[q], v_absmax = s.v_absmax[q];
    // All loads first, then the arithmetic and stores: the loads of the 8 elements are independent
    // and in flight together (a store to params could alias a later load, so the compiler would not
    // hoist those loads above it by itself).
    float p[ADAMW8BIT_PER_LANE], g[ADAMW8BIT_PER_LANE], m[ADAMW8BIT_PER_LANE], v[ADAMW8BIT_PER_LANE];
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = base + r * 32 + lane, j = t.offset + i, e = slot.state_offset + i;
        p[r] = g[r] = m[r] = v[r] = 0.f;  // elements past the tensor's end count as zeros in the maxima
        if (i >= t.size) continue;
        p[r] = master ? master[j] : to_float(params[j]);
        g[r] = __fmul_rn(to_float(grads[j]), scale);
        m[r] = adamw8bit_dequantize(signed_map, s.m_codes[e], m_absmax);
        v[r] = adamw8bit_dequantize(unsigned_map, s.v_codes[e], v_absmax);
    }
    float m_max = 0.f, v_max = 0.f;
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = base + r * 32 + lane, j = t.offset + i;
        if (i >= t.size) break;
        adamw_element(p[r], m[r], v[r], g[r], decay, c);
        if (master) master[j] = p[r];
        params[j] = from_float<T>(p[r]);
        m_max = fmaxf(m_max, fabsf(m[r]));
        v_max = fmaxf(v_max, v[r]);
    }
    // Every lane read the old absmax before the shuffles, so lane 0 may overwrite it after them.
    const float2 absmax = adamw8bit_warp_max(m_max, v_max);
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = base + r * 32 + lane;
        if (i >= t.size) break;
        const size_t e = slot.state_offset + i;
        s.m_codes[e] = adamw8bit_quantize(signed_map, m[r], absmax.x);
        s.v_codes[e] = adamw8bit_quantize_v(unsigned_map, v[r], absmax.y);
    }
    if (lane == 0) {
        s.m_absmax[q] = absmax.x;
        s.v_absmax[q] = absmax.y;
    }
}

// ----------------------------------------------------------------------------
// kernel launchers

// One 8-bit AdamW step over all N parameters; the same contract as adamw_update (llmc/adamw.cuh)
// with the moments in `state` (from adamw8bit_init or adamw8bit_view on the plan of the same table):
// params (N) written; master (N, fp32) the weights when T is a lower precision (nullptr when T is
// float); grads (N) multiplied by grad_scale (and *grad_scale_device when given); tensors (device,
// num_tensors entries) partitions [0, N); step is 1-based.
template <class T>
void adamw8bit_update(T* params, float* master, const T* grads, const AdamW8bitState& state,
                      const ParamTensor* tensors, int num_tensors, size_t N, float lr, float beta1, float beta2,
                      float eps, float weight_decay, float grad_scale, int step, cudaStream_t stream,
                      const float* grad_scale_device = nullptr) {
    if (step < 1) {
        fprintf(stderr, "adamw8bit_update: step must be >= 1 (1-based, for bias correction), got %d\n", step);
        exit(EXIT_FAILURE);
    }
    if (num_tensors != state.num_tensors || N != state.N) {
        fprintf(stderr, "adamw8bit_update: the state was planned for %d tensors, %zu parameters; called with %d, "
                "%zu (plan the state with adamw8bit_plan on this tensor table)\n", state.num_tensors, state.N,
                num_tensors, N);
        exit(EXIT_FAILURE);
    }
    if (master == nullptr && !std::is_same<T, float>::value) {
        fprintf(stderr, "adamw8bit_update: %zu-byte parameters need fp32 master weights (master == nullptr): "
                "rounding every update to the storage type would lose updates smaller than half an ulp\n",
                sizeof(T));
        exit(EXIT_FAILURE);
    }
    if (state.num_blocks == 0) return;
    AdamWCoefficients c = adamw_coefficients(lr, beta1, beta2, eps, weight_decay, grad_scale, step);
    const size_t grid = CEIL_DIV(state.num_blocks, (size_t)ADAMW8BIT_WARPS);
    cudaCheck(launch_kernel(adamw8bit_kernel<T>, dim3((unsigned)grid), dim3(ADAMW8BIT_WARPS * 32), 0, stream, params,
                            master, grads, state, tensors, c, grad_scale_device));
}
