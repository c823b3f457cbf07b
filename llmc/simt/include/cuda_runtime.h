// llmc/simt/include/cuda_runtime.h — the CPU backend's stand-in for <cuda_runtime.h>: lets the
// project's CUDA C++ compile unchanged with g++ and run each CUDA thread as a fiber on the CPU.
//
// How it works. The toolkit's own host headers already describe the runtime API (types, enums,
// cudaDeviceProp, cudaLaunchConfig_t, the cudaMalloc... prototypes), so this header defines the
// CUDA keywords first (the toolkit's crt/host_defines.h keeps definitions it finds), includes
// the toolkit's <cuda_runtime_api.h>, and adds what only nvcc normally provides:
//   - built-ins threadIdx/blockIdx/blockDim/gridDim: thread-local globals that the scheduler sets
//     on every fiber switch (they cannot be macros: cudaLaunchConfig_t has fields of those names);
//   - __syncthreads, warp shuffles/votes, atomics, cache-hinted loads, math intrinsics;
//   - cudaLaunchKernelEx as a template that keeps the kernel's argument types (the toolkit's
//     version erases them into void**, which only a GPU driver can unpack).
// The backend's implementation lives in llmc/simt/*.cpp. Never included by nvcc builds.
#pragma once

// ----------------------------------------------------------------------------
// CUDA keywords, defined before the toolkit headers see them

// (#undef first: a toolkit header included earlier may have defined them as GPU attributes.)
#undef __global__
#undef __device__
#undef __host__
#undef __constant__
#undef __managed__
#undef __grid_constant__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
// Static shared memory: one copy per worker OS thread, shared by the fibers (CUDA threads) of the
// block that worker is running — exactly the visibility CUDA gives. Blocks on the same worker
// run one after another, so they reuse it, as blocks reuse an SM's shared memory.
#define __shared__ thread_local
#define SIMT_CPU 1

#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <memory>
#include <utility>

// ----------------------------------------------------------------------------
// Built-in variables (per worker thread; the scheduler rewrites threadIdx on every switch)

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ----------------------------------------------------------------------------
// The scheduler's interface (implemented in llmc/simt/scheduler.cpp)

namespace simt {

// What a fiber waits for when it hands control back to the scheduler.
enum class WarpOp : int {
    Sync, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, ReduceAdd, ReduceMin, ReduceMax,
    MatchAny
};
enum class BarrierOp : int { Plain, Count, And, Or };

// Blocks the calling CUDA thread at __syncthreads (or a _count/_and/_or form) until every
// non-exited thread of its block arrives; returns the reduction of pred for the counted forms.
int barrier(BarrierOp op, int pred, const char* file, int line);

// Blocks the calling lane until every lane named in mask has arrived at the same warp
// collective, then returns this lane's result (raw bits of up to 8 bytes).
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                         const char* file, int line);

// The calling thread's lane (0..31) and the mask of lanes of its warp that have not exited.
unsigned lane_id();
unsigned active_mask();

// This block's dynamic shared memory (size given at launch; poisoned past it under ASan) and its size.
void* dynamic_shared_memory();
size_t dynamic_shared_memory_size();

// cp.async for llmc/tensor_core.cuh (implemented in scheduler.cpp): issues a 16-byte copy from
// global to shared memory (both 16-byte aligned, or a fault), commits the calling thread's issued
// copies as a group, and performs the copies of all but its newest pending_groups groups.
void cp_async_16(void* dst, const void* src, int src_bytes, const char* file, int line);
void cp_async_commit(const char* file, int line);
void cp_async_wait(int pending_groups, const char* file, int line);
// wgmma for llmc/wgmma.cuh (implemented in scheduler.cpp): wgmma.fence; fence.proxy.async (stores
// made visible to wgmma); issuing a warpgroup MMA whose `complete` computes its result (run by the
// wait); the async proxy's copy of the dynamic shared memory that completions read (null before
// the block's first wgmma); the warpgroup check of a warp's wgmma (called once per warp, with what
// identifies the instruction); commit_group; and wait_group (runs the completions of all but the
// newest pending_groups groups, oldest first).
void wgmma_fence(const char* file, int line);
void fence_proxy_async(const char* file, int line);
void wgmma_issue(std::function<void()> complete, const char* file, int line);
const void* async_proxy_shared_memory();
void warp_wgmma_issue(const uint64_t key[3], const char* what, const char* file, int line);
void wgmma_commit(const char* file, int line);
void wgmma_wait(int pending_groups, const char* file, int line);
// prefetch.global.L2 for llmc/tensor_core.cuh: no cache to warm here; a fault unless p is global memory.
void prefetch_l2(const void* p, const char* file, int line);

// Stops the run with a message naming the kernel, block and thread (used by __trap and faults).
[[noreturn]] void fault(const char* what, const char* file, int line);

// One launch: the grid shape, the dynamic shared memory and a type-erased body to run per thread.
struct LaunchBody {
    void (*invoke)(const void* closure);  // calls the kernel with its captured arguments
    const void* closure;
    const void* kernel;  // the kernel's address, to name it in messages and look up attributes
    // A heap copy of the closure, for a launch that runs after the call returns
    // (SIMT_STREAMS=adversarial queues launches on their stream).
    std::shared_ptr<const void> (*copy)(const void* closure);
};
cudaError_t launch(const cudaLaunchConfig_t& cfg, const LaunchBody& body);

// Schedule order of the threads between two sync points (SIMT_ORDER=forward|reverse|random[:seed]
// sets the default; tests switch it programmatically to compare runs).
enum class Order { Forward, Reverse, Random };
void set_order(Order order, uint64_t seed = 0);
Order get_order();

// Runs everything issued to stream so far (the CPU backend's cudaStreamSynchronize).
void synchronize_stream(cudaStream_t stream);

// Number of worker OS threads running blocks in parallel (SIMT_THREADS sets the default, 1).
void set_workers(int n);
int get_workers();

// Number of kernel launches since start-up (the trainers report launches per step).
uint64_t launch_count();

// Number of calls since start-up that can make the host wait for the device: stream and device
// synchronization, event synchronization on an event whose work has not run yet, copies to or from
// pageable host memory (CUDA may stage those by waiting for the stream), synchronous copies
// involving host memory, cudaFree and cudaFreeHost. A training step that makes none keeps the GPU
// fed while the host prepares the next micro-batch.
uint64_t host_sync_count();
void note_host_sync();

// Number of operations the host has issued to streams since start-up: kernel launches, async copies
// and memsets, cuBLASLt matmuls, NCCL collectives, graph launches (a graph's replayed operations are
// not issued by the host). With the micro-step replayed as a CUDA graph a step issues few.
uint64_t host_stream_op_count();

// Number of cuBLASLt descriptors (matmul descriptors, matrix layouts, matmul preferences) created
// since start-up. Each is host work between GEMMs; llmc/matmul.cuh caches them with its plans, and
// test_matmul checks that a repeated GEMM creates none.
uint64_t cublaslt_descriptor_count();

// The OpenBLAS kernel family the backend's cuBLASLt computes with, as OpenBLAS names it ("SkylakeX",
// "Haswell", ...): the one the CPU's features allow unless OPENBLAS_CORETYPE names another
// (llmc/simt/cublaslt.cpp, load_openblas).
const char* openblas_core();

// Size of the virtual device's global memory in bytes: cudaMalloc fails with
// cudaErrorMemoryAllocation beyond it, as on a GPU. SIMT_DEVICE_MEMORY sets the default (bytes, or
// with a K/M/G suffix: "80G" for an H100); unset, the memory of the SIMT_DEVICE profile's GPU, at
// most the machine's physical memory.
void set_device_memory(size_t bytes);
size_t get_device_memory();

template <class T>
inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp collectives move at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T>
inline T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

}  // namespace simt

// ----------------------------------------------------------------------------
// Kernel launch (CUDA 12+ API): the closure keeps each argument converted to the kernel's
// parameter type, as the real cudaLaunchKernelEx does with its coercedArgs.

template <typename... ExpTypes, typename... ActTypes>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(ExpTypes...),
                                      ActTypes&&... args) {
    auto closure = [kernel, coerced = std::tuple<std::decay_t<ExpTypes>...>(
                                std::forward<ActTypes>(args)...)]() { std::apply(kernel, coerced); };
    using Closure = decltype(closure);
    simt::LaunchBody body{[](const void* c) { (*static_cast<const Closure*>(c))(); }, &closure,
                          reinterpret_cast<const void*>(kernel), [](const void* c) -> std::shared_ptr<const void> {
                              return std::make_shared<const Closure>(*static_cast<const Closure*>(c));
                          }};
    return simt::launch(*config, body);
}

template <class T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
template <class T>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, T* entry) {
    return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(entry));
}
template <class T>
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, T func,
                                                                 int block_size, size_t dyn_smem) {
    return ::cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        num_blocks, reinterpret_cast<const void*>(func), block_size, dyn_smem, cudaOccupancyDefault);
}
template <class T>
inline cudaError_t cudaMallocHost(T** ptr, size_t size) {
    return ::cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
template <class T>
inline cudaError_t cudaMalloc(T** ptr, size_t size) {
    return ::cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
template <class T>
inline cudaError_t cudaMemcpyToSymbol(const T& symbol, const void* src, size_t count,
                                      size_t offset = 0,
                                      cudaMemcpyKind kind = cudaMemcpyHostToDevice) {
    (void)kind;
    simt::synchronize_stream(nullptr);  // a synchronous copy on the legacy stream, as cudaMemcpy
    std::memcpy(reinterpret_cast<char*>(const_cast<T*>(&symbol)) + offset, src, count);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Synchronization

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::barrier(simt::BarrierOp::Plain, 0, file, line);
}
inline int __syncthreads_count(int pred, const char* file = __builtin_FILE(),
                               int line = __builtin_LINE()) {
    return simt::barrier(simt::BarrierOp::Count, pred, file, line);
}
inline int __syncthreads_and(int pred, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    return simt::barrier(simt::BarrierOp::And, pred, file, line);
}
inline int __syncthreads_or(int pred, const char* file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
    return simt::barrier(simt::BarrierOp::Or, pred, file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
    simt::warp_collective(simt::WarpOp::Sync, mask, 0, 0, 32, file, line);
}
// Memory fences: every fiber of a worker sees memory immediately; across workers the only
// cross-block communication is through atomics, which are sequentially consistent here.
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __trap(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    simt::fault("__trap() called", file, line);
}

// ----------------------------------------------------------------------------
// Warp shuffles and votes

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_collective(simt::WarpOp::ShflIdx, mask,
                                                    simt::to_bits(var), src_lane, width, file, line));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_collective(simt::WarpOp::ShflUp, mask, simt::to_bits(var),
                                                    (int)delta, width, file, line));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_collective(simt::WarpOp::ShflDown, mask,
                                                    simt::to_bits(var), (int)delta, width, file, line));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return simt::from_bits<T>(simt::warp_collective(simt::WarpOp::ShflXor, mask,
                                                    simt::to_bits(var), lane_mask, width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    return (unsigned)simt::warp_collective(simt::WarpOp::Ballot, mask, pred != 0, 0, 32, file, line);
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
    return (int)simt::warp_collective(simt::WarpOp::Any, mask, pred != 0, 0, 32, file, line);
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
    return (int)simt::warp_collective(simt::WarpOp::All, mask, pred != 0, 0, 32, file, line);
}
inline unsigned __activemask() { return simt::active_mask(); }
template <class T>
inline unsigned __match_any_sync(unsigned mask, T value, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
    return (unsigned)simt::warp_collective(simt::WarpOp::MatchAny, mask, simt::to_bits(value), 0, 32,
                                           file, line);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
    return (unsigned)simt::warp_collective(simt::WarpOp::ReduceAdd, mask, v, 0, 32, file, line);
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
    return (unsigned)simt::warp_collective(simt::WarpOp::ReduceMin, mask, v, 0, 32, file, line);
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
    return (unsigned)simt::warp_collective(simt::WarpOp::ReduceMax, mask, v, 0, 32, file, line);
}

// ----------------------------------------------------------------------------
// Atomics: GCC's __atomic builtins, so blocks on parallel workers (SIMT_THREADS > 1) are safe.

// Read-modify-write of *address by compare-and-swap on its bits (an unsigned integer of T's size:
// clang does not count __half2 as trivially copyable, so the CAS cannot take T itself).
template <class T>
inline T simt_atomic_cas_update(T* address, T (*update)(T, T), T val) {
    using Bits = typename std::conditional<sizeof(T) == 2, uint16_t,
                 typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type>::type;
    static_assert(sizeof(T) == sizeof(Bits), "atomics on 2-, 4- and 8-byte types");
    Bits* bits = reinterpret_cast<Bits*>(address);
    Bits old = __atomic_load_n(bits, __ATOMIC_SEQ_CST), desired;
    T before;
    do {
        std::memcpy(static_cast<void*>(&before), &old, sizeof(T));
        T after = update(before, val);
        std::memcpy(&desired, static_cast<const void*>(&after), sizeof(T));
    } while (!__atomic_compare_exchange_n(bits, &old, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return before;
}
inline int atomicAdd(int* a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float* a, float v) {
    return simt_atomic_cas_update<float>(a, [](float x, float y) { return x + y; }, v);
}
inline double atomicAdd(double* a, double v) {
    return simt_atomic_cas_update<double>(a, [](double x, double y) { return x + y; }, v);
}
inline __half2 atomicAdd(__half2* a, __half2 v) {
    return simt_atomic_cas_update<__half2>(a, [](__half2 x, __half2 y) { return __hadd2(x, y); }, v);
}
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* a, __nv_bfloat162 v) {
    return simt_atomic_cas_update<__nv_bfloat162>(
        a, [](__nv_bfloat162 x, __nv_bfloat162 y) { return __hadd2(x, y); }, v);
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
inline int atomicMax(int* a, int v) {
    return simt_atomic_cas_update<int>(a, [](int x, int y) { return x > y ? x : y; }, v);
}
inline unsigned atomicMax(unsigned* a, unsigned v) {
    return simt_atomic_cas_update<unsigned>(a, [](unsigned x, unsigned y) { return x > y ? x : y; }, v);
}
inline int atomicMin(int* a, int v) {
    return simt_atomic_cas_update<int>(a, [](int x, int y) { return x < y ? x : y; }, v);
}
inline unsigned atomicMin(unsigned* a, unsigned v) {
    return simt_atomic_cas_update<unsigned>(a, [](unsigned x, unsigned y) { return x < y ? x : y; }, v);
}
inline int atomicExch(int* a, int v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* a, unsigned v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }
inline float atomicExch(float* a, float v) {
    float old;
    __atomic_exchange(a, &v, &old, __ATOMIC_SEQ_CST);
    return old;
}
template <class T>
inline T simt_atomic_cas(T* a, T compare, T val) {
    __atomic_compare_exchange_n(a, &compare, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;  // holds the old value whether or not the exchange happened
}
inline int atomicCAS(int* a, int c, int v) { return simt_atomic_cas(a, c, v); }
inline unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { return simt_atomic_cas(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
    return simt_atomic_cas(a, c, v);
}
inline unsigned short atomicCAS(unsigned short* a, unsigned short c, unsigned short v) {
    return simt_atomic_cas(a, c, v);
}

// ----------------------------------------------------------------------------
// Cache-hinted loads and stores: on the CPU they are plain loads and stores.

template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// ----------------------------------------------------------------------------
// Math and bit intrinsics. The fast-math forms (__expf...) compute the accurate function here;
// GPU results may differ by a few ulp, which the tests' tolerances account for.

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float exp10f(float x) { return std::pow(10.0f, x); }
inline int __float_as_int(float x) { return simt::from_bits<int>(simt::to_bits(x)); }
inline unsigned __float_as_uint(float x) { return simt::from_bits<unsigned>(simt::to_bits(x)); }
inline float __int_as_float(int x) { return simt::from_bits<float>(simt::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return simt::from_bits<float>(simt::to_bits(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline long long clock64() { return (long long)__builtin_ia32_rdtsc(); }
