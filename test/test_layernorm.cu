// test/test_layernorm.cu — the kernels of llmc/layernorm.cuh (LayerNorm forward and backward, the
// fused residual + LayerNorm, the residual add) against a double-precision reference, for fp32, bf16
// and fp16, under three thread orders, at GPT-2-like shapes scaled down and at sizes that are not
// multiples of 8/32/128, with per-element error budgets derived from the kernels' arithmetic.
#include "../llmc/layernorm.cuh"
#include "harness.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

// ----------------------------------------------------------------------------
// Helpers

// The unit roundoff of the final rounding to T, on top of the fp32 computation: 0 for fp32 (the
// fp32 budget already counts it), eps of bf16 or fp16 for those (k = 1: one rounding is at most eps/2
// of the value, the other half covers an fp32 result that straddles a rounding boundary the exact
// one does not).
template <class T>
double final_rounding() { return sizeof(T) == 4 ? 0.0 : dtype_eps<T>(); }

// Rows of C values with a per-row offset and spread cycling through: centered, shifted, a large
// mean against a small spread (a one-pass E[x^2] - E[x]^2 variance would lose every digit), and a
// variance below eps = 1e-5 (so eps visibly matters).
template <class T>
std::vector<T> layernorm_input(int N, int C, uint64_t seed) {
    const float offsets[] = {0.f, 0.5f, 30.f, 0.f}, spreads[] = {1.f, 2.f, 0.25f, 0.003f};
    std::vector<float> f((size_t)N * C);
    th::fill_uniform(f.data(), f.size(), seed);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) f[(size_t)n * C + c] = offsets[n % 4] + spreads[n % 4] * f[(size_t)n * C + c];
    return th::round_to<T>(f);
}

// Concatenates vectors of T as floats (exact for fp32, bf16 and fp16), for run_orders' bitwise compare.
template <class T>
std::vector<float> as_floats(std::initializer_list<const std::vector<T>*> parts) {
    std::vector<float> all;
    for (auto* p : parts)
        for (const T& v : *p) all.push_back(to_float(v));
    return all;
}

// ----------------------------------------------------------------------------
// Reference (double) and error budgets
//
// The budgets count the fp32 roundings of the kernels' algorithm (eps = 2^-23):
// - a row sum: each lane adds its ceil(C/32) elements in turn, then a 5-level butterfly, so its
//   error is at most (ceil(C/32) + 5) eps * sum|terms| (+1 for the division by C);
// - the mean's error d enters the two-pass variance only as d^2 (sum(x - mean) = 0), so rstd's
//   relative error is about half the variance's, (ceil(C/32)/2 + 8) eps (rounding of the squares,
//   + eps, rsqrt), plus (d * rstd)^2;
// - xhat = (x - mean) * rstd then inherits d * rstd + |xhat| * rel(rstd), and out = xhat*w + b two
//   more roundings; bf16 and fp16 add final_rounding<T>() * |out|.

double sum_ulps(int C) { return CEIL_DIV(C, 32) + 6; }

struct ForwardRef {
    std::vector<double> out, mean, rstd, out_budget, mean_budget, rstd_budget;
};

// LayerNorm of each row of x (N,C) in double, with the budgets of an fp32 kernel storing T.
template <class T>
ForwardRef layernorm_reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                               int N, int C, double eps) {
    const double e32 = th::EPS_FP32, round_T = final_rounding<T>();
    ForwardRef r;
    r.out.resize((size_t)N * C), r.out_budget.resize((size_t)N * C);
    for (int n = 0; n < N; n++) {
        const double* row = &x[(size_t)n * C];
        double sum = 0, sum_abs = 0, sum_sq = 0;
        for (int c = 0; c < C; c++) sum += row[c], sum_abs += std::fabs(row[c]);
        double m = sum / C;
        for (int c = 0; c < C; c++) sum_sq += (row[c] - m) * (row[c] - m);
        double s = 1 / std::sqrt(sum_sq / C + eps);
        double mean_err = sum_ulps(C) * e32 * sum_abs / C;
        double rstd_rel = (CEIL_DIV(C, 32) / 2.0 + 8) * e32 + (mean_err * s) * (mean_err * s);
        r.mean.push_back(m), r.mean_budget.push_back(mean_err + e32 * std::fabs(m));
        r.rstd.push_back(s), r.rstd_budget.push_back(rstd_rel * s);
        for (int c = 0; c < C; c++) {
            double xhat = (row[c] - m) * s, o = xhat * w[c] + b[c];
            double xhat_err = mean_err * s + std::fabs(xhat) * (rstd_rel + 2 * e32);
            r.out[(size_t)n * C + c] = o;
            r.out_budget[(size_t)n * C + c] = std::fabs(w[c]) * xhat_err +
                                              e32 * (std::fabs(xhat * w[c]) + std::fabs(o)) + round_T * std::fabs(o);
        }
    }
    return r;
}

struct BackwardRef {
    std::vector<double> dinp, dweight, dbias, dinp_budget, dweight_budget, dbias_budget;
};

// The analytic LayerNorm gradient in double, accumulated onto dinp0/dweight0/dbias0, at the given
// per-row mean and rstd (the ones the kernel reads), with the budgets of an fp32 kernel storing T:
// the row means of dnorm and dnorm*xhat carry sum_ulps(C) eps of their absolute sums; a parameter
// gradient is a tree of sums in which each row's term goes through at most `sum_depth` additions
// (see param_sum_depth), so its error is within sum_depth eps of the sum of |terms|, plus 3 eps
// of each dweight term's own (xhat and the product).
template <class T>
BackwardRef layernorm_backward_reference(const std::vector<double>& dout, const std::vector<double>& x,
                                         const std::vector<double>& w, const std::vector<double>& mean,
                                         const std::vector<double>& rstd, const std::vector<double>& dinp0,
                                         const std::vector<double>& dweight0, const std::vector<double>& dbias0, int N,
                                         int C, int sum_depth) {
    const double e32 = th::EPS_FP32, round_T = final_rounding<T>();
    BackwardRef r;
    r.dinp = dinp0, r.dweight = dweight0, r.dbias = dbias0;
    r.dinp_budget.resize((size_t)N * C);
    std::vector<double> dw_abs(C, 0), db_abs(C, 0);
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        double m = mean[n], s = rstd[n];
        double sum_dn = 0, sum_dnx = 0, abs_dn = 0, abs_dnx = 0;
        for (int c = 0; c < C; c++) {
            double xhat = (x[o + c] - m) * s, dn = dout[o + c] * w[c];
            sum_dn += dn, sum_dnx += dn * xhat, abs_dn += std::fabs(dn), abs_dnx += std::fabs(dn * xhat);
            r.dweight[c] += dout[o + c] * xhat, r.dbias[c] += dout[o + c];
            dw_abs[c] += std::fabs(dout[o + c] * xhat), db_abs[c] += std::fabs(dout[o + c]);
        }
        double mdn = sum_dn / C, mdnx = sum_dnx / C;
        double mdn_err = sum_ulps(C) * e32 * abs_dn / C, mdnx_err = (sum_ulps(C) + 3) * e32 * abs_dnx / C;
        for (int c = 0; c < C; c++) {
            double xhat = (x[o + c] - m) * s, dn = dout[o + c] * w[c];
            double dx = s * (dn - mdn - xhat * mdnx);
            r.dinp[o + c] += dx;
            double inner_err = mdn_err + std::fabs(xhat) * mdnx_err +
                               5 * e32 * (std::fabs(dn) + std::fabs(mdn) + std::fabs(xhat * mdnx));
            r.dinp_budget[o + c] = s * inner_err + e32 * std::fabs(dx) + (e32 + round_T) * std::fabs(r.dinp[o + c]);
        }
    }
    for (int c = 0; c < C; c++) {
        r.dweight_budget.push_back((sum_depth + 3) * e32 * dw_abs[c] + (e32 + round_T) * std::fabs(r.dweight[c]));
        r.dbias_budget.push_back(sum_depth * e32 * db_abs[c] + (e32 + round_T) * std::fabs(r.dbias[c]));
    }
    return r;
}

// The most additions one row's term goes through on its way into dweight/dbias in
// layernorm_backward: its warp's running sum over the block's rows, the sum over the block's warps,
// the reduce kernel's strided sum over blocks and its 32-way combine, and the final += .
int param_sum_depth(int N) {
    int rows = layernorm_backward_rows_per_block(N), blocks = CEIL_DIV(N, rows);
    return CEIL_DIV(rows, kLayernormBackwardWarps) + kLayernormBackwardWarps + CEIL_DIV(blocks, 32) + 32 + 1;
}

// ----------------------------------------------------------------------------
// Tests

// The backward reference against central finite differences of the forward reference (double):
// guards the analytic formula itself.
void test_reference_gradient() {
    int N = 3, C = 5;
    std::vector<double> x(N * C), w(C), b(C), dout(N * C);
    for (int i = 0; i < N * C; i++) x[i] = std::sin(1.3 * i) * (1 + i % 3), dout[i] = std::cos(0.7 * i);
    for (int c = 0; c < C; c++) w[c] = 0.5 + 0.1 * c, b[c] = 0.2 * c - 0.3;
    double eps = 1e-5;
    auto loss = [&](const std::vector<double>& xx, const std::vector<double>& ww, const std::vector<double>& bb) {
        auto f = layernorm_reference<float>(xx, ww, bb, N, C, eps);
        double l = 0;
        for (int i = 0; i < N * C; i++) l += dout[i] * f.out[i];
        return l;
    };
    auto f = layernorm_reference<float>(x, w, b, N, C, eps);
    auto g = layernorm_backward_reference<float>(dout, x, w, f.mean, f.rstd, std::vector<double>(N * C, 0),
                                                 std::vector<double>(C, 0), std::vector<double>(C, 0), N, C, 0);
    double h = 1e-6, worst = 0;
    auto fd = [&](std::vector<double>& v, int i, const std::function<double()>& l) {
        double saved = v[i];
        v[i] = saved + h;
        double up = l();
        v[i] = saved - h;
        double down = l();
        v[i] = saved;
        return (up - down) / (2 * h);
    };
    auto l = [&] { return loss(x, w, b); };
    for (int i = 0; i < N * C; i++) worst = std::fmax(worst, std::fabs(fd(x, i, l) - g.dinp[i]));
    for (int c = 0; c < C; c++) {
        worst = std::fmax(worst, std::fabs(fd(w, c, l) - g.dweight[c]));
        worst = std::fmax(worst, std::fabs(fd(b, c, l) - g.dbias[c]));
    }
    // Central differences with h = 1e-6 on O(1) values: truncation ~h^2, cancellation ~1e-16/h = 1e-10.
    th::report(worst < 1e-7, "reference: analytic LayerNorm gradient equals finite differences", "max diff %.3g", worst);
}

// layernorm_forward (with and without mean/rstd) and fused_residual_layernorm_forward at (N, C).
// `offset` > 0 places every tensor at a misaligned view (the scalar path even when C allows packs).
template <class T>
void test_forward(int N, int C, float eps, size_t offset, uint64_t seed) {
    size_t NC = (size_t)N * C;
    auto inp1 = layernorm_input<T>(N, C, seed);
    auto inp2 = th::random_tensor<T>(NC, seed + 1, -0.05f, 0.05f);  // a residual branch's small update
    auto w = th::random_tensor<T>(C, seed + 2), b = th::random_tensor<T>(C, seed + 3);
    char name[200], shape[96];
    snprintf(shape, sizeof(shape), "%s N=%d C=%d eps=%g%s", th::dtype_name<T>(), N, C, eps, offset ? " misaligned" : "");

    // layernorm_forward
    snprintf(name, sizeof(name), "layernorm_forward %s: thread orders", shape);
    std::vector<T> out;
    std::vector<float> mean, rstd;
    auto all = th::run_orders(name, [&] {
        th::DeviceView<T> d_inp(inp1, offset), d_w(w, offset), d_b(b, offset), d_out(std::vector<T>(NC), offset);
        th::DeviceBuffer<float> d_mean(N, th::Fill::Zero), d_rstd(N, th::Fill::Zero);
        layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, (const T*)d_inp.ptr, (const T*)d_w.ptr, (const T*)d_b.ptr,
                          N, C, eps, 0);
        out = d_out.host(), mean = d_mean.host(), rstd = d_rstd.host();
        std::vector<float> r = as_floats<T>({&out});
        r.insert(r.end(), mean.begin(), mean.end());
        r.insert(r.end(), rstd.begin(), rstd.end());
        return r;
    });
    auto ref = layernorm_reference<T>(th::widen(inp1), th::widen(w), th::widen(b), N, C, eps);
    snprintf(name, sizeof(name), "layernorm_forward %s: out vs double", shape);
    th::check_budget(name, ref.out, out, ref.out_budget);
    snprintf(name, sizeof(name), "layernorm_forward %s: mean vs double", shape);
    th::check_budget(name, ref.mean, mean, ref.mean_budget);
    snprintf(name, sizeof(name), "layernorm_forward %s: rstd vs double", shape);
    th::check_budget(name, ref.rstd, rstd, ref.rstd_budget);

    // Inference: null mean/rstd leave out unchanged.
    {
        th::DeviceView<T> d_inp(inp1, offset), d_w(w, offset), d_b(b, offset), d_out(std::vector<T>(NC), offset);
        layernorm_forward(d_out.ptr, nullptr, nullptr, (const T*)d_inp.ptr, (const T*)d_w.ptr, (const T*)d_b.ptr, N, C,
                          eps, 0);
        auto out_nostats = d_out.host();
        snprintf(name, sizeof(name), "layernorm_forward %s: null mean/rstd gives the same out", shape);
        th::check_bitwise(name, out_nostats.data(), out.data(), NC * sizeof(T));
    }

    // fused_residual_layernorm_forward: the residual is inp1 + inp2 rounded once to T, exactly;
    // the normalization is checked against the reference of that residual, and bitwise against
    // layernorm_forward applied to it (the same algorithm, so the same bits).
    snprintf(name, sizeof(name), "fused_residual_layernorm_forward %s: thread orders", shape);
    std::vector<T> residual, fused_out;
    std::vector<float> fused_mean, fused_rstd;
    th::run_orders(name, [&] {
        th::DeviceView<T> d_in1(inp1, offset), d_in2(inp2, offset), d_w(w, offset), d_b(b, offset),
            d_res(std::vector<T>(NC), offset), d_out(std::vector<T>(NC), offset);
        th::DeviceBuffer<float> d_mean(N, th::Fill::Zero), d_rstd(N, th::Fill::Zero);
        fused_residual_layernorm_forward(d_res.ptr, d_out.ptr, d_mean.ptr, d_rstd.ptr, (const T*)d_in1.ptr,
                                         (const T*)d_in2.ptr, (const T*)d_w.ptr, (const T*)d_b.ptr, N, C, eps, 0);
        residual = d_res.host(), fused_out = d_out.host(), fused_mean = d_mean.host(), fused_rstd = d_rstd.host();
        std::vector<float> r = as_floats<T>({&residual, &fused_out});
        r.insert(r.end(), fused_mean.begin(), fused_mean.end());
        r.insert(r.end(), fused_rstd.begin(), fused_rstd.end());
        return r;
    });
    std::vector<T> residual_ref(NC);
    for (size_t i = 0; i < NC; i++) residual_ref[i] = from_float<T>(to_float(inp1[i]) + to_float(inp2[i]));
    snprintf(name, sizeof(name), "fused_residual_layernorm_forward %s: residual == round(inp1 + inp2)", shape);
    th::check_bitwise(name, residual.data(), residual_ref.data(), NC * sizeof(T));
    auto fref = layernorm_reference<T>(th::widen(residual_ref), th::widen(w), th::widen(b), N, C, eps);
    snprintf(name, sizeof(name), "fused_residual_layernorm_forward %s: out vs double", shape);
    th::check_budget(name, fref.out, fused_out, fref.out_budget);
    snprintf(name, sizeof(name), "fused_residual_layernorm_forward %s: rstd vs double", shape);
    th::check_budget(name, fref.rstd, fused_rstd, fref.rstd_budget);
    {
        th::DeviceView<T> d_res(residual_ref, offset), d_w(w, offset), d_b(b, offset), d_out(std::vector<T>(NC), offset);
        th::DeviceBuffer<float> d_mean(N, th::Fill::Zero), d_rstd(N, th::Fill::Zero);
        layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, (const T*)d_res.ptr, (const T*)d_w.ptr, (const T*)d_b.ptr,
                          N, C, eps, 0);
        auto split = d_out.host();
        auto m = d_mean.host(), s = d_rstd.host();
        bool same = as_floats<T>({&split}) == as_floats<T>({&fused_out}) && m == fused_mean && s == fused_rstd;
        snprintf(name, sizeof(name), "fused_residual_layernorm_forward %s == residual add + layernorm_forward", shape);
        th::report(same, name, same ? "bit-identical out, mean, rstd" : "results differ");
    }
}

// residual_forward over N elements (through a misaligned view when offset > 0): exactly
// round(inp1 + inp2), one rounding of an fp32 sum, as the host computes it.
template <class T>
void test_residual(size_t N, size_t offset, uint64_t seed) {
    auto a = th::random_tensor<T>(N, seed, -4.f, 4.f), b = th::random_tensor<T>(N, seed + 1, -0.1f, 0.1f);
    char name[160];
    snprintf(name, sizeof(name), "residual_forward %s N=%zu%s: thread orders", th::dtype_name<T>(), N,
             offset ? " misaligned" : "");
    auto out = th::run_orders(name, [&] {
        th::DeviceView<T> d_a(a, offset), d_b(b, offset), d_out(std::vector<T>(N), offset);
        residual_forward(d_out.ptr, (const T*)d_a.ptr, (const T*)d_b.ptr, N, 0);
        return d_out.host();
    });
    std::vector<T> ref(N);
    for (size_t i = 0; i < N; i++) ref[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
    snprintf(name, sizeof(name), "residual_forward %s N=%zu%s == round(inp1 + inp2)", th::dtype_name<T>(), N,
             offset ? " misaligned" : "");
    th::check_bitwise(name, out.data(), ref.data(), N * sizeof(T));
}

// layernorm_backward at (N, C), accumulating onto non-zero dinp/dweight/dbias; mean and rstd are
// the reference's, rounded to fp32 as the forward pass would store them.
template <class T>
void test_backward(int N, int C, size_t offset, uint64_t seed, bool orders = true) {
    size_t NC = (size_t)N * C;
    auto inp = layernorm_input<T>(N, C, seed);
    auto dout = th::random_tensor<T>(NC, seed + 1), w = th::random_tensor<T>(C, seed + 2);
    auto dinp0 = th::random_tensor<T>(NC, seed + 3), dw0 = th::random_tensor<T>(C, seed + 4), db0 = th::random_tensor<T>(C, seed + 5);
    auto fwd = layernorm_reference<T>(th::widen(inp), th::widen(w), std::vector<double>(C, 0), N, C, 1e-5);
    std::vector<float> mean(N), rstd(N);
    for (int n = 0; n < N; n++) mean[n] = (float)fwd.mean[n], rstd[n] = (float)fwd.rstd[n];
    char name[200], shape[96];
    snprintf(shape, sizeof(shape), "%s N=%d C=%d%s", th::dtype_name<T>(), N, C, offset ? " misaligned" : "");

    auto colsum0 = th::random_tensor<T>(C, seed + 6);
    std::vector<T> dinp, dw, db, colsum;
    // with_colsum: also dinp_colsum (onto colsum0), else without it (two column sums, not three)
    auto run = [&](bool with_colsum) {
        th::DeviceView<T> d_dinp(dinp0, offset), d_dw(dw0, offset), d_db(db0, offset), d_dout(dout, offset),
            d_inp(inp, offset), d_w(w, offset), d_colsum(colsum0, offset);
        th::DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
        void* scratch;
        size_t scratch_bytes = layernorm_backward_scratch_bytes(N, C);
        cudaCheck(cudaMalloc(&scratch, scratch_bytes));
        layernorm_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, scratch, (const T*)d_dout.ptr, (const T*)d_inp.ptr,
                           (const T*)d_w.ptr, (const float*)d_mean.ptr, (const float*)d_rstd.ptr, N, C, 0,
                           with_colsum ? d_colsum.ptr : (T*)nullptr);
        cudaCheck(cudaFree(scratch));
        dinp = d_dinp.host(), dw = d_dw.host(), db = d_db.host(), colsum = d_colsum.host();
        return as_floats<T>({&dinp, &dw, &db, &colsum});
    };
    snprintf(name, sizeof(name), "layernorm_backward %s: thread orders", shape);
    if (orders) th::run_orders(name, [&] { return run(true); });
    else run(true);

    // dinp_colsum: the column sums of dinp as stored, onto colsum0; the fp32 sums go through the same
    // tree of additions as dbias's (param_sum_depth), then one rounding to T.
    std::vector<double> colsum_ref = th::widen(colsum0), colsum_budget(C);
    std::vector<double> colsum_abs(C, 0);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double v = to_float(dinp[(size_t)n * C + c]);
            colsum_ref[c] += v, colsum_abs[c] += std::fabs(v);
        }
    for (int c = 0; c < C; c++)
        colsum_budget[c] = param_sum_depth(N) * th::EPS_FP32 * colsum_abs[c] +
                           (th::EPS_FP32 + final_rounding<T>()) * std::fabs(colsum_ref[c]);
    snprintf(name, sizeof(name), "layernorm_backward %s: dinp_colsum (+=) vs double sums of the stored dinp", shape);
    th::check_budget(name, colsum_ref, colsum, colsum_budget);
    // The third sum changes nothing else: without it, dinp, dweight and dbias are the same bits.
    std::vector<T> with_dinp = dinp, with_dw = dw, with_db = db;
    run(false);
    auto same_bits = [](const std::vector<T>& a, const std::vector<T>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
    };
    bool same = same_bits(dinp, with_dinp) && same_bits(dw, with_dw) && same_bits(db, with_db);
    snprintf(name, sizeof(name), "layernorm_backward %s: without dinp_colsum, the same dinp, dweight, dbias", shape);
    th::report(same, name, "%s", same ? "" : "outputs differ");

    std::vector<double> mean_d(mean.begin(), mean.end()), rstd_d(rstd.begin(), rstd.end());
    auto ref = layernorm_backward_reference<T>(th::widen(dout), th::widen(inp), th::widen(w), mean_d, rstd_d, th::widen(dinp0),
                                               th::widen(dw0), th::widen(db0), N, C, param_sum_depth(N));
    snprintf(name, sizeof(name), "layernorm_backward %s: dinp (+=) vs double", shape);
    th::check_budget(name, ref.dinp, dinp, ref.dinp_budget);
    snprintf(name, sizeof(name), "layernorm_backward %s: dweight (+=) vs double", shape);
    th::check_budget(name, ref.dweight, dw, ref.dweight_budget);
    snprintf(name, sizeof(name), "layernorm_backward %s: dbias (+=) vs double", shape);
    th::check_budget(name, ref.dbias, db, ref.dbias_budget);
}

// layernorm_backward's kernels, the rows in registers (Auto, where a row fits), with the column sums in
// registers too (SumsInRegisters) and the streaming one, give the same bits: dinp, dweight, dbias and
// dinp_colsum, at every chunk count the registers take (1 to kLayernormBackwardRegisterChunks chunks
// of 32 packs) and past it (where Auto and SumsInRegisters stream).
template <class T>
void test_backward_kernels_agree(int N, int C, uint64_t seed) {
    size_t NC = (size_t)N * C;
    auto inp = layernorm_input<T>(N, C, seed);
    auto dout = th::random_tensor<T>(NC, seed + 1), w = th::random_tensor<T>(C, seed + 2);
    auto dinp0 = th::random_tensor<T>(NC, seed + 3), params0 = th::random_tensor<T>(3 * (size_t)C, seed + 4);
    auto fwd = layernorm_reference<T>(th::widen(inp), th::widen(w), std::vector<double>(C, 0), N, C, 1e-5);
    std::vector<float> mean(fwd.mean.begin(), fwd.mean.end()), rstd(fwd.rstd.begin(), fwd.rstd.end());
    auto run = [&](LayernormBackwardKernel which) {
        th::DeviceBuffer<T> d_dinp(dinp0), d_params(params0), d_dout(dout), d_inp(inp), d_w(w);
        th::DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
        th::DeviceBuffer<char> scratch(layernorm_backward_scratch_bytes(N, C));
        layernorm_backward(d_dinp.ptr, d_params.ptr, d_params.ptr + C, (void*)scratch.ptr, (const T*)d_dout.ptr,
                           (const T*)d_inp.ptr, (const T*)d_w.ptr, (const float*)d_mean.ptr, (const float*)d_rstd.ptr,
                           N, C, 0, d_params.ptr + 2 * C, which);
        std::vector<T> out = d_dinp.host(), params = d_params.host();
        out.insert(out.end(), params.begin(), params.end());
        return out;
    };
    std::vector<T> auto_out = run(LayernormBackwardKernel::Auto), streamed = run(LayernormBackwardKernel::Streamed),
                   sums = run(LayernormBackwardKernel::SumsInRegisters);
    int chunks = CEIL_DIV(C, 32 * Packed128<T>::size);
    const bool fits = chunks <= kLayernormBackwardRegisterChunks;
    char name[160];
    snprintf(name, sizeof(name), "layernorm_backward %s N=%d C=%d (chunks %d: %s) = the streaming kernel, bit for bit",
             th::dtype_name<T>(), N, C, chunks, fits ? "rows in registers" : "streamed");
    th::check_bitwise(name, auto_out.data(), streamed.data(), auto_out.size() * sizeof(T));
    snprintf(name, sizeof(name), "layernorm_backward %s N=%d C=%d (chunks %d: %s) = the streaming kernel, bit for bit",
             th::dtype_name<T>(), N, C, chunks, fits ? "column sums in registers too" : "streamed");
    th::check_bitwise(name, sums.data(), streamed.data(), sums.size() * sizeof(T));
}

// Loss-scaled fp16 gradients: an inf in dout must reach the outputs (its row of dinp, its column of
// dweight and dbias), and a parameter-gradient sum beyond fp16's range must become inf, not be
// clamped, so the trainer's overflow check sees both. N = 4, C = 64: dout[1][3] = inf; dout[r][5] =
// 25000 in rows 0, 2, 3, whose dbias sum, 75000, overflows while their dinp (|w| < 1, inputs uniform
// in [-4, 4): rstd ~ 0.43) stays finite.
void test_backward_nonfinite_fp16() {
    const int N = 4, C = 64;
    auto inp = th::random_tensor<__half>((size_t)N * C, 41, -4.f, 4.f);
    auto dout = th::random_tensor<__half>((size_t)N * C, 42), w = th::random_tensor<__half>(C, 43);
    dout[1 * C + 3] = from_float<__half>(INFINITY);
    for (int r : {0, 2, 3}) dout[r * C + 5] = from_float<__half>(25000.f);
    auto fwd = layernorm_reference<__half>(th::widen(inp), th::widen(w), std::vector<double>(C, 0), N, C, 1e-5);
    std::vector<float> mean(fwd.mean.begin(), fwd.mean.end()), rstd(fwd.rstd.begin(), fwd.rstd.end());
    th::DeviceBuffer<__half> d_dinp(N * C, th::Fill::Zero), d_dw(C, th::Fill::Zero), d_db(C, th::Fill::Zero),
        d_dout(dout), d_inp(inp), d_w(w);
    th::DeviceBuffer<float> d_mean(mean), d_rstd(rstd);
    th::DeviceBuffer<char> scratch(layernorm_backward_scratch_bytes(N, C));
    layernorm_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, (void*)scratch.ptr, (const __half*)d_dout.ptr,
                       (const __half*)d_inp.ptr, (const __half*)d_w.ptr, (const float*)d_mean.ptr,
                       (const float*)d_rstd.ptr, N, C, 0);
    std::vector<__half> dinp = d_dinp.host(), dw = d_dw.host(), db = d_db.host();
    size_t row1_finite = 0, others_nonfinite = 0;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            bool finite = std::isfinite(to_float(dinp[r * C + c]));
            if (r == 1) row1_finite += finite;
            else others_nonfinite += !finite;
        }
    size_t params_bad = 0;  // columns other than 3 and 5 must stay finite
    for (int c = 0; c < C; c++)
        if (c != 3 && c != 5) params_bad += !std::isfinite(to_float(dw[c])) + !std::isfinite(to_float(db[c]));
    bool ok = row1_finite == 0 && others_nonfinite == 0 && !std::isfinite(to_float(dw[3])) &&
              !std::isfinite(to_float(db[3])) && to_float(db[5]) == INFINITY && params_bad == 0;
    th::report(ok, "layernorm_backward fp16: an inf dout and an overflowing dbias sum reach the outputs (no clamping)",
               "dinp row 1: %zu finite (want 0); other rows: %zu non-finite (want 0); dweight[3]=%g dbias[3]=%g "
               "dbias[5]=%g (want inf); other columns non-finite: %zu",
               row1_finite, others_nonfinite, to_float(dw[3]), to_float(db[3]), to_float(db[5]), params_bad);
}

int main() {
    test_reference_gradient();
    test_backward_nonfinite_fp16();

    // (N, C): GPT-2-like rows (C = 768, N = B*T = 2*64) scaled down, C off multiples of 32 and of
    // the 128-bit pack (72: 8-multiple only; 100: 4-multiple only, so bf16 and fp16 run scalar;
    // 30 < 32 lanes; 770: neither; 1600, GPT-2 XL's, needs more than 48 KiB of shared memory: the
    // opt-in path), and N = 1, 7, 130 (partial blocks of the forward's 8 rows and the backward's 32).
    const int shapes[][2] = {{128, 768}, {1, 64}, {7, 72}, {130, 100}, {5, 30}, {9, 770}, {3, 1600}};
    for (auto& s : shapes) {
        test_forward<float>(s[0], s[1], 1e-5f, 0, 11);
        test_forward<__nv_bfloat16>(s[0], s[1], 1e-5f, 0, 11);
        test_forward<__half>(s[0], s[1], 1e-5f, 0, 11);
        test_backward<float>(s[0], s[1], 0, 21);
        test_backward<__nv_bfloat16>(s[0], s[1], 0, 21);
        test_backward<__half>(s[0], s[1], 0, 21);
    }
    // BERT's eps, misaligned views (the scalar path with C a pack multiple).
    test_forward<float>(7, 64, 1e-12f, 0, 12);
    test_forward<__nv_bfloat16>(7, 64, 1e-12f, 0, 12);
    test_forward<__half>(7, 64, 1e-12f, 0, 12);
    test_forward<float>(7, 64, 1e-5f, 1, 13);
    test_forward<__nv_bfloat16>(7, 64, 1e-5f, 1, 13);
    test_forward<__half>(7, 64, 1e-5f, 1, 13);
    test_backward<float>(7, 64, 1, 22);
    test_backward<__nv_bfloat16>(7, 64, 1, 22);
    test_backward<__half>(7, 64, 1, 22);
    // Enough rows that the backward's blocks take more than 32 rows each (the row split grows
    // past kLayernormBackwardMaxBlocks blocks), once per dtype.
    test_backward<float>(33000, 8, 0, 23, false);
    test_backward<__nv_bfloat16>(33000, 8, 0, 23, false);
    test_backward<__half>(33000, 8, 0, 23, false);

    for (int C : {256, 512, 768, 1024, 1280}) test_backward_kernels_agree<__nv_bfloat16>(70, C, 24);
    for (int C : {128, 384, 512, 640}) test_backward_kernels_agree<float>(70, C, 25);
    test_backward_kernels_agree<__half>(70, 1024, 26);

    for (size_t N : {(size_t)2 * 64 * 768, (size_t)1, (size_t)7, (size_t)130, (size_t)8195}) {
        test_residual<float>(N, 0, 31);
        test_residual<__nv_bfloat16>(N, 0, 31);
        test_residual<__half>(N, 0, 31);
    }
    test_residual<float>(1000, 1, 32);
    test_residual<__nv_bfloat16>(1003, 3, 32);
    test_residual<__half>(1003, 3, 32);
    return th::finish();
}
