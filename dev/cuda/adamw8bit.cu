// dev/cuda/adamw8bit.cu — 8-bit AdamW (block-wise quantized moments): each variant against a CPU
// reference (bit for bit), then timed on GPT-2 124M's parameter table next to 32-bit AdamW.
//
// Variants:
//   1           three launches: dequantize the moments to fp32 scratch, 32-bit AdamW (llmc/adamw.cuh),
//               quantize them back
//   production  llmc/adamw8bit.cuh: one fused launch, the moments never in memory as fp32. Faster:
//               about 3x less DRAM traffic, and no 8 bytes per parameter of scratch (all the memory
//               8-bit state saves).
//
// Build and run: make build/cpu/dev_adamw8bit && build/cpu/dev_adamw8bit    (CPU backend)
//                make build/gpu/dev_adamw8bit && build/gpu/dev_adamw8bit    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/adamw8bit.cuh"
#include "../../test/harness.h"
#include "common.h"
#include "gpt2_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

static const float LR = 1e-2f, BETA1 = 0.9f, BETA2 = 0.95f, EPS = 1e-8f, WD = 0.1f;

// ----------------------------------------------------------------------------
// CPU reference: per quantization block, dequantize, torch.optim.AdamW's fp32 operations in its
// order, new absmax, requantize to the nearest map value (a positive v never to 0).

// The state on the host, as adamw8bit_plan lays it out.
struct HostState {
    std::vector<float> m32, v32, m_absmax, v_absmax;
    std::vector<uint8_t> m_codes, v_codes;
};

// The code of the map value nearest to n (ties to the lower); positive second moments skip code 0.
static uint8_t nearest(const float* map, float n, bool second_moment) {
    int i = (int)(std::upper_bound(map, map + ADAMW8BIT_MAP_SIZE, n) - map) - 1;
    if (i < 0) i = 0;
    if (i < ADAMW8BIT_MAP_SIZE - 1 && map[i + 1] - n < n - map[i]) i++;
    if (second_moment && i == 0 && n > 0) i = 1;
    return (uint8_t)i;
}

// One torch-order AdamW element update in fp32.
static void adamw_element_cpu(float& p, float& m, float& v, float g, bool decay, int step) {
    const float decay_f = (float)(1.0 - (double)LR * WD), w1 = (float)(1.0 - (double)BETA1);
    const float w2 = (float)(1.0 - (double)BETA2);
    const float bc2_sqrt = (float)std::sqrt(1.0 - std::pow((double)BETA2, step));
    const float neg_step = (float)(-((double)LR / (1.0 - std::pow((double)BETA1, step))));
    if (decay) p = p * decay_f;
    m = std::fma(w1, g - m, m);
    v = v * BETA2;
    v = v + (w2 * g) * g;
    float denom = std::sqrt(v) / bc2_sqrt;
    denom = denom + EPS;
    p = p + (neg_step * m) / denom;
}

static void adamw8bit_cpu(std::vector<float>& p, HostState& st, const std::vector<float>& grad,
                          const std::vector<ParamTensor>& tensors, const AdamW8bitLayout& L, float scale, int step) {
    const float* smap = adamw8bit_map(true).data();
    const float* umap = adamw8bit_map(false).data();
    for (size_t k = 0; k < tensors.size(); k++) {
        const ParamTensor& t = tensors[k];
        const AdamW8bitSlot& s = L.slots[k];
        if (!s.quantized) {
            for (size_t i = 0; i < t.size; i++)
                adamw_element_cpu(p[t.offset + i], st.m32[s.state_offset + i], st.v32[s.state_offset + i],
                                  grad[t.offset + i] * scale, t.weight_decay, step);
            continue;
        }
        for (size_t b = 0; b * ADAMW8BIT_BLOCK < t.size; b++) {
            const size_t begin = b * ADAMW8BIT_BLOCK, end = std::min(t.size, begin + ADAMW8BIT_BLOCK);
            float m[ADAMW8BIT_BLOCK], v[ADAMW8BIT_BLOCK], am = 0, av = 0;
            for (size_t i = begin; i < end; i++) {
                const size_t e = s.state_offset + i;
                float& mi = m[i - begin];
                float& vi = v[i - begin];
                mi = smap[st.m_codes[e]] * st.m_absmax[s.absmax_offset + b];
                vi = umap[st.v_codes[e]] * st.v_absmax[s.absmax_offset + b];
                adamw_element_cpu(p[t.offset + i], mi, vi, grad[t.offset + i] * scale, t.weight_decay, step);
                am = std::max(am, std::fabs(mi));
                av = std::max(av, vi);
            }
            for (size_t i = begin; i < end; i++) {
                st.m_codes[s.state_offset + i] = nearest(smap, am > 0 ? m[i - begin] / am : 0.f, false);
                st.v_codes[s.state_offset + i] = nearest(umap, av > 0 ? v[i - begin] / av : 0.f, true);
            }
            st.m_absmax[s.absmax_offset + b] = am;
            st.v_absmax[s.absmax_offset + b] = av;
        }
    }
}

// ----------------------------------------------------------------------------
// Variant 1: three launches — dequantize every moment to fp32 scratch buffers (N each), run 32-bit
// AdamW (llmc/adamw.cuh's adamw_update) on them, quantize them back (block absmax + codes). Same
// operations, so the same bits as the fused kernel. The fused production kernel is ~3x less DRAM
// traffic: per parameter, v1 writes 8 bytes of fp32 moments, AdamW reads and writes them (16), the
// quantize pass reads them again (8), on top of the 16 bytes the fused kernel moves in total
// (weights, gradient, codes); and v1's scratch costs 8 bytes per parameter, all the memory 8-bit
// state saves.

// scratch_m[j], scratch_v[j] = the moments of parameter j, dequantized (or copied from fp32 state);
// one block of 256 threads per quantization block, one element per thread.
__global__ void dequantize_kernel(float* scratch_m, float* scratch_v, AdamW8bitState s, const ParamTensor* tensors) {
    const int k = adamw8bit_find_tensor(s.slots, s.num_tensors, blockIdx.x);
    const ParamTensor t = tensors[k];
    const AdamW8bitSlot slot = s.slots[k];
    const size_t b = blockIdx.x - slot.first_block, i = b * ADAMW8BIT_BLOCK + threadIdx.x;
    if (i >= t.size) return;
    const size_t e = slot.state_offset + i;
    if (slot.quantized) {
        scratch_m[t.offset + i] = adamw8bit_dequantize(s.maps, s.m_codes[e], s.m_absmax[slot.absmax_offset + b]);
        scratch_v[t.offset + i] =
            adamw8bit_dequantize(s.maps + ADAMW8BIT_MAP_SIZE, s.v_codes[e], s.v_absmax[slot.absmax_offset + b]);
    } else {
        scratch_m[t.offset + i] = s.m32[e];
        scratch_v[t.offset + i] = s.v32[e];
    }
}

// The inverse: block absmax and codes of the fp32 scratch moments (or a copy back to fp32 state);
// one warp per quantization block, 8 elements per lane.
__global__ void quantize_kernel(AdamW8bitState s, const float* scratch_m, const float* scratch_v,
                                const ParamTensor* tensors) {
    const int k = adamw8bit_find_tensor(s.slots, s.num_tensors, blockIdx.x);
    const ParamTensor t = tensors[k];
    const AdamW8bitSlot slot = s.slots[k];
    const size_t b = blockIdx.x - slot.first_block;
    float m[ADAMW8BIT_PER_LANE], v[ADAMW8BIT_PER_LANE], m_max = 0.f, v_max = 0.f;
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = b * ADAMW8BIT_BLOCK + r * 32 + threadIdx.x;
        m[r] = i < t.size ? scratch_m[t.offset + i] : 0.f;
        v[r] = i < t.size ? scratch_v[t.offset + i] : 0.f;
        m_max = fmaxf(m_max, fabsf(m[r]));
        v_max = fmaxf(v_max, v[r]);
    }
    const float2 absmax = adamw8bit_warp_max(m_max, v_max);
    for (int r = 0; r < ADAMW8BIT_PER_LANE; r++) {
        const size_t i = b * ADAMW8BIT_BLOCK + r * 32 + threadIdx.x, e = slot.state_offset + i;
        if (i >= t.size) break;
        if (slot.quantized) {
            s.m_codes[e] = adamw8bit_quantize(s.maps, m[r], absmax.x);
            s.v_codes[e] = adamw8bit_quantize_v(s.maps + ADAMW8BIT_MAP_SIZE, v[r], absmax.y);
        } else {
            s.m32[e] = m[r];
            s.v32[e] = v[r];
        }
    }
    if (slot.quantized && threadIdx.x == 0) {
        s.m_absmax[slot.absmax_offset + b] = absmax.x;
        s.v_absmax[slot.absmax_offset + b] = absmax.y;
    }
}

// ----------------------------------------------------------------------------
// Device state of one run, and the variants behind one signature

template <class T>
struct Run {
    const std::vector<ParamTensor>& table;
    AdamW8bitLayout layout;
    size_t N;
    T *params, *grads;
    float *master = nullptr, *scratch_m, *scratch_v;  // scratch: v1's fp32 moments, or 32-bit AdamW's
    unsigned char* state_buffer;
    ParamTensor* tensors;
    AdamW8bitState state;
    Run(const std::vector<ParamTensor>& t, bool with_master) : table(t), layout(adamw8bit_plan(t)), N(layout.N) {
        cudaMallocCheck(&params, N * sizeof(T));
        cudaMallocCheck(&grads, N * sizeof(T));
        if (with_master) cudaMallocCheck(&master, N * sizeof(float));
        cudaMallocCheck(&scratch_m, N * sizeof(float));
        cudaMallocCheck(&scratch_v, N * sizeof(float));
        cudaMallocCheck(&state_buffer, layout.total_bytes);
        cudaMallocCheck(&tensors, t.size() * sizeof(ParamTensor));
        cudaCheck(cudaMemcpy(tensors, t.data(), t.size() * sizeof(ParamTensor), cudaMemcpyHostToDevice));
        state = adamw8bit_init(state_buffer, layout);
    }
    ~Run() {
        for (void* ptr : {(void*)params, (void*)grads, (void*)master, (void*)scratch_m, (void*)scratch_v,
                          (void*)state_buffer, (void*)tensors})
            if (ptr) cudaCheck(cudaFree(ptr));
    }
};

enum class Variant { ThreeLaunches, Production, AdamW32 };
static const char* variant_name(Variant k) {
    if (k == Variant::ThreeLaunches) return "v1 dequantize/AdamW/quantize";
    return k == Variant::Production ? "production (fused)" : "32-bit AdamW (adamw.cuh)";
}

template <class T>
static void run_variant(Variant k, Run<T>& r, float grad_scale, int step) {
    const int nt = (int)r.table.size();
    if (k == Variant::Production) {
        adamw8bit_update(r.params, r.master, r.grads, r.state, r.tensors, nt, r.N, LR, BETA1, BETA2, EPS, WD,
                         grad_scale, step, 0);
    } else if (k == Variant::ThreeLaunches) {
        const dim3 grid((unsigned)r.layout.num_blocks);
        cudaCheck(launch_kernel(dequantize_kernel, grid, dim3(ADAMW8BIT_BLOCK), 0, 0, r.scratch_m, r.scratch_v, r.state,
                                r.tensors));
        adamw_update(r.params, r.master, r.grads, r.scratch_m, r.scratch_v, r.tensors, nt, r.N, LR, BETA1, BETA2, EPS,
                     WD, grad_scale, step, 0);
        cudaCheck(launch_kernel(quantize_kernel, grid, dim3(32), 0, 0, r.state, (const float*)r.scratch_m,
                                (const float*)r.scratch_v, r.tensors));
    } else {
        adamw_update(r.params, r.master, r.grads, r.scratch_m, r.scratch_v, r.tensors, nt, r.N, LR, BETA1, BETA2, EPS,
                     WD, grad_scale, step, 0);
    }
}

// ----------------------------------------------------------------------------
// Validation: 3 steps of each 8-bit variant vs the CPU reference from a zero state; same
// operations in the same order, so weights, codes and absmax must be identical (budget 0).

template <class T>
static void validate(Variant k, const std::vector<ParamTensor>& table) {
    const bool lowp = !std::is_same<T, float>::value;
    Run<T> r(table, lowp);
    const size_t N = r.N;
    const AdamW8bitLayout& L = r.layout;
    std::vector<float> p(N), g(N);
    th::fill_uniform(p.data(), N, 1);
    for (float& x : p) x = to_float(from_float<T>(x));
    cudaCheck(cudaMemcpy(r.params, th::round_to<T>(p).data(), N * sizeof(T), cudaMemcpyHostToDevice));
    if (lowp) cudaCheck(cudaMemcpy(r.master, p.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    HostState st{std::vector<float>(L.num_fp32, 0.f), std::vector<float>(L.num_fp32, 0.f),
                 std::vector<float>(L.num_absmax, 0.f), std::vector<float>(L.num_absmax, 0.f),
                 std::vector<uint8_t>(L.num_quantized, 0), std::vector<uint8_t>(L.num_quantized, 0)};
    const float scales[3] = {1.f, 0.37f, 1.f};
    for (int step = 1; step <= 3; step++) {
        th::fill_uniform(g.data(), N, 10 + step);
        std::vector<T> gT = th::round_to<T>(g);
        for (size_t i = 0; i < N; i++) g[i] = to_float(gT[i]);
        cudaCheck(cudaMemcpy(r.grads, gT.data(), N * sizeof(T), cudaMemcpyHostToDevice));
        run_variant(k, r, scales[step - 1], step);
        adamw8bit_cpu(p, st, g, table, L, scales[step - 1], step);
    }
    std::vector<float> w(N);
    std::vector<T> pT(N);
    cudaCheck(cudaMemcpy(pT.data(), r.params, N * sizeof(T), cudaMemcpyDeviceToHost));
    if (lowp) cudaCheck(cudaMemcpy(w.data(), r.master, N * sizeof(float), cudaMemcpyDeviceToHost));
    else for (size_t i = 0; i < N; i++) w[i] = to_float(pT[i]);
    std::vector<unsigned char> bytes(L.total_bytes);
    cudaCheck(cudaMemcpy(bytes.data(), r.state_buffer, L.total_bytes, cudaMemcpyDeviceToHost));
    const bool same_state =
        !memcmp(bytes.data() + L.m32_at, st.m32.data(), L.num_fp32 * 4) &&
        !memcmp(bytes.data() + L.v32_at, st.v32.data(), L.num_fp32 * 4) &&
        !memcmp(bytes.data() + L.m_absmax_at, st.m_absmax.data(), L.num_absmax * 4) &&
        !memcmp(bytes.data() + L.v_absmax_at, st.v_absmax.data(), L.num_absmax * 4) &&
        !memcmp(bytes.data() + L.m_codes_at, st.m_codes.data(), L.num_quantized) &&
        !memcmp(bytes.data() + L.v_codes_at, st.v_codes.data(), L.num_quantized);
    std::vector<T> ref_T = th::round_to<T>(p);
    char name[128], tn[32];
    snprintf(tn, sizeof(tn), "%s%s", th::dtype_name<T>(), lowp ? "+master" : "");
    snprintf(name, sizeof(name), "%s %s: weights", variant_name(k), tn);
    th::check_bitwise(name, p.data(), w.data(), N * 4);
    snprintf(name, sizeof(name), "%s %s: params", variant_name(k), tn);
    th::check_bitwise(name, ref_T.data(), pT.data(), N * sizeof(T));
    snprintf(name, sizeof(name), "%s %s: state (codes, absmax, fp32 moments)", variant_name(k), tn);
    th::report(same_state, name, "%zu quantized, %zu fp32-state elements, %zu blocks", L.num_quantized, L.num_fp32,
               L.num_absmax);
}

// ----------------------------------------------------------------------------
// Benchmark

template <class T>
static void benchmark(Variant k, const std::vector<ParamTensor>& table, int reps) {
    const bool lowp = !std::is_same<T, float>::value;
    Run<T> r(table, lowp);
    cudaCheck(cudaMemset(r.params, 0, r.N * sizeof(T)));
    cudaCheck(cudaMemset(r.grads, 0, r.N * sizeof(T)));
    cudaCheck(cudaMemset(r.scratch_m, 0, r.N * sizeof(float)));
    cudaCheck(cudaMemset(r.scratch_v, 0, r.N * sizeof(float)));
    if (lowp) cudaCheck(cudaMemset(r.master, 0, r.N * sizeof(float)));
    int step = 1;  // every call is the next step, the warm-up call included
    float ms = time_ms([&] { run_variant(k, r, 1.f, step++); }, reps);
    // Necessary bytes per parameter: read weights (fp32 master or fp32 params) and the gradient,
    // write the weights (and the T copy); plus the moments: 8-bit codes read and written (2 + 2),
    // 8 bytes of absmax per block, fp32 moments (16) for the small tensors; 32-bit AdamW: 16.
    const double weights = lowp ? (4 + sizeof(T)) + (4 + sizeof(T)) : 4 + sizeof(T) + 4;
    const AdamW8bitLayout& L = r.layout;
    double bytes = weights * r.N;
    if (k == Variant::AdamW32) bytes += 16.0 * r.N;
    else bytes += 4.0 * L.num_quantized + 16.0 * L.num_absmax + 16.0 * L.num_fp32;
    char name[96];
    snprintf(name, sizeof(name), "%-30s %-12s N=%zu", variant_name(k), lowp ? "bf16+master" : "fp32", r.N);
    bench_line(name, ms, bytes);
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "8-bit AdamW (block-wise quantized moments): variant 1 (dequantize, AdamW, quantize) and production\n"
        "(llmc/adamw8bit.cuh, fused), bit for bit, timed on GPT-2 124M's parameter table beside 32-bit AdamW.\n" DEV_VALIDATES);
    // Validation at a small GPT-2-like shape with odd sizes: quantized tensors (wte 36108, matrices)
    // with partial last blocks, fp32-state ones (wpe 2412, layernorms, biases, attproj 2592).
    std::vector<ParamTensor> small = gpt2_table(1003, 67, 2, 36).tensors;
    for (Variant k : {Variant::ThreeLaunches, Variant::Production}) {
        validate<float>(k, small);
        validate<__nv_bfloat16>(k, small);
        validate<__half>(k, small);
    }

    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const bool cpu_backend = peak_gbps() == 0;
    // GPT-2 124M on a GPU; a 1.35M-parameter model on the CPU backend, whose timings measure the
    // backend, not a GPU.
    std::vector<ParamTensor> table = (cpu_backend ? gpt2_table(4096, 256, 4, 128) : gpt2_table(50304, 1024, 12, 768)).tensors;
    const AdamW8bitLayout L = adamw8bit_plan(table);
    const int reps = cpu_backend ? 2 : 20;
    printf("8-bit state: %.4f bytes/param (%zu bytes for %zu parameters; 32-bit AdamW: 8 bytes/param)\n",
           (double)L.total_bytes / L.N, L.total_bytes, L.N);
    printf("benchmark on %s%s:\n", prop.name, cpu_backend ? " (CPU-backend figures, not GPU performance)" : "");
    for (Variant k : {Variant::ThreeLaunches, Variant::Production, Variant::AdamW32}) {
        benchmark<float>(k, table, reps);
        benchmark<__nv_bfloat16>(k, table, reps);
    }
    return th::finish();
}
