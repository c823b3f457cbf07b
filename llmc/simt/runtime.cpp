// llmc/simt/runtime.cpp — the CUDA runtime API subset on the CPU: device memory, the virtual device,
// errors, function attributes and occupancy (streams, events and copies: streams.cpp).
//
// Device memory is host memory, allocated at exactly the requested size so that AddressSanitizer
// flags any access past the end (real allocations are padded, so a GPU hides such bugs), and
// filled with a poison pattern: a GPU's fresh allocations hold whatever was there before, so code
// that reads memory it never wrote must fail here, not pass by finding zeros.
#include "internal.h"

#include <cuda_profiler_api.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace simt {
namespace {

thread_local cudaError_t t_last_error = cudaSuccess;

// The profiles SIMT_DEVICE chooses from, the first the default: the real GPUs' figures (CUDA C++
// Programming Guide, table of technical specifications per compute capability; the products'
// datasheets for memory).
constexpr size_t kGiB = (size_t)1 << 30;
const DeviceProfile kProfiles[] = {
    // key      compute  threads blocks  shared memory:          memory
    //          capab.   per SM  per SM  opt-in per block  per SM
    {"h100",    9, 0,    2048,   32,     227 * 1024, 228 * 1024, 80 * kGiB},
    {"a100",    8, 0,    2048,   32,     163 * 1024, 164 * 1024, 80 * kGiB},
    {"rtx3090", 8, 6,    1536,   16,      99 * 1024, 100 * 1024, 24 * kGiB},
    {"l4",      8, 9,    1536,   24,      99 * 1024, 100 * 1024, 24 * kGiB},
};

struct Allocations {
    std::mutex mu;
    std::map<const void*, size_t> device, pinned;  // ordered: which allocation holds a pointer
    size_t device_bytes = 0;
};
Allocations& allocs() {
    static Allocations* a = new Allocations();  // outlives static destruction (late cudaFree)
    return *a;
}

struct FuncAttributes {
    std::mutex mu;
    std::map<const void*, size_t> max_dyn_smem;
};
FuncAttributes& func_attrs() {
    static FuncAttributes* f = new FuncAttributes();
    return *f;
}

// The host memory a new allocation can still get: /proc/meminfo's MemAvailable (what the kernel
// can give without swapping, other processes' use left out; SIMT_MEMINFO names another file, for
// tests), at most physical memory.
size_t available_memory() {
    size_t bytes = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    const char* meminfo = getenv("SIMT_MEMINFO");
    if (FILE* f = fopen(meminfo && *meminfo ? meminfo : "/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kib;
        while (fgets(line, sizeof(line), f))
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) bytes = std::min(bytes, (size_t)kib * 1024);
        fclose(f);
    }
    return bytes;
}

// The virtual device's memory: SIMT_DEVICE_MEMORY ("24G", "512M", bytes), else the profile's, capped
// by the host memory available when the process first asks (the device's memory is host memory:
// more, e.g. all of the RAM for --batch-size auto to fill, would end in the host running out). Read
// once, so that the free memory the device reports changes only with its own allocations.
size_t& device_memory_setting() {
    static size_t bytes = [] {
        const char* e = getenv("SIMT_DEVICE_MEMORY");
        if (!e || !*e) return std::min(device_profile().memory, available_memory());
        char* end = nullptr;
        double v = strtod(e, &end);
        double unit = 1;
        if (end && (*end == 'K' || *end == 'k')) unit = 1024.0;
        if (end && (*end == 'M' || *end == 'm')) unit = 1048576.0;
        if (end && (*end == 'G' || *end == 'g')) unit = 1073741824.0;
        if (end == e || v <= 0) {
            fprintf(stderr, "simt: SIMT_DEVICE_MEMORY='%s' is not a size (e.g. 80G, 512M, 1000000)\n", e);
            exit(EXIT_FAILURE);
        }
        return (size_t)(v * unit);
    }();
    return bytes;
}

// Every byte of a fresh device or pinned allocation: 0xFF makes each float type a NaN (fp32 0xFFFFFFFF,
// bf16/fp16 0xFFFF, fp8 E4M3 0xFF and E5M2 0xFF) and each integer -1, so a kernel that accumulates
// into, or reads, memory nobody initialized gives NaNs or wild indices instead of the right answer.
constexpr int kPoisonByte = 0xFF;

void* alloc_exact(size_t size) {
    void* p = nullptr;
    // 256-byte alignment as cudaMalloc guarantees; the size itself is not rounded up.
    if (posix_memalign(&p, 256, size ? size : 1) != 0) return nullptr;
    memset(p, kPoisonByte, size);
    return p;
}

}  // namespace

const DeviceProfile& device_profile() {
    static const DeviceProfile& profile = []() -> const DeviceProfile& {
        const char* e = getenv("SIMT_DEVICE");
        std::string key = e && *e ? e : kProfiles[0].key, accepted;
        for (const DeviceProfile& p : kProfiles) {
            if (key == p.key) return p;
            accepted += std::string(accepted.empty() ? "" : ", ") + p.key;
        }
        fprintf(stderr, "simt: SIMT_DEVICE='%s' is not a device profile (accepted: %s)\n", e, accepted.c_str());
        exit(EXIT_FAILURE);
    }();
    return profile;
}

namespace {
// Read at start-up, so that a misspelt SIMT_DEVICE stops every program, not only those that ask.
[[maybe_unused]] const DeviceProfile& g_startup_profile = device_profile();
}  // namespace

cudaError_t set_last_error(cudaError_t err) {
    if (err != cudaSuccess) t_last_error = err;
    return err;
}

size_t max_dynamic_smem(const void* kernel) {
    std::lock_guard<std::mutex> lk(func_attrs().mu);
    auto it = func_attrs().max_dyn_smem.find(kernel);
    return it == func_attrs().max_dyn_smem.end() ? kDefaultSmemPerBlock : it->second;
}

namespace {
bool inside(const std::map<const void*, size_t>& m, const void* p) {
    auto it = m.upper_bound(p);
    if (it == m.begin()) return false;
    --it;
    return (const char*)p < (const char*)it->first + std::max<size_t>(it->second, 1);
}
}  // namespace

bool is_device_memory(const void* p) {
    std::lock_guard<std::mutex> lk(allocs().mu);
    return inside(allocs().device, p);
}
bool is_pinned_memory(const void* p) {
    std::lock_guard<std::mutex> lk(allocs().mu);
    return inside(allocs().pinned, p);
}

}  // namespace simt

using simt::set_last_error;

// ----------------------------------------------------------------------------
// Errors

extern "C" {

cudaError_t cudaGetLastError(void) {
    cudaError_t e = simt::t_last_error;
    simt::t_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return simt::t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotSupported: return "cudaErrorNotSupported";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorIllegalState: return "cudaErrorIllegalState";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
        case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
        case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
        case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
        case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
        case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
        case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
        case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
        default: return "cudaErrorUnknown";
    }
}

const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotSupported: return "operation not supported";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorIllegalState: return "the resource is in an illegal state for this operation";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
        case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
        case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
        case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
        case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
        case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
        default: return "unknown error";
    }
}

// ----------------------------------------------------------------------------
// The virtual device: the limits of the GPU SIMT_DEVICE names (default H100: compute capability 9.0,
// so every code path the project has is selectable), host RAM as global memory. Its name says it is
// no GPU (tables keyed by GPU name, such as llmc/mfu.h's peaks, must not match it) and names any
// profile but the default.

cudaError_t cudaGetDeviceCount(int* count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : set_last_error(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
// No profiler attaches to the CPU backend: the brackets a program sets for one are accepted and do nothing.
cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device != 0) return set_last_error(cudaErrorInvalidDevice);
    const simt::DeviceProfile& p = simt::device_profile();
    memset(prop, 0, sizeof(*prop));
    if (&p == &simt::kProfiles[0])
        snprintf(prop->name, sizeof(prop->name), "SIMT CPU backend (virtual device)");
    else
        snprintf(prop->name, sizeof(prop->name), "SIMT CPU backend (virtual device, SIMT_DEVICE=%s)", p.key);
    prop->totalGlobalMem = simt::device_memory_setting();
    prop->sharedMemPerBlock = simt::kDefaultSmemPerBlock;
    prop->sharedMemPerBlockOptin = p.smem_per_block_optin;
    prop->sharedMemPerMultiprocessor = p.smem_per_sm;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = simt::kMaxThreadsPerBlock;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 64 * 1024;
    prop->major = p.major;
    prop->minor = p.minor;
    prop->multiProcessorCount = simt::kSmCount;
    prop->maxThreadsPerMultiProcessor = p.max_threads_per_sm;
    prop->maxBlocksPerMultiProcessor = p.max_blocks_per_sm;
    prop->l2CacheSize = 32 * 1024 * 1024;
    prop->memoryBusWidth = 0;  // unknown: bandwidth figures are not meaningful on a CPU
    prop->concurrentKernels = 0;
    prop->unifiedAddressing = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return cudaErrorInvalidDevice;
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrWarpSize: *value = p.warpSize; break;
        case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
        case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
        default: return set_last_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Memory

// Allocating and freeing are unsafe during a capture (llmc/simt/streams.cpp): a graph would not
// replay them.
cudaError_t cudaMalloc(void** ptr, size_t size) {
    if (cudaError_t err = simt::unsafe_during_capture()) return set_last_error(err);
    {
        std::lock_guard<std::mutex> lk(simt::allocs().mu);
        if (simt::allocs().device_bytes + size > simt::device_memory_setting()) {
            *ptr = nullptr;
            return set_last_error(cudaErrorMemoryAllocation);
        }
    }
    void* p = simt::alloc_exact(size);
    if (!p) {
        *ptr = nullptr;
        return set_last_error(cudaErrorMemoryAllocation);
    }
    std::lock_guard<std::mutex> lk(simt::allocs().mu);
    simt::allocs().device[p] = size;
    simt::allocs().device_bytes += size;
    *ptr = p;
    return cudaSuccess;
}

namespace {
cudaError_t free_device(void* ptr) {
    std::lock_guard<std::mutex> lk(simt::allocs().mu);
    auto it = simt::allocs().device.find(ptr);
    if (it == simt::allocs().device.end()) return set_last_error(cudaErrorInvalidDevicePointer);
    simt::allocs().device_bytes -= it->second;
    simt::allocs().device.erase(it);
    free(ptr);
    return cudaSuccess;
}
}  // namespace

// Waits for all queued work first, as a GPU does: some of it may use the memory.
cudaError_t cudaFree(void* ptr) {
    if (!ptr) return cudaSuccess;
    if (cudaError_t err = simt::unsafe_during_capture()) return set_last_error(err);
    simt::note_host_sync();
    simt::synchronize_device();
    return free_device(ptr);
}

// Stream-ordered allocation, without CUDA's allocation nodes in a capture: refused while capturing
// (cudaMalloc's check; cudaFreeAsync's below), where CUDA would record them.
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t) { return cudaMalloc(ptr, size); }
// Freed when the stream gets there (a pointer that is not an allocation is reported at once).
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
    if (!ptr) return cudaSuccess;
    if (simt::stream_capturing(stream)) return set_last_error(cudaErrorStreamCaptureUnsupported);
    if (!simt::is_device_memory(ptr)) return set_last_error(cudaErrorInvalidDevicePointer);
    return set_last_error(simt::issue(stream, [ptr] { free_device(ptr); }));
}
cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int) { return cudaMalloc(ptr, size); }

cudaError_t cudaMallocHost(void** ptr, size_t size) {
    if (cudaError_t err = simt::unsafe_during_capture()) return set_last_error(err);
    void* p = simt::alloc_exact(size);
    if (!p) return set_last_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(simt::allocs().mu);
    simt::allocs().pinned[p] = size;
    *ptr = p;
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) { return cudaMallocHost(ptr, size); }

cudaError_t cudaFreeHost(void* ptr) {
    if (!ptr) return cudaSuccess;
    if (cudaError_t err = simt::unsafe_during_capture()) return set_last_error(err);
    simt::note_host_sync();
    simt::synchronize_device();
    std::lock_guard<std::mutex> lk(simt::allocs().mu);
    if (!simt::allocs().pinned.erase(ptr)) return set_last_error(cudaErrorInvalidValue);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    size_t phys = simt::device_memory_setting();
    std::lock_guard<std::mutex> lk(simt::allocs().mu);
    *total = phys;
    *free_bytes = phys > simt::allocs().device_bytes ? phys - simt::allocs().device_bytes : 0;
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Function attributes and occupancy

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > simt::device_profile().smem_per_block_optin)
            return set_last_error(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> lk(simt::func_attrs().mu);
        simt::func_attrs().max_dyn_smem[func] = (size_t)value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;  // a hint
    return set_last_error(cudaErrorInvalidValue);
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
    memset(attr, 0, sizeof(*attr));
    attr->maxThreadsPerBlock = simt::kMaxThreadsPerBlock;
    attr->maxDynamicSharedSizeBytes = (int)simt::max_dynamic_smem(func);
    attr->ptxVersion = attr->binaryVersion = 10 * simt::device_profile().major + simt::device_profile().minor;
    return cudaSuccess;
}

// Occupancy of the virtual device: limited by threads, blocks and shared memory per SM
// (registers are not modelled: the CPU backend does not know a kernel's register count).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* num_blocks, const void*,
                                                                   int block_size, size_t dyn_smem,
                                                                   unsigned int) {
    const simt::DeviceProfile& p = simt::device_profile();
    if (block_size <= 0 || block_size > simt::kMaxThreadsPerBlock) return set_last_error(cudaErrorInvalidValue);
    int by_threads = p.max_threads_per_sm / block_size;
    int by_smem = dyn_smem ? (int)(p.smem_per_sm / dyn_smem) : p.max_blocks_per_sm;
    *num_blocks = std::min(std::min(by_threads, by_smem), p.max_blocks_per_sm);
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func,
                                                          int block_size, size_t dyn_smem) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size, dyn_smem, 0);
}

// The C launch API cannot be served: its arguments arrive type-erased. The shadow header's
// cudaLaunchKernelEx template is the way to launch on the CPU backend.
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t*, const void*, void**) {
    return set_last_error(cudaErrorNotSupported);
}

}  // extern "C"

namespace simt {
void set_device_memory(size_t bytes) { device_memory_setting() = bytes; }
size_t get_device_memory() { return device_memory_setting(); }
}  // namespace simt
