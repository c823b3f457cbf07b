// dev/cuda/encoder.cu — the embeddings (token + position, and BERT's token type), forward and
// backward: each variant against a CPU reference, then timed.
//
// Variants:
//   forward 1   one thread per element (2- or 4-byte accesses)
//   forward     llmc/encoder.cuh: one thread per 16-byte pack of channels (Packed128). Faster: a warp
//   production  moves 512 contiguous bytes per load instruction instead of 64-128, so 4-8x fewer
//               instructions (and address computations) for the same bytes.
//   backward 1  one thread per (destination row, channel), summing the row's whole group of
//               positions in order (deterministic, like the production kernel)
//   backward    llmc/encoder.cuh: groups cut into 32-position segments, one warp per (segment,
//   production  channel chunk) with 16-byte loads, fp32 partials for large groups. Faster: variant 1
//               puts a whole group on one thread's chain of dependent loads (a token type row sums
//               all B*T positions serially, frequent tokens stall their rows) and moves 2-4 bytes per
//               lane.
//
// Build and run: make build/cpu/dev_encoder && build/cpu/dev_encoder    (CPU backend)
//                make build/gpu/dev_encoder && build/gpu/dev_encoder    (GPU, nvcc)
// Prints a PASS/FAIL line per checked output and variant (the exit code says whether all passed),
// then times each variant (dev/cuda/README.md).
#include "../../llmc/encoder.cuh"
#include "../../test/harness.h"
#include "common.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

// ----------------------------------------------------------------------------
// CPU reference (double)

// out (B,T,C) = wte[inp] + wpe[t] (+ wtt[type]).
void encoder_forward_cpu(double* out, const int* inp, const double* wte, const double* wpe, const int* types,
                         const double* wtt, int B, int T, int C) {
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            double v = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
            if (wtt) v += wtt[(size_t)types[bt] * C + c];
            out[(size_t)bt * C + c] = v;
        }
}

// dwte, dwpe, dwtt += the gradient of the forward for dout (B,T,C).
void encoder_backward_cpu(double* dwte, double* dwpe, double* dwtt, const double* dout, const int* inp,
                          const int* types, int B, int T, int C) {
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            double g = dout[(size_t)bt * C + c];
            dwte[(size_t)inp[bt] * C + c] += g;
            dwpe[(size_t)(bt % T) * C + c] += g;
            if (dwtt) dwtt[(size_t)types[bt] * C + c] += g;
        }
}

// ----------------------------------------------------------------------------
// Variant 1 kernels

// One thread per output element.
template <class floatX>
__global__ void encoder_forward_kernel1(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                        const int* types, const floatX* wtt, int BT, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * C) return;
    int bt = (int)(idx / C), c = (int)(idx % C);
    float v = to_float(wte[(size_t)inp[bt] * C + c]) + to_float(wpe[(size_t)(bt % T) * C + c]);
    if (wtt != nullptr) v += to_float(wtt[(size_t)types[bt] * C + c]);
    out[idx] = from_float<floatX>(v);
}

// One thread per (row of a table, channel): row r's positions are positions[row_start[r] ..
// row_start[r+1]) (compressed rows, built on the host), summed in order into table[row_id[r]].
template <class floatX>
__global__ void encoder_backward_kernel1(floatX* table, const int* row_id, const int* row_start, const int* positions,
                                         int num_rows, const floatX* dout, int C) {
    int r = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= num_rows || c >= C) return;
    float sum = 0.f;
    for (int i = row_start[r]; i < row_start[r + 1]; i++) sum += to_float(dout[(size_t)positions[i] * C + c]);
    floatX* dst = table + (size_t)row_id[r] * C + c;
    *dst = from_float<floatX>(to_float(*dst) + sum);
}

// The compressed rows of one table for variant 1, on the device.
struct RowsDevice {
    int num_rows = 0;
    int *row_id = nullptr, *row_start = nullptr, *positions = nullptr;
};

// Groups positions 0..BT-1 by key (one compressed row per key that occurs) and uploads them.
RowsDevice build_rows(const int* keys, int BT, int num_keys) {
    std::vector<std::vector<int>> by_key(num_keys);
    for (int i = 0; i < BT; i++) by_key[keys[i]].push_back(i);
    std::vector<int> row_id, row_start{0}, positions;
    for (int k = 0; k < num_keys; k++) {
        if (by_key[k].empty()) continue;
        row_id.push_back(k);
        positions.insert(positions.end(), by_key[k].begin(), by_key[k].end());
        row_start.push_back((int)positions.size());
    }
    RowsDevice d;
    d.num_rows = (int)row_id.size();
    cudaMallocCheck(&d.row_id, row_id.size() * sizeof(int));
    cudaMallocCheck(&d.row_start, row_start.size() * sizeof(int));
    cudaMallocCheck(&d.positions, positions.size() * sizeof(int));
    cudaCheck(cudaMemcpy(d.row_id, row_id.data(), row_id.size() * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.row_start, row_start.data(), row_start.size() * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d.positions, positions.data(), positions.size() * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

// Frees the device copies of build_rows.
void free_rows(RowsDevice& d) {
    cudaCheck(cudaFree(d.row_id));
    cudaCheck(cudaFree(d.row_start));
    cudaCheck(cudaFree(d.positions));
    d = RowsDevice();
}

// Variant 1 of the forward: one thread per element.
template <class floatX>
void encoder_forward1(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, const int* types,
                      const floatX* wtt, int B, int T, int C, cudaStream_t stream) {
    const int block_size = 256;
    size_t n = (size_t)B * T * C;
    cudaCheck(launch_kernel(encoder_forward_kernel1<floatX>, dim3((int)CEIL_DIV(n, (size_t)block_size)),
                            dim3(block_size), 0, stream, out, inp, wte, wpe, types, wtt, B * T, T, C));
}

// Variant 1 of the backward: one launch per table over its compressed rows.
template <class floatX>
void encoder_backward1(floatX* dwte, floatX* dwpe, floatX* dwtt, const RowsDevice& wte_rows,
                       const RowsDevice& wpe_rows, const RowsDevice& wtt_rows, const floatX* dout, int C,
                       cudaStream_t stream) {
    const int block_size = 256;
    const RowsDevice* rows[3] = {&wte_rows, &wpe_rows, &wtt_rows};
    floatX* tables[3] = {dwte, dwpe, dwtt};
    for (int k = 0; k < 3; k++) {
        if (tables[k] == nullptr || rows[k]->num_rows == 0) continue;
        dim3 grid(CEIL_DIV(C, block_size), rows[k]->num_rows);
        cudaCheck(launch_kernel(encoder_backward_kernel1<floatX>, grid, dim3(block_size), 0, stream, tables[k],
                                (const int*)rows[k]->row_id, (const int*)rows[k]->row_start,
                                (const int*)rows[k]->positions, rows[k]->num_rows, dout, C));
    }
}

// ----------------------------------------------------------------------------
// Problem setup

// Device copies of one problem in storage type floatX and its double reference inputs.
template <class floatX>
struct Problem {
    int B = 0, T = 0, C = 0, V = 0, Vp = 0, n_types = 0;
    std::vector<int> inp, types;
    std::vector<double> wte, wpe, wtt, dout;  // storage-rounded values, as doubles
    floatX *d_out = nullptr, *d_wte = nullptr, *d_wpe = nullptr, *d_wtt = nullptr, *d_dout = nullptr;
    floatX *d_dwte = nullptr, *d_dwpe = nullptr, *d_dwtt = nullptr;
    int *d_inp = nullptr, *d_types = nullptr;
};

// Uploads n values uniform in [-1, 1), rounded to floatX; returns the rounded values.
template <class floatX>
std::vector<double> upload_random(floatX** d, size_t n, uint64_t seed) {
    std::vector<floatX> x = th::random_tensor<floatX>(n, seed);
    cudaMallocCheck(d, n * sizeof(floatX));
    cudaCheck(cudaMemcpy(*d, x.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return th::widen(x);
}

// Tokens with a Zipf-like skew (token k has weight 1/(k+1)), as in text: a few tokens occur
// hundreds of times per batch. Types: the first third of each sequence is type 0, the rest 1.
template <class floatX>
Problem<floatX> make_problem(int B, int T, int C, int V, int Vp, int n_types, uint64_t seed) {
    Problem<floatX> p;
    p.B = B, p.T = T, p.C = C, p.V = V, p.Vp = Vp, p.n_types = n_types;
    int BT = B * T;
    std::vector<double> cdf(V);
    double total = 0;
    for (int k = 0; k < V; k++) cdf[k] = total += 1.0 / (k + 1);
    std::vector<float> u(BT);
    th::fill_uniform(u.data(), BT, seed, 0.f, 1.f);
    p.inp.resize(BT);
    p.types.resize(BT);
    for (int i = 0; i < BT; i++) {
        p.inp[i] = (int)(std::lower_bound(cdf.begin(), cdf.end(), u[i] * total) - cdf.begin());
        p.inp[i] = std::min(p.inp[i], V - 1);
        p.types[i] = n_types ? (i % T >= T / 3 ? 1 : 0) % n_types : 0;
    }
    p.wte = upload_random(&p.d_wte, (size_t)Vp * C, seed + 1);
    p.wpe = upload_random(&p.d_wpe, (size_t)T * C, seed + 2);
    p.wtt = upload_random(&p.d_wtt, (size_t)std::max(n_types, 1) * C, seed + 3);
    p.dout = upload_random(&p.d_dout, (size_t)BT * C, seed + 4);
    cudaMallocCheck(&p.d_out, (size_t)BT * C * sizeof(floatX));
    cudaMallocCheck(&p.d_dwte, (size_t)Vp * C * sizeof(floatX));
    cudaMallocCheck(&p.d_dwpe, (size_t)T * C * sizeof(floatX));
    cudaMallocCheck(&p.d_dwtt, (size_t)std::max(n_types, 1) * C * sizeof(floatX));
    cudaMallocCheck(&p.d_inp, BT * sizeof(int));
    cudaMallocCheck(&p.d_types, BT * sizeof(int));
    cudaCheck(cudaMemcpy(p.d_inp, p.inp.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(p.d_types, p.types.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    return p;
}

// Frees the problem's device buffers.
template <class floatX>
void free_problem(Problem<floatX>& p) {
    floatX* buffers[] = {p.d_out, p.d_wte, p.d_wpe, p.d_wtt, p.d_dout, p.d_dwte, p.d_dwpe, p.d_dwtt};
    for (floatX* d : buffers) cudaCheck(cudaFree(d));
    cudaCheck(cudaFree(p.d_inp));
    cudaCheck(cudaFree(p.d_types));
}

// ----------------------------------------------------------------------------
// Validation

// Checks both variants of the forward and of the backward against the double reference.
template <class floatX>
void validate(int B, int T, int C, int V, int Vp, int n_types) {
    Problem<floatX> p = make_problem<floatX>(B, T, C, V, Vp, n_types, 1000 + C);
    int BT = B * T;
    bool types = n_types > 0;
    const int* d_types = types ? p.d_types : nullptr;
    const floatX* d_wtt = types ? p.d_wtt : nullptr;
    floatX* d_dwtt = types ? p.d_dwtt : nullptr;
    char name[200];

    // Forward: two fp32 additions of values in [-1, 1) (atol = EPS_FP32, k = 1), bf16 and fp16 add
    // the rounding of the result (k = 1 of the type's eps); see test/test_encoder.cu.
    std::vector<double> ref((size_t)BT * C);
    encoder_forward_cpu(ref.data(), p.inp.data(), p.wte.data(), p.wpe.data(), p.types.data(),
                        types ? p.wtt.data() : nullptr, B, T, C);
    th::Tol ftol = sizeof(floatX) == 4 ? th::tol(th::EPS_FP32, 1, th::EPS_FP32)
                                       : th::tol(dtype_eps<floatX>(), 1, th::EPS_FP32);
    for (int v = 1; v <= 2; v++) {
        cudaCheck(cudaMemset(p.d_out, 0, (size_t)BT * C * sizeof(floatX)));
        if (v == 1) encoder_forward1(p.d_out, p.d_inp, p.d_wte, p.d_wpe, d_types, d_wtt, B, T, C, 0);
        else encoder_forward(p.d_out, p.d_inp, p.d_wte, p.d_wpe, d_types, d_wtt, B, T, C, 0);
        snprintf(name, sizeof(name), "forward %d %s B=%d T=%d C=%d%s", v, th::dtype_name<floatX>(), B, T, C,
                 types ? " +types" : "");
        th::check_close(name, ref.data(), th::to_host(p.d_out, ref.size()).data(), ref.size(), ftol);
    }

    // Backward from zeroed gradients: a sum of n terms in fp32 errs by at most n*u*sum|terms|
    // <= n*u*n (|dout| < 1), so atol = max_n^2 * EPS_FP32 / 2 covers every row; bf16 and fp16 add
    // the rounding of the result (k = 1 of the type's eps).
    size_t nte = (size_t)Vp * C, npe = (size_t)T * C, ntt = (size_t)std::max(n_types, 1) * C;
    std::vector<double> gref(nte + npe + ntt, 0.0);
    encoder_backward_cpu(gref.data(), gref.data() + nte, types ? gref.data() + nte + npe : nullptr, p.dout.data(),
                         p.inp.data(), p.types.data(), B, T, C);
    std::vector<int> count(Vp, 0);
    for (int i = 0; i < BT; i++) count[p.inp[i]]++;
    double max_n = std::max({(double)*std::max_element(count.begin(), count.end()), (double)B,
                             types ? (double)BT : 0.0});
    th::Tol btol{max_n * max_n * th::EPS_FP32 / 2, sizeof(floatX) == 4 ? 0.0 : dtype_eps<floatX>()};

    EncoderBackwardPlan plan;
    encoder_backward_plan(&plan, p.inp.data(), types ? p.types.data() : nullptr, B, T, C, V, n_types, 0);
    std::vector<int> positions_of_t(BT);
    for (int i = 0; i < BT; i++) positions_of_t[i] = i % T;
    RowsDevice wte_rows = build_rows(p.inp.data(), BT, V), wpe_rows = build_rows(positions_of_t.data(), BT, T);
    RowsDevice wtt_rows = build_rows(p.types.data(), BT, std::max(n_types, 1));
    for (int v = 1; v <= 2; v++) {
        cudaCheck(cudaMemset(p.d_dwte, 0, nte * sizeof(floatX)));
        cudaCheck(cudaMemset(p.d_dwpe, 0, npe * sizeof(floatX)));
        cudaCheck(cudaMemset(p.d_dwtt, 0, ntt * sizeof(floatX)));
        if (v == 1) encoder_backward1(p.d_dwte, p.d_dwpe, d_dwtt, wte_rows, wpe_rows, wtt_rows, p.d_dout, C, 0);
        else encoder_backward(p.d_dwte, p.d_dwpe, d_dwtt, plan, p.d_dout, p.d_inp, d_types, B, T, C, 0);
        std::vector<floatX> got = th::to_host(p.d_dwte, nte), pe = th::to_host(p.d_dwpe, npe),
                            tt = th::to_host(p.d_dwtt, ntt);
        got.insert(got.end(), pe.begin(), pe.end());
        got.insert(got.end(), tt.begin(), tt.end());
        snprintf(name, sizeof(name), "backward %d %s B=%d T=%d C=%d%s", v, th::dtype_name<floatX>(), B, T, C,
                 types ? " +types" : "");
        th::check_close(name, gref.data(), got.data(), gref.size(), btol);
    }
    free_rows(wte_rows);
    free_rows(wpe_rows);
    free_rows(wtt_rows);
    encoder_backward_plan_free(&plan);
    free_problem(p);
}

// ----------------------------------------------------------------------------
// Benchmark

// GPT-2 124M's step shape (B*T = 8192, C = 768, V = 50257) on a GPU; a smaller batch on the CPU
// backend. The backward with token types is BERT's (two types). Bytes counted: the compulsory
// traffic — forward: two or three table rows read and one row written per position; backward:
// dout read once per table, and every touched gradient row read and written once.
void benchmark() {
    using floatX = __nv_bfloat16;
    bool gpu = peak_gbps() > 0;
    int B = gpu ? 8 : 1, T = gpu ? 1024 : 256, C = 768, V = 50257, Vp = 50304, reps = gpu ? 20 : 1;
    printf("benchmark, bf16, B=%d T=%d C=%d V=%d%s\n", B, T, C, V,
           gpu ? "" : "  (CPU-backend figures: they measure the simulator, not a GPU)");
    for (int n_types : {0, 2}) {
        Problem<floatX> p = make_problem<floatX>(B, T, C, V, Vp, n_types, 7);
        int BT = B * T, tables = n_types ? 3 : 2;
        const int* d_types = n_types ? p.d_types : nullptr;
        const floatX* d_wtt = n_types ? p.d_wtt : nullptr;
        floatX* d_dwtt = n_types ? p.d_dwtt : nullptr;
        double row = (double)C * sizeof(floatX);
        printf(" %s\n", n_types ? "with token types (BERT)" : "without token types (GPT-2)");
        double fbytes = (double)BT * (tables + 1) * row + BT * sizeof(int) * (tables - 1);
        bench_line("forward 1 (element per thread)", time_ms([&] {
            encoder_forward1(p.d_out, p.d_inp, p.d_wte, p.d_wpe, d_types, d_wtt, B, T, C, 0);
        }, reps), fbytes);
        bench_line("forward 2 (llmc, Packed128)", time_ms([&] {
            encoder_forward(p.d_out, p.d_inp, p.d_wte, p.d_wpe, d_types, d_wtt, B, T, C, 0);
        }, reps), fbytes);

        // The host's share: building the lists (a trainer's data-loader thread does it), timed apart
        // from the upload.
        EncoderBackwardPlan plan;
        auto t0 = std::chrono::steady_clock::now();
        encoder_plan_build(plan.lists, p.inp.data(), n_types ? p.types.data() : nullptr, B, T, V, n_types);
        double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        encoder_backward_plan_upload(&plan, plan.lists, C, 0);
        std::vector<int> distinct(p.inp);
        std::sort(distinct.begin(), distinct.end());
        size_t rows = (size_t)(std::unique(distinct.begin(), distinct.end()) - distinct.begin()) + T + n_types;
        double bbytes = (double)BT * tables * row + 2.0 * rows * row;
        std::vector<int> positions_of_t(BT);
        for (int i = 0; i < BT; i++) positions_of_t[i] = i % T;
        RowsDevice wte_rows = build_rows(p.inp.data(), BT, V), wpe_rows = build_rows(positions_of_t.data(), BT, T);
        RowsDevice wtt_rows = build_rows(p.types.data(), BT, std::max(n_types, 1));
        bench_line("backward 1 (thread per row, channel)", time_ms([&] {
            encoder_backward1(p.d_dwte, p.d_dwpe, d_dwtt, wte_rows, wpe_rows, wtt_rows, p.d_dout, C, 0);
        }, reps), bbytes);
        bench_line("backward 2 (llmc, segments)", time_ms([&] {
            encoder_backward(p.d_dwte, p.d_dwpe, d_dwtt, plan, p.d_dout, p.d_inp, d_types, B, T, C, 0);
        }, reps), bbytes);
        printf("  %-*s %9.4f ms  (host: %zu segments, %zu multi-segment groups)\n", kBenchNameWidth,
               "backward plan's lists (host, per micro-step)", plan_ms, plan.lists.segments.size(), plan.lists.groups.size());
        free_rows(wte_rows);
        free_rows(wpe_rows);
        free_rows(wtt_rows);
        encoder_backward_plan_free(&plan);
        free_problem(p);
    }
}

int main(int argc, char** argv) {
    dev_command_line(argc, argv,
        "The embeddings (token + position, and BERT's token type), forward and backward: variants 1\n"
        "and production (llmc/encoder.cuh), timed in GB/s.\n" DEV_VALIDATES);
    // Shapes: GPT-2 scaled down; C not a multiple of 8 or 32 (element access in bf16 and fp16);
    // B > 32 (every wpe row spans two segments); a skewed vocabulary with token types (large groups).
    for (int dtype = 0; dtype < 3; dtype++) {
        auto run = [&](int B, int T, int C, int V, int Vp, int n_types) {
            if (dtype == 0) validate<float>(B, T, C, V, Vp, n_types);
            else if (dtype == 1) validate<__nv_bfloat16>(B, T, C, V, Vp, n_types);
            else validate<__half>(B, T, C, V, Vp, n_types);
        };
        run(4, 64, 96, 500, 512, 0);
        run(40, 6, 100, 300, 320, 2);
        run(3, 7, 45, 37, 40, 3);
    }
    benchmark();
    return th::finish();
}
