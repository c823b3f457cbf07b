// test/test_dropout.cu — the dropout of llmc/dropout.cuh: the Philox4x32-10 generator against its published
// known-answer vectors (on the device and the host), and the hidden-state kernels (dropout_forward,
// dropout_residual_forward, dropout_backward) for fp32, bf16 and fp16.
//
// What is exact, and checked bit for bit: every output element equals the host formula
// from_float(to_float(x) * (keep ? s : 0)), s = fl(1/(1-p)), with keep from the host's dropout_keep
// (the same function the kernels call: one mask on GPU and CPU); the backward's mask is the forward's;
// the fused residual form equals dropout_forward followed by residual_forward; p = 0 is a copy; a
// misaligned view (the scalar path) gives the aligned (128-bit) path's bits; three thread orders agree;
// an offset read from device memory (pass_offset) gives the masks of the same offset as an argument.
// Kept fp32 values are also within one ulp of x/(1-p) computed in double (two roundings: of s and of
// the product, each at most half an ulp), and bf16/fp16 ones within half an ulp of the type plus that.
//
// Statistics, with 5-sigma binomial bounds (a false alarm once in ~1.7 million per check; the seeds are
// fixed, so a pass is reproducible): the keep rate, |kept/n - (1-p)| <= 5 sqrt(p(1-p)/n); the rate at
// which two elements are both kept, for neighbours in one Philox call (n, n+1), in adjacent calls
// (n, n+4) and between two streams (other offset, other seed), against (1-p)^2 with the bound for that
// rate; the same for the attention mask (dropout_attention_keep) over a (head, query, key) grid.
#include "../llmc/dropout.cuh"
#include "../llmc/layernorm.cuh"
#include "harness.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

// ----------------------------------------------------------------------------
// Philox known answers

// The three philox4x32 10 lines of Random123's tests/kat_vectors: counter, key, result.
struct PhiloxKat {
    uint4 ctr;
    uint2 key;
    uint4 expect;
};
const PhiloxKat kKat[3] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

// out[i] = philox4x32_10(ctr[i], key[i]) on the device.
__global__ void philox_kernel(uint4* out, const uint4* ctr, const uint2* key, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = philox4x32_10(ctr[i], key[i]);
}

bool same4(uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }

void test_philox_kat() {
    std::vector<uint4> ctr, expect;
    std::vector<uint2> key;
    for (const PhiloxKat& k : kKat) ctr.push_back(k.ctr), key.push_back(k.key), expect.push_back(k.expect);
    int host_ok = 0;
    for (int i = 0; i < 3; i++) host_ok += same4(philox4x32_10(ctr[i], key[i]), expect[i]);
    th::report(host_ok == 3, "philox4x32_10 host: Random123 known-answer vectors", "%d of 3 match", host_ok);
    th::DeviceBuffer<uint4> d_ctr(ctr), d_out(3, th::Fill::Zero);
    th::DeviceBuffer<uint2> d_key(key);
    cudaCheck(launch_kernel(philox_kernel, dim3(1), dim3(32), 0, 0, d_out.ptr, (const uint4*)d_ctr.ptr,
                            (const uint2*)d_key.ptr, 3));
    std::vector<uint4> got = d_out.host();
    int dev_ok = 0;
    for (int i = 0; i < 3; i++) dev_ok += same4(got[i], expect[i]);
    th::report(dev_ok == 3, "philox4x32_10 device: Random123 known-answer vectors", "%d of 3 match", dev_ok);
}

// ----------------------------------------------------------------------------
// Helpers

constexpr uint64_t kSeed = 0x0123456789abcdefull;

// n values of T in [-1, 1) with no zeros (a kept zero would look dropped).
template <class T>
std::vector<T> nonzero_tensor(size_t n, uint64_t seed) {
    std::vector<T> t = th::random_tensor<T>(n, seed);
    for (T& x : t)
        if (to_float(x) == 0.f) x = from_float<T>(0.5f);
    return t;
}

// What every kernel computes for one element: x * (keep ? s : 0), rounded to T.
template <class T>
T dropped(T x, bool keep, const DropoutArgs& d) {
    return from_float<T>(to_float(x) * (keep ? d.scale : 0.f));
}

// dropout_forward (or dropout_backward: `backward`) of x through a view `offset` elements into its
// allocation (offset 1 defeats 128-bit access: the scalar path), under three thread orders.
template <class T>
std::vector<T> run_dropout(const std::vector<T>& x, size_t offset, float p, uint64_t seed, uint64_t stream,
                           const char* name, bool backward = false) {
    return th::run_orders(name, [&] {
        th::DeviceView<T> in(x, offset), out(std::vector<T>(x.size()), offset);
        if (backward) dropout_backward(out.ptr, (const T*)in.ptr, x.size(), p, seed, stream, 0);
        else dropout_forward(out.ptr, (const T*)in.ptr, x.size(), p, seed, stream, 0);
        return out.host();
    });
}

// |rate - expect| <= 5 sqrt(expect (1 - expect) / n): the 5-sigma binomial bound.
bool check_rate(const std::string& name, size_t hits, size_t n, double expect) {
    double rate = (double)hits / n, bound = 5 * std::sqrt(expect * (1 - expect) / n);
    return th::report(std::fabs(rate - expect) <= bound, name.c_str(), "%zu of %zu = %.5f, expected %.5f +- %.5f",
                      hits, n, rate, expect, bound);
}

// ----------------------------------------------------------------------------
// Tests

// Forward and backward at n elements against the host formula, bit for bit, through an aligned and a
// misaligned view; the values against x/(1-p) in double; the backward's mask is the forward's.
template <class T>
void test_exact(size_t n, float p, uint64_t stream) {
    const char* tn = th::dtype_name<T>();
    char name[200];
    std::vector<T> x = nonzero_tensor<T>(n, 1 + n), g = nonzero_tensor<T>(n, 2 + n);
    DropoutArgs d = dropout_args("test", p, kSeed, stream);
    std::vector<T> expect(n), expect_grad(n), aligned_out;
    for (size_t i = 0; i < n; i++) {
        bool keep = dropout_keep(d, i);
        expect[i] = dropped(x[i], keep, d);
        expect_grad[i] = dropped(g[i], keep, d);
    }
    for (size_t offset : {0, 1}) {
        snprintf(name, sizeof(name), "dropout_forward %s n=%zu p=%.2f view offset %zu: thread orders", tn, n, p,
                 offset);
        std::vector<T> out = run_dropout(x, offset, p, kSeed, stream, name);
        if (offset == 0) aligned_out = out;
        snprintf(name, sizeof(name), "dropout_forward %s n=%zu p=%.2f view offset %zu = host formula, host mask", tn, n,
                 p, offset);
        th::check_bitwise(name, expect.data(), out.data(), n * sizeof(T));
        snprintf(name, sizeof(name), "dropout_backward %s n=%zu p=%.2f view offset %zu: thread orders", tn, n, p,
                 offset);
        std::vector<T> dinp = run_dropout(g, offset, p, kSeed, stream, name, true);
        // The forward's own mask, read off its output (inputs are nonzero): dinp = dout * that mask * s.
        std::vector<T> from_fwd(n);
        for (size_t i = 0; i < n; i++) from_fwd[i] = dropped(g[i], to_float(out[i]) != 0.f, d);
        snprintf(name, sizeof(name), "dropout_backward %s n=%zu p=%.2f view offset %zu uses the forward's mask", tn, n,
                 p, offset);
        th::check_bitwise(name, from_fwd.data(), dinp.data(), n * sizeof(T));
        if (offset == 0) {
            snprintf(name, sizeof(name), "dropout_backward %s n=%zu p=%.2f = host formula", tn, n, p);
            th::check_bitwise(name, expect_grad.data(), dinp.data(), n * sizeof(T));
        }
    }
    // Kept values against x/(1-p) in double: fp32 one ulp (2 eps_fp32 relative: s and the product each
    // rounded once); bf16/fp16 the type's half ulp on top (eps_T/2, k = 1/2), which below fp16's normal
    // range (2^-14; the inputs reach it) is absolute: half the smallest subnormal, 2^-25.
    double rtol = 2 * th::EPS_FP32 + (sizeof(T) == 4 ? 0 : dtype_eps<T>() / 2);
    double atol = sizeof(T) == 4 ? 0 : dtype_denorm_min<T>() / 2;
    std::vector<double> ref(n), budget(n);
    for (size_t i = 0; i < n; i++) {
        ref[i] = dropout_keep(d, i) ? th::to_double(x[i]) / (1 - (double)p) : 0;
        budget[i] = atol + rtol * std::fabs(ref[i]);
    }
    snprintf(name, sizeof(name), "dropout_forward %s n=%zu p=%.2f kept values vs x/(1-p) in double", tn, n, p);
    th::check_budget(name, ref, aligned_out, budget);
}

// Keep rate and pair statistics of the hidden-state mask (on the device: read off the forward's output)
// and of the attention mask (host: dropout_attention_keep, the function the attention kernels' masks
// are checked against in test_attention).
void test_statistics(float p) {
    const size_t n = 1 << 18;
    std::vector<float> x = nonzero_tensor<float>(n, 3);
    char name[200];
    auto mask_of = [&](uint64_t seed, uint64_t stream) {
        snprintf(name, sizeof(name), "dropout_forward fp32 n=%zu p=%.2f seed=%llx offset=%llu: thread orders", n, p,
                 (unsigned long long)seed, (unsigned long long)stream);
        std::vector<float> out = run_dropout(x, 0, p, seed, stream, name);
        std::vector<char> keep(n);
        for (size_t i = 0; i < n; i++) keep[i] = out[i] != 0.f;
        return keep;
    };
    std::vector<char> a = mask_of(kSeed, 7), b = mask_of(kSeed, 8), c = mask_of(kSeed + 1, 7),
                      again = mask_of(kSeed, 7);
    size_t kept = 0, both1 = 0, both4 = 0, both_offset = 0, both_seed = 0;
    for (size_t i = 0; i < n; i++) {
        kept += a[i];
        if (i + 1 < n) both1 += a[i] && a[i + 1];
        if (i + 4 < n) both4 += a[i] && a[i + 4];
        both_offset += a[i] && b[i];
        both_seed += a[i] && c[i];
    }
    double q = 1 - (double)p;
    snprintf(name, sizeof(name), "hidden mask p=%.2f: keep rate", p);
    check_rate(name, kept, n, q);
    snprintf(name, sizeof(name), "hidden mask p=%.2f: (n, n+1) both kept (one Philox call)", p);
    check_rate(name, both1, n - 1, q * q);
    snprintf(name, sizeof(name), "hidden mask p=%.2f: (n, n+4) both kept (adjacent calls)", p);
    check_rate(name, both4, n - 4, q * q);
    snprintf(name, sizeof(name), "hidden mask p=%.2f: offset 7 and 8 both keep (independent streams)", p);
    check_rate(name, both_offset, n, q * q);
    snprintf(name, sizeof(name), "hidden mask p=%.2f: seed and seed+1 both keep (independent streams)", p);
    check_rate(name, both_seed, n, q * q);
    snprintf(name, sizeof(name), "hidden mask p=%.2f: same (seed, offset) in a new launch reproduces it", p);
    th::report(a == again, name, "%s", a == again ? "identical" : "differs");

    // Attention: 4 heads x 128 queries x 128 keys, pairs across the 2x2 group (q, k^8), (q^8, k) and
    // across groups (k+1, another call).
    DropoutArgs d = dropout_args("test", p, kSeed, 3);
    size_t na = 0, ka = 0, pair_k8 = 0, pair_q8 = 0, pair_k1 = 0, np = 0;
    for (uint32_t bh = 0; bh < 4; bh++)
        for (int i = 0; i < 128; i++)
            for (int j = 0; j < 128; j++) {
                bool k = dropout_attention_keep(d, bh, i, j);
                na++, ka += k;
                if ((i & 8) == 0 && (j & 8) == 0) {
                    np++;
                    pair_k8 += k && dropout_attention_keep(d, bh, i, j + 8);
                    pair_q8 += k && dropout_attention_keep(d, bh, i + 8, j);
                    pair_k1 += k && dropout_attention_keep(d, bh, i, j + 1);
                }
            }
    snprintf(name, sizeof(name), "attention mask p=%.2f: keep rate", p);
    check_rate(name, ka, na, q);
    snprintf(name, sizeof(name), "attention mask p=%.2f: (q, k), (q, k+8) both kept (one Philox call)", p);
    check_rate(name, pair_k8, np, q * q);
    snprintf(name, sizeof(name), "attention mask p=%.2f: (q, k), (q+8, k) both kept (one Philox call)", p);
    check_rate(name, pair_q8, np, q * q);
    snprintf(name, sizeof(name), "attention mask p=%.2f: (q, k), (q, k+1) both kept (adjacent calls)", p);
    check_rate(name, pair_k1, np, q * q);
}

// The fused residual form equals dropout_forward followed by residual_forward bit for bit, out of place
// and in place (out = residual, out = inp), aligned and misaligned; and p = 0 is residual_forward.
template <class T>
void test_residual(size_t n, float p) {
    const char* tn = th::dtype_name<T>();
    char name[200];
    std::vector<T> res = th::random_tensor<T>(n, 5 + n, -4.f, 4.f), x = nonzero_tensor<T>(n, 6 + n);
    for (float prob : {p, 0.f})
        for (size_t offset : {0, 1}) {
            th::DeviceView<T> d_res(res, offset), d_x(x, offset), tmp(std::vector<T>(n), offset),
                unfused(std::vector<T>(n), offset);
            dropout_forward(tmp.ptr, (const T*)d_x.ptr, n, prob, kSeed, 11, 0);
            residual_forward(unfused.ptr, (const T*)d_res.ptr, (const T*)tmp.ptr, n, 0);
            std::vector<T> want = unfused.host();
            snprintf(name, sizeof(name), "dropout_residual_forward %s n=%zu p=%.2f offset %zu: thread orders", tn, n,
                     prob, offset);
            std::vector<T> fused = th::run_orders(name, [&] {
                th::DeviceView<T> out(std::vector<T>(n), offset);
                dropout_residual_forward(out.ptr, (const T*)d_res.ptr, (const T*)d_x.ptr, n, prob, kSeed, 11, 0);
                return out.host();
            });
            snprintf(name, sizeof(name),
                     "dropout_residual_forward %s n=%zu p=%.2f offset %zu = dropout_forward + residual_forward", tn, n,
                     prob, offset);
            th::check_bitwise(name, want.data(), fused.data(), n * sizeof(T));
            th::DeviceView<T> in_res(res, offset), in_x(x, offset);
            dropout_residual_forward(in_res.ptr, (const T*)in_res.ptr, (const T*)d_x.ptr, n, prob, kSeed, 11, 0);
            dropout_residual_forward(in_x.ptr, (const T*)d_res.ptr, (const T*)in_x.ptr, n, prob, kSeed, 11, 0);
            std::vector<T> a = in_res.host(), b = in_x.host();
            snprintf(name, sizeof(name),
                     "dropout_residual_forward %s n=%zu p=%.2f offset %zu in place (out = residual, out = inp)", tn, n,
                     prob, offset);
            bool same = memcmp(a.data(), want.data(), n * sizeof(T)) == 0 &&
                        memcmp(b.data(), want.data(), n * sizeof(T)) == 0;
            th::report(same, name, "%s", same ? "bit-identical to out of place" : "differs from out of place");
        }
}

// p = 0: dropout_forward and dropout_backward copy every bit (-0, inf, NaN included), in place nothing
// changes; and non-finite inputs with p > 0 follow IEEE: a kept inf stays inf, a dropped inf or NaN
// becomes NaN (inf * 0), never a silent 0.
template <class T>
void test_p0_and_nonfinite() {
    const char* tn = th::dtype_name<T>();
    char name[200];
    const size_t n = 1001;
    std::vector<T> x = th::random_tensor<T>(n, 9);
    x[0] = from_float<T>(-0.f), x[1] = from_float<T>(INFINITY), x[2] = from_float<T>(-INFINITY);
    x[3] = from_float<T>(NAN);
    for (bool backward : {false, true}) {
        snprintf(name, sizeof(name), "%s %s p=0: thread orders", backward ? "dropout_backward" : "dropout_forward", tn);
        std::vector<T> out = run_dropout(x, 0, 0.f, kSeed, 1, name, backward);
        snprintf(name, sizeof(name), "%s %s p=0 is an exact copy (-0, +-inf, NaN included)",
                 backward ? "dropout_backward" : "dropout_forward", tn);
        th::check_bitwise(name, x.data(), out.data(), n * sizeof(T));
    }
    th::DeviceBuffer<T> inplace(x);
    dropout_forward(inplace.ptr, (const T*)inplace.ptr, n, 0.f, kSeed, 1, 0);
    std::vector<T> same = inplace.host();
    snprintf(name, sizeof(name), "dropout_forward %s p=0 in place changes nothing", tn);
    th::check_bitwise(name, x.data(), same.data(), n * sizeof(T));

    // Put +inf at the first kept and the first dropped positions, NaN at the second dropped one.
    DropoutArgs d = dropout_args("test", 0.5f, kSeed, 2);
    std::vector<T> y = nonzero_tensor<T>(n, 10);
    size_t kept_at = n, dropped_at = n, nan_at = n;
    for (size_t i = 0; i < n; i++) {
        if (dropout_keep(d, i) && kept_at == n) kept_at = i;
        else if (!dropout_keep(d, i) && dropped_at == n) dropped_at = i;
        else if (!dropout_keep(d, i) && nan_at == n) nan_at = i;
    }
    y[kept_at] = y[dropped_at] = from_float<T>(INFINITY);
    y[nan_at] = from_float<T>(NAN);
    th::DeviceBuffer<T> d_y(y), d_out(n, th::Fill::Zero);
    dropout_forward(d_out.ptr, (const T*)d_y.ptr, n, 0.5f, kSeed, 2, 0);
    std::vector<T> out = d_out.host();
    float k = to_float(out[kept_at]), dr = to_float(out[dropped_at]), nn = to_float(out[nan_at]);
    snprintf(name, sizeof(name), "dropout_forward %s p=0.5: kept inf stays inf, dropped inf and NaN become NaN", tn);
    th::report(std::isinf(k) && k > 0 && std::isnan(dr) && std::isnan(nn), name, "kept inf -> %g, dropped inf -> %g, "
               "dropped NaN -> %g", k, dr, nn);
}

// A pass offset in device memory (what a replayed CUDA graph reads; written by dropout_set_pass_offset)
// gives the masks of the same offset as an argument, forward and backward, and another pass's value
// other masks.
template <class T>
void test_pass_offset() {
    const size_t n = 4099;
    const char* tn = th::dtype_name<T>();
    std::vector<T> x = nonzero_tensor<T>(n, 12);
    th::DeviceBuffer<T> d_x(x), want(n, th::Fill::Zero), got(n, th::Fill::Zero);
    th::DeviceBuffer<uint64_t> pass(1, th::Fill::Zero);
    auto masks_equal = [&](bool backward, uint64_t stored, uint64_t argument) {
        dropout_set_pass_offset(pass.ptr, stored, 0);
        auto run = backward ? dropout_backward<T> : dropout_forward<T>;
        run(got.ptr, (const T*)d_x.ptr, n, 0.1f, kSeed, 5, 0, pass.ptr);
        run(want.ptr, (const T*)d_x.ptr, n, 0.1f, kSeed, argument, 0, nullptr);
        std::vector<T> a = got.host(), b = want.host();
        return memcmp(a.data(), b.data(), n * sizeof(T)) == 0;
    };
    for (bool backward : {false, true}) {
        bool same = masks_equal(backward, 70, 75), other = !masks_equal(backward, 80, 75);
        char name[128];
        snprintf(name, sizeof(name), "%s %s: offset 5 + 70 in device memory == offset 75, 5 + 80 differs",
                 backward ? "dropout_backward" : "dropout_forward", tn);
        th::report(same && other, name, "%s; %s", same ? "identical" : "differs",
                   other ? "another pass differs" : "another pass is the same");
    }
}

// A drop probability outside [0, 1) must stop the program with a message naming it.
void test_bad_p() {
    for (float p : {1.f, -0.1f, NAN}) {
        th::ChildOutput child = th::run_in_child([&] {
            th::DeviceBuffer<float> x(16, th::Fill::Zero);
            dropout_forward(x.ptr, (const float*)x.ptr, 16, p, kSeed, 0, 0);
        });
        bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) != 0 &&
                  child.text.find("must be in [0, 1)") != std::string::npos;
        std::string first = child.text.substr(0, child.text.find('\n'));
        char name[96];
        snprintf(name, sizeof(name), "dropout_forward p=%g exits with a message", p);
        th::report(ok, name, "%s", first.c_str());
    }
}

int main() {
    test_philox_kat();
    // Sizes: 1, 3, 7 (below one pack), 9 and 4097 (a pack and a tail), 100003 (several blocks, a tail);
    // p = 0.1 (BERT) and 0.5; every stream offset different.
    uint64_t stream = 100;
    for (size_t n : {1, 3, 7, 9, 4097, 100003})
        for (float p : {0.1f, 0.5f}) {
            test_exact<float>(n, p, stream);
            test_exact<__nv_bfloat16>(n, p, stream);
            test_exact<__half>(n, p, stream);
            stream++;
        }
    test_statistics(0.1f);
    test_statistics(0.5f);
    for (size_t n : {5, 4099, 65536}) {
        test_residual<float>(n, 0.1f);
        test_residual<__nv_bfloat16>(n, 0.1f);
        test_residual<__half>(n, 0.1f);
    }
    test_p0_and_nonfinite<float>();
    test_p0_and_nonfinite<__nv_bfloat16>();
    test_p0_and_nonfinite<__half>();
    test_pass_offset<float>();
    test_pass_offset<__nv_bfloat16>();
#if defined(SIMT_CPU)
    if (th::can_run_fault_tests()) test_bad_p();
#else
    test_bad_p();
#endif
    return th::finish();
}
