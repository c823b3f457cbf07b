// llmc/precision.cuh — storage types and conversions shared by every kernel: the run-time precision
// choice, float <-> storage conversions, 128-bit packed loads/stores, and dtype tolerances.
#pragma once
#include "cuda_common.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

// ----------------------------------------------------------------------------
// Run-time precision. Kernels are templated on the storage type T of parameters and activations
// (float, __nv_bfloat16 or __half); the trainer dispatches once, at start-up, on this enum.
// Accumulation is always fp32; master weights and optimizer state are fp32 whenever T is not.
// FP16 has bf16's 16 bits with 3 more of mantissa and 3 fewer of exponent: finite only below 65504,
// subnormal below 6.1e-5, so training in it needs loss scaling (the trainer's job).

enum class Precision { FP32, BF16, FP16 };

inline const char* precision_name(Precision p) {
    return p == Precision::FP32 ? "fp32" : p == Precision::BF16 ? "bf16" : "fp16";
}

// ----------------------------------------------------------------------------
// Conversions between fp32 and a storage type (round to nearest even, as the hardware does).

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__host__ __device__ inline float to_float(__half x) { return __half2float(x); }

template <class T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) { return x; }
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__host__ __device__ inline __half from_float<__half>(float x) { return __float2half(x); }

// Unit roundoff of a storage type: the eps of the tests' bound |out - ref| <= atol + k*eps*|ref| (doc/testing.md).
template <class T> constexpr double dtype_eps();
template <> constexpr double dtype_eps<float>() { return 1.0 / (1 << 23); }
template <> constexpr double dtype_eps<__nv_bfloat16>() { return 1.0 / (1 << 7); }
template <> constexpr double dtype_eps<__half>() { return 1.0 / (1 << 10); }

// Smallest positive subnormal of a storage type. Below the smallest normal number the spacing of
// representable values stops shrinking, so one rounding errs by up to half of this, absolutely:
// the atol of a result that small (reached in fp16, whose normal range ends at 2^-14 = 6.1e-5).
template <class T> constexpr double dtype_denorm_min();
template <> constexpr double dtype_denorm_min<float>() { return 1.4012984643248171e-45; }         // 2^-149
template <> constexpr double dtype_denorm_min<__nv_bfloat16>() { return 9.1835496157991212e-41; }  // 2^-133
template <> constexpr double dtype_denorm_min<__half>() { return 1.0 / (1 << 24); }                // 2^-24

// ----------------------------------------------------------------------------
// Packed128: 16 bytes of T moved with one 128-bit load or store (4 floats, 8 bf16 or 8 fp16), the unit
// memory-bound kernels work in so that a warp moves 512 contiguous bytes per instruction.
// Requires 16-byte aligned addresses: callers keep row lengths a multiple of Packed128<T>::size.

template <class T>
struct alignas(16) Packed128 {
    static constexpr int size = 16 / sizeof(T);
    T payload[size];

    __device__ static Packed128 constant(T value) {
        Packed128 p;
        for (int k = 0; k < size; k++) p.payload[k] = value;
        return p;
    }
    __device__ static Packed128 zeros() { return constant(from_float<T>(0.f)); }
    __device__ T& operator[](int k) { return payload[k]; }
    __device__ const T& operator[](int k) const { return payload[k]; }
};

// Whether rows of `row` elements of T can move as whole Packed128s: the row length a multiple of
// the pack width and every pointer 16-byte aligned.
template <class T>
inline bool rows_pack128(int row, std::initializer_list<const void*> pointers) {
    return row % Packed128<T>::size == 0 && aligned16(pointers);
}

// Loads 16 bytes from a 16-byte aligned address.
template <class T>
__device__ inline Packed128<T> load128(const T* address) {
    Packed128<T> p;
    int4 bits = *reinterpret_cast<const int4*>(address);
    memcpy(&p, &bits, sizeof(p));
    return p;
}
// Same, with the streaming hint (data read once: do not keep it in cache).
template <class T>
__device__ inline Packed128<T> load128cs(const T* address) {
    Packed128<T> p;
    int4 bits = __ldcs(reinterpret_cast<const int4*>(address));
    memcpy(&p, &bits, sizeof(p));
    return p;
}
// Stores 16 bytes to a 16-byte aligned address.
template <class T>
__device__ inline void store128(T* target, Packed128<T> value) {
    int4 bits;
    memcpy(&bits, &value, sizeof(bits));
    *reinterpret_cast<int4*>(target) = bits;
}
