// llmc/simt/scheduler.cpp — the SIMT engine: runs each CUDA thread of a block as a fiber, resolves
// barriers and warp collectives, permutes schedules, and reports faults instead of hanging.
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
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
namespace {

// ----------------------------------------------------------------------------
// Threads (fibers) and workers

enum class State : uint8_t { Runnable, AtBarrier, AtWarp, Exited };

constexpr int kFaultExit = 3;  // exit status of a run stopped by a fault

struct Thread {
    fc::fcontext_t ctx = nullptr;  // where to resume this fiber
    State state = State::Exited;
    uint3 tid{};
    // What it waits at (valid in AtBarrier / AtWarp).
    const char* file = nullptr;
    int line = 0;
    int op = 0;        // BarrierOp or WarpOp
    unsigned mask = 0; // warp collectives: the lanes named
    int arg = 0;       // shuffle source lane / delta / xor mask
    int width = 32;
    uint64_t value = 0;   // this lane's contribution (or the barrier predicate)
    uint64_t result = 0;  // what the collective returns to this lane
    // Stack: [map, map + kGuard) is a PROT_NONE guard page, the stack grows down towards it.
    char* map = nullptr;
    size_t map_size = 0;
#if SIMT_ASAN
    void* fake_stack = nullptr;
#endif
};

constexpr size_t kGuard = 64 * 1024;  // large enough that a big local array cannot jump over it

size_t stack_size() {
    static size_t sz = [] {
        const char* e = getenv("SIMT_STACK_KB");
        size_t kb = e ? strtoull(e, nullptr, 10) : 256;
        return std::max<size_t>(kb, 64) * 1024;
    }();
    return sz;
}

struct Worker {
    std::vector<std::unique_ptr<Thread>> threads;  // fiber pool, grown to the largest block
    fc::fcontext_t sched_ctx = nullptr;            // the worker's own (scheduler) context
    Thread* current = nullptr;
    int current_index = 0;
    const LaunchBody* body = nullptr;
    dim3 block;
    int nthreads = 0;
    int n_exited = 0, n_at_barrier = 0, n_at_warp = 0;
    std::vector<int> order;      // permutation used by the current phase
    uint64_t rng = 0;            // for Order::Random
    void* dyn_smem = nullptr;    // this launch's dynamic shared memory, exactly sized
    size_t dyn_smem_size = 0;
    std::vector<char> altstack;  // signal stack, so a stack overflow can still be reported
#if SIMT_ASAN
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
#endif
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

std::string site(const Thread& t) {
    const char* slash = strrchr(t.file ? t.file : "?", '/');
    return std::string(slash ? slash + 1 : (t.file ? t.file : "?")) + ":" + std::to_string(t.line);
}
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
        for (auto& t : w->threads) {
            if (addr >= t->map && addr < t->map + kGuard) {
                char name[512];
                kernel_name(w->body ? w->body->kernel : nullptr, name, sizeof(name));
                char msg[1024];
                int len = snprintf(msg, sizeof(msg),
                                   "simt: fault in kernel %s, block (%u,%u,%u), thread (%u,%u,%u): "
                                   "fiber stack overflow (stack is %zu KiB; raise SIMT_STACK_KB)\n",
                                   name, blockIdx.x, blockIdx.y, blockIdx.z, t->tid.x, t->tid.y,
                                   t->tid.z, stack_size() / 1024);
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
// Context switches (annotated for AddressSanitizer, which must know which stack is live)

void switch_to_thread(Worker* w, Thread* t) {
    w->current = t;
    threadIdx = t->tid;
#if SIMT_ASAN
    void* fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, t->map + kGuard, t->map_size - kGuard);
#endif
    fc::transfer_t r = fc::jump_fcontext(t->ctx, t);
    t->ctx = r.fctx;
#if SIMT_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// Suspends the calling fiber and returns to its worker's scheduler.
void yield_to_scheduler(Worker* w, Thread* t) {
#if SIMT_ASAN
    __sanitizer_start_switch_fiber(&t->fake_stack, w->sched_stack_bottom, w->sched_stack_size);
#endif
    fc::transfer_t r = fc::jump_fcontext(w->sched_ctx, nullptr);
    w->sched_ctx = r.fctx;
#if SIMT_ASAN
    __sanitizer_finish_switch_fiber(t->fake_stack, &w->sched_stack_bottom, &w->sched_stack_size);
#endif
    (void)t;
}

// Every fiber runs this loop for its whole life: run the kernel body for the block it is given,
// mark itself exited, hand control back, and wait to be resumed for the next block.
void fiber_main(fc::transfer_t r) {
    Worker* w = tw;
    w->sched_ctx = r.fctx;
    Thread* self = static_cast<Thread*>(r.data);
#if SIMT_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &w->sched_stack_bottom, &w->sched_stack_size);
#endif
    for (;;) {
        w->body->invoke(w->body->closure);
        self->state = State::Exited;
        w->n_exited++;
        yield_to_scheduler(w, self);
    }
}

// Makes sure the pool holds n fibers (each on a fresh guarded stack).
void grow_pool(Worker* w, int n) {
    while ((int)w->threads.size() < n) {
        auto t = std::make_unique<Thread>();
        t->map_size = stack_size() + kGuard;
        void* m = mmap(nullptr, t->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) die(w, nullptr, "cannot map a fiber stack");
        mprotect(m, kGuard, PROT_NONE);
        t->map = static_cast<char*>(m);
        t->ctx = fc::make_fcontext(t->map + t->map_size, t->map_size - kGuard, fiber_main);
        w->threads.push_back(std::move(t));
    }
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

// Fills w->order with the sequence in which this phase resumes the threads.
void make_order(Worker* w) {
    int n = w->nthreads;
    w->order.resize(n);
    Order o = order_setting().order;
    for (int i = 0; i < n; i++) w->order[i] = o == Order::Reverse ? n - 1 - i : i;
    if (o == Order::Random)
        for (int i = n - 1; i > 0; i--) std::swap(w->order[i], w->order[next_random(w->rng) % (i + 1)]);
}

// ----------------------------------------------------------------------------
// Resolving warp collectives and barriers

// Completes the collective that the lanes of `mask` in warp `base` all wait at.
void complete_warp(Worker* w, int base, int nlanes, unsigned mask) {
    Thread** lanes = reinterpret_cast<Thread**>(alloca(sizeof(Thread*) * 32));
    for (int j = 0; j < 32; j++) lanes[j] = j < nlanes ? w->threads[base + j].get() : nullptr;
    const Thread& first = *lanes[__builtin_ctz(mask)];
    int op = first.op;
    uint64_t ballot = 0, reduce = 0;
    if (op == (int)WarpOp::Ballot || op == (int)WarpOp::Any || op == (int)WarpOp::All) {
        for (int j = 0; j < 32; j++)
            if ((mask >> j & 1) && lanes[j]->value) ballot |= 1ull << j;
    } else if (op == (int)WarpOp::ReduceAdd || op == (int)WarpOp::ReduceMin ||
               op == (int)WarpOp::ReduceMax) {
        bool firstv = true;
        for (int j = 0; j < 32; j++) {
            if (!(mask >> j & 1)) continue;
            uint32_t v = (uint32_t)lanes[j]->value;
            if (firstv) { reduce = v; firstv = false; continue; }
            if (op == (int)WarpOp::ReduceAdd) reduce = (uint32_t)(reduce + v);
            if (op == (int)WarpOp::ReduceMin) reduce = std::min<uint64_t>(reduce, v);
            if (op == (int)WarpOp::ReduceMax) reduce = std::max<uint64_t>(reduce, v);
        }
    }
    for (int l = 0; l < 32; l++) {
        if (!(mask >> l & 1)) continue;
        Thread& t = *lanes[l];
        int seg = (l / t.width) * t.width;
        int src = l;
        switch ((WarpOp)op) {
            case WarpOp::ShflIdx: src = seg + ((t.arg % t.width) + t.width) % t.width; break;
            case WarpOp::ShflUp: src = (l - seg) >= t.arg ? l - t.arg : l; break;
            case WarpOp::ShflDown: src = (l - seg) + t.arg < t.width ? l + t.arg : l; break;
            case WarpOp::ShflXor: src = (l ^ t.arg) < seg + t.width ? (l ^ t.arg) : l; break;
            default: break;
        }
        switch ((WarpOp)op) {
            case WarpOp::ShflIdx: case WarpOp::ShflUp: case WarpOp::ShflDown: case WarpOp::ShflXor:
                // Reading a lane outside the mask is undefined in CUDA: return a poison value
                // (all ones: NaN as a float) so that a result that matters shows up wrong.
                t.result = (src >= 0 && src < 32 && (mask >> src & 1)) ? lanes[src]->value : ~0ull;
                break;
            case WarpOp::Ballot: t.result = ballot; break;
            case WarpOp::Any: t.result = ballot != 0; break;
            case WarpOp::All: t.result = ballot == mask; break;
            case WarpOp::ReduceAdd: case WarpOp::ReduceMin: case WarpOp::ReduceMax: t.result = reduce; break;
            case WarpOp::MatchAny: {
                unsigned m = 0;
                for (int j = 0; j < 32; j++)
                    if ((mask >> j & 1) && lanes[j]->value == t.value) m |= 1u << j;
                t.result = m;
                break;
            }
            case WarpOp::Sync: t.result = 0; break;
        }
    }
    for (int l = 0; l < 32; l++)
        if (mask >> l & 1) lanes[l]->state = State::Runnable;
    w->n_at_warp -= __builtin_popcount(mask);
}

// Completes every warp collective whose lanes have all arrived; faults on collectives that can
// never complete because a named lane has exited or waits at a different collective.
bool resolve_warps(Worker* w) {
    if (w->n_at_warp == 0) return false;
    bool progress = false;
    for (int base = 0; base < w->nthreads; base += 32) {
        int nlanes = std::min(32, w->nthreads - base);
        for (int l = 0; l < nlanes; l++) {
            Thread& t = *w->threads[base + l];
            if (t.state != State::AtWarp) continue;
            bool ready = true;
            for (int j = 0; j < 32 && ready; j++) {
                if (!(t.mask >> j & 1)) continue;
                if (j >= nlanes)
                    die(w, &t, std::string(warp_op_name(t.op)) + " at " + site(t) + ": mask names lane " +
                                   std::to_string(j) + ", which does not exist (block of " +
                                   std::to_string(w->nthreads) + " threads) — an exited lane");
                const Thread& u = *w->threads[base + j];
                if (u.state == State::Exited)
                    die(w, &t, std::string(warp_op_name(t.op)) + " at " + site(t) + ": mask names lane " +
                                   std::to_string(j) + ", which has exited");
                if (u.state != State::AtWarp) { ready = false; break; }
                if (u.op != t.op || u.mask != t.mask)
                    die(w, &t, "lanes of one warp wait at different collectives: lane " +
                                   std::to_string(l) + " at " + waiting_at(t) + ", lane " +
                                   std::to_string(j) + " at " + waiting_at(u));
            }
            if (ready) {
                complete_warp(w, base, nlanes, t.mask);
                progress = true;
            }
        }
    }
    return progress;
}

// Releases a barrier every non-exited thread has reached, after checking they all reached the
// same one (a barrier in divergent code is undefined behaviour on a GPU: it may hang or not).
void release_barrier(Worker* w) {
    const Thread* first = nullptr;
    int count = 0, n = 0;
    for (int i = 0; i < w->nthreads; i++) {
        const Thread& t = *w->threads[i];
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
        Thread& t = *w->threads[i];
        if (t.state != State::AtBarrier) continue;
        t.result = (uint64_t)result;
        t.state = State::Runnable;
    }
    w->n_at_barrier = 0;
}

// Nothing can proceed: describe who waits for whom and stop.
[[noreturn]] void report_deadlock(Worker* w) {
    for (int i = 0; i < w->nthreads; i++) {
        const Thread& t = *w->threads[i];
        if (t.state != State::AtWarp) continue;
        int base = i / 32 * 32;
        for (int j = 0; j < 32; j++) {
            if (!(t.mask >> j & 1)) continue;
            const Thread& u = *w->threads[base + j];
            if (u.state == State::AtBarrier)
                die(w, &t, "deadlock: waits at " + waiting_at(t) + " for lane " + std::to_string(j) +
                               ", which waits at " + waiting_at(u));
        }
    }
    die(w, nullptr, "deadlock: no thread can proceed");
}

// Runs one block to completion on worker w.
void run_block(Worker* w, uint3 bid) {
    blockIdx = bid;
    int n = w->nthreads;
    for (int i = 0; i < n; i++) w->threads[i]->state = State::Runnable;
    w->n_exited = w->n_at_barrier = w->n_at_warp = 0;
    // Uninitialised shared memory reads as NaN (all-ones bytes), deterministically.
    if (w->dyn_smem_size) memset(w->dyn_smem, 0xff, w->dyn_smem_size);
    w->rng = order_setting().seed * 0x9E3779B97F4A7C15ull + launch_count() * 1315423911u +
             (bid.x + 1) * 2654435761u + bid.y * 97u + bid.z + 1;
    for (;;) {
        make_order(w);
        for (int k = 0; k < n; k++) {
            int i = w->order[k];
            Thread* t = w->threads[i].get();
            if (t->state != State::Runnable) continue;
            w->current_index = i;
            switch_to_thread(w, t);
        }
        if (w->n_exited == n) break;
        if (resolve_warps(w)) continue;
        if (w->n_at_barrier + w->n_exited == n) {
            release_barrier(w);
            continue;
        }
        report_deadlock(w);
    }
    w->current = nullptr;
}

// ----------------------------------------------------------------------------
// Worker pool: SIMT_THREADS workers take blocks from a shared counter (default 1: deterministic)

int& n_workers_setting() {
    static int n = [] {
        const char* e = getenv("SIMT_THREADS");
        int v = e ? atoi(e) : 1;
        return std::max(1, std::min(v, 256));
    }();
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
        install_overflow_handler(tw);
    }
    return tw;
}

// Runs blocks of job until none are left.
void work_on(Job* job) {
    Worker* w = this_worker();
    const cudaLaunchConfig_t& cfg = *job->cfg;
    w->body = job->body;
    w->block = cfg.blockDim;
    w->nthreads = (int)(cfg.blockDim.x * cfg.blockDim.y * cfg.blockDim.z);
    blockDim = cfg.blockDim;
    gridDim = cfg.gridDim;
    grow_pool(w, w->nthreads);
    for (int i = 0; i < w->nthreads; i++) {
        unsigned x = i % cfg.blockDim.x, y = (i / cfg.blockDim.x) % cfg.blockDim.y,
                 z = i / (cfg.blockDim.x * cfg.blockDim.y);
        w->threads[i]->tid = uint3{x, y, z};
    }
    w->dyn_smem_size = cfg.dynamicSmemBytes;
    w->dyn_smem = cfg.dynamicSmemBytes ? malloc(cfg.dynamicSmemBytes) : nullptr;
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
    Job job;
    job.body = &body;
    job.cfg = &cfg;
    job.total = (uint64_t)cfg.gridDim.x * cfg.gridDim.y * cfg.gridDim.z;
    pool().run(&job);
    g_launches++;
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
    yield_to_scheduler(w, t);
    return (int)t->result;
}

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width,
                         const char* file, int line) {
    Worker* w = tw;
    Thread* t = w ? w->current : nullptr;
    if (!t) fault("warp collective called outside a kernel", file, line);
    t->file = file;
    t->line = line;
    t->op = (int)op;
    unsigned lane = (unsigned)w->current_index % 32;
    if (!(mask >> lane & 1))
        die(w, t, std::string(warp_op_name((int)op)) + " at " + site(*t) + ": mask does not name the calling lane " +
                      std::to_string(lane));
    if (width <= 0 || width > 32 || (width & (width - 1)))
        die(w, t, std::string(warp_op_name((int)op)) + " at " + site(*t) + ": width " + std::to_string(width) +
                      " is not a power of two in [1, 32]");
    t->state = State::AtWarp;
    t->mask = mask;
    t->value = value;
    t->arg = arg;
    t->width = width;
    w->n_at_warp++;
    yield_to_scheduler(w, t);
    return t->result;
}

unsigned lane_id() { return tw && tw->current ? (unsigned)tw->current_index % 32 : 0; }

unsigned active_mask() {
    Worker* w = tw;
    int base = w->current_index / 32 * 32;
    unsigned m = 0;
    for (int j = 0; j < 32 && base + j < w->nthreads; j++)
        if (w->threads[base + j]->state != State::Exited) m |= 1u << j;
    return m;
}

void* dynamic_shared_memory() { return tw ? tw->dyn_smem : nullptr; }

void fault(const char* what, const char* file, int line) {
    Worker* w = tw;
    const char* slash = strrchr(file, '/');
    die(w, w ? w->current : nullptr, std::string(what) + " at " + (slash ? slash + 1 : file) + ":" + std::to_string(line));
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
    Dl_info info{};
    if (kernel && dladdr(kernel, &info) && info.dli_sname) {
        int status = 0;
        char* dem = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
        snprintf(buf, len, "%s", status == 0 && dem ? dem : info.dli_sname);
        free(dem);
    } else {
        snprintf(buf, len, "at %p (build with -rdynamic to see names)", kernel);
    }
    return buf;
}

}  // namespace simt
