// llmc/simt/internal.h — what the CPU backend's runtime and scheduler share, not seen by kernels.
#pragma once
#include <cuda_runtime.h>

#include <functional>

namespace simt {

// Limits every profile of the virtual device shares (documented in README, "The CPU backend"). A
// small SM count, whatever the GPU: grids sized by it stay cheap on a CPU.
constexpr int kSmCount = 8;
constexpr int kMaxThreadsPerBlock = 1024;
constexpr size_t kDefaultSmemPerBlock = 48 * 1024;  // usable without opting in, as on GPUs

// The GPU whose limits the virtual device presents, chosen by SIMT_DEVICE (default h100): what
// cudaGetDeviceProperties reports and what cudaFuncSetAttribute and launches enforce, so that a
// kernel asking for more than, say, an L4 has fails here as it would there.
struct DeviceProfile {
    const char* key;  // the SIMT_DEVICE value
    int major, minor;  // compute capability
    int max_threads_per_sm;
    int max_blocks_per_sm;
    size_t smem_per_block_optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
    size_t smem_per_sm;
    size_t memory;  // global memory (capped by the host's, unless SIMT_DEVICE_MEMORY is set)
};
const DeviceProfile& device_profile();

// The integer environment variable `name` (unset or empty: `fallback`); any other value that is not
// an integer in [lo, hi] stops the program with one line naming it, as a typo would otherwise run
// with a setting nobody asked for.
long env_int(const char* name, long fallback, long lo, long hi);

// The dynamic shared memory limit a kernel opted in to with cudaFuncSetAttribute (default 48 KiB).
size_t max_dynamic_smem(const void* kernel);

// Records err as the calling thread's last error (cudaGetLastError returns and clears it).
cudaError_t set_last_error(cudaError_t err);

// Whether p points into a cudaMalloc'd (device) or cudaMallocHost'd (pinned) allocation.
bool is_device_memory(const void* p);
bool is_pinned_memory(const void* p);

// Streams (streams.cpp). issue() runs op on stream: at once, or with SIMT_STREAMS=adversarial
// (streams_deferred()) when something forces the stream; ops issued from ops run at once. While the
// stream captures, op is recorded into the capture instead; the error is CUDA's for work a capture
// refuses (and then op never runs). stream_capturing(): whether issue() would record or refuse work
// for stream (it captures, or it is the legacy stream while a blocking stream captures).
bool streams_deferred();
cudaError_t issue(cudaStream_t stream, std::function<void()> op);
// Counts an operation the host issued and ran at once without issue() (host_stream_op_count).
void note_host_op();
bool stream_capturing(cudaStream_t stream);
void synchronize_device();
// For the calls CUDA calls unsafe during a capture (allocating, freeing, synchronous copies with host
// memory): cudaErrorStreamCaptureUnsupported, invalidating the captures that forbid them (mode
// global, or thread-local begun by the calling thread), or cudaSuccess.
cudaError_t unsafe_during_capture();

// Demangled name of a kernel from its address, for messages ("kernel at 0x..." if unknown).
const char* kernel_name(const void* kernel, char* buf, size_t len);

}  // namespace simt
