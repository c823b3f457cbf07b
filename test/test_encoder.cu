// test/test_encoder.cu — encoder_forward and encoder_backward (llmc/encoder.cuh) against a CPU
// reference in double, for float, bf16 and fp16, under forward/reverse/random thread orders; the backward
// replayed from a CUDA graph for other batches' plans; the plan's checks of token ids.
#include "../llmc/encoder.cuh"
#include "harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// Token ids in [0, V): `hot` of every 10 positions (on average) take token `hot_id`, so that its
// group spans several 32-position segments; V-1 and 0 occur; the rest is uniform.
std::vector<int> make_tokens(int n, int V, int hot_id, int hot, uint64_t seed) {
    std::vector<float> u(n), w(n);
    th::fill_uniform(u.data(), n, seed, 0.f, 1.f);
    th::fill_uniform(w.data(), n, seed + 1, 0.f, 1.f);
    std::vector<int> ids(n);
    for (int i = 0; i < n; i++) ids[i] = u[i] * 10 < hot ? hot_id : std::min(V - 1, (int)(w[i] * V));
    ids[0] = V - 1;
    ids[n - 1] = 0;
    return ids;
}

// One shape of the embeddings: B, T, C, the table sizes, token types or not.
struct Shape {
    int B, T, C, V, Vp, maxT, n_types;  // n_types 0: GPT-2 (no token types)
    int hot;                            // tenths of the positions that take one frequent token
};

// Writes the shape's short description into buf (for test names).
const char* describe(const Shape& s, char* buf, size_t len) {
    snprintf(buf, len, "B=%d T=%d C=%d V=%d%s", s.B, s.T, s.C, s.V, s.n_types ? " +types" : "");
    return buf;
}

// ----------------------------------------------------------------------------
// Forward

// encoder_forward against the double reference, under thread orders.
template <class floatX>
void test_forward(const Shape& s, uint64_t seed) {
    int BT = s.B * s.T;
    std::vector<floatX> wte = th::random_tensor<floatX>((size_t)s.Vp * s.C, seed);
    std::vector<floatX> wpe = th::random_tensor<floatX>((size_t)s.maxT * s.C, seed + 1);
    std::vector<floatX> wtt = th::random_tensor<floatX>((size_t)std::max(s.n_types, 1) * s.C, seed + 2);
    std::vector<int> inp = make_tokens(BT, s.V, 3, s.hot, seed + 3);
    std::vector<int> types(BT);
    for (int i = 0; i < BT; i++) types[i] = s.n_types ? (i * 7 + i / s.T) % s.n_types : 0;

    th::DeviceBuffer<floatX> d_out((size_t)BT * s.C), d_wte(wte), d_wpe(wpe), d_wtt(wtt);
    th::DeviceBuffer<int> d_inp(inp), d_types(types);
    const int* types_ptr = s.n_types ? d_types.ptr : nullptr;
    const floatX* wtt_ptr = s.n_types ? d_wtt.ptr : nullptr;

    char shape[96], name[256];
    describe(s, shape, sizeof(shape));
    snprintf(name, sizeof(name), "encoder_forward %s %s: thread orders", th::dtype_name<floatX>(), shape);
    auto out = th::run_orders(name, [&] {
        encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, types_ptr, wtt_ptr, s.B, s.T, s.C, 0);
        return d_out.host();
    });

    std::vector<double> ref((size_t)BT * s.C);
    for (int bt = 0; bt < BT; bt++)
        for (int c = 0; c < s.C; c++) {
            double v = (double)to_float(wte[(size_t)inp[bt] * s.C + c]) + to_float(wpe[(size_t)(bt % s.T) * s.C + c]);
            if (s.n_types) v += to_float(wtt[(size_t)types[bt] * s.C + c]);
            ref[(size_t)bt * s.C + c] = v;
        }
    // Two fp32 additions of terms in [-1, 1): error <= u*|a+b| + u*|ref| <= eps + eps/2*|ref| (u = eps/2):
    // atol = EPS_FP32, k = 1. bf16 and fp16: one more rounding of the result, <= half an ulp of the
    // storage type: k = 1 of its eps (no subnormal floor for fp16: its inputs are multiples of 2^-24,
    // so a sum below its normal range is one too, and exact).
    th::Tol tol = sizeof(floatX) == 4 ? th::tol(th::EPS_FP32, 1, th::EPS_FP32)
                                      : th::tol(dtype_eps<floatX>(), 1, th::EPS_FP32);
    snprintf(name, sizeof(name), "encoder_forward %s %s: out vs double reference", th::dtype_name<floatX>(), shape);
    th::check_close(name, ref.data(), th::widen(out).data(), ref.size(), tol);
}

// ----------------------------------------------------------------------------
// Backward

// Compares a gradient table with per-element budgets: a sum of n terms rounded along a chain of
// n+1 fp32 additions (the initial value included) errs by at most (n+1)*u*sum|terms| (Higham's
// gamma bound; with eps = 2u it has a factor 2 to spare), and bf16 or fp16 output adds one rounding
// of at most half an ulp (k = 1 of the storage type's eps leaves a factor 2).
template <class floatX>
bool check_gradient(const char* name, const std::vector<double>& ref, const std::vector<double>& abs_sum,
                    const std::vector<int>& n_terms, const std::vector<floatX>& out) {
    double out_eps = sizeof(floatX) == 4 ? 0.0 : dtype_eps<floatX>();
    std::vector<double> budget(ref.size());
    for (size_t i = 0; i < ref.size(); i++)
        budget[i] = (n_terms[i] + 1) * th::EPS_FP32 * abs_sum[i] + out_eps * std::fabs(ref[i]);
    return th::check_budget(name, ref, out, budget);
}

// encoder_backward (+= into random initial gradients) against the double reference, under
// thread orders; `plan` is reused from the previous call, as a trainer reuses it across steps.
template <class floatX>
void test_backward(const Shape& s, EncoderBackwardPlan& plan, uint64_t seed) {
    int BT = s.B * s.T, C = s.C;
    int types_rows = std::max(s.n_types, 1);
    std::vector<floatX> dout = th::random_tensor<floatX>((size_t)BT * C, seed);
    std::vector<floatX> dwte0 = th::random_tensor<floatX>((size_t)s.Vp * C, seed + 1, -0.5f, 0.5f);
    std::vector<floatX> dwpe0 = th::random_tensor<floatX>((size_t)s.maxT * C, seed + 2, -0.5f, 0.5f);
    std::vector<floatX> dwtt0 = th::random_tensor<floatX>((size_t)types_rows * C, seed + 3, -0.5f, 0.5f);
    std::vector<int> inp = make_tokens(BT, s.V, 7, s.hot, seed + 4);
    std::vector<int> types(BT);
    for (int i = 0; i < BT; i++) types[i] = s.n_types ? (i % s.T >= s.T / 3 ? 1 : 0) % s.n_types : 0;
    if (s.n_types > 2) types[BT / 2] = s.n_types - 1;

    th::DeviceBuffer<floatX> d_dout(dout), d_dwte(dwte0.size()), d_dwpe(dwpe0.size()), d_dwtt(dwtt0.size());
    th::DeviceBuffer<int> d_inp(inp), d_types(types);
    bool has_types = s.n_types > 0;
    encoder_backward_plan(&plan, inp.data(), has_types ? types.data() : nullptr, s.B, s.T, C, s.V, s.n_types, 0);

    char shape[96], name[256];
    describe(s, shape, sizeof(shape));
    snprintf(name, sizeof(name), "encoder_backward %s %s: thread orders (segments: %zu, multi-segment groups: %zu)",
             th::dtype_name<floatX>(), shape, plan.lists.segments.size(), plan.lists.groups.size());
    auto grads = th::run_orders(name, [&] {
        d_dwte.upload(dwte0);
        d_dwpe.upload(dwpe0);
        d_dwtt.upload(dwtt0);
        encoder_backward(d_dwte.ptr, d_dwpe.ptr, has_types ? d_dwtt.ptr : nullptr, plan, d_dout.ptr, d_inp.ptr,
                         has_types ? d_types.ptr : nullptr, s.B, s.T, C, 0);
        std::vector<floatX> all = d_dwte.host(), pe = d_dwpe.host(), tt = d_dwtt.host();
        all.insert(all.end(), pe.begin(), pe.end());
        all.insert(all.end(), tt.begin(), tt.end());
        return all;
    });

    // Reference: the initial values plus the sums in double, with sum|terms| and the term counts.
    std::vector<floatX> init = dwte0;
    init.insert(init.end(), dwpe0.begin(), dwpe0.end());
    init.insert(init.end(), dwtt0.begin(), dwtt0.end());
    std::vector<double> ref = th::widen(init), abs_sum(ref.size());
    std::vector<int> n_terms(ref.size(), 0);
    for (size_t i = 0; i < ref.size(); i++) abs_sum[i] = std::fabs(ref[i]);
    size_t pe_base = dwte0.size(), tt_base = pe_base + dwpe0.size();
    for (int bt = 0; bt < BT; bt++) {
        size_t rows[3] = {(size_t)inp[bt] * C, pe_base + (size_t)(bt % s.T) * C, tt_base + (size_t)types[bt] * C};
        for (int r = 0; r < (has_types ? 3 : 2); r++)
            for (int c = 0; c < C; c++) {
                double g = to_float(dout[(size_t)bt * C + c]);
                ref[rows[r] + c] += g;
                abs_sum[rows[r] + c] += std::fabs(g);
                n_terms[rows[r] + c]++;
            }
    }
    snprintf(name, sizeof(name), "encoder_backward %s %s: dwte, dwpe%s vs double reference", th::dtype_name<floatX>(),
             shape, has_types ? ", dwtt" : "");
    check_gradient(name, ref, abs_sum, n_terms, grads);
}

// Loss-scaled fp16 gradients: a sum beyond fp16's range must become inf (not be clamped) and an inf
// or NaN in dout must reach its rows, so the trainer's overflow check sees them. B = 2, T = 3, C = 16
// (one 128-bit pack per 8 channels): token 5 at positions (0, 0) and (1, 0), whose dout[.][2] = 40000
// add up to 80000 in dwte[5][2] and dwpe[0][2]; dout at (b=1, t=2) holds an inf in channel 9 and a
// NaN in channel 10.
void test_backward_nonfinite_fp16() {
    const int B = 2, T = 3, C = 16, V = 8;
    std::vector<int> inp = {5, 1, 2, 5, 3, 4};
    std::vector<__half> dout = th::random_tensor<__half>((size_t)B * T * C, 61);
    dout[0 * C + 2] = dout[3 * C + 2] = from_float<__half>(40000.f);
    dout[5 * C + 9] = from_float<__half>(INFINITY);
    dout[5 * C + 10] = from_float<__half>(NAN);
    th::DeviceBuffer<__half> d_dout(dout), d_dwte((size_t)V * C, th::Fill::Zero), d_dwpe((size_t)T * C, th::Fill::Zero);
    th::DeviceBuffer<int> d_inp(inp);
    EncoderBackwardPlan plan;
    encoder_backward_plan(&plan, inp.data(), nullptr, B, T, C, V, 0, 0);
    encoder_backward(d_dwte.ptr, d_dwpe.ptr, (__half*)nullptr, plan, d_dout.ptr, d_inp.ptr, nullptr, B, T, C, 0);
    encoder_backward_plan_free(&plan);
    std::vector<__half> dwte = d_dwte.host(), dwpe = d_dwpe.host();
    auto f = [](__half x) { return to_float(x); };
    size_t unexpected = 0;  // every other element must be finite
    for (int r = 0; r < V; r++)
        for (int c = 0; c < C; c++)
            if (!(r == 5 && c == 2) && !(r == 4 && (c == 9 || c == 10)))
                unexpected += !std::isfinite(f(dwte[r * C + c]));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            if (!(t == 0 && c == 2) && !(t == 2 && (c == 9 || c == 10)))
                unexpected += !std::isfinite(f(dwpe[t * C + c]));
    bool ok = f(dwte[5 * C + 2]) == INFINITY && f(dwpe[2]) == INFINITY && f(dwte[4 * C + 9]) == INFINITY &&
              std::isnan(f(dwte[4 * C + 10])) && f(dwpe[2 * C + 9]) == INFINITY && std::isnan(f(dwpe[2 * C + 10])) &&
              unexpected == 0;
    th::report(ok, "encoder_backward fp16: an overflowing sum, an inf and a NaN reach dwte and dwpe (no clamping)",
               "dwte[5][2]=%g dwpe[0][2]=%g (want inf), dwte[4][9]=%g dwte[4][10]=%g dwpe[2][9]=%g dwpe[2][10]=%g, "
               "other non-finite: %zu",
               f(dwte[5 * C + 2]), f(dwpe[2]), f(dwte[4 * C + 9]), f(dwte[4 * C + 10]), f(dwpe[2 * C + 9]),
               f(dwpe[2 * C + 10]), unexpected);
}

// The backward's launches do not depend on the batch: captured once in a CUDA graph with one
// batch's plan, replayed after the plans of two other batches (another token mix, with more and
// fewer multi-segment groups) were uploaded into the same buffers, it gives each batch's eager
// result bit for bit. The plan's SM count is set to 1 (8 blocks of 8 warps) so that the kernels'
// loops over the device's counts take several turns.
void test_backward_graph_replay() {
    using floatX = __nv_bfloat16;
    const int B = 40, T = 5, C = 24, V = 60, n_types = 3, BT = B * T;
    std::vector<floatX> dout = th::random_tensor<floatX>((size_t)BT * C, 71);
    std::vector<int> types(BT);
    for (int i = 0; i < BT; i++) types[i] = i % n_types;
    std::vector<int> batches[3] = {make_tokens(BT, V, 7, 4, 72), make_tokens(BT, V, 3, 9, 73),
                                   make_tokens(BT, V, 5, 0, 74)};
    th::DeviceBuffer<floatX> d_dout(dout), d_dwte((size_t)V * C, th::Fill::Zero), d_dwpe((size_t)T * C, th::Fill::Zero),
        d_dwtt((size_t)n_types * C, th::Fill::Zero);
    th::DeviceBuffer<int> d_inp(batches[0]), d_types(types);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    auto zero_grads = [&] {
        for (auto* g : {&d_dwte, &d_dwpe, &d_dwtt})
            cudaCheck(cudaMemsetAsync(g->ptr, 0, g->n * sizeof(floatX), stream));
    };
    auto grads = [&] {
        cudaCheck(cudaStreamSynchronize(stream));
        std::vector<floatX> all = d_dwte.host(), pe = d_dwpe.host(), tt = d_dwtt.host();
        all.insert(all.end(), pe.begin(), pe.end());
        all.insert(all.end(), tt.begin(), tt.end());
        return all;
    };
    auto backward = [&](const EncoderBackwardPlan& plan) {
        encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dwtt.ptr, plan, d_dout.ptr, d_inp.ptr, d_types.ptr, B, T, C, stream);
    };
    EncoderBackwardPlan eager, graphed;
    std::vector<floatX> want[3], got[3];
    for (int k = 0; k < 3; k++) {
        encoder_backward_plan(&eager, batches[k].data(), types.data(), B, T, C, V, n_types, stream);
        zero_grads();
        backward(eager);
        want[k] = grads();
    }
    cudaGraphExec_t exec = nullptr;
    int segments[3] = {}, groups[3] = {};
    for (int k = 0; k < 3; k++) {
        encoder_backward_plan(&graphed, batches[k].data(), types.data(), B, T, C, V, n_types, stream);
        graphed.sm_count = 1;
        segments[k] = (int)graphed.lists.segments.size();
        groups[k] = (int)graphed.lists.groups.size();
        zero_grads();
        if (!exec) {
            cudaGraph_t graph;
            cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            backward(graphed);
            cudaCheck(cudaStreamEndCapture(stream, &graph));
            cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
            cudaCheck(cudaGraphDestroy(graph));
        }
        cudaCheck(cudaGraphLaunch(exec, stream));
        got[k] = grads();
    }
    cudaCheck(cudaGraphExecDestroy(exec));
    encoder_backward_plan_free(&eager);
    encoder_backward_plan_free(&graphed);
    cudaCheck(cudaStreamDestroy(stream));
    bool same = true;
    for (int k = 0; k < 3; k++)
        same &= want[k].size() == got[k].size() && memcmp(want[k].data(), got[k].data(), want[k].size() * sizeof(floatX)) == 0;
    th::report(same && segments[0] > 64 && groups[1] != groups[2],
               "encoder_backward bf16: one graph replayed for 3 batches' plans == eager, bit for bit",
               "results %s; segments %d/%d/%d, multi-segment groups %d/%d/%d (64 warps in the grid)",
               same ? "bit-identical" : "differ", segments[0], segments[1], segments[2], groups[0], groups[1],
               groups[2]);
}

// ----------------------------------------------------------------------------
// The plan's id checks: each runs in a child process, which must exit with a clear message.

// Builds a plan from token ids with one bad entry (child process side).
int run_bad_ids(const std::string& which) {
    int B = 2, T = 5, V = 50;
    std::vector<int> inp(B * T, 1), types(B * T, 0);
    if (which == "token") inp[7] = V;
    if (which == "negative") inp[3] = -1;
    if (which == "type") types[4] = 2;
    EncoderBackwardPlan plan;
    encoder_backward_plan(&plan, inp.data(), types.data(), B, T, 8, V, 2, 0);
    encoder_backward_plan_free(&plan);
    return 0;
}

// Runs this binary with --bad-ids `which` and checks that it fails with the expected message.
void expect_rejected(const char* self, const char* which, const char* must_contain) {
    th::ChildOutput child = th::run_command(std::string(self) + " --bad-ids " + which + " 2>&1");
    std::string& out = child.text;
    bool ok = child.status != 0 && out.find(must_contain) != std::string::npos;
    std::string name = std::string("encoder_backward_plan rejects a bad id: ") + which;
    if (!out.empty() && out.back() == '\n') out.pop_back();
    th::report(ok, name.c_str(), "status %d | %s", child.status, out.substr(0, 200).c_str());
}

// ----------------------------------------------------------------------------

// Every test for one storage type.
template <class floatX>
void test_dtype() {
    // GPT-2-like scaled down (C = 768/8; V=500 padded to 512); C = 100 and 45 are not multiples of
    // 8 (bf16 and fp16 fall back to element access) nor of 32; B = 40 > 32 splits every wpe row's group.
    const Shape shapes[] = {
        {4, 64, 96, 500, 512, 80, 0, 4},
        {40, 5, 100, 500, 512, 8, 2, 1},
        {3, 7, 45, 37, 40, 7, 3, 5},
    };
    uint64_t seed = 100;
    for (const Shape& s : shapes) test_forward<floatX>(s, seed += 10);
    EncoderBackwardPlan plan;  // one plan for all shapes and steps: it regrows and rebuilds
    for (const Shape& s : shapes) test_backward<floatX>(s, plan, seed += 10);
    test_backward<floatX>(shapes[0], plan, seed += 10);  // a second step of the same shape
    encoder_backward_plan_free(&plan);
}

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--bad-ids") return run_bad_ids(argv[2]);
    test_dtype<float>();
    test_dtype<__nv_bfloat16>();
    test_dtype<__half>();
    test_backward_nonfinite_fp16();
    test_backward_graph_replay();
    expect_rejected(argv[0], "token", "token id 50 at (b=1, t=2) is outside the vocabulary [0, 50)");
    expect_rejected(argv[0], "negative", "token id -1 at (b=0, t=3)");
    expect_rejected(argv[0], "type", "token type 2 at (b=0, t=4) is outside [0, 2)");
    return th::finish();
}
