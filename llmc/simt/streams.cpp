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
//
// Stream capture and graphs (CUDA graphs): between cudaStreamBeginCapture and cudaStreamEndCapture
// the work issued to a capturing stream is recorded, not run; streams that wait on an event
// recorded in the capture join it (a fork), and must be joined back into the origin stream before
// the capture ends. cudaGraphLaunch replays the recorded operations, in the order they were issued
// (an order every dependency of the capture allows), as one operation of the launch stream: queued
// like any other with SIMT_STREAMS=adversarial, so a copy from pinned memory reads the buffer when
// the replay reaches it. What CUDA forbids during a capture is refused with its error code and
// invalidates the capture, so that cudaStreamEndCapture returns cudaErrorStreamCaptureInvalidated:
// synchronizing the capturing stream or the device, a copy with pageable host memory, work on the
// legacy stream while a blocking stream captures, a wait on an event recorded outside the capture,
// and (unless the capture is cudaStreamCaptureModeRelaxed) allocating or freeing memory.
#include "internal.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace simt {
namespace {

using Clock = std::chrono::steady_clock;
using Op = std::function<void()>;
struct Queue;

// A capture sequence: what the streams taking part issued, in issue order.
struct Capture {
    std::shared_ptr<Queue> origin;  // where it began and must end
    cudaStreamCaptureMode mode;
    std::thread::id thread;  // that began it (cudaStreamCaptureModeThreadLocal, and ending it)
    bool active = true;      // false once ended
    bool invalidated = false;
    std::vector<Op> ops;
    std::vector<std::shared_ptr<Queue>> members;  // the origin, then the streams forked from it
};

// For each stream of a capture, how much of its captured work (counted in operations) a point of
// the capture depends on: what an event recorded there carries to the streams that wait on it.
using Reach = std::map<const Queue*, uint64_t>;

// One stream's queue. Operation k (1-based, in issue order) has run once completed >= k.
struct Queue {
    bool blocking = true;  // synchronizes with the legacy default stream (cudaStreamNonBlocking: false)
    bool legacy = false;
    std::deque<Op> pending;
    uint64_t issued = 0, completed = 0;
    bool running = false;  // an operation of this queue is executing
    // While it takes part in a capture: the capture, the operations it added to it, and what of the
    // other streams' captured work it waited for.
    std::shared_ptr<Capture> capture;
    uint64_t captured = 0;
    Reach reach;
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
    std::set<std::shared_ptr<Capture>> captures;  // the active ones
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
    std::shared_ptr<simt::Queue> queue;  // where it was last recorded (null: never, or in a capture)
    uint64_t seq = 0;                    // the record's position in that queue
    std::shared_ptr<simt::Clock::time_point> when = std::make_shared<simt::Clock::time_point>();
    std::shared_ptr<simt::Capture> capture;  // the capture it was last recorded in (null: none)
    simt::Reach reach;                       // the captured work that record follows
};
// A graph and its executable form: the captured operations, shared (a graph may be destroyed once
// instantiated, as in CUDA).
struct CUgraph_st {
    std::shared_ptr<const std::vector<simt::Op>> ops;
};
struct CUgraphExec_st {
    std::shared_ptr<const std::vector<simt::Op>> ops;
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
        Op op = std::move(q->pending.front());
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
void push(const std::shared_ptr<Queue>& q, Op op) {
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

// Marks c invalidated: its streams keep capturing (their work is refused) until it ends.
void invalidate(const std::shared_ptr<Capture>& c) { c->invalidated = true; }

// The active capture of a blocking stream, which work on the legacy stream would depend on
// implicitly (null: none).
std::shared_ptr<Capture> blocking_capture() {
    for (const auto& q : streams().all)
        if (q->blocking && q->capture) return q->capture;
    return nullptr;
}

std::atomic<uint64_t> g_host_ops{0};

}  // namespace

bool streams_deferred() { return g_adversarial; }

cudaError_t issue(cudaStream_t stream, Op op) {
    std::lock_guard<std::recursive_mutex> lk(streams().mu);
    g_host_ops++;
    std::shared_ptr<Queue> q = queue_of(stream);
    if (q->capture) {
        if (q->capture->invalidated) return cudaErrorStreamCaptureInvalidated;
        q->capture->ops.push_back(std::move(op));
        q->captured++;
        return cudaSuccess;
    }
    if (q->legacy) {  // would wait for the blocking streams, one of which is capturing
        if (std::shared_ptr<Capture> c = blocking_capture()) {
            invalidate(c);
            return cudaErrorStreamCaptureImplicit;
        }
    }
    push(q, std::move(op));
    if (!g_adversarial) run_all(q);
    return cudaSuccess;
}

bool stream_capturing(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lk(streams().mu);
    std::shared_ptr<Queue> q = queue_of(stream);
    return q->capture != nullptr || (q->legacy && blocking_capture() != nullptr);
}

cudaError_t unsafe_during_capture() {
    std::lock_guard<std::recursive_mutex> lk(streams().mu);
    cudaError_t err = cudaSuccess;
    for (const auto& c : streams().captures) {
        bool forbids = c->mode == cudaStreamCaptureModeGlobal ||
                       (c->mode == cudaStreamCaptureModeThreadLocal && c->thread == std::this_thread::get_id());
        if (forbids) {
            invalidate(c);
            err = cudaErrorStreamCaptureUnsupported;
        }
    }
    return err;
}

uint64_t host_stream_op_count() { return g_host_ops.load(); }
void note_host_op() { g_host_ops++; }

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
    if (stream->queue->capture) {
        simt::invalidate(stream->queue->capture);
        return set_last_error(cudaErrorStreamCaptureUnsupported);
    }
    simt::run_all(stream->queue);
    simt::streams().all.erase(stream->queue);
    delete stream;
    return cudaSuccess;
}
namespace {
// Waiting for q is refused while it captures (its work has not been issued to run), and for the
// legacy stream while a blocking stream captures (the legacy stream would wait for it).
cudaError_t refuse_capturing(const std::shared_ptr<simt::Queue>& q) {
    std::shared_ptr<simt::Capture> c = q->capture ? q->capture : q->legacy ? simt::blocking_capture() : nullptr;
    if (!c) return cudaSuccess;
    simt::invalidate(c);
    return set_last_error(q->capture ? cudaErrorStreamCaptureUnsupported : cudaErrorStreamCaptureImplicit);
}
}  // namespace

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    {
        std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
        if (cudaError_t err = refuse_capturing(simt::queue_of(stream))) return err;
    }
    simt::note_host_sync();
    simt::synchronize_stream(stream);
    return cudaSuccess;
}
// Work still queued: "not ready" — and it runs, so that a loop polling for completion ends.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    auto q = simt::queue_of(stream);
    if (cudaError_t err = refuse_capturing(q)) return err;
    if (q->completed == q->issued) return cudaSuccess;
    simt::run_all(q);
    return cudaErrorNotReady;
}
// An event recorded in a capture makes the waiting stream join that capture (a fork, or a join back
// into a stream already in it); a capturing stream may wait only on events of its own capture.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    {
        std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
        std::shared_ptr<simt::Queue> q = simt::queue_of(stream);
        if (event->capture) {
            std::shared_ptr<simt::Capture> c = event->capture;
            if (!c->active) return set_last_error(cudaErrorStreamCaptureIsolation);  // that capture has ended
            if (q->legacy) {
                simt::invalidate(c);
                return set_last_error(cudaErrorStreamCaptureImplicit);
            }
            if (q->capture && q->capture != c) {
                simt::invalidate(c);
                simt::invalidate(q->capture);
                return set_last_error(cudaErrorStreamCaptureMerge);
            }
            if (!q->capture) {  // a fork: q captures into c from here on
                q->capture = c;
                q->captured = 0;
                q->reach.clear();
                c->members.push_back(q);
            }
            for (const auto& [member, ops] : event->reach) q->reach[member] = std::max(q->reach[member], ops);
            return c->invalidated ? set_last_error(cudaErrorStreamCaptureInvalidated) : cudaSuccess;
        }
        if (q->capture && event->queue) {  // a dependency on work outside the capture
            simt::invalidate(q->capture);
            return set_last_error(cudaErrorStreamCaptureIsolation);
        }
    }
    if (!event->queue) return cudaSuccess;  // never recorded: nothing to wait for
    std::shared_ptr<simt::Queue> other = event->queue;
    uint64_t seq = event->seq;
    simt::issue(stream, [other, seq] { simt::run_until(other, seq); });
    return cudaSuccess;
}

// Refused during any capture: it would wait for the capturing streams.
cudaError_t cudaDeviceSynchronize(void) {
    {
        std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
        if (!simt::streams().captures.empty()) {
            for (const auto& c : simt::streams().captures) simt::invalidate(c);
            return set_last_error(cudaErrorStreamCaptureUnsupported);
        }
    }
    simt::note_host_sync();
    simt::synchronize_device();
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// Stream capture and graphs

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return set_last_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    std::shared_ptr<simt::Queue> q = simt::queue_of(stream);
    if (q->legacy) return set_last_error(cudaErrorStreamCaptureUnsupported);  // "may not be initiated"
    if (q->capture) return set_last_error(cudaErrorIllegalState);
    auto c = std::make_shared<simt::Capture>();
    c->origin = q;
    c->mode = mode;
    c->thread = std::this_thread::get_id();
    c->members.push_back(q);
    q->capture = c;
    q->captured = 0;
    q->reach.clear();
    simt::streams().captures.insert(c);
    return cudaSuccess;
}

// Ends the capture begun on stream: every stream that joined it leaves it. The graph is returned
// unless the capture was invalidated or a forked stream's last work was not joined back into the
// origin stream (cudaErrorStreamCaptureUnjoined); then *graph is null.
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (!graph) return set_last_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    std::shared_ptr<simt::Queue> q = simt::queue_of(stream);
    std::shared_ptr<simt::Capture> c = q->capture;
    if (!c) return set_last_error(cudaErrorIllegalState);
    if (c->origin != q) return set_last_error(cudaErrorStreamCaptureUnmatched);
    if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
        return set_last_error(cudaErrorStreamCaptureWrongThread);
    bool joined = true;
    for (const auto& m : c->members)
        if (m != q && (!q->reach.count(m.get()) || q->reach.at(m.get()) < m->captured)) joined = false;
    for (const auto& m : c->members) {
        m->capture = nullptr;
        m->captured = 0;
        m->reach.clear();
    }
    c->active = false;
    c->members.clear();
    simt::streams().captures.erase(c);
    *graph = nullptr;
    if (c->invalidated) return set_last_error(cudaErrorStreamCaptureInvalidated);
    if (!joined) return set_last_error(cudaErrorStreamCaptureUnjoined);
    *graph = new CUgraph_st{std::make_shared<const std::vector<simt::Op>>(std::move(c->ops))};
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    if (!status) return set_last_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    std::shared_ptr<simt::Queue> q = simt::queue_of(stream);
    if (q->legacy && simt::blocking_capture()) return set_last_error(cudaErrorStreamCaptureImplicit);
    *status = !q->capture ? cudaStreamCaptureStatusNone
              : q->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                        : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

// No instantiation flags are supported (upload, auto-free, device launch, priorities).
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
    if (!exec || !graph || flags != 0) return set_last_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{graph->ops};
    return cudaSuccess;
}

// The graph's operations run in capture order as one operation of `stream`, with the arguments
// they were captured with (kernel parameters by value; pointers as they were).
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return set_last_error(cudaErrorInvalidValue);
    std::shared_ptr<const std::vector<simt::Op>> ops = exec->ops;
    return set_last_error(simt::issue(stream, [ops] {
        for (const simt::Op& op : *ops) op();
    }));
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;  // a launch still queued holds the operations
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
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
// In a capture it adds no operation (as in CUDA): it marks the point of the capture that streams
// waiting on the event will follow.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    std::shared_ptr<simt::Queue> q = simt::queue_of(stream);
    if (q->capture) {
        if (q->capture->invalidated) return set_last_error(cudaErrorStreamCaptureInvalidated);
        event->capture = q->capture;
        event->reach = q->reach;
        event->reach[q.get()] = q->captured;
        event->queue = nullptr;
        event->seq = 0;
        return cudaSuccess;
    }
    if (cudaError_t err = refuse_capturing(q)) return err;
    event->capture = nullptr;
    event->reach.clear();
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
    if (event->capture) return set_last_error(cudaErrorCapturedEvent);
    if (event->queue && event->queue->completed < event->seq) simt::note_host_sync();  // a wait, not a check
    if (event->queue) simt::run_until(event->queue, event->seq);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (!event) return set_last_error(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
    if (event->capture) return set_last_error(cudaErrorCapturedEvent);
    if (!event->queue || event->queue->completed >= event->seq) return cudaSuccess;
    simt::run_until(event->queue, event->seq);
    return cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end) return set_last_error(cudaErrorInvalidResourceHandle);
    if (start->capture || end->capture) return set_last_error(cudaErrorCapturedEvent);
    if (!start->queue || !end->queue) return set_last_error(cudaErrorInvalidResourceHandle);
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
    if ((d == Mem::Pageable || s == Mem::Pageable) && simt::stream_capturing(stream)) {
        // A graph cannot replay a copy with pageable memory (CUDA stages it synchronously).
        std::lock_guard<std::recursive_mutex> lk(simt::streams().mu);
        return refuse_capturing(simt::queue_of(stream));
    }
    if (d == Mem::Pageable || s == Mem::Pageable) simt::note_host_sync();
    if (d == Mem::Pageable && s == Mem::Pageable) {  // host to host: synchronous
        memmove(dst, src, count);
    } else if (s == Mem::Pageable) {
        // Staged now, written when the stream gets there: the caller may reuse src at once.
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + count);
        return set_last_error(simt::issue(stream, [dst, staged] { memcpy(dst, staged->data(), staged->size()); }));
    } else if (d == Mem::Pageable) {
        // Returns only once the copy is done.
        if (cudaError_t err = simt::issue(stream, [dst, src, count] { memmove(dst, src, count); }))
            return set_last_error(err);
        simt::synchronize_stream(stream);
    } else {
        return set_last_error(simt::issue(stream, [dst, src, count] { memmove(dst, src, count); }));
    }
    return cudaSuccess;
}

// On the legacy stream; waits for it (and so for the blocking streams) unless device to device.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
    if (!count) return cudaSuccess;
    if (!dst || !src) return set_last_error(cudaErrorInvalidValue);
    bool host = !(simt::is_device_memory(dst) && simt::is_device_memory(src));
    if (host)
        if (cudaError_t err = simt::unsafe_during_capture()) return set_last_error(err);
    bool counted = memory_kind(dst) == Mem::Pageable || memory_kind(src) == Mem::Pageable;  // by the async copy
    if (host && !counted) simt::note_host_sync();
    cudaError_t err = cudaMemcpyAsync(dst, src, count, kind, nullptr);
    if (err == cudaSuccess && host) simt::synchronize_stream(nullptr);
    return err;
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind) {
    if (width > dpitch || width > spitch) return set_last_error(cudaErrorInvalidValue);
    if (cudaError_t err = simt::unsafe_during_capture()) return set_last_error(err);
    simt::note_host_sync();
    simt::synchronize_stream(nullptr);
    for (size_t r = 0; r < height; r++)
        memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
    if (!count) return cudaSuccess;
    if (!ptr) return set_last_error(cudaErrorInvalidValue);
    return set_last_error(simt::issue(stream, [ptr, value, count] { memset(ptr, value, count); }));
}
// Asynchronous with respect to the host on device memory, like any legacy-stream work.
cudaError_t cudaMemset(void* ptr, int value, size_t count) { return cudaMemsetAsync(ptr, value, count, nullptr); }

}  // extern "C"
