// llmc/simt/cublaslt.cpp — the CPU backend's cuBLASLt: the subset of the real <cublasLt.h> the
// project calls, with NVIDIA's documented column-major semantics, computed in fp32 with OpenBLAS.
//
// What cublasLtMatmul computes (cuBLAS documentation, cublasLtMatmul and "Tensorwide Scaling For
// FP8 Data Types"):
//   Aux_temp = alpha * scaleA * scaleB * op(A) op(B) + beta * C + bias
//   D_temp = Epilogue(Aux_temp),   amax_D = max |D_temp|,   D = scaleD * D_temp
// (the scales and amax exist for fp8 only; GELU_AUX* store Aux_temp, the GELU's input, as aux).
// Inputs are widened to fp32 (CUBLAS_COMPUTE_32F_FAST_TF32 first rounds A and B to TF32, so the CPU
// loses the same precision the tensor cores lose), op(A) op(B) is one cblas_sgemm (OpenBLAS, loaded
// at the first cublasLtCreate with the kernels the CPU's features allow: see load_openblas) with fp32
// accumulation, and the result is rounded to D's type once, after the epilogue, as on the GPU.
// "Device" pointers are host pointers on this backend. A call is checked when it is made and computed
// when its stream runs it (at once, or later with SIMT_STREAMS=adversarial: llmc/simt/streams.cpp):
// alpha and beta are read at the call, the fp8 scales (device memory) when the GEMM runs.
//
// The backend accepts only what the real library accepts (the "datatypes supported" table, fp8's
// TN rule and alignment rules) and returns CUBLAS_STATUS_NOT_SUPPORTED for the rest, so code that
// runs here runs on a GPU. Where NVIDIA's support varies with the GPU or the library version (the
// fp8 epilogues NVIDIA's own tests let cuBLAS refuse, bias types other than the default) it
// refuses too: passing here should mean passing everywhere.
//
// The functions keep the C linkage the header gave them in its extern "C" block.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cblas.h>
#include <dlfcn.h>
#include "internal.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

// The handle: the header declares struct cublasLtContext and leaves it to the library to define.
// It owns the fp32 scratch matrices, reused from call to call (the caller's workspace argument is
// sized for GPU kernels that need none here).
struct cublasLtContext {
    std::vector<float> a, b, c, acc, aux, vec, grad;
};

namespace {

// Descriptors created so far (simt::cublaslt_descriptor_count).
std::atomic<uint64_t> g_descriptors{0};

// ----------------------------------------------------------------------------
// OpenBLAS

// OpenBLAS picks its kernels when it is loaded, from the CPU model it recognizes. A CPU newer than the
// installed OpenBLAS (Debian 12's 0.3.21 on the Xeon of the project's VM, family 6 model 207) is
// unknown to it and gets the generic SSE3 kernels ("Prescott"): there the LM head's GEMM (50304 x 512
// x 128) ran at 23 GFLOP/s on one core against 85 with the AVX-512 kernels, and the default
// ./train_gpt2's steps took 1.4x as long. So the backend loads OpenBLAS itself, and first names the
// kernel family the CPU's own feature flags allow (OPENBLAS_CORETYPE: SkylakeX with AVX-512, Haswell
// with AVX2 and FMA), whatever its model. Every x86 CPU with the same features then runs the same
// kernels, which also makes the backend's fp32 rounding the same there. A user's OPENBLAS_CORETYPE
// is kept.
struct OpenBlas {
    decltype(&cblas_sgemm) sgemm;
    decltype(&openblas_set_num_threads) set_num_threads;
    decltype(&openblas_get_corename) corename;
};
OpenBlas g_openblas;

const char* openblas_core_for_cpu() {
#if defined(__x86_64__)
    // libgcc's checks include the operating system's support (XCR0) for the AVX and AVX-512 state
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return nullptr;  // OpenBLAS's own choice
}

void load_openblas() {
    static std::once_flag once;
    std::call_once(once, [] {
        // The variable is set only while OpenBLAS initializes (dlopen runs its constructor), so that
        // the processes this one starts (an oracle's Python, mpirun) inherit the environment unchanged.
        const char* core = getenv("OPENBLAS_CORETYPE") ? nullptr : openblas_core_for_cpu();
        if (core) setenv("OPENBLAS_CORETYPE", core, 0);
        void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
        if (core) unsetenv("OPENBLAS_CORETYPE");
        if (lib) {
            g_openblas.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(lib, "cblas_sgemm"));
            g_openblas.set_num_threads =
                reinterpret_cast<decltype(&openblas_set_num_threads)>(dlsym(lib, "openblas_set_num_threads"));
            g_openblas.corename = reinterpret_cast<decltype(&openblas_get_corename)>(dlsym(lib, "openblas_get_corename"));
        }
        if (!lib || !g_openblas.sgemm || !g_openblas.set_num_threads || !g_openblas.corename) {
            fprintf(stderr, "simt: cannot load OpenBLAS (libopenblas.so.0): %s (apt-get install libopenblas-dev)\n",
                    lib ? "it lacks cblas_sgemm, openblas_set_num_threads or openblas_get_corename" : dlerror());
            exit(EXIT_FAILURE);
        }
        // OpenBLAS's own thread pool spins and yields between calls, which costs more than it gains
        // for the project's GEMMs on a few cores (and competes with SIMT_THREADS workers): one thread,
        // unless the user asked otherwise through OPENBLAS_NUM_THREADS.
        if (!getenv("OPENBLAS_NUM_THREADS")) g_openblas.set_num_threads(1);
    });
}

// ----------------------------------------------------------------------------
// Element types

// Bytes per element of the matrix types this backend handles (0 for any other type).
size_t type_size(cudaDataType t) {
    switch (t) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16BF:
        case CUDA_R_16F: return 2;
        case CUDA_R_8F_E4M3:
        case CUDA_R_8F_E5M2: return 1;
        default: return 0;
    }
}

bool is_fp8(cudaDataType t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

// Calls f with a value of the C++ type that stores t, so one template serves every type. The
// toolkit's conversions round to nearest even; fp8 saturates to the largest finite value.
template <class F>
void with_type(cudaDataType t, F&& f) {
    switch (t) {
        case CUDA_R_32F: f(float{}); break;
        case CUDA_R_16BF: f(__nv_bfloat16{}); break;
        case CUDA_R_16F: f(__half{}); break;
        case CUDA_R_8F_E4M3: f(__nv_fp8_e4m3{}); break;
        case CUDA_R_8F_E5M2: f(__nv_fp8_e5m2{}); break;
        default: break;  // unreachable: plan() admits only the types above
    }
}

// Rounds x to TF32 (fp32's 8-bit exponent, 10 mantissa bits) to nearest even, which is what
// CUBLAS_COMPUTE_32F_FAST_TF32 does to A and B before multiplying. Inf and NaN pass unchanged.
float round_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0x0fffu + ((u >> 13) & 1u);  // add half an ulp of TF32, plus one when odd: ties to even
        u &= 0xffffe000u;
    }
    memcpy(&x, &u, 4);
    return x;
}

// Copies a rows x cols column-major matrix of type t (leading dimension ld) into a compact fp32
// matrix (leading dimension rows), rounding to TF32 when asked.
void gather(cudaDataType t, const void* src, int64_t ld, int64_t rows, int64_t cols, bool tf32,
            float* dst) {
    with_type(t, [&](auto tag) {
        using T = decltype(tag);
        const T* s = static_cast<const T*>(src);
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) {
                float v = static_cast<float>(s[i + j * ld]);
                dst[i + j * rows] = tf32 ? round_tf32(v) : v;
            }
    });
}

// Rounds a compact fp32 matrix to type t into a column-major matrix with leading dimension ld.
void scatter(cudaDataType t, const float* src, int64_t rows, int64_t cols, void* dst, int64_t ld) {
    with_type(t, [&](auto tag) {
        using T = decltype(tag);
        T* d = static_cast<T*>(dst);
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < rows; i++) d[i + j * ld] = T(src[i + j * rows]);
    });
}

// Byte offset of matrix b of a strided batch whose matrices are stride elements apart.
int64_t batch_offset(cudaDataType t, int64_t stride, int64_t b) {
    return b * stride * (int64_t)type_size(t);
}

// The GELU of GPT-2 and of cuBLASLt's GELU epilogues: the tanh approximation.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

float gelu(float x) {
    float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu(x) / dx, what the DGELU epilogues multiply the incoming gradient by.
float gelu_grad(float x) {
    float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    float t = tanhf(u);
    float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// ----------------------------------------------------------------------------
// Descriptors: attributes stored as raw bytes, one 8-byte slot per attribute id

constexpr int kMaxAttrs = 39;

struct Attrs {
    uint64_t slot[kMaxAttrs] = {};
};

// Each table gives an attribute's size in bytes, indexed by its id, as the header documents it
// (0: an id the header does not define); Set/Get insist on it, as the real library does.
constexpr uint8_t kDescAttrSize[] = {
    4, 4, 4,        // COMPUTE_TYPE, SCALE_TYPE, POINTER_MODE
    4, 4, 4, 4, 4,  // TRANSA, TRANSB, TRANSC, FILL_MODE, EPILOGUE
    8, 0, 8,        // BIAS_POINTER, (9), BIAS_BATCH_STRIDE
    8, 8, 8,        // EPILOGUE_AUX_POINTER, EPILOGUE_AUX_LD, EPILOGUE_AUX_BATCH_STRIDE
    8, 4, 0,        // ALPHA_VECTOR_BATCH_STRIDE, SM_COUNT_TARGET, (16)
    8, 8, 8, 8, 8,  // A/B/C/D_SCALE_POINTER, AMAX_D_POINTER
    4, 8, 8,        // EPILOGUE_AUX_DATA_TYPE, EPILOGUE_AUX_SCALE_POINTER, EPILOGUE_AUX_AMAX_POINTER
    1, 4,           // FAST_ACCUM, BIAS_DATA_TYPE
    0, 0, 0, 0,     // (27-30)
    4, 4, 4, 4, 4,  // A/B/C/D_SCALE_MODE, EPILOGUE_AUX_SCALE_MODE
    8, 4, 8,        // D_OUT_SCALE_POINTER, D_OUT_SCALE_MODE, EMULATION_DESCRIPTOR
};
static_assert(sizeof(kDescAttrSize) == CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR + 1, "one per id");
static_assert(sizeof(kDescAttrSize) <= kMaxAttrs, "Attrs holds every id");

constexpr uint8_t kLayoutAttrSize[] = {
    4, 4, 8, 8, 8,  // TYPE, ORDER, ROWS, COLS, LD
    4, 8, 8, 4,     // BATCH_COUNT, STRIDED_BATCH_OFFSET, PLANE_OFFSET, BATCH_MODE
};
static_assert(sizeof(kLayoutAttrSize) == CUBLASLT_MATRIX_LAYOUT_BATCH_MODE + 1, "one per id");

constexpr uint8_t kPrefAttrSize[] = {
    4, 8, 0, 4, 0,  // SEARCH_MODE, MAX_WORKSPACE_BYTES, (2), REDUCTION_SCHEME_MASK, (4)
    4, 4, 4, 4,     // MIN_ALIGNMENT_A/B/C/D_BYTES
    4, 0, 0, 8,     // MAX_WAVES_COUNT, (10), (11), IMPL_MASK
};
static_assert(sizeof(kPrefAttrSize) == CUBLASLT_MATMUL_PREF_IMPL_MASK + 1, "one per id");

// The header's three descriptor handles point at fixed-size opaque structs; ours point at Attrs.
template <class Handle>
Attrs& attrs(Handle h) {
    return *reinterpret_cast<Attrs*>(h);
}

template <class T>
T get(const Attrs& a, int attr) {
    T v;
    memcpy(&v, &a.slot[attr], sizeof(T));
    return v;
}

template <class T>
void put(Attrs& a, int attr, T v) {
    memcpy(&a.slot[attr], &v, sizeof(T));
}

// Stores an attribute after checking its id and size against the table.
template <size_t N>
cublasStatus_t set_attr(Attrs& a, const uint8_t (&sizes)[N], int attr, const void* buf,
                        size_t size) {
    if (attr < 0 || attr >= (int)N || sizes[attr] == 0 || buf == nullptr || size != sizes[attr])
        return CUBLAS_STATUS_INVALID_VALUE;
    a.slot[attr] = 0;
    memcpy(&a.slot[attr], buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

// Reads an attribute back; with size 0 it only reports the size needed, as documented.
template <size_t N>
cublasStatus_t get_attr(const Attrs& a, const uint8_t (&sizes)[N], int attr, void* buf,
                        size_t size, size_t* written) {
    if (attr < 0 || attr >= (int)N || sizes[attr] == 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (size == 0) {
        if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
        *written = sizes[attr];
        return CUBLAS_STATUS_SUCCESS;
    }
    if (buf == nullptr || size != sizes[attr]) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, &a.slot[attr], size);
    if (written) *written = size;
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// Checking a matmul against the library's rules

// One matrix operand as its layout describes it.
struct Matrix {
    cudaDataType type;
    int64_t rows, cols, ld, batch, stride;
};

// Everything cublasLtMatmul needs about a call, decoded and checked once (also by the heuristic).
struct Problem {
    Matrix a, b, c, d;
    int64_t m, n, k;
    bool ta, tb, tf32;
    uint32_t epilogue;
    cudaDataType bias_type;
    int64_t bias_stride, aux_ld, aux_stride;
};

// Epilogue parts, from the bits the header composes the epilogue values of (after the
// whitelist in plan(), these tests are exact).
bool adds_bias(uint32_t e) { return e & CUBLASLT_EPILOGUE_BIAS; }
bool applies_gelu(uint32_t e) { return e & CUBLASLT_EPILOGUE_GELU; }
bool applies_dgelu(uint32_t e) { return e & 64; }  // the DGELU bit
bool uses_aux(uint32_t e) { return e & 128; }      // GELU_AUX* write it, DGELU* read it
bool dgelu_bgrad(uint32_t e) { return e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
bool writes_bias_grad(uint32_t e) {
    return dgelu_bgrad(e) || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}

// Reads and sanity-checks a layout; orders other than column-major are not emulated.
cublasStatus_t read_layout(cublasLtMatrixLayout_t l, Matrix* m) {
    const Attrs& a = attrs(l);
    if (get<int32_t>(a, CUBLASLT_MATRIX_LAYOUT_ORDER) != CUBLASLT_ORDER_COL ||
        get<uint32_t>(a, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE) != CUBLASLT_BATCH_MODE_STRIDED ||
        get<int64_t>(a, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET) != 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    m->type = (cudaDataType)get<uint32_t>(a, CUBLASLT_MATRIX_LAYOUT_TYPE);
    m->rows = (int64_t)get<uint64_t>(a, CUBLASLT_MATRIX_LAYOUT_ROWS);
    m->cols = (int64_t)get<uint64_t>(a, CUBLASLT_MATRIX_LAYOUT_COLS);
    m->ld = get<int64_t>(a, CUBLASLT_MATRIX_LAYOUT_LD);
    m->batch = get<int32_t>(a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
    m->stride = get<int64_t>(a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    if (type_size(m->type) == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m->rows < 0 || m->cols < 0 || m->ld < std::max<int64_t>(1, m->rows) || m->batch < 1 ||
        m->stride < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    // "Usually only values that can be expressed as int32_t are supported" — and cblas takes int.
    if (m->rows > INT32_MAX || m->cols > INT32_MAX || m->ld > INT32_MAX)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

// The cublasLtMatmul "datatypes supported" table, restricted to the types handled here: compute
// 32F with A=B in 32F/16BF/16F and C=D in A's type or 32F; TF32 all in 32F; fp8 A and B (not both
// E5M2) with C in 16BF/16F (D = C, E4M3, or E5M2 when an input is E5M2) or C = D = 32F.
bool types_supported(cublasComputeType_t compute, cudaDataType a, cudaDataType b, cudaDataType c,
                     cudaDataType d) {
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        return a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F && d == CUDA_R_32F;
    if (is_fp8(a) || is_fp8(b)) {
        if (!is_fp8(a) || !is_fp8(b) || (a == CUDA_R_8F_E5M2 && b == CUDA_R_8F_E5M2)) return false;
        if (c == CUDA_R_32F) return d == CUDA_R_32F;
        if (c != CUDA_R_16BF && c != CUDA_R_16F) return false;
        bool e5m2_input = a == CUDA_R_8F_E5M2 || b == CUDA_R_8F_E5M2;
        return d == c || d == CUDA_R_8F_E4M3 || (d == CUDA_R_8F_E5M2 && e5m2_input);
    }
    if (a != b || c != d) return false;
    return c == CUDA_R_32F || c == a;
}

// The bias type the library expects: D's type, except for fp8 inputs, where the bias is 16-bit:
// C's type, or BF16 when C and D are fp32 (cublasLtMatmul fp8 table, BIAS_DATA_TYPE docs).
cudaDataType default_bias_type(const Problem& p) {
    if (!is_fp8(p.a.type)) return p.d.type;
    return p.c.type == CUDA_R_32F ? CUDA_R_16BF : p.c.type;
}

// Whether the dimension or leading dimension of n elements of type t fills whole 16 bytes.
bool aligned16(int64_t n, cudaDataType t) { return n * (int64_t)type_size(t) % 16 == 0; }

// The epilogues run with fp8 inputs. The documentation restricts none: every fp8 row of the
// cublasLtMatmul datatypes table names a bias type (the rows that take no epilogue say "Epilogue is
// not supported"), and "Tensorwide Scaling For FP8 Data Types" defines the epilogue and its aux
// output for fp8 (see the top of the file). The real library still refuses some combinations,
// depending on the GPU and the version: NVIDIA's own fp8 epilogue tests (nvmath-python,
// test_fp8_epilogs.py, "gaps in cuBLAS support", cuBLAS 12.8 and later) accept NOT_SUPPORTED for
//   - any GELU epilogue (DGELU included) with C = D = fp32,
//   - GELU_AUX and DGELU with C = D = fp16,
//   - GELU, GELU_BIAS and DGELU with an fp8 D,
//   - every bias-gradient epilogue (DGELU_BGRAD, BGRADA, BGRADB),
//   - on compute capability 8.9, GELU_AUX(_BIAS) with A and B in different formats,
// and XLA fuses GELU into fp8 GEMMs only from CUDA 12.4 on ("cuBLAS LT returns
// CUBLAS_STATUS_NOT_SUPPORTED in some cases" before 12.3.2). This backend refuses all of those, and
// the GELU_AUX epilogues with an fp8 D, whose fp8 aux (with its own scale and amax) it does not
// emulate. What it runs has a 16-bit D (and C = D, by the table):
//   DEFAULT, BIAS           any row
//   GELU, GELU_BIAS         D = C = bf16 or fp16
//   GELU_AUX_BIAS           D = C = bf16 or fp16, A and B in one format
//   GELU_AUX                D = C = bf16, A and B in one format
//   DGELU                   D = C = bf16
// which includes every fused fp8 GEMM of llmc/matmul.cuh (E4M3 x E4M3 with GELU_AUX(_BIAS), E4M3 x
// E5M2 with DGELU, bf16 out); Transformer Engine issues the same epilogues with fp8 inputs.
bool fp8_epilogue_supported(const Problem& p) {
    const bool d16 = p.d.type == CUDA_R_16BF || p.d.type == CUDA_R_16F;
    const bool one_format = p.a.type == p.b.type;
    switch (p.epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT:
        case CUBLASLT_EPILOGUE_BIAS: return true;
        case CUBLASLT_EPILOGUE_GELU:
        case CUBLASLT_EPILOGUE_GELU_BIAS: return d16;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return d16 && one_format;
        case CUBLASLT_EPILOGUE_GELU_AUX: return p.d.type == CUDA_R_16BF && one_format;
        case CUBLASLT_EPILOGUE_DGELU: return p.d.type == CUDA_R_16BF;
        default: return false;
    }
}

// Decodes the descriptors into p and applies the library's rules: CUBLAS_STATUS_INVALID_VALUE
// for inconsistent descriptors, CUBLAS_STATUS_NOT_SUPPORTED for what the library (or this
// backend) does not do.
cublasStatus_t plan(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                    cublasLtMatrixLayout_t Ddesc, Problem* p) {
    if (!desc || !Adesc || !Bdesc || !Cdesc || !Ddesc) return CUBLAS_STATUS_INVALID_VALUE;
    cublasStatus_t s;
    if ((s = read_layout(Adesc, &p->a)) || (s = read_layout(Bdesc, &p->b)) ||
        (s = read_layout(Cdesc, &p->c)) || (s = read_layout(Ddesc, &p->d)))
        return s;
    const Attrs& d = attrs(desc);

    // Operations: op(X) is X or its transpose (CUBLAS_OP_C is the transpose for real types).
    int32_t opa = get<int32_t>(d, CUBLASLT_MATMUL_DESC_TRANSA);
    int32_t opb = get<int32_t>(d, CUBLASLT_MATMUL_DESC_TRANSB);
    if (opa < CUBLAS_OP_N || opa > CUBLAS_OP_C || opb < CUBLAS_OP_N || opb > CUBLAS_OP_C)
        return CUBLAS_STATUS_INVALID_VALUE;
    p->ta = opa != CUBLAS_OP_N;
    p->tb = opb != CUBLAS_OP_N;

    // Shapes: op(A) is m x k, op(B) is k x n, C and D are m x n, all with the same batch count.
    p->m = p->ta ? p->a.cols : p->a.rows;
    p->k = p->ta ? p->a.rows : p->a.cols;
    p->n = p->tb ? p->b.rows : p->b.cols;
    int64_t kb = p->tb ? p->b.cols : p->b.rows;
    if (kb != p->k || p->c.rows != p->m || p->c.cols != p->n || p->d.rows != p->m ||
        p->d.cols != p->n)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (p->a.batch != p->d.batch || p->b.batch != p->d.batch || p->c.batch != p->d.batch)
        return CUBLAS_STATUS_INVALID_VALUE;

    // Types.
    auto compute = (cublasComputeType_t)get<int32_t>(d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE);
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;  // 16F, 64F, 32I, other fast modes: not emulated
    if (get<int32_t>(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE) != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!types_supported(compute, p->a.type, p->b.type, p->c.type, p->d.type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    p->tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    bool fp8 = is_fp8(p->a.type);

    // fp8 kernels: "A must be transposed and B non-transposed (the TN format)", and the Tensor
    // Core alignment rules are requirements: 16-byte multiples for k, m and leading dimensions
    // (and, here, for batch strides, which move the 16-byte-aligned base pointers).
    if (fp8) {
        if (!p->ta || p->tb) return CUBLAS_STATUS_NOT_SUPPORTED;
        const Matrix* all[] = {&p->a, &p->b, &p->c, &p->d};
        for (const Matrix* x : all)
            if (!aligned16(x->rows, x->type) || !aligned16(x->ld, x->type) ||
                (x->batch > 1 && !aligned16(x->stride, x->type)))
                return CUBLAS_STATUS_NOT_SUPPORTED;
    }

    // Attributes this backend does not emulate. (SM_COUNT_TARGET and FAST_ACCUM are performance
    // hints; they are accepted, and the CPU always accumulates in full fp32.)
    int32_t pointer_mode = get<int32_t>(d, CUBLASLT_MATMUL_DESC_POINTER_MODE);
    if ((pointer_mode != CUBLASLT_POINTER_MODE_HOST && pointer_mode != CUBLASLT_POINTER_MODE_DEVICE) ||
        get<int32_t>(d, CUBLASLT_MATMUL_DESC_TRANSC) != CUBLAS_OP_N ||
        get<int32_t>(d, CUBLASLT_MATMUL_DESC_FILL_MODE) != CUBLAS_FILL_MODE_FULL)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    for (int attr : {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                     CUBLASLT_MATMUL_DESC_C_SCALE_MODE, CUBLASLT_MATMUL_DESC_D_SCALE_MODE,
                     CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE,
                     CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE, CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
                     CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER,
                     CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR})
        if (d.slot[attr] != 0) return CUBLAS_STATUS_NOT_SUPPORTED;

    // Scale and amax pointers belong to fp8 operands; set elsewhere, "calling cublasLtMatmul() will
    // return CUBLAS_INVALID_VALUE" (cublasLtMatmulDescAttributes_t). The aux matrix is never fp8
    // here (see fp8_epilogue_supported), so its scale and amax are always misplaced.
    if (!fp8 && (d.slot[CUBLASLT_MATMUL_DESC_A_SCALE_POINTER] || d.slot[CUBLASLT_MATMUL_DESC_B_SCALE_POINTER]))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!is_fp8(p->d.type) &&
        (d.slot[CUBLASLT_MATMUL_DESC_D_SCALE_POINTER] || d.slot[CUBLASLT_MATMUL_DESC_AMAX_D_POINTER]))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (d.slot[CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER] ||
        d.slot[CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER])
        return CUBLAS_STATUS_INVALID_VALUE;

    // Epilogue.
    p->epilogue = get<uint32_t>(d, CUBLASLT_MATMUL_DESC_EPILOGUE);
    switch (p->epilogue) {
        case CUBLASLT_EPILOGUE_DEFAULT:
        case CUBLASLT_EPILOGUE_BIAS:
        case CUBLASLT_EPILOGUE_GELU:
        case CUBLASLT_EPILOGUE_GELU_BIAS:
        case CUBLASLT_EPILOGUE_GELU_AUX:
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
        case CUBLASLT_EPILOGUE_DGELU:
        case CUBLASLT_EPILOGUE_DGELU_BGRAD:
        case CUBLASLT_EPILOGUE_BGRADA:
        case CUBLASLT_EPILOGUE_BGRADB: break;
        default: return CUBLAS_STATUS_NOT_SUPPORTED;  // ReLU epilogues etc.: not emulated
    }
    if (fp8 && !fp8_epilogue_supported(*p)) return CUBLAS_STATUS_NOT_SUPPORTED;
    // "BGRADA only works with non-transposed A", "BGRADB only works with transposed B" (NVIDIA's
    // cuBLASMp tests; nvmath-python's also feed BGRADA an untransposed A). These are the forms a
    // weight-gradient GEMM takes anyway.
    if ((p->epilogue == CUBLASLT_EPILOGUE_BGRADA && p->ta) ||
        (p->epilogue == CUBLASLT_EPILOGUE_BGRADB && !p->tb))
        return CUBLAS_STATUS_NOT_SUPPORTED;

    p->bias_type = default_bias_type(*p);
    int32_t bias_type = get<int32_t>(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
    if (bias_type != -1 && bias_type != p->bias_type) return CUBLAS_STATUS_NOT_SUPPORTED;
    p->bias_stride = get<int64_t>(d, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE);

    // The GELU input matrix has D's type and "must be divisible by 8 and be no less than the
    // number of rows in the output matrix" (leading dimension; the batch stride too). Its type may
    // be given explicitly (Transformer Engine does, for fp8); another type than D's is allowed only
    // with an E4M3 D, which no accepted configuration has: "If set for an unsupported matrix data,
    // scale, and compute type combination, calling cublasLtMatmul() will return
    // CUBLAS_INVALID_VALUE" (EPILOGUE_AUX_DATA_TYPE).
    p->aux_ld = get<int64_t>(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD);
    p->aux_stride = get<int64_t>(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE);
    if (uses_aux(p->epilogue)) {
        int32_t aux_type = get<int32_t>(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE);
        if (aux_type != -1 && aux_type != p->d.type) return CUBLAS_STATUS_INVALID_VALUE;
        if (p->aux_ld < p->m || p->aux_ld % 8 != 0 || p->aux_stride < 0 || p->aux_stride % 8 != 0)
            return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// Computing one matmul of a batch

// The pointers and scalars of one cublasLtMatmul call.
struct Operands {
    const void *A, *B, *C;
    void *D, *bias, *aux;
    float scale_ab;  // alpha * scaleA * scaleB
    float beta, scale_d;
};

// op(X) in fp32 for cblas: an fp32 operand is used in place, any other is widened (and
// TF32-rounded) into scratch. Returns the matrix and sets *ld to its leading dimension.
const float* fp32_operand(const Matrix& x, const char* src, bool tf32, std::vector<float>& scratch,
                          int64_t* ld) {
    if (x.type == CUDA_R_32F && !tf32) {
        *ld = x.ld;
        return reinterpret_cast<const float*>(src);
    }
    scratch.resize(x.rows * x.cols);
    gather(x.type, src, x.ld, x.rows, x.cols, tf32, scratch.data());
    *ld = std::max<int64_t>(1, x.rows);
    return scratch.data();
}

// SIMT_FP8_ACCUMULATION_BITS=n (1..23; unset: fp32): fp8 GEMMs add their products in k order into
// an accumulator that keeps n bits below the running sum's leading bit, truncating after every
// addition, as a narrow tensor-core accumulator may (Hopper's fp8 tensor cores are reported to keep
// about 14): what a budget that assumes fp32 accumulation misses, shown on a CPU.
int fp8_accumulation_bits() {
    static const int bits = (int)simt::env_int("SIMT_FP8_ACCUMULATION_BITS", 0, 1, 23);
    return bits;
}

// x cut to `bits` bits below its leading bit (toward zero).
float truncate_bits(float x, int bits) {
    int e;
    float f = std::frexp(x, &e);  // x = f 2^e, 0.5 <= |f| < 1
    return std::ldexp(std::trunc(std::ldexp(f, bits + 1)), e - bits - 1);
}

// acc (m,n, column-major) = op(A) op(B) with the sums truncated as fp8_accumulation_bits() says.
void narrow_accumulate(float* acc, const float* A, int64_t lda, bool ta, const float* B, int64_t ldb, bool tb,
                       int64_t m, int64_t n, int64_t k, int bits) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            float s = 0.f;
            for (int64_t p = 0; p < k; p++) {
                float a = ta ? A[p + i * lda] : A[i + p * lda], b = tb ? B[j + p * ldb] : B[p + j * ldb];
                s = truncate_bits(s + a * b, bits);
            }
            acc[i + j * m] = s;
        }
}

// Computes matmul b of the batch into D (and the aux matrix and bias vector the epilogue writes),
// folding max |D_temp| into *amax.
void multiply(cublasLtContext& ws, const Problem& p, const Operands& o, int64_t b, float* amax) {
    const int64_t m = p.m, n = p.n, k = p.k;
    const uint32_t e = p.epilogue;

    // acc = op(A) op(B), accumulated in fp32 (an empty sum when k = 0; fp8: see narrow_accumulate).
    int64_t lda = 1, ldb = 1;
    const float *A = nullptr, *B = nullptr;
    ws.acc.assign(m * n, 0.0f);
    if (k > 0) {
        const char* a_b = static_cast<const char*>(o.A) + batch_offset(p.a.type, p.a.stride, b);
        const char* b_b = static_cast<const char*>(o.B) + batch_offset(p.b.type, p.b.stride, b);
        A = fp32_operand(p.a, a_b, p.tf32, ws.a, &lda);
        B = fp32_operand(p.b, b_b, p.tf32, ws.b, &ldb);
        if (is_fp8(p.a.type) && fp8_accumulation_bits() > 0)
            narrow_accumulate(ws.acc.data(), A, lda, p.ta, B, ldb, p.tb, m, n, k, fp8_accumulation_bits());
        else
            g_openblas.sgemm(CblasColMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans,
                             (int)m, (int)n, (int)k, 1.0f, A, (int)lda, B, (int)ldb, 0.0f, ws.acc.data(),
                             (int)m);
    }

    // Epilogue inputs, widened to fp32. C is copied before D is written, so C may alias D; with
    // beta = 0, C is not read at all (it may hold NaNs or be unset, as with BLAS).
    if (o.beta != 0.0f) {
        ws.c.resize(m * n);
        const char* c_b = static_cast<const char*>(o.C) + batch_offset(p.c.type, p.c.stride, b);
        gather(p.c.type, c_b, p.c.ld, m, n, false, ws.c.data());
    }
    char* bias_b = o.bias ? static_cast<char*>(o.bias) + batch_offset(p.bias_type, p.bias_stride, b)
                          : nullptr;
    if (adds_bias(e)) {
        ws.vec.resize(m);
        gather(p.bias_type, bias_b, m, m, 1, false, ws.vec.data());
    }
    char* aux_b = o.aux ? static_cast<char*>(o.aux) + batch_offset(p.d.type, p.aux_stride, b) : nullptr;
    if (uses_aux(e)) {
        ws.aux.resize(m * n);
        if (applies_dgelu(e)) gather(p.d.type, aux_b, p.aux_ld, m, n, false, ws.aux.data());
    }
    if (dgelu_bgrad(e)) ws.grad.assign(m, 0.0f);

    // The epilogue, element by element in fp32: scale, add beta*C and bias, apply GELU or its
    // gradient, then scale for fp8. D is rounded to its type only after all of it.
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            const int64_t ij = i + j * m;
            float v = o.scale_ab * ws.acc[ij];
            if (o.beta != 0.0f) v += o.beta * ws.c[ij];
            if (adds_bias(e)) v += ws.vec[i];
            if (applies_gelu(e)) {
                if (uses_aux(e)) ws.aux[ij] = v;  // the GELU input, kept for the backward pass
                v = gelu(v);
            }
            if (applies_dgelu(e)) v *= gelu_grad(ws.aux[ij]);
            if (dgelu_bgrad(e)) ws.grad[i] += v;  // bias gradient: D summed over its columns
            *amax = std::max(*amax, std::fabs(v));
            ws.acc[ij] = v * o.scale_d;
        }
    char* d_b = static_cast<char*>(o.D) + batch_offset(p.d.type, p.d.stride, b);
    scatter(p.d.type, ws.acc.data(), m, n, d_b, p.d.ld);
    if (uses_aux(e) && applies_gelu(e)) scatter(p.d.type, ws.aux.data(), m, n, aux_b, p.aux_ld);

    // BGRADA / BGRADB: the bias gradient is op(A) summed over k (one value per row of D) or op(B)
    // summed over k (one per column of D). plan() admits only op(A) = A and op(B) = B^T, so both
    // are stored len x k and the sum runs over their columns.
    if (e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB) {
        const bool from_a = e == CUBLASLT_EPILOGUE_BGRADA;
        const float* X = from_a ? A : B;
        const int64_t ldx = from_a ? lda : ldb, len = from_a ? m : n;
        ws.grad.assign(len, 0.0f);
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t i = 0; i < len; i++) ws.grad[i] += X[i + kk * ldx];
    }
    if (writes_bias_grad(e)) {
        int64_t len = e == CUBLASLT_EPILOGUE_BGRADB ? n : m;
        scatter(p.bias_type, ws.grad.data(), len, 1, bias_b, len);
    }
}

// ----------------------------------------------------------------------------
// Status names

struct StatusText {
    cublasStatus_t status;
    const char* name;
    const char* text;
};

constexpr StatusText kStatusText[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED", "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE", "an invalid value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH", "the device does not support the operation"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR", "an access to device memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED", "the device program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR", "a license check failed"},
};

const StatusText* find_status(cublasStatus_t s) {
    for (const StatusText& t : kStatusText)
        if (t.status == s) return &t;
    return nullptr;
}

}  // namespace

uint64_t simt::cublaslt_descriptor_count() { return g_descriptors.load(); }

const char* simt::openblas_core() {
    load_openblas();
    return g_openblas.corename();
}

// ----------------------------------------------------------------------------
// Library and status

// Creates the handle: a context holding reusable scratch (no device to bind here).
cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* lightHandle) {
    load_openblas();
    if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
    *lightHandle = new cublasLtContext();
    return CUBLAS_STATUS_SUCCESS;
}

// Destroys a handle made by cublasLtCreate.
cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    simt::synchronize_device();  // GEMMs still queued use the handle's scratch
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

// Reports the version of the headers this backend implements (major*10000 + minor*100 + patch).
size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

// The enumerator's name, e.g. "CUBLAS_STATUS_NOT_SUPPORTED".
const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
    const StatusText* t = find_status(status);
    return t ? t->name : "CUBLAS_STATUS_UNKNOWN";
}

// A sentence describing the status.
const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
    const StatusText* t = find_status(status);
    return t ? t->text : "unknown cuBLAS status";
}

// cuBLASLt's own spellings of the two above.
const char* CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }
const char* CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

// ----------------------------------------------------------------------------
// Matmul descriptor

// Creates a descriptor with the documented defaults: no transposes, full fill, DEFAULT epilogue,
// host pointer mode, bias and aux types derived from D (-1).
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    Attrs* d = new Attrs();
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, computeType);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scaleType);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_N);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_FILL_MODE, CUBLAS_FILL_MODE_FULL);
    put<uint32_t>(*d, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, -1);
    put<int32_t>(*d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, -1);
    *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    g_descriptors++;
    return CUBLAS_STATUS_SUCCESS;
}

// Destroys a descriptor made by cublasLtMatmulDescCreate.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    delete reinterpret_cast<Attrs*>(matmulDesc);
    return CUBLAS_STATUS_SUCCESS;
}

// Sets one attribute; sizeInBytes must be the attribute's documented size.
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void* buf, size_t sizeInBytes) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    return set_attr(attrs(matmulDesc), kDescAttrSize, attr, buf,
                    sizeInBytes);
}

// Reads one attribute (or, with sizeInBytes 0, the size it needs).
cublasStatus_t CUBLASWINAPI cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           void* buf, size_t sizeInBytes,
                                                           size_t* sizeWritten) {
    if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
    return get_attr(attrs(matmulDesc), kDescAttrSize, attr, buf, sizeInBytes, sizeWritten);
}

// ----------------------------------------------------------------------------
// Matrix layouts

// Creates a layout: column-major, one matrix (batch count 1), as documented.
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout,
                                                       cudaDataType type, uint64_t rows,
                                                       uint64_t cols, int64_t ld) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    Attrs* l = new Attrs();
    put<uint32_t>(*l, CUBLASLT_MATRIX_LAYOUT_TYPE, type);
    put<int32_t>(*l, CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_COL);
    put<uint64_t>(*l, CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
    put<uint64_t>(*l, CUBLASLT_MATRIX_LAYOUT_COLS, cols);
    put<int64_t>(*l, CUBLASLT_MATRIX_LAYOUT_LD, ld);
    put<int32_t>(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
    *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
    g_descriptors++;
    return CUBLAS_STATUS_SUCCESS;
}

// Destroys a layout made by cublasLtMatrixLayoutCreate.
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    delete reinterpret_cast<Attrs*>(matLayout);
    return CUBLAS_STATUS_SUCCESS;
}

// Sets one layout attribute; sizeInBytes must be the attribute's documented size.
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void* buf, size_t sizeInBytes) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    return set_attr(attrs(matLayout), kLayoutAttrSize, attr, buf,
                    sizeInBytes);
}

// Reads one layout attribute (or, with sizeInBytes 0, the size it needs).
cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             void* buf, size_t sizeInBytes,
                                                             size_t* sizeWritten) {
    if (!matLayout) return CUBLAS_STATUS_INVALID_VALUE;
    return get_attr(attrs(matLayout), kLayoutAttrSize, attr, buf, sizeInBytes, sizeWritten);
}

// ----------------------------------------------------------------------------
// Heuristic search preferences (kept for Get; the single CPU algorithm ignores them)

// Creates a preference with the documented defaults.
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    Attrs* p = new Attrs();
    put<uint32_t>(*p, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, CUBLASLT_REDUCTION_SCHEME_MASK);
    for (int attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        put<uint32_t>(*p, attr, 256);
    put<uint64_t>(*p, CUBLASLT_MATMUL_PREF_IMPL_MASK, ~uint64_t(0));
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
    g_descriptors++;
    return CUBLAS_STATUS_SUCCESS;
}

// Destroys a preference made by cublasLtMatmulPreferenceCreate.
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete reinterpret_cast<Attrs*>(pref);
    return CUBLAS_STATUS_SUCCESS;
}

// Sets one preference attribute; sizeInBytes must be the attribute's documented size.
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void* buf, size_t sizeInBytes) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    return set_attr(attrs(pref), kPrefAttrSize, attr, buf, sizeInBytes);
}

// Reads one preference attribute (or, with sizeInBytes 0, the size it needs).
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 void* buf, size_t sizeInBytes,
                                                                 size_t* sizeWritten) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    return get_attr(attrs(pref), kPrefAttrSize, attr, buf,
                    sizeInBytes, sizeWritten);
}

// ----------------------------------------------------------------------------
// Heuristic and matmul

// Offers the CPU algorithm (needing no workspace) when the configuration is supported, twice when
// more than one is asked for (algo.data[0] 0 and 1, computing the same values), so that code choosing
// among the offered algorithms (matmul_autotune) runs here as on a GPU; otherwise returns no algorithm
// and the reason (NOT_SUPPORTED or INVALID_VALUE).
cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc,
                                                           cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc,
                                                           cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int* returnAlgoCount) {
    (void)preference;  // workspace limits and alignments cannot exclude an algorithm needing neither
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returnAlgoCount = 0;
    Problem p;
    cublasStatus_t s = plan(operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    *returnAlgoCount = std::min(requestedAlgoCount, 2);
    for (int i = 0; i < *returnAlgoCount; i++) {
        heuristicResultsArray[i] = cublasLtMatmulHeuristicResult_t{};
        heuristicResultsArray[i].algo.data[0] = (uint64_t)i;
        heuristicResultsArray[i].workspaceSize = 0;
        heuristicResultsArray[i].state = CUBLAS_STATUS_SUCCESS;
        heuristicResultsArray[i].wavesCount = 1.0f;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// D = epilogue(alpha * op(A) op(B) + beta * C) on stream; see the top of the file.
cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle,
                                           cublasLtMatmulDesc_t computeDesc, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t Adesc,
                                           const void* B, cublasLtMatrixLayout_t Bdesc,
                                           const void* beta, const void* C,
                                           cublasLtMatrixLayout_t Cdesc, void* D,
                                           cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace,
                                           size_t workspaceSizeInBytes, cudaStream_t stream) {
    (void)algo, (void)workspace, (void)workspaceSizeInBytes;  // see the file comment
    if (!lightHandle) return CUBLAS_STATUS_NOT_INITIALIZED;
    Problem p;
    cublasStatus_t s = plan(computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;

    // Host and device pointer modes read alike: device memory is host memory here.
    const Attrs& d = attrs(computeDesc);
    const float* scale_a = get<const float*>(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER);
    const float* scale_b = get<const float*>(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER);
    const float* scale_d = get<const float*>(d, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER);
    Operands o;
    o.A = A, o.B = B, o.C = C, o.D = D;
    o.bias = get<void*>(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER);
    o.aux = get<void*>(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
    const float alpha_value = *static_cast<const float*>(alpha);
    o.beta = *static_cast<const float*>(beta);
    float* amax_d = get<float*>(d, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER);

    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;
    if (!D || (p.k > 0 && (!A || !B)) || (o.beta != 0.0f && !C) ||
        ((adds_bias(p.epilogue) || writes_bias_grad(p.epilogue)) && !o.bias) ||
        (uses_aux(p.epilogue) && !o.aux))
        return CUBLAS_STATUS_INVALID_VALUE;
    // fp8 kernels read and write 16-byte aligned base pointers (Tensor Core usage rules), and take
    // their scales from 16-byte aligned addresses too: on an H100 (cuBLASLt 13.1) a scale pointer 4
    // or 8 bytes past a 16-byte boundary makes cublasLtMatmul return NOT_SUPPORTED for every
    // algorithm the heuristic offered.
    if (is_fp8(p.a.type)) {
        for (const void* ptr : {A, B, C, (const void*)D})
            if ((uintptr_t)ptr % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
        for (int attr : {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                         CUBLASLT_MATMUL_DESC_D_SCALE_POINTER})
            if ((uintptr_t)get<const float*>(d, attr) % 16 != 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    }

    cudaError_t issued = simt::issue(stream, [=, ctx = lightHandle]() mutable {
        // "If not specified, or set to NULL, the scaling factor is 1"
        auto scale = [](const float* ptr) { return ptr ? *ptr : 1.0f; };
        o.scale_ab = alpha_value * scale(scale_a) * scale(scale_b);
        o.scale_d = scale(scale_d);
        float amax = 0.0f;
        for (int64_t b = 0; b < p.d.batch; b++) multiply(*ctx, p, o, b, &amax);
        if (amax_d) *amax_d = amax;
    });
    // A capture that refuses the GEMM (invalidated) fails it, as the CUDA runtime call below it would.
    return issued == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
