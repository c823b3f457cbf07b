// llmc/simt/streams.cpp — streams, events, copies and memsets on the CPU backend: run when issued
// (the default), or with SIMT_STREAMS=adversarial as late as the CUDA ordering rules allow.
//
// A GPU runs a stream's work after the call that issued it has returned, concurrently with the host
// and with other streams; only the program orders it: the order within one stream, events a stream
// waits on, the legacy default stream's implicit synchronization, and synchronizing calls. Running
// every operation when it is issued (the default here) hides the bugs that breaks: a missing
// cudaStreamWaitEvent, a pinned host buffer refilled before the async copy that reads it ran, a
// host read of memory an async copy has not written yet.
//
// SIMT_STREAMS=adversarial queues every operation on its stream and runs nothing until something
// forces it: a synchronizing call (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize,
// a copy to pageable host memory, cudaFree), or a queued cudaStreamWaitEvent reached while forcing
// another stream. Forcing runs only what the forced work depends on, in issue order per stream, so
// work runs in the latest order the dependencies allow: a consumer whose stream does not wait for
// its producer reads what was there before, and a copy from pinned memory reads the buffer when the
// stream reaches it. The order is deterministic, so such a bug shows up on every run.
//
// Copy semantics follow the CUDA Runtime API's "API synchronization behavior" section: an async
// copy from pageable host memory is staged when issued (the caller may reuse its buffer at once);
// an async copy to pageable memory returns only when done; synchronous copies involving host memory
// wait for the legacy default stream (and so for the blocking streams); device-to-device cudaMemcpy
// and cudaMemset on device memory do not wait.
#include "internal.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace simt {
namespace {

using Clock = std::chrono::steady_clock;

// One stream's queue. Operation k (1-based, in issue order) has run once completed >= k.
struct Queue {
    bool blocking = true;  // synchronizes with the legacy default stream (cudaStreamNonBlocking: false)
    bool legacy = false;
    std::deque<std::function<void()>> pending;
    uint64_t issued = 0, completed = 0;
    bool running = false;  // an operation of this queue is executing
};

struct Streams {
    // One lock for every queue, held while operations run: one operation runs at a time (a forced
    // stream may force others through its waits, so the lock is recursive).
    std::recursive_mutex mu;
    std::shared_ptr<Queue> legacy = [] {
        auto q = std::make_shared<Queue>();
        q->legacy = true;
        return q;
    }();
    std::set<std::shared_ptr<Queue>> all{legacy};
};
Streams& streams() {
    static Streams* s = new Streams();  // outlives static destruction (late frees sync the device)
    return *s;
}

bool read_adversarial() {
    const char* e = getenv("SIMT_STREAMS");
    std::string v = e ? e : "";
    if (v.empty() || v == "inorder") return false;
    if (v == "adversarial") return true;
    fprintf(stderr, "simt: SIMT_STREAMS='%s' is not a stream mode (accepted: inorder, adversarial)\n", e);
    exit(EXIT_FAILURE);
}
// Read at start-up, so that a misspelt SIMT_STREAMS stops every program.
bool g_adversarial = read_adversarial();

}  // namespace
}  // namespace simt

// The CUDA stream handle: a queue shared with the events recorded on it and the waits that name it,
// so destroying the handle leaves them valid.
struct CUstream_st {
    std::shared_ptr<simt::Queue> queue;
};
struct CUevent_st {
    std::shared_ptr<simt::Queue> queue;  // where it was last recorded (null: never)
    uint64_t seq = 0;                    // the record's position in that queue
    std::shared_ptr<simt::Clock::time_point> when = std::make_shared<simt::Clock::time_point>();
};

namespace simt {
namespace {

std::shared_ptr<Queue> queue_of(cudaStream_t stream) {
    // 0, cudaStreamLegacy and cudaStreamPerThread (one host thread uses it here) are the legacy stream.
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return streams().legacy;
    return stream->queue;
}

// Runs q's operations up to and including the seq-th (caller holds the lock).
void run_until(const std::shared_ptr<Queue>& q, uint64_t seq) {
    while (q->completed < seq) {
        if (q->running) {
            fprintf(stderr, "simt: streams wait on each other in a cycle (cudaStreamWaitEvent)\n");
            exit(EXIT_FAILURE);
        }
        std::function<void()> op = std::move(q->pending.front());
        q->pending.pop_front();
        q->running = true;
        op();
        q->running = false;
        q->completed++;
    }
}

void run_all(const std::shared_ptr<Queue>& q) { run_until(q, q->issued); }

// Appends op to q; the legacy stream's implicit synchronization comes first: work issued to it
// waits for everything issued before on the blocking streams, and work issued to a blocking stream
// waits for everything issued before on the legacy stream.
void push(const std::shared_ptr<Queue>& q, std::function<void()> op) {
    Streams& s = streams();
    auto wait_for = [&](const std::shared_ptr<Queue>& other) {
        if (other->issued == other->completed) return;
        uint64_t seq = other->issued;
        q->pending.push_back([other, seq] { run_until(other, seq); });
        q->issued++;
    };
    if (q->legacy) {
        for (const auto& other : s.all)
            if (other != q && other->blocking) wait_for(other);
    } else if (q->blocking) {
        wait_for(s.legacy);
    }
    q->pending.push_back(std::move(op));
    q->issued++;
}

}  // namespace

bool streams_deferred() { return g_adversarial; }

void issue(cudaStream_t stream, std::function<void()> op) {
    std::lock_guard<std::recursive_mutex> lk(streams().mu);
    std::shared_ptr<Queue> q = queue_of(stream);
    push(q, std::move(op));
    if (!g_adversarial) run_all(q);
}

void synchronize_stream(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lk(streams().mu);
    run_all(queue_of(stream));
}

void synchronize_device() {
    std::lock_guard<std::recursive_mutex> lk(streams().mu);
    for (const auto& q : streams().all) run_all(q);
}

namespace {
std::atomic<uint64_t> g_host_syncs{0};
}
uint64_t host_sync_count() { return g_host_syncs.load(); }
void note_host_sync() { g_host_syncs++; }

}  // namespace simt

using simt::set_last_error;

extern "C" {

// ----------------------------------------------------------------------------
// Streams

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    auto q = std::make_shared<simt::Queue>();
    q->blocking = !(flags & cudaStreamNonBlocking);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    simt::streams().all.insert(q);
    *stream = new CUstream_st{q};
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int) {
    return cudaStreamCreateWithFlags(stream, flags);
}
// A GPU finishes a destroyed stream's work later; here it runs now, so nothing is left behind.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    simt::run_all(stream->queue);
    simt::streams().all.erase(stream->queue);
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    simt::note_host_sync();
    simt::synchronize_stream(stream);
    return cudaSuccess;
}
// Work still queued: "not ready" — and it runs, so that a loop polling for completion ends.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    auto q = simt::queue_of(stream);
    if (q->completed == q->issued) return cudaSuccess;
    simt::run_all(q);
    return cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    if (!event->queue) return cudaSuccess;  // never recorded: nothing to wait for
    std::shared_ptr<simt::Queue> other = event->queue;
    uint64_t seq = event->seq;
    simt::issue(stream, [other, seq] { simt::run_until(other, seq); });
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    simt::note_host_sync();
    simt::synchronize_device();
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Events: a record is an operation on its stream that notes the host time when it runs.

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    *event = new CUevent_st();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    std::shared_ptr<simt::Queue> q = simt::queue_of(stream);
    auto when = std::make_shared<simt::Clock::time_point>();
    event->when = when;
    event->queue = q;
    simt::issue(stream, [when] { *when = simt::Clock::now(); });
    event->seq = q->issued;  // after issue: the legacy stream's implicit waits come before the record
    return cudaSuccess;
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int) {
    return cudaEventRecord(event, stream);
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    if (event->queue && event->queue->completed < event->seq) simt::note_host_sync();  // a wait, not a check
    if (event->queue) simt::run_until(event->queue, event->seq);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    if (!event->queue || event->queue->completed >= event->seq) return cudaSuccess;
    simt::run_until(event->queue, event->seq);
    return cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end || !start->queue || !end->queue) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    if (start->queue->completed < start->seq || end->queue->completed < end->seq)
        return set_last_error(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(*end->when - *start->when).count();
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Copies and memsets

namespace {
// What a pointer is: device memory, pinned host memory, or pageable host memory (anything else).
enum class Mem { Device, Pinned, Pageable };
Mem memory_kind(const void* p) {
    if (simt::is_device_memory(p)) return Mem::Device;
    return simt::is_pinned_memory(p) ? Mem::Pinned : Mem::Pageable;
}
}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind, cudaStream_t stream) {
    if (!count) return cudaSuccess;
    if (!dst || !src) return set_last_error(cudaErrorInvalidValue);
    Mem d = memory_kind(dst), s = memory_kind(src);
    if (d == Mem::Pageable || s == Mem::Pageable) simt::note_host_sync();
    if (d == Mem::Pageable && s == Mem::Pageable) {  // host to host: synchronous
        memmove(dst, src, count);
    } else if (s == Mem::Pageable) {
        // Staged now, written when the stream gets there: the caller may reuse src at once.
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + count);
        simt::issue(stream, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
    } else if (d == Mem::Pageable) {
        // Returns only once the copy is done.
        simt::issue(stream, [dst, src, count] { memmove(dst, src, count); });
        simt::synchronize_stream(stream);
    } else {
        simt::issue(stream, [dst, src, count] { memmove(dst, src, count); });
    }
    return cudaSuccess;
}

// On the legacy stream; waits for it (and so for the blocking streams) unless device to device.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    if (!count) return cudaSuccess;
    if (!dst || !src) return set_last_error(cudaErrorInvalidValue);
    bool host = !(simt::is_device_memory(dst) && simt::is_device_memory(src));
    bool counted = memory_kind(dst) == Mem::Pageable || memory_kind(src) == Mem::Pageable;  // by the async copy
    if (host && !counted) simt::note_host_sync();
    cudaError_t err = cudaMemcpyAsync(dst, src, count, kind, nullptr);
    if (err == cudaSuccess && host) simt::synchronize_stream(nullptr);
    return err;
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind) {
    if (width > dpitch || width > spitch) return set_last_error(cudaErrorInvalidValue);
    simt::note_host_sync();
    simt::synchronize_stream(nullptr);
    for (size_t r = 0; r < height; r++)
        memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
    if (!count) return cudaSuccess;
    if (!ptr) return set_last_error(cudaErrorInvalidValue);
    simt::issue(stream, [ptr, value, count] { memset(ptr, value, count); });
    return cudaSuccess;
}
// Asynchronous with respect to the host on device memory, like any legacy-stream work.
cudaError_t cudaMemset(void* ptr, int value, size_t count) { return cudaMemsetAsync(ptr, value, count, nullptr); }

}  // extern "C"
