// llmc/simt/scheduler.cpp — the SIMT engine: runs each CUDA thread of a block as a fiber, resolves
// barriers and warp collectives, permutes schedules, reports faults instead of hanging, and records
// which kernels ran (SIMT_COVERAGE_DIR).
//
// The model. A worker (an OS thread) runs one block at a time. Every CUDA thread of the block is
// a fiber on its own guarded stack (Boost.Context's fcontext: a context switch is a few dozen
// instructions, no system call). The worker runs the block in *phases*: it resumes every runnable
// thread once, in the chosen order, and each runs until it reaches a sync point (__syncthreads, a
// warp collective) or returns. When all threads are blocked the worker resolves what can be
// resolved — a warp collective whose lanes have all arrived, then a barrier every non-exited
// thread has reached — and starts the next phase. If nothing can be resolved, the block is
// deadlocked and the run stops with a message naming the kernel, block and thread.
//
// Between two sync points the threads of a block run one after another, in forward, reverse or
// seeded-random order (SIMT_ORDER). A kernel that forgot a __syncthreads gives different results
// under different orders, which is how the tests catch it.
#include "internal.h"

#include <boost/context/detail/fcontext.hpp>
#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#else
#define SIMT_ASAN 0
#endif

namespace fc = boost::context::detail;

namespace simt {

long env_int(const char* name, long fallback, long lo, long hi) {
    const char* e = getenv(name);
    if (!e || !*e) return fallback;
    char* end = nullptr;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (*end || errno || v < lo || v > hi) {
        fprintf(stderr, "simt: %s='%s' is not an integer in [%ld, %ld]\n", name, e, lo, hi);
        exit(EXIT_FAILURE);
    }
    return v;
}

namespace {

// ----------------------------------------------------------------------------
// Threads (fibers) and workers

enum class State : uint8_t { Runnable, AtBarrier, AtWarp, Exited };

constexpr int kFaultExit = 3;  // exit status of a run stopped by a fault

struct Fiber;

// A cp.async copy issued and not yet performed: 16 bytes to dst, the first src_bytes from src and
// zeros after them, in commit group `group` (the number of cp_async_commit calls its thread had
// made when it issued it).
struct AsyncCopy {
    void* dst;
    const void* src;
    int src_bytes;
    uint64_t group;
};

// A wgmma.mma_async issued and not yet completed: what computes its result into the issuing
// thread's accumulators (llmc/simt/include/wgmma_simt.h), in commit group `group`.
struct AsyncMma {
    std::function<void()> complete;
    uint64_t group;
};

// A warpgroup's k-th wgmma.mma_async as the first of its warps to issue it passed it (its operands,
// shape and flags, wgmma_simt.h's key), and which of the four warps have issued their k-th since.
struct WarpgroupMma {
    uint64_t key[3];
    unsigned warps = 0;  // bit w % 4 for warp w
    int first_warp = 0;
    const char* file = nullptr;
    int line = 0;
};

// One CUDA thread of the running block: who it is and what it waits at.
struct Thread {
    State state = State::Exited;
    int index = 0;   // linear index in the block (lane = index % 32)
    uint3 tid{};
    Fiber* fiber = nullptr;  // the fiber running it; null until it starts and after it exits
    // What it waits at (valid in AtBarrier / AtWarp).
    int op = 0;        // BarrierOp or WarpOp
    unsigned mask = 0; // warp collectives: the lanes named
    int arg = 0;       // shuffle source lane / delta / xor mask
    int width = 32;
    uint64_t value = 0;   // this lane's contribution (or the barrier predicate)
    uint64_t result = 0;  // what the collective returns to this lane
    const char* file = nullptr;
    int line = 0;
    // cp.async (see "cp.async" below): the copies it has issued and not yet performed, oldest
    // first, and how many groups it has committed.
    std::vector<AsyncCopy> async_copies;
    uint64_t async_groups = 0;
    // wgmma (see "wgmma" below): the warpgroup MMAs it has issued and not yet completed, oldest
    // first, how many groups it has committed, and whether a wgmma.fence came since its last wait.
    std::vector<AsyncMma> async_mmas;
    uint64_t mma_groups = 0;
    bool mma_fenced = false;
};

// An execution context: a guarded stack and the suspended state on it. A thread gets a fiber
// when it starts and gives it back when it exits; a kernel without sync points therefore runs
// all its threads one after another on a single fiber, without any context switch.
struct Fiber {
    fc::fcontext_t ctx = nullptr;  // where to resume it
    Thread* thread = nullptr;      // the thread it runs (null: free, or the scheduler)
    // Stack: [map, map + kGuard) is a PROT_NONE guard area, the stack grows down towards it.
    char* map = nullptr;
    size_t map_size = 0;
#if SIMT_ASAN
    void* fake_stack = nullptr;
    const void* stack_bottom = nullptr;  // the usable stack, for ASan's switch annotations
    size_t stack_size = 0;
#endif
};

constexpr size_t kGuard = 64 * 1024;  // large enough that a big local array cannot jump over it

size_t stack_size() {
    static size_t sz = (size_t)env_int("SIMT_STACK_KB", 256, 64, 1 << 20) * 1024;
    return sz;
}

struct Worker {
    std::vector<Thread> threads;      // the block's threads (capacity reserved: stable addresses)
    std::vector<Fiber> fibers;        // fiber pool (capacity reserved: stable addresses)
    std::vector<Fiber*> free_fibers;  // fibers not running a thread
    Fiber sched;                      // the worker's own (scheduler) context
    Thread* current = nullptr;        // the running CUDA thread, null in the scheduler
    int current_index = 0;
    Order order_kind = Order::Forward;             // this launch's schedule order
    int warp_base = 0, warp_lanes = 0;             // the warp being run: first thread, lane count
    int phase_pos = 0;                             // next position in this phase's lane order
    const LaunchBody* body = nullptr;
    int nthreads = 0;
    int n_exited = 0, n_at_barrier = 0;
    unsigned warp_waiting[32] = {};  // per warp of the block: lanes waiting at a warp collective
    int lane_order[32];          // lane permutation of the current phase (Order::Random)
    std::vector<int> warp_order; // warp permutation of the current barrier interval
    uint64_t rng = 0;            // for Order::Random
    void* dyn_smem = nullptr;    // this launch's dynamic shared memory, exactly sized
    size_t dyn_smem_size = 0;
    // wgmma (see "wgmma" below): the dynamic shared memory as wgmma reads it (through the async
    // proxy; set up at the block's first wgmma), whether a fence.proxy.async came since that copy
    // was last brought up to date, each warp's count of wgmma.mma_async, and the warpgroup MMAs
    // some but not yet all warps of their warpgroup issued, by (warpgroup, k).
    std::vector<char> async_view;
    bool view_ready = false, proxy_fenced = false;
    std::vector<uint64_t> warp_wgmmas;
    std::map<std::pair<int, uint64_t>, WarpgroupMma> warpgroup_mmas;
    std::vector<char> altstack;  // signal stack, so a stack overflow can still be reported
};

thread_local Worker* tw = nullptr;  // the worker running on this OS thread

// ----------------------------------------------------------------------------
// Fault reporting

const char* warp_op_name(int op) {
    static const char* names[] = {"__syncwarp",       "__shfl_sync",       "__shfl_up_sync",
                                  "__shfl_down_sync", "__shfl_xor_sync",   "__ballot_sync",
                                  "__any_sync",       "__all_sync",        "__reduce_add_sync",
                                  "__reduce_min_sync", "__reduce_max_sync", "__match_any_sync"};
    return names[op];
}
const char* barrier_op_name(int op) {
    static const char* names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                  "__syncthreads_or"};
    return names[op];
}

// Prints "simt: fault in kernel K, block (x,y,z), thread (x,y,z): what" and stops the run.
[[noreturn]] void die(Worker* w, const Thread* t, const std::string& what) {
    char name[512] = "(no kernel running)";
    if (w && w->body) kernel_name(w->body->kernel, name, sizeof(name));
    fflush(stdout);
    if (w && t)
        fprintf(stderr, "simt: fault in kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s\n", name,
                blockIdx.x, blockIdx.y, blockIdx.z, t->tid.x, t->tid.y, t->tid.z, what.c_str());
    else
        fprintf(stderr, "simt: fault in kernel %s, block (%u,%u,%u): %s\n", name, blockIdx.x,
                blockIdx.y, blockIdx.z, what.c_str());
    fflush(stderr);
    _exit(kFaultExit);
}

// "file.cu:line", the file without its directories.
std::string site(const char* file, int line) {
    const char* slash = strrchr(file ? file : "?", '/');
    return std::string(slash ? slash + 1 : (file ? file : "?")) + ":" + std::to_string(line);
}
std::string site(const Thread& t) { return site(t.file, t.line); }
std::string waiting_at(const Thread& t) {
    if (t.state == State::AtBarrier) return std::string(barrier_op_name(t.op)) + " at " + site(t);
    if (t.state == State::AtWarp) {
        char m[16];
        snprintf(m, sizeof(m), "0x%08x", t.mask);
        return std::string(warp_op_name(t.op)) + "(mask " + m + ") at " + site(t);
    }
    return t.state == State::Exited ? "exited" : "running";
}
std::string thread_str(const Thread& t) {
    return "thread (" + std::to_string(t.tid.x) + "," + std::to_string(t.tid.y) + "," +
           std::to_string(t.tid.z) + ")";
}

// A SIGSEGV on a fiber's guard page is a stack overflow: say which thread overflowed. Any other
// SIGSEGV goes back to the handler that was installed before ours (default or ASan's).
struct sigaction g_prev_segv;

void on_segv(int sig, siginfo_t* info, void* uctx) {
    Worker* w = tw;
    char* addr = static_cast<char*>(info->si_addr);
    if (w) {
        for (const Fiber& f : w->fibers) {
            if (addr >= f.map && addr < f.map + kGuard) {
                uint3 tid = f.thread ? f.thread->tid : uint3{0, 0, 0};
                char name[512];
                kernel_name(w->body ? w->body->kernel : nullptr, name, sizeof(name));
                char msg[1024];
                int len = snprintf(msg, sizeof(msg),
                                   "simt: fault in kernel %s, block (%u,%u,%u), thread (%u,%u,%u): "
                                   "fiber stack overflow (stack is %zu KiB; raise SIMT_STACK_KB)\n",
                                   name, blockIdx.x, blockIdx.y, blockIdx.z, tid.x, tid.y, tid.z,
                                   stack_size() / 1024);
                if (write(2, msg, len) < 0) _exit(kFaultExit);
                _exit(kFaultExit);
            }
        }
    }
    sigaction(SIGSEGV, &g_prev_segv, nullptr);
    (void)sig;
    (void)uctx;
}

// Gives this OS thread an alternate signal stack and installs the overflow handler once.
void install_overflow_handler(Worker* w) {
    w->altstack.resize(64 * 1024);
    stack_t ss{};
    ss.ss_sp = w->altstack.data();
    ss.ss_size = w->altstack.size();
    sigaltstack(&ss, nullptr);
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa {};
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_prev_segv);
    });
}

// ----------------------------------------------------------------------------
// Schedule order

struct OrderSetting {
    Order order = Order::Forward;
    uint64_t seed = 0;
    OrderSetting() {
        const char* e = getenv("SIMT_ORDER");
        if (!e || !*e || !strcmp(e, "forward")) return;
        if (!strcmp(e, "reverse")) { order = Order::Reverse; return; }
        if (!strncmp(e, "random", 6)) {
            order = Order::Random;
            seed = e[6] == ':' ? strtoull(e + 7, nullptr, 10) : 1;
            return;
        }
        fprintf(stderr, "simt: SIMT_ORDER=%s is not one of forward, reverse, random[:seed]\n", e);
        exit(2);
    }
};
OrderSetting& order_setting() {
    static OrderSetting s;
    return s;
}

uint64_t next_random(uint64_t& s) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
}

// Fills order[0..n) with 0..n-1 in forward, reverse or (seeded) random order.
void make_order(Worker* w, int* order, int n) {
    for (int i = 0; i < n; i++) order[i] = w->order_kind == Order::Reverse ? n - 1 - i : i;
    if (w->order_kind == Order::Random)
        for (int i = n - 1; i > 0; i--) std::swap(order[i], order[next_random(w->rng) % (i + 1)]);
}

// ----------------------------------------------------------------------------
// Context switches
//
// A thread that blocks switches straight to the next runnable thread of the phase (one jump, not
// two through the scheduler); only the last one of a phase switches back to the scheduler. A
// thread that exits hands its fiber to the next thread if that one has not started yet (no jump
// at all). Every jump passes the fiber it leaves, and whoever resumes stores the suspended
// context there. Switches are annotated for AddressSanitizer, which must know the live stack.

void fiber_main(fc::transfer_t r);

// A free fiber (a fresh guarded stack when the pool has none).
Fiber* take_fiber(Worker* w) {
    if (!w->free_fibers.empty()) {
        Fiber* f = w->free_fibers.back();
        w->free_fibers.pop_back();
        return f;
    }
    if (w->fibers.size() == w->fibers.capacity()) die(w, nullptr, "fiber pool exhausted");
    w->fibers.emplace_back();
    Fiber* f = &w->fibers.back();
    // Stagger the stack tops by a different number of pages *and* cache lines per fiber: stacks
    // of equal size would put every fiber's top at the same page offset modulo the TLB's set
    // count and the same L1 set, so switching among a warp's 32 fibers would thrash both.
    size_t stagger = ((w->fibers.size() - 1) % 32) * (4096 + 128);
    f->map_size = stack_size() + kGuard + 32 * (4096 + 128);
    void* m = mmap(nullptr, f->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die(w, nullptr, "cannot map a fiber stack");
    mprotect(m, kGuard, PROT_NONE);
    f->map = static_cast<char*>(m);
    size_t usable = f->map_size - kGuard - stagger;
    f->ctx = fc::make_fcontext(f->map + kGuard + usable, usable, fiber_main);
#if SIMT_ASAN
    f->stack_bottom = f->map + kGuard;
    f->stack_size = usable;
#endif
    return f;
}

// Makes t the running thread (built-ins and bookkeeping), without switching stacks.
inline __attribute__((always_inline)) void make_current(Worker* w, Thread* t) {
    w->current = t;
    w->current_index = t->index;
    threadIdx = t->tid;
}

// Suspends fiber `from` and resumes `to` (a fiber or the scheduler); returns when `from` is
// resumed. The caller has already made to's thread current.
void switch_fiber(Worker* w, Fiber* from, Fiber* to) {
#if SIMT_ASAN
    __sanitizer_start_switch_fiber(&from->fake_stack, to->stack_bottom, to->stack_size);
#endif
    fc::transfer_t r = fc::jump_fcontext(to->ctx, from);
    Fiber* left = static_cast<Fiber*>(r.data);
    left->ctx = r.fctx;
#if SIMT_ASAN
    const void* bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(from->fake_stack, &bottom, &size);
    if (left == &w->sched) {
        w->sched.stack_bottom = bottom;
        w->sched.stack_size = size;
    }
#endif
}

void make_order(Worker* w, int* order, int n);

// The next runnable lane of the running warp in this phase's order. At the end of the order the
// phase starts over (a collective completed by its last lane makes the others runnable again), so
// null means no lane of the warp can run: all wait at a barrier, have exited, or are stuck.
inline __attribute__((always_inline)) Thread* next_in_phase(Worker* w) {
    int n = w->warp_lanes;
    for (int round = 0; round < 2; round++) {
        while (w->phase_pos < n) {
            int k = w->phase_pos++;
            int l = w->order_kind == Order::Forward ? k : w->order_kind == Order::Reverse ? n - 1 - k : w->lane_order[k];
            Thread* t = &w->threads[w->warp_base + l];
            if (t->state == State::Runnable) return t;
        }
        w->phase_pos = 0;
        if (w->order_kind == Order::Random) make_order(w, w->lane_order, n);
    }
    return nullptr;
}

// Leaves fiber `from` for thread t (starting it on a free fiber if it has none), or for the
// scheduler when t is null.
inline __attribute__((always_inline)) void run_next(Worker* w, Fiber* from, Thread* t) {
    if (!t) {
        w->current = nullptr;
        switch_fiber(w, from, &w->sched);
        return;
    }
    if (!t->fiber) {
        t->fiber = take_fiber(w);
        t->fiber->thread = t;
    }
    make_current(w, t);
    switch_fiber(w, from, t->fiber);
}

// Called by a thread that has just blocked: runs the next thread of the phase.
void block_current(Worker* w, Thread* self) { run_next(w, self->fiber, next_in_phase(w)); }

// Every fiber runs this loop for its whole life: run the kernel body for the thread it was
// given; when that thread exits, start the next thread of the phase right here if it has not
// started yet, else hand control on and wait (free) until a thread is given to it again.
void fiber_main(fc::transfer_t r) {
    Worker* w = tw;
    Fiber* left = static_cast<Fiber*>(r.data);
    left->ctx = r.fctx;
    Fiber* self = w->current->fiber;
#if SIMT_ASAN
    const void* bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(nullptr, &bottom, &size);
    if (left == &w->sched) {
        w->sched.stack_bottom = bottom;
        w->sched.stack_size = size;
    }
#endif
    for (;;) {
        w->body->invoke(w->body->closure);
        Thread* done = self->thread;
        done->state = State::Exited;
        // Copies it never waited for are dropped: on a GPU they land at some unknown time, and no
        // thread can wait for them any more, so whoever reads their destination races with them;
        // here the read sees the old bytes, one outcome that race allows.
        done->async_copies.clear();
        if (!done->async_mmas.empty())
            die(w, done, "exited with " + std::to_string(done->async_mmas.size()) +
                             " wgmma.mma_async never waited for (wgmma_wait): their accumulators are never written");
        done->fiber = nullptr;
        w->n_exited++;
        Thread* next = next_in_phase(w);
        if (next && !next->fiber) {
            next->fiber = self;
            self->thread = next;
            make_current(w, next);
            continue;
        }
        self->thread = nullptr;
        w->free_fibers.push_back(self);  // safe: run_next takes no fiber, next has one or is null
        run_next(w, self, next);
        // Resumed: whoever took this fiber from the free list bound a new thread to it.
    }
}

// ----------------------------------------------------------------------------
// Resolving warp collectives and barriers

// Completes the collective that the lanes of `mask` in warp `base` all wait at: every lane gets
// its result and becomes runnable.
void complete_warp(Worker* w, int base, unsigned mask) {
    Thread* lanes = &w->threads[base];  // every lane named in mask exists (checked before)
    const Thread& first = lanes[__builtin_ctz(mask)];
    WarpOp op = (WarpOp)first.op;
    switch (op) {
        case WarpOp::Sync:
            break;
        case WarpOp::ShflIdx: case WarpOp::ShflUp: case WarpOp::ShflDown: case WarpOp::ShflXor: {
            // The source lane of each lane within its width-sized segment; reading a lane outside
            // the mask is undefined in CUDA: it returns a poison value (all ones: NaN as a float)
            // so that a result that matters shows up wrong.
            for (unsigned m = mask; m; m &= m - 1) {
                int l = __builtin_ctz(m);
                Thread& t = lanes[l];
                int width = t.width, seg = l & ~(width - 1), src = l;
                if (op == WarpOp::ShflIdx) src = seg + (t.arg & (width - 1));
                else if (op == WarpOp::ShflUp) src = (l - seg) >= t.arg ? l - t.arg : l;
                else if (op == WarpOp::ShflDown) src = (l - seg) + t.arg < width ? l + t.arg : l;
                else src = (l ^ t.arg) < seg + width ? (l ^ t.arg) : l;
                t.result = (src >= 0 && src < 32 && (mask >> src & 1)) ? lanes[src].value : ~0ull;
            }
            break;
        }
        case WarpOp::Ballot: case WarpOp::Any: case WarpOp::All: {
            uint64_t ballot = 0;
            for (unsigned m = mask; m; m &= m - 1)
                if (lanes[__builtin_ctz(m)].value) ballot |= 1ull << __builtin_ctz(m);
            uint64_t r = op == WarpOp::Ballot ? ballot : op == WarpOp::Any ? ballot != 0 : ballot == mask;
            for (unsigned m = mask; m; m &= m - 1) lanes[__builtin_ctz(m)].result = r;
            break;
        }
        case WarpOp::ReduceAdd: case WarpOp::ReduceMin: case WarpOp::ReduceMax: {
            uint32_t r = (uint32_t)first.value;
            for (unsigned m = mask & (mask - 1); m; m &= m - 1) {
                uint32_t v = (uint32_t)lanes[__builtin_ctz(m)].value;
                r = op == WarpOp::ReduceAdd ? r + v : op == WarpOp::ReduceMin ? std::min(r, v) : std::max(r, v);
            }
            for (unsigned m = mask; m; m &= m - 1) lanes[__builtin_ctz(m)].result = r;
            break;
        }
        case WarpOp::MatchAny:
            for (unsigned m = mask; m; m &= m - 1) {
                Thread& t = lanes[__builtin_ctz(m)];
                unsigned same = 0;
                for (unsigned k = mask; k; k &= k - 1)
                    if (lanes[__builtin_ctz(k)].value == t.value) same |= 1u << __builtin_ctz(k);
                t.result = same;
            }
            break;
    }
    for (unsigned m = mask; m; m &= m - 1) lanes[__builtin_ctz(m)].state = State::Runnable;
    w->warp_waiting[base / 32] &= ~mask;
}

// Completes every collective of the running warp whose lanes have all arrived; faults on one that
// can never complete because a named lane has exited or waits at a different collective.
bool resolve_warp(Worker* w) {
    if (w->warp_waiting[w->warp_base / 32] == 0) return false;
    bool progress = false;
    int base = w->warp_base, nlanes = w->warp_lanes;
    for (int l = 0; l < nlanes; l++) {
        Thread& t = w->threads[base + l];
        if (t.state != State::AtWarp) continue;
        bool ready = true;
        for (int j = 0; j < 32 && ready; j++) {
            if (!(t.mask >> j & 1)) continue;
            if (j >= nlanes)
                die(w, &t, std::string(warp_op_name(t.op)) + " at " + site(t) + ": mask names lane " +
                               std::to_string(j) + ", which does not exist (block of " +
                               std::to_string(w->nthreads) + " threads)");
            const Thread& u = w->threads[base + j];
            if (u.state == State::Exited)
                die(w, &t, std::string(warp_op_name(t.op)) + " at " + site(t) + ": mask names lane " +
                               std::to_string(j) + ", which has exited");
            if (u.state != State::AtWarp) { ready = false; break; }
            if (u.op != t.op || u.mask != t.mask)
                die(w, &t, "lanes of one warp wait at different collectives: lane " + std::to_string(l) +
                               " at " + waiting_at(t) + ", lane " + std::to_string(j) + " at " + waiting_at(u));
        }
        if (ready) {
            complete_warp(w, base, t.mask);
            progress = true;
        }
    }
    return progress;
}

// True when every lane of mask in warp `base` waits at the same collective with the same mask
// (then it can complete); false when one still waits elsewhere with a disjoint group in mind;
// a lane that names the same lanes but a different collective is a fault.
bool collective_consistent(Worker* w, int base, unsigned mask) {
    const Thread& first = w->threads[base + __builtin_ctz(mask)];
    for (unsigned m = mask; m; m &= m - 1) {
        const Thread& u = w->threads[base + __builtin_ctz(m)];
        if (u.op == first.op && u.mask == first.mask) continue;
        if ((u.mask & mask) == 0) return false;
        die(w, &u, "lanes of one warp wait at different collectives: lane " + std::to_string(__builtin_ctz(m)) +
                       " at " + waiting_at(u) + ", lane " + std::to_string(__builtin_ctz(mask)) + " at " +
                       waiting_at(first));
    }
    return true;
}

// Releases a barrier every non-exited thread has reached, after checking they all reached the
// same one (a barrier in divergent code is undefined behaviour on a GPU: it may hang or not).
void release_barrier(Worker* w) {
    const Thread* first = nullptr;
    int count = 0, n = 0;
    for (int i = 0; i < w->nthreads; i++) {
        const Thread& t = w->threads[i];
        if (t.state != State::AtBarrier) continue;
        if (!first) first = &t;
        if (t.file != first->file || t.line != first->line || t.op != first->op)
            die(w, &t, "divergent barrier: " + thread_str(t) + " waits at " + waiting_at(t) +
                           " but " + thread_str(*first) + " waits at " + waiting_at(*first));
        count += t.value != 0;
        n++;
    }
    int result = 0;
    switch ((BarrierOp)first->op) {
        case BarrierOp::Plain: break;
        case BarrierOp::Count: result = count; break;
        case BarrierOp::And: result = count == n; break;
        case BarrierOp::Or: result = count > 0; break;
    }
    for (int i = 0; i < w->nthreads; i++) {
        Thread& t = w->threads[i];
        if (t.state != State::AtBarrier) continue;
        t.result = (uint64_t)result;
        t.state = State::Runnable;
    }
    w->n_at_barrier = 0;
}

// Nothing can proceed: describe who waits for whom and stop.
// A warpgroup's wgmma.mma_async is one instruction of all its 128 threads: a block that ends with
// one that only some of the warps issued (warp_wgmma_issue below) stops the run.
[[noreturn]] void report_partial_warpgroup_mma(Worker* w) {
    const auto& [at, mma] = *w->warpgroup_mmas.begin();
    std::string issued, missing;
    for (int i = 0; i < 4; i++) {
        std::string& to = mma.warps >> i & 1 ? issued : missing;
        to += (to.empty() ? "" : ", ") + std::to_string(4 * at.first + i);
    }
    die(w, nullptr,
        "wgmma.mma_async #" + std::to_string(at.second + 1) + " of warpgroup " + std::to_string(at.first) +
            " (at " + site(mma.file, mma.line) + ") was issued by warp(s) " + issued + " but never by warp(s) " +
            missing +
            ": all four warps of a warpgroup execute each wgmma.mma_async together");
}

[[noreturn]] void report_deadlock(Worker* w) {
    for (int i = 0; i < w->nthreads; i++) {
        const Thread& t = w->threads[i];
        if (t.state != State::AtWarp) continue;
        int base = i / 32 * 32;
        for (int j = 0; j < 32; j++) {
            if (!(t.mask >> j & 1)) continue;
            const Thread& u = w->threads[base + j];
            if (u.state == State::AtBarrier)
                die(w, &t, "deadlock: waits at " + waiting_at(t) + " for lane " + std::to_string(j) +
                               ", which waits at " + waiting_at(u));
        }
    }
    die(w, nullptr, "deadlock: no thread can proceed");
}

// Runs one block to completion on worker w.
//
// Warp by warp: the lanes of one warp run (a phase) until each blocks; its collectives are
// resolved and the warp runs again, until all its lanes wait at a barrier or have exited; then
// the next warp. Warps are independent between barriers, so this is a schedule a GPU may also
// produce, and keeping one warp's 32 fiber stacks hot in L1 makes collectives cheap. When every
// warp is done, the barrier is released (or the block has finished, or it is deadlocked).
void run_block(Worker* w, uint3 bid) {
    blockIdx = bid;
    int n = w->nthreads, nwarps = (n + 31) / 32;
    for (int i = 0; i < n; i++) {
        w->threads[i].state = State::Runnable;
        w->threads[i].async_copies.clear();
        w->threads[i].async_groups = 0;
        w->threads[i].async_mmas.clear();
        w->threads[i].mma_groups = 0;
        w->threads[i].mma_fenced = false;
    }
    w->n_exited = w->n_at_barrier = 0;
    memset(w->warp_waiting, 0, sizeof(w->warp_waiting));
    w->view_ready = w->proxy_fenced = false;
    w->warp_wgmmas.assign(nwarps, 0);
    w->warpgroup_mmas.clear();
    // Uninitialised shared memory reads as NaN (all-ones bytes), deterministically.
    if (w->dyn_smem_size) memset(w->dyn_smem, 0xff, w->dyn_smem_size);
    w->order_kind = order_setting().order;
    w->rng = order_setting().seed * 0x9E3779B97F4A7C15ull + launch_count() * 1315423911u +
             (bid.x + 1) * 2654435761u + bid.y * 97u + bid.z + 1;
    w->warp_order.resize(nwarps);
    for (;;) {
        make_order(w, w->warp_order.data(), nwarps);
        for (int k = 0; k < nwarps; k++) {
            w->warp_base = w->warp_order[k] * 32;
            w->warp_lanes = std::min(32, n - w->warp_base);
            do {
                if (w->order_kind == Order::Random) make_order(w, w->lane_order, w->warp_lanes);
                w->phase_pos = 0;
                Thread* first = next_in_phase(w);
                if (first) run_next(w, &w->sched, first);
            } while (resolve_warp(w));  // normally nothing left: collectives complete on arrival
        }
        if (w->n_exited == n) break;
        if (w->n_at_barrier + w->n_exited == n) {
            release_barrier(w);
            continue;
        }
        report_deadlock(w);
    }
    w->current = nullptr;
    if (!w->warpgroup_mmas.empty()) report_partial_warpgroup_mma(w);
}

// ----------------------------------------------------------------------------
// Worker pool: SIMT_THREADS workers take blocks from a shared counter (default 1: deterministic)

int& n_workers_setting() {
    static int n = (int)env_int("SIMT_THREADS", 1, 1, 256);
    return n;
}
int n_workers() { return n_workers_setting(); }

struct Job {
    const LaunchBody* body;
    const cudaLaunchConfig_t* cfg;
    std::atomic<uint64_t> next{0};
    uint64_t total = 0;
};

std::atomic<uint64_t> g_launches{0};

Worker* this_worker() {
    if (!tw) {
        tw = new Worker();  // lives as long as its OS thread; stacks are reused by every launch
        tw->threads.reserve(kMaxThreadsPerBlock);
        tw->fibers.reserve(kMaxThreadsPerBlock);
        install_overflow_handler(tw);
    }
    return tw;
}

// Runs blocks of job until none are left.
void work_on(Job* job) {
    Worker* w = this_worker();
    const cudaLaunchConfig_t& cfg = *job->cfg;
    w->body = job->body;
    w->nthreads = (int)(cfg.blockDim.x * cfg.blockDim.y * cfg.blockDim.z);
    blockDim = cfg.blockDim;
    gridDim = cfg.gridDim;
    w->threads.resize(w->nthreads);
    for (int i = 0; i < w->nthreads; i++) {
        unsigned x = i % cfg.blockDim.x, y = (i / cfg.blockDim.x) % cfg.blockDim.y,
                 z = i / (cfg.blockDim.x * cfg.blockDim.y);
        w->threads[i].tid = uint3{x, y, z};
        w->threads[i].index = i;
    }
    w->dyn_smem_size = cfg.dynamicSmemBytes;
    // Exactly sized (ASan flags accesses past the requested size); 1024-byte aligned, so that its
    // addresses and the shared-window offsets wgmma descriptors hold agree in the low 10 bits, the
    // 128-byte swizzle's pattern (llmc/wgmma.cuh); WMMA needs 32.
    w->dyn_smem = nullptr;
    if (cfg.dynamicSmemBytes && posix_memalign(&w->dyn_smem, 1024, cfg.dynamicSmemBytes) != 0)
        die(w, nullptr, "cannot allocate dynamic shared memory");
    for (;;) {
        uint64_t b = job->next.fetch_add(1);
        if (b >= job->total) break;
        uint3 bid{(unsigned)(b % cfg.gridDim.x), (unsigned)(b / cfg.gridDim.x % cfg.gridDim.y),
                  (unsigned)(b / ((uint64_t)cfg.gridDim.x * cfg.gridDim.y))};
        run_block(w, bid);
    }
    free(w->dyn_smem);
    w->dyn_smem = nullptr;
    w->body = nullptr;
}

class Pool {
  public:
    // Runs job on the calling thread plus n_workers()-1 pool threads; returns when all are done.
    void run(Job* job) {
        int extra = n_workers() - 1;
        if (extra == 0 || job->total == 1) {
            work_on(job);
            return;
        }
        {
            std::unique_lock<std::mutex> lk(mu_);
            while ((int)threads_.size() < extra) threads_.emplace_back([this] { loop(); });
            job_ = job;
            busy_ = extra;
            generation_++;
        }
        cv_.notify_all();
        work_on(job);
        std::unique_lock<std::mutex> lk(mu_);
        done_cv_.wait(lk, [this] { return busy_ == 0; });
        job_ = nullptr;
    }

  private:
    void loop() {
        uint64_t seen = 0;
        for (;;) {
            Job* job;
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return generation_ != seen; });
                seen = generation_;
                job = job_;
            }
            work_on(job);
            std::lock_guard<std::mutex> lk(mu_);
            if (--busy_ == 0) done_cv_.notify_all();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    std::vector<std::thread> threads_;  // detached at exit: they sleep on cv_ forever
    Job* job_ = nullptr;
    int busy_ = 0;
    uint64_t generation_ = 0;
};

Pool& pool() {
    static Pool* p = new Pool();  // never destroyed: its threads outlive static destruction
    return *p;
}

// ----------------------------------------------------------------------------
// Kernel coverage (SIMT_COVERAGE_DIR, an absolute path): the first launch of each kernel appends
// its base name — no return type, scope, template arguments or parameters, which is how
// scripts/kernel_coverage.py matches it to a __global__ definition in the sources — as one line to
// <dir>/<program>.<pid>. A kernel the executable does not name (not linked with -rdynamic) is
// written as "? <address>", so that the check can say why it cannot match it.
//
// Written at the first launch, not at exit: a process may end without running exit handlers — a
// planted fault's _exit, a test's forked child that calls _exit, an ASan report's abort — and what
// it launched counts too. The file is opened per line under the pid of that moment, so a forked
// child writes a file of its own (what the parent launched before the fork is in the parent's).
// The cost is one open/write/close per distinct kernel; every launch looks its pointer up.

// The mangled name of the kernel at this address; null if the executable does not export it (not
// linked with -rdynamic). dladdr answers with the nearest exported symbol below the address: only
// an exact match is the kernel's own.
const char* symbol_of(const void* kernel) {
    Dl_info info{};
    if (kernel && dladdr(kernel, &info) && info.dli_sname && info.dli_saddr == kernel) return info.dli_sname;
    return nullptr;
}

// The name without return type, scope, template arguments and parameters:
// "void ns::k<float, 4>(float*, int)" -> "k". The last identifier at bracket depth 0 before the
// parameter list (the first '(' at depth 0 after a name: "(anonymous namespace)::" comes before one).
std::string base_name(const char* demangled) {
    std::string name;
    int depth = 0;
    bool in_word = false;
    for (const char* p = demangled; *p; p++) {
        char c = *p;
        if (c == '(' && depth == 0 && !name.empty()) break;
        if (c == '<' || c == '(') depth++;
        if (c == '>' || c == ')') depth--;
        bool word = depth == 0 && (isalnum((unsigned char)c) || c == '_');
        if (word && !in_word) name.clear();
        if (word) name += c;
        in_word = word;
    }
    return name;
}

class Coverage {
  public:
    Coverage() {
        const char* e = getenv("SIMT_COVERAGE_DIR");
        if (e) dir_ = e;
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        exe[n > 0 ? n : 0] = 0;
        const char* slash = strrchr(exe, '/');
        program_ = slash ? slash + 1 : exe;
    }

    void record(const void* kernel) {
        if (dir_.empty()) return;
        std::lock_guard<std::mutex> lk(mu_);
        if (!seen_.insert(kernel).second) return;
        std::string line;
        if (symbol_of(kernel)) {
            char name[4096];
            line = base_name(kernel_name(kernel, name, sizeof(name)));
            if (!names_.insert(line).second) return;  // another instance of the same template
        } else {
            char addr[32];
            snprintf(addr, sizeof(addr), "? %p", kernel);
            line = addr;
        }
        line += '\n';
        std::string path = dir_ + "/" + program_ + "." + std::to_string(getpid());
        int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0 || write(fd, line.data(), line.size()) != (ssize_t)line.size()) {
            if (!warned_) fprintf(stderr, "simt: cannot record kernel coverage in %s: %s\n", path.c_str(), strerror(errno));
            warned_ = true;
        }
        if (fd >= 0) close(fd);
    }

  private:
    std::string dir_, program_;
    std::mutex mu_;
    std::unordered_set<const void*> seen_;
    std::unordered_set<std::string> names_;
    bool warned_ = false;
};

Coverage& coverage() {
    static Coverage* c = new Coverage();  // never destroyed: a launch may come during static destruction
    return *c;
}

// Checks a launch configuration as the driver would; returns the error a GPU would give.
cudaError_t validate(const cudaLaunchConfig_t& cfg, const LaunchBody& body) {
    const dim3& b = cfg.blockDim;
    const dim3& g = cfg.gridDim;
    if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) return cudaErrorInvalidConfiguration;
    if (b.x > 1024 || b.y > 1024 || b.z > 64 || (uint64_t)b.x * b.y * b.z > (uint64_t)kMaxThreadsPerBlock)
        return cudaErrorInvalidConfiguration;
    if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) return cudaErrorInvalidConfiguration;
    if (cfg.dynamicSmemBytes > max_dynamic_smem(body.kernel)) return cudaErrorInvalidValue;
    return cudaSuccess;
}

void run_grid(const cudaLaunchConfig_t& cfg, const LaunchBody& body) {
    Job job;
    job.body = &body;
    job.cfg = &cfg;
    job.total = (uint64_t)cfg.gridDim.x * cfg.gridDim.y * cfg.gridDim.z;
    pool().run(&job);
    g_launches++;
}

}  // namespace

// ----------------------------------------------------------------------------
// Interface used by the shadow cuda_runtime.h

cudaError_t launch(const cudaLaunchConfig_t& cfg, const LaunchBody& body) {
    cudaError_t err = validate(cfg, body);
    if (err != cudaSuccess) return set_last_error(err);
    if (tw && tw->current) {
        fprintf(stderr, "simt: a kernel launched a kernel (dynamic parallelism is not supported)\n");
        _exit(kFaultExit);
    }
    coverage().record(body.kernel);
    if (streams_deferred() || stream_capturing(cfg.stream)) {
        // Checked now (the errors a launch returns), run when the stream is forced or the graph
        // that captured it is replayed (with these arguments, by value, as CUDA captures them).
        std::shared_ptr<const void> closure = body.copy(body.closure);
        cudaLaunchConfig_t queued = cfg;
        queued.attrs = nullptr;
        queued.numAttrs = 0;
        return set_last_error(issue(cfg.stream, [queued, body, closure] {
            LaunchBody held = body;
            held.closure = closure.get();
            run_grid(queued, held);
        }));
    }
    note_host_op();
    run_grid(cfg, body);
    return cudaSuccess;
}

int barrier(BarrierOp op, int pred, const char* file, int line) {
    Worker* w = tw;
    Thread* t = w ? w->current : nullptr;
    if (!t) fault("__syncthreads called outside a kernel", file, line);
    t->state = State::AtBarrier;
    t->op = (int)op;
    t->value = pred != 0;
    t->file = file;
    t->line = line;
    w->n_at_barrier++;
    block_current(w, t);
    return (int)t->result;
}

namespace {
// Stops the run for a warp collective called with arguments CUDA does not allow. Kept out of
// line so the hot path's stack frame stays small (every fiber switch touches it).
[[noreturn]] __attribute__((noinline, cold)) void bad_collective(Worker* w, Thread* t, unsigned lane) {
    std::string what = std::string(warp_op_name(t->op)) + " at " + site(*t) + ": ";
    if (!(t->mask >> lane & 1))
        what += "mask does not name the calling lane " + std::to_string(lane);
    else
        what += "width " + std::to_string(t->width) + " is not a power of two in [1, 32]";
    die(w, t, what);
}
}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                         const char* file, int line) {
    Worker* w = tw;
    Thread* t = w ? w->current : nullptr;
    if (!t) fault("warp collective called outside a kernel", file, line);
    t->file = file;
    t->line = line;
    t->op = (int)op;
    t->mask = mask;
    t->value = value;
    t->arg = arg;
    t->width = width;
    unsigned lane = (unsigned)w->current_index % 32;
    if (!(mask >> lane & 1) || width <= 0 || width > 32 || (width & (width - 1))) bad_collective(w, t, lane);
    t->state = State::AtWarp;
    // The last lane of the mask to arrive completes the collective and runs on without a switch.
    int base = w->current_index / 32 * 32;
    unsigned waiting = (w->warp_waiting[base / 32] |= 1u << lane);
    if ((waiting & mask) == mask && collective_consistent(w, base, mask)) {
        complete_warp(w, base, mask);
        return t->result;
    }
    block_current(w, t);
    return t->result;
}

unsigned lane_id() { return tw && tw->current ? (unsigned)tw->current_index % 32 : 0; }

unsigned active_mask() {
    Worker* w = tw;
    int base = w->current_index / 32 * 32;
    unsigned m = 0;
    for (int j = 0; j < 32 && base + j < w->nthreads; j++)
        if (w->threads[base + j].state != State::Exited) m |= 1u << j;
    return m;
}

void* dynamic_shared_memory() { return tw ? tw->dyn_smem : nullptr; }
size_t dynamic_shared_memory_size() { return tw ? tw->dyn_smem_size : 0; }

// ----------------------------------------------------------------------------
// cp.async (llmc/tensor_core.cuh): copies global -> shared memory that are not visible until the
// issuing thread waits for their group. A GPU performs them at some time between the issue and the
// wait; the backend performs them at the wait, the latest time allowed, so a kernel that reads the
// destination early (or lets another thread read it before the issuing thread has waited and a
// barrier followed) sees the old bytes.

// The calling CUDA thread; a cp.async function called outside a kernel stops the run.
static Thread* async_caller(const char* what, const char* file, int line) {
    if (!tw || !tw->current)
        die(tw, nullptr, std::string(what) + " called outside a kernel at " + file + ":" + std::to_string(line));
    return tw->current;
}

void cp_async_16(void* dst, const void* src, int src_bytes, const char* file, int line) {
    Thread* t = async_caller("cp.async", file, line);
    char msg[256];
    if (src_bytes < 0 || src_bytes > 16) {
        snprintf(msg, sizeof(msg), "cp.async of 16 bytes with src-size %d: it must be in [0, 16]", src_bytes);
        fault(msg, file, line);
    }
    if (reinterpret_cast<uintptr_t>(dst) % 16 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % 16)) {
        snprintf(msg, sizeof(msg),
                 "cp.async of 16 bytes from %p to %p: both addresses must be 16-byte aligned, as the PTX ISA "
                 "requires", src, dst);
        fault(msg, file, line);
    }
    if (is_device_memory(dst) || is_pinned_memory(dst)) {
        snprintf(msg, sizeof(msg), "cp.async: the destination %p is global memory; it must be shared memory", dst);
        fault(msg, file, line);
    }
    t->async_copies.push_back({dst, src, src_bytes, t->async_groups});
}

void prefetch_l2(const void* p, const char* file, int line) {
    if (!is_device_memory(p)) {
        char msg[160];
        snprintf(msg, sizeof(msg), "prefetch.global.L2 of %p: the address must be global (device) memory", p);
        fault(msg, file, line);
    }
}

void cp_async_commit(const char* file, int line) {
    async_caller("cp.async.commit_group", file, line)->async_groups++;
}

void cp_async_wait(int pending_groups, const char* file, int line) {
    Thread* t = async_caller("cp.async.wait_group", file, line);
    // Groups 0 .. async_groups-1 are committed; all but the newest pending_groups must be complete.
    // Copies not yet committed (group == async_groups) belong to no group and stay pending.
    uint64_t complete_below = t->async_groups > (uint64_t)pending_groups ? t->async_groups - pending_groups : 0;
    size_t kept = 0;
    for (AsyncCopy& c : t->async_copies) {
        if (c.group < complete_below) {
            if (c.src_bytes > 0) memcpy(c.dst, c.src, c.src_bytes);
            memset(static_cast<char*>(c.dst) + c.src_bytes, 0, 16 - c.src_bytes);
        } else {
            t->async_copies[kept++] = c;
        }
    }
    t->async_copies.resize(kept);
}

// ----------------------------------------------------------------------------
// wgmma
//
// wgmma.mma_async computes at the latest moment a GPU may: when its thread waits for its group.
// Until then its accumulators keep their old values, and the shared memory it reads is read at
// the wait, so a kernel that reads the accumulators early, or overwrites an operand tile before
// the wait, gets different numbers here. A thread must have executed wgmma.fence since its last
// wait (or its start) before it issues one, and must wait for all it issued before it exits.

//
// wgmma reads shared memory through the async proxy, which sees a thread's ordinary stores and
// cp.async copies only after that thread's fence.proxy.async. Here wgmma reads a copy of the
// dynamic shared memory (async_view), brought up to date when the first warp of a warpgroup issues a
// wgmma after any thread's fence since the last update: a wgmma whose operand bytes differ between
// that copy and the shared memory when it computes stops the run (a store not fenced before the
// wgmma was issued, or an operand tile overwritten before the wait). That one thread's fence stands
// for the whole block's is this model's leniency.
//
// A warpgroup's four warps execute each wgmma.mma_async together: each warp's k-th is compared with
// the first k-th its warpgroup issued (warp_wgmma_issue), and a block ending with a wgmma only some
// of the four issued stops the run.

void wgmma_fence(const char* file, int line) { async_caller("wgmma.fence", file, line)->mma_fenced = true; }

void fence_proxy_async(const char* file, int line) {
    async_caller("fence.proxy.async", file, line);
    tw->proxy_fenced = true;
}

void wgmma_issue(std::function<void()> complete, const char* file, int line) {
    Thread* t = async_caller("wgmma.mma_async", file, line);
    if (!t->mma_fenced)
        fault("wgmma.mma_async without a wgmma.fence since this thread's last wgmma wait (or its start): the "
              "PTX ISA requires one before the first wgmma.mma_async and after the accumulators or A "
              "registers are accessed by other instructions", file, line);
    t->async_mmas.push_back({std::move(complete), t->mma_groups});
}

const void* async_proxy_shared_memory() { return tw && tw->view_ready ? tw->async_view.data() : nullptr; }

void warp_wgmma_issue(const uint64_t key[3], const char* what, const char* file, int line) {
    Thread* t = async_caller(what, file, line);
    Worker* w = tw;
    int warp = t->index / 32, group = warp / 4;
    uint64_t k = w->warp_wgmmas[warp]++;
    auto [it, first] = w->warpgroup_mmas.try_emplace({group, k});
    WarpgroupMma& m = it->second;
    if (first) {
        memcpy(m.key, key, sizeof(m.key));
        m.first_warp = warp;
        m.file = file;
        m.line = line;
        if (!w->view_ready || w->proxy_fenced) {
            // The operands as of the warpgroup's first issue: before any fence the block's initial
            // bytes (NaN-poisoned, as run_block leaves the shared memory), after one all stores so far.
            w->async_view.resize(w->dyn_smem_size);
            if (w->proxy_fenced) memcpy(w->async_view.data(), w->dyn_smem, w->dyn_smem_size);
            else memset(w->async_view.data(), 0xff, w->dyn_smem_size);
            w->view_ready = true;
            w->proxy_fenced = false;
        }
    } else if (memcmp(m.key, key, sizeof(m.key)) != 0) {
        fault((std::string(what) + ": warp " + std::to_string(warp) + "'s wgmma #" + std::to_string(k + 1) +
               " differs from warp " + std::to_string(m.first_warp) + "'s (at " + site(m.file, m.line) +
               ") in its descriptors, shape, types or accumulate flag: the four warps of a warpgroup execute "
               "each wgmma.mma_async together")
                  .c_str(),
              file, line);
    }
    m.warps |= 1u << (warp % 4);
    if (m.warps == 0xF) w->warpgroup_mmas.erase(it);
}

void wgmma_commit(const char* file, int line) { async_caller("wgmma.commit_group", file, line)->mma_groups++; }

void wgmma_wait(int pending_groups, const char* file, int line) {
    Thread* t = async_caller("wgmma.wait_group", file, line);
    // As cp_async_wait: all but the newest pending_groups committed groups complete, in issue order
    // (later ones accumulate into what earlier ones wrote); uncommitted ones stay pending.
    uint64_t complete_below = t->mma_groups > (uint64_t)pending_groups ? t->mma_groups - pending_groups : 0;
    size_t kept = 0;
    for (AsyncMma& m : t->async_mmas) {
        if (m.group < complete_below) m.complete();
        else t->async_mmas[kept++] = std::move(m);
    }
    t->async_mmas.resize(kept);
    t->mma_fenced = false;
}

void fault(const char* what, const char* file, int line) {
    Worker* w = tw;
    die(w, w ? w->current : nullptr, std::string(what) + " at " + site(file, line));
}

void set_order(Order order, uint64_t seed) {
    order_setting().order = order;
    order_setting().seed = seed;
}
Order get_order() { return order_setting().order; }
void set_workers(int n) { n_workers_setting() = std::max(1, std::min(n, 256)); }
int get_workers() { return n_workers(); }
uint64_t launch_count() { return g_launches.load(); }

const char* kernel_name(const void* kernel, char* buf, size_t len) {
    if (const char* symbol = symbol_of(kernel)) {
        int status = 0;
        char* dem = abi::__cxa_demangle(symbol, nullptr, nullptr, &status);
        snprintf(buf, len, "%s", status == 0 && dem ? dem : symbol);
        free(dem);
    } else {
        snprintf(buf, len, "at %p (build with -rdynamic to see names)", kernel);
    }
    return buf;
}

}  // namespace simt
