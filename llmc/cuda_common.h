// llmc/cuda_common.h — what every kernel file, test and trainer shares: the error-check macro, the
// launch helper, a scalar written in stream order, dynamic shared memory (access and reservation), the 16-byte alignment check and
// CEIL_DIV. Compiles with nvcc and with the CPU backend.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <thread>
#include <utility>

#include "fatal.h"

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))


// Evaluates a CUDA runtime call once; on failure prints the error, the statement, file and line,
// and exits (a failed allocation or launch leaves nothing worth continuing with). An allocation that
// failed also says how much it asked for (`requested`, when known), how much device memory is free,
// and what makes a run need less.
[[noreturn]] inline void cuda_check_failed(cudaError_t err, const char* call, const char* file, int line,
                                           size_t requested = 0) {
    fprintf(stderr, "%s[CUDA ERROR] %s (%s)\n  in: %s\n  at %s:%d\n", fatal_error_prefix, cudaGetErrorString(err),
            cudaGetErrorName(err), call, file, line);
    size_t free_b = 0, total_b = 0;
    if (err == cudaErrorMemoryAllocation && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
        if (requested) fprintf(stderr, "  it asked for %.1f MiB;", requested / 1048576.0);
        fprintf(stderr, "%sthe device has %.1f MiB free of %.1f MiB: a smaller model or micro-batch, --recompute, "
                "--optimizer adamw8bit, or --zero over several GPUs needs less\n", requested ? " " : "  ",
                free_b / 1048576.0, total_b / 1048576.0);
    }
    fatal_exit();
}
#define cudaCheck(call)                                                       \
    do {                                                                      \
        cudaError_t err_ = (call);                                            \
        if (err_ != cudaSuccess) cuda_check_failed(err_, #call, __FILE__, __LINE__); \
    } while (0)

// cudaMalloc(ptr, bytes) checked as cudaCheck does; a failure also says how many bytes it asked for.
template <class T>
inline void cuda_malloc_check(T** ptr, size_t bytes, const char* call, const char* file, int line) {
    cudaError_t err = cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
    if (err != cudaSuccess) cuda_check_failed(err, call, file, line, bytes);
}
#define cudaMallocCheck(ptr, bytes) \
    cuda_malloc_check((ptr), (bytes), "cudaMalloc(" #ptr ", " #bytes ")", __FILE__, __LINE__)

// Launches kernel<<<grid, block, smem, stream>>>(args...) through cudaLaunchKernelEx, the form both
// nvcc and the CPU backend's g++ build accept, and returns the launch's error code.
template <class... KArgs, class... Args>
inline cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    cudaError_t last = cudaGetLastError();  // read (and clear) it either way, so it cannot linger
    return err != cudaSuccess ? err : last;
}

// *dst = value, written in stream order by one thread. For a scalar that launches replayed from a
// CUDA graph read from device memory (a replay reuses the arguments it was captured with): write it
// before each replay.
template <class T>
__global__ void set_scalar_kernel(T* dst, T value) { *dst = value; }
template <class T>
inline void set_device_scalar(T* dst, T value, cudaStream_t stream) {
    cudaCheck(launch_kernel(set_scalar_kernel<T>, dim3(1), dim3(1), 0, stream, dst, value));
}

// The block's dynamic shared memory as T* (sized by the launch). On the CPU backend it is an
// exactly-sized allocation, so AddressSanitizer catches accesses past the requested size.
template <class T>
__device__ inline T* dynamic_shared() {
#if defined(SIMT_CPU)
    return static_cast<T*>(simt::dynamic_shared_memory());
#else
    extern __shared__ __align__(128) unsigned char dynamic_smem_[];
    return reinterpret_cast<T*>(dynamic_smem_);
#endif
}

// The dynamic shared memory per block a kernel on the current device may opt in to.
inline int device_smem_optin() {
    int device = 0, bytes = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory per block. Every device gives 48 KiB
// without asking; above that the kernel must opt in, up to device_smem_optin(). When the device has
// less, exits with "<op>: <size_name>=<size> needs N bytes of shared memory per block, the device
// allows M: <size_name> is too large", naming the launcher's argument that set the size.
template <class Kernel>
inline void reserve_dynamic_smem(Kernel kernel, size_t bytes, const char* op, const char* size_name, long long size) {
    if (bytes <= 48 * 1024) return;
    int limit = device_smem_optin();
    if (bytes > (size_t)limit) {
        fprintf(stderr,
                "%s: %s=%lld needs %zu bytes of shared memory per block, the device allows %d: %s is too large\n", op,
                size_name, size, bytes, limit, size_name);
        exit(EXIT_FAILURE);
    }
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Whether every pointer allows 128-bit loads and stores (Packed128). cudaMalloc gives 256-byte
// alignment, but views into a tensor at odd offsets may have less; null pointers pass.
inline bool aligned16(std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return true;
}

// Milliseconds the device takes for the work f() issues to `stream`, waited for (the autotuners'
// trial runs: --gemm-autotune, --attention-backward tune). Not during a graph capture.
template <class F>
float time_on_stream(cudaStream_t stream, F&& f) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventRecord(start, stream));
    f();
    cudaCheck(cudaEventRecord(stop, stream));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return ms;
}

// Kernel launches since start-up, counted by the CPU backend (a GPU build has no counter: -1).
// The trainers report launches per step with it.
inline long long kernel_launch_count() {
#if defined(SIMT_CPU)
    return (long long)simt::launch_count();
#else
    return -1;
#endif
}

// Calls since start-up that can make the host wait for the device, counted by the CPU backend
// (simt::host_sync_count says which); -1 on a GPU, where nothing counts them.
inline long long host_sync_count() {
#if defined(SIMT_CPU)
    return (long long)simt::host_sync_count();
#else
    return -1;
#endif
}

// Operations the host has issued to streams since start-up (kernels, copies, memsets, GEMMs,
// collectives, graph launches), counted by the CPU backend; -1 on a GPU. With CUDA graphs a
// micro-step's hundreds become one graph launch.
inline long long host_stream_op_count() {
#if defined(SIMT_CPU)
    return (long long)simt::host_stream_op_count();
#else
    return -1;
#endif
}

// True when this build runs on the CPU backend rather than a GPU (programs pick smaller defaults).
constexpr bool on_cpu_backend() {
#if defined(SIMT_CPU)
    return true;
#else
    return false;
#endif
}

// On the CPU backend, runs blocks on every core (shared among the `processes` of this node, e.g. the
// ranks of a data-parallel run) unless SIMT_THREADS chose otherwise (the kernels are deterministic,
// so the worker count does not change results); nothing to do on a GPU.
inline void use_all_cpu_cores(int processes = 1) {
#if defined(SIMT_CPU)
    int cores = (int)std::thread::hardware_concurrency();
    if (!getenv("SIMT_THREADS")) simt::set_workers(std::max(1, cores / std::max(1, processes)));
#else
    (void)processes;
#endif
}
