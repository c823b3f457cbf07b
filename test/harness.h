// test/harness.h — the test harness every test shares: dtype-derived tolerances, one line per
// test, a final "N passed, N failed" and a non-zero exit code when anything failed; device
// buffers, storage-type inputs and child processes for the tests.
#pragma once
#include "../llmc/precision.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace th {

// Every regular file in a folder (not below it), by file name, and its bytes (none for a folder that
// cannot be read).
inline std::map<std::string, std::string> folder_files(const std::string& folder) {
    std::map<std::string, std::string> files;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
        if (!it->is_regular_file()) continue;
        std::ifstream in(it->path(), std::ios::binary);
        std::ostringstream bytes;
        bytes << in.rdbuf();
        files[it->path().filename().string()] = bytes.str();
    }
    return files;
}

// ----------------------------------------------------------------------------
// Tolerances (doc/testing.md): |out - ref| <= atol + k * eps * |ref|, eps the unit roundoff of the
// storage/compute dtype. A test states k (how many roundings its result can accumulate) and atol
// (the absolute floor, for results near zero) and says why; a budget is never widened to pass.

constexpr double EPS_FP32 = 1.0 / (1 << 23);  // 2^-23
constexpr double EPS_TF32 = 1.0 / (1 << 10);  // 10 explicit mantissa bits, like fp16
constexpr double EPS_FP16 = 1.0 / (1 << 10);  // 2^-10
constexpr double EPS_BF16 = 1.0 / (1 << 7);   // 2^-7
constexpr double EPS_E4M3 = 1.0 / (1 << 3);   // 3 mantissa bits
constexpr double EPS_E5M2 = 1.0 / (1 << 2);   // 2 mantissa bits

struct Tol {
    double atol;  // absolute floor
    double rtol;  // k * eps
};
inline Tol tol(double eps, double k, double atol) { return Tol{atol, k * eps}; }

// ----------------------------------------------------------------------------
// Tally

inline int& n_passed() { static int n = 0; return n; }
inline int& n_failed() { static int n = 0; return n; }

// Records one test result and prints its line: "PASS name  detail" or "FAIL name  detail".
inline bool report(bool ok, const char* name, const char* fmt = "", ...) {
    char detail[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, detail[0] ? "  " : "", detail);
    fflush(stdout);
    (ok ? n_passed() : n_failed())++;
    return ok;
}

inline void end_replay();  // see run_in_child

// Prints the final tally and returns the process exit code (0 only when nothing failed).
inline int finish() {
    end_replay();
    printf("%d passed, %d failed\n", n_passed(), n_failed());
    return n_failed() == 0 ? 0 : 1;
}

// ----------------------------------------------------------------------------
// Comparisons

inline double to_double(float x) { return x; }
inline double to_double(double x) { return x; }
inline double to_double(__nv_bfloat16 x) { return __bfloat162float(x); }
inline double to_double(__half x) { return __half2float(x); }

// Compares out(i) against ref(i) for i < n, each under its own budget(i) (all three return
// doubles); reports the max abs error and the largest share of an element's budget used (a pass
// uses at most 100%).
template <class Out, class Ref, class Budget>
bool check_each(const char* name, size_t n, Out out, Ref ref, Budget budget) {
    double max_err = 0, worst_share = 0;
    size_t worst_i = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double err = std::fabs(out(i) - ref(i)), b = budget(i);
        double share = b > 0 ? err / b : (err > 0 ? INFINITY : 0);
        if (!(err <= b)) bad++;  // NaN fails too
        if (std::isnan(err)) share = INFINITY;
        if (err > max_err || std::isnan(err)) max_err = err;
        if (share > worst_share) { worst_share = share; worst_i = i; }
    }
    return report(bad == 0, name, "max_err=%.3g budget_used=%.0f%% (n=%zu, bad=%zu, worst at %zu: out=%.9g ref=%.9g)",
                  max_err, worst_share * 100, n, bad, worst_i, n ? out(worst_i) : 0, n ? ref(worst_i) : 0);
}

// Compares out against ref element-wise under tol. T and R need a to_double overload (float,
// double, __nv_bfloat16 and __half are provided above).
template <class T, class R>
bool check_close(const char* name, const R* ref, const T* out, size_t n, Tol t) {
    return check_each(name, n, [&](size_t i) { return to_double(out[i]); }, [&](size_t i) { return to_double(ref[i]); },
                      [&](size_t i) { return t.atol + t.rtol * std::fabs(to_double(ref[i])); });
}

// Compares out against ref element-wise, each element under its own budget: for errors that
// depend on more than |ref| (the sum of |terms| of a dot product, the conditioning of a function).
template <class T>
bool check_budget(const char* name, const std::vector<double>& ref, const std::vector<T>& out,
                  const std::vector<double>& budget) {
    return check_each(name, ref.size(), [&](size_t i) { return to_double(out[i]); }, [&](size_t i) { return ref[i]; },
                      [&](size_t i) { return budget[i]; });
}

// Bitwise equality of two buffers (used for determinism and schedule-order checks).
inline bool check_bitwise(const char* name, const void* a, const void* b, size_t bytes) {
    const unsigned char* pa = (const unsigned char*)a;
    const unsigned char* pb = (const unsigned char*)b;
    size_t first = bytes;
    for (size_t i = 0; i < bytes; i++)
        if (pa[i] != pb[i]) { first = i; break; }
    if (first == bytes) return report(true, name, "bit-identical (%zu bytes)", bytes);
    return report(false, name, "first differing byte at %zu of %zu", first, bytes);
}

// ----------------------------------------------------------------------------
// Inputs in a storage type

// Deterministic pseudo-random fill in [lo, hi), so tests need no global RNG state.
inline void fill_uniform(float* x, size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / (1ull << 24)));
    }
}

// Each value of f rounded to the storage type T (nearest even, as the kernels round).
template <class T>
std::vector<T> round_to(const std::vector<float>& f) {
    std::vector<T> t(f.size());
    for (size_t i = 0; i < f.size(); i++) t[i] = from_float<T>(f[i]);
    return t;
}

// n values uniform in [lo, hi), rounded to the storage type T, so that a reference computed
// from them sees exactly what the kernel sees.
template <class T>
std::vector<T> random_tensor(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    std::vector<float> f(n);
    fill_uniform(f.data(), n, seed, lo, hi);
    return round_to<T>(f);
}

// The values of a storage-type vector as doubles, for references and comparisons.
template <class T>
std::vector<double> widen(const std::vector<T>& t) {
    std::vector<double> d(t.size());
    for (size_t i = 0; i < t.size(); i++) d[i] = to_double(t[i]);
    return d;
}

// The storage type's name in test names.
template <class T> const char* dtype_name();
template <> inline const char* dtype_name<float>() { return "fp32"; }
template <> inline const char* dtype_name<__nv_bfloat16>() { return "bf16"; }
template <> inline const char* dtype_name<__half>() { return "fp16"; }

// ----------------------------------------------------------------------------
// Device memory

// n elements of T copied from device memory to a host vector.
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// What a new DeviceBuffer holds: whatever the allocator left, zero bytes, or all-ones bytes
// (NaN in fp32, bf16 and fp16, so that an element a kernel fails to write shows in the comparison).
enum class Fill { None, Zero, NaN };

// A device allocation of exactly n elements of T, freed on scope exit. Exact, so that the CPU
// backend's AddressSanitizer build catches any access past n.
template <class T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t n = 0;

    explicit DeviceBuffer(size_t count, Fill fill = Fill::None) : n(count) {
        cudaCheck(cudaMalloc(&ptr, n * sizeof(T)));
        if (fill == Fill::None) return;
        cudaCheck(cudaMemset(ptr, fill == Fill::Zero ? 0 : 0xff, n * sizeof(T)));
        // cudaMemset runs on the legacy default stream, which orders nothing on a non-blocking
        // stream: wait, so that the buffer is filled before work on any stream uses it.
        cudaCheck(cudaDeviceSynchronize());
    }
    // A device copy of h.
    explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) { upload(h); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    ~DeviceBuffer() { cudaCheck(cudaFree(ptr)); }

    // Overwrites the n elements with h's first n.
    void upload(const std::vector<T>& h) {
        cudaCheck(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    // The n elements, copied to the host.
    std::vector<T> host() const { return to_host(ptr, n); }
};

// A device copy of h at element `offset` of an exactly sized, zeroed allocation of offset +
// h.size() elements: offset > 0 gives a view that 128-bit accesses cannot use (the scalar path).
template <class T>
struct DeviceView {
    DeviceBuffer<T> base;
    T* ptr;
    size_t n;

    DeviceView(const std::vector<T>& h, size_t offset)
        : base(offset + h.size(), Fill::Zero), ptr(base.ptr + offset), n(h.size()) {
        cudaCheck(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    }
    // The view's n elements, copied to the host.
    std::vector<T> host() const { return to_host(ptr, n); }
};

// Whether `measured`, by how much the device's bytes in use (cudaMemGetInfo) grew, is what `count`
// cudaMallocs of `bytes` in all take. The CPU backend counts exactly the bytes allocated. A GPU
// reserves memory in pages (its allocation granularity: 2 MiB on the A100 and H100) and packs small
// allocations together (on an H100, those of up to 1 MiB, 512-byte aligned): a 4-byte cudaMalloc
// takes a new 2 MiB page, or nothing where a page reserved before has room; a 3 MiB one takes 4 MiB.
// So each allocation moves the bytes in use by its size give or take less than a page, and the GPU
// check fails only when `bytes` is off by `count` pages or more: loose for the tests' small models,
// whose exact check is the CPU backend's.
inline bool device_bytes_match(size_t measured, size_t bytes, size_t count) {
#if defined(SIMT_CPU)
    return measured == bytes;
#else
    const size_t page = 2 << 20;
    return measured < bytes + count * page && bytes < measured + count * page;
#endif
}

// ----------------------------------------------------------------------------
// Child processes: a test of an error path runs it in a child, which must stop with a message.
//
// A forked child shares everything the test has set up (objects, files, temporary paths), so
// run_in_child forks first. But on a GPU a CUDA context does not survive fork(): once the test has
// used the device, a forked child's first CUDA call fails with cudaErrorInitializationError (its
// first cuBLASLt call with CUBLAS_STATUS_NOT_INITIALIZED), before the code under test gets to its
// check. Such a case runs again in a fresh process, which starts CUDA itself: the test binary
// (/proc/self/exe, the same arguments) with TH_REPLAY=k in its environment replays the test up to
// its k-th run_in_child call, with stdout and stderr discarded and every earlier call skipped, then
// runs that call's body with stderr to the parent and exits. It rebuilds the same state, provided
// the test makes the same run_in_child calls every run; its temporary directories are its own. On
// the CPU backend a forked child can use the device, so nothing is replayed there.

// What a child process left: its raw wait status (decode with WIFEXITED/WEXITSTATUS) and output.
struct ChildOutput {
    int status;
    std::string text;
};

// Runs a shell command; returns its status and stdout (append 2>&1 to capture stderr too).
inline ChildOutput run_command(const std::string& cmd) {
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t got;
    while (p && (got = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
    return {p ? pclose(p) : -1, out};
}

// Reads fd (a child's end of a pipe) to its end and closes it, then waits for the child pid.
inline ChildOutput collect_child(pid_t pid, int fd) {
    std::string text;
    char buf[1024];
    ssize_t got;
    while ((got = read(fd, buf, sizeof(buf))) > 0) text.append(buf, got);
    close(fd);
    int status = 0;
    waitpid(pid, &status, 0);
    return {status, text};
}

// In a process replaying the test: the run_in_child call it runs (counted from 0) and the pipe for
// that call's stderr; call -1 otherwise. Set up before main: TH_REPLAY leaves the environment (no
// program the test starts inherits it), and stdout and stderr go to /dev/null until the call.
struct Replay {
    long call = -1;
    int fd = -1;
};
inline Replay start_replay() {
    Replay r;
    const char* call = getenv("TH_REPLAY");
    if (!call) return r;
    r.call = atol(call);
    unsetenv("TH_REPLAY");
    r.fd = fcntl(2, F_DUPFD_CLOEXEC, 3);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
    close(devnull);
    return r;
}
inline const Replay replay = start_replay();

// Whether this process replays the test for one run_in_child case. A test may skip, when replaying,
// work that makes no run_in_child call and that no later case depends on (long program runs), so
// that a replay does not take as long as the whole test.
inline bool replaying() { return replay.call >= 0; }

// The number of run_in_child calls so far.
inline long& child_calls() { static long n = 0; return n; }

// Runs body() in a forked child (which exits 0 if body returns); returns its status and stderr.
template <class F>
ChildOutput fork_child(F& body) {
    int fds[2];
    if (pipe(fds) != 0) return {-1, "pipe failed"};
    fflush(stdout);  // or the child's exit would print what the parent buffered a second time
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        body();
        _exit(0);
    }
    close(fds[1]);
    return collect_child(pid, fds[0]);
}

// Runs run_in_child call number `call` in a process that replays the test up to it; returns that
// process's status and the call's stderr.
inline ChildOutput replay_in_child(long call) {
    std::string args;  // the test's arguments, each ended by '\0'
    if (FILE* f = fopen("/proc/self/cmdline", "rb")) {
        char buf[4096];
        size_t got;
        while ((got = fread(buf, 1, sizeof(buf), f)) > 0) args.append(buf, got);
        fclose(f);
    }
    std::vector<char*> argv;
    for (size_t at = 0; at < args.size(); at += strlen(&args[at]) + 1) argv.push_back(&args[at]);
    argv.push_back(nullptr);
    std::string tag = "TH_REPLAY=" + std::to_string(call);
    std::vector<char*> envp;
    for (char** e = environ; *e; e++) envp.push_back(*e);
    envp.push_back(&tag[0]);
    envp.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) return {-1, "pipe failed"};
    // Between fork and exec only async-signal-safe calls: CUDA runs threads in this process, and one
    // of them may hold a lock (malloc's, stdio's) that the child's copy would never see released.
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);  // until the replay sets its stderr aside, errors (the loader's) reach the parent
        close(fds[0]);
        close(fds[1]);
        execve("/proc/self/exe", argv.data(), envp.data());
        _exit(127);
    }
    close(fds[1]);
    return collect_child(pid, fds[0]);
}

// How a forked child's first use of the device fails once the test has used it before the fork, as
// the project's error checks report it: cudaCheck names the CUDA runtime's error, and cublasCheck
// gives cuBLASLt's status (CUBLAS_STATUS_NOT_INITIALIZED, for the handle the child inherited or
// could not create).
constexpr const char* kForkedDeviceErrors[] = {"cudaErrorInitializationError",
                                               "[cuBLASLt ERROR] the library was not initialized (1)"};

// Runs body() in a child process (which exits 0 if body returns); returns its status and stderr:
// forked, or replayed where a forked child cannot use the device (see above).
template <class F>
ChildOutput run_in_child(F body) {
    long call = child_calls()++;
    if (replay.call >= 0) {  // this process replays the test for one call
        if (call < replay.call) return {-1, ""};
        dup2(replay.fd, 2);
        close(replay.fd);
        body();
        exit(0);  // not _exit: the process is its own, so its atexit cleanup (temporary files) runs
    }
    ChildOutput child = fork_child(body);
    for (const char* error : kForkedDeviceErrors)
        if (child.text.find(error) != std::string::npos) return replay_in_child(call);
    return child;
}

// run_in_child with the child's stdout going where its stderr goes: the text of a tool that prints
// its results, for a test of what it says.
template <class F>
ChildOutput run_in_child_with_stdout(F body) {
    return run_in_child([&] {
        dup2(2, 1);
        body();
        fflush(stdout);
    });
}

// A replay that reaches the end of the test never met its call (the test's calls differ between
// runs): it says so and fails.
inline void end_replay() {
    if (replay.call < 0) return;
    dprintf(replay.fd, "the replay of the test ended before its run_in_child call %ld\n", replay.call);
    exit(1);
}

}  // namespace th

// ----------------------------------------------------------------------------
// Schedule orders (CPU backend only): a deterministic kernel must give bit-identical results
// whatever order the threads run in between two sync points, and whichever tile element each WMMA
// fragment's x[i] holds (CUDA leaves both unspecified); a missing __syncthreads, or a kernel that
// assumes a fragment layout, shows up as a difference. On a GPU there is one (hardware) order and
// layout, and run_orders just runs.
#if defined(SIMT_CPU)
#include <mma.h>

namespace th {
// Runs `run` (launches kernels, returns a std::vector of host results) under forward, reverse and
// seeded-random thread orders, each with its own fragment order (the process's, SIMT_FRAGMENT_ORDER,
// then the next two seeds), reports whether all results are bit-identical, and returns the
// forward-order result. Under AddressSanitizer (make test-asan) the random order is left out: that
// build looks for memory errors, which two orders exercise as fully as three, and make test runs the
// same checks unsanitized with all three (the random order is most of a kernel test's time there). On a difference, more runs in forward thread order tell which of the two
// the results depend on: the fragment order when the first configuration repeats its result and
// the second fragment order alone changes it; else the threads (a race also makes one
// configuration give different results, after runs that left other values in memory).
template <class F>
auto run_orders(const char* name, F run) -> decltype(run()) {
    simt::Order saved = simt::get_order();
    uint64_t frag = simt::get_fragment_order();
    auto run_under = [&](simt::Order order, uint64_t seed, uint64_t fragment_order) {
        simt::set_order(order, seed);
        simt::set_fragment_order(fragment_order);
        return run();
    };
    auto fwd = run_under(simt::Order::Forward, 0, frag);
    auto same_as_fwd = [&](const decltype(fwd)& other) {
        size_t bytes = fwd.size() * sizeof(fwd[0]);
        return other.size() == fwd.size() && (bytes == 0 || memcmp(fwd.data(), other.data(), bytes) == 0);
    };
#if defined(__SANITIZE_ADDRESS__)
    constexpr bool all_three = false;
#else
    constexpr bool all_three = true;
#endif
    bool same = same_as_fwd(run_under(simt::Order::Reverse, 0, frag + 1)) &&
                (!all_three || same_as_fwd(run_under(simt::Order::Random, 12345, frag + 2)));
    if (same && all_three)
        report(true, name,
               "bit-identical under forward, reverse and random thread orders (fragment orders %llu, %llu, %llu)",
               (unsigned long long)frag, (unsigned long long)frag + 1, (unsigned long long)frag + 2);
    else if (same)
        report(true, name, "bit-identical under forward and reverse thread orders (fragment orders %llu, %llu; "
               "AddressSanitizer build: make test adds the random order)",
               (unsigned long long)frag, (unsigned long long)frag + 1);
    else if (same_as_fwd(run_under(simt::Order::Forward, 0, frag)) &&
             !same_as_fwd(run_under(simt::Order::Forward, 0, frag + 1)))
        report(false, name, "results differ between fragment orders %llu and %llu (SIMT_FRAGMENT_ORDER): a kernel "
               "assumes which tile element a WMMA fragment's x[i] holds", (unsigned long long)frag,
               (unsigned long long)frag + 1);
    else
        report(false, name, "results differ between thread orders (missing __syncthreads/__syncwarp?)");
    simt::set_order(saved);
    simt::set_fragment_order(frag);
    return fwd;
}
}  // namespace th
#else
namespace th {
template <class F>
auto run_orders(const char*, F run) -> decltype(run()) { return run(); }
}  // namespace th
#endif

// ----------------------------------------------------------------------------
// Faults (CPU backend only): what CUDA leaves undefined (a GPU may hang or misbehave) the backend
// reports, stopping the program with exit status 3 and a message on stderr.
#if defined(SIMT_CPU)
namespace th {
// Whether fault tests can run: fork() keeps only the calling thread, so a child would lose the
// worker pool that SIMT_THREADS > 1 starts. Prints a SKIP line when they cannot.
inline bool can_run_fault_tests() {
    const char* threads = getenv("SIMT_THREADS");
    if (threads && atoi(threads) > 1) {
        printf("SKIP fault tests (need SIMT_THREADS=1)\n");
        return false;
    }
    return true;
}

// Runs launch() and a device sync in a child process; passes when the child stops with the fault
// status and its stderr contains `expect`. The reported stderr hides what changes between runs:
// which thread faults first (it depends on the schedule order) and addresses.
template <class F>
void expect_fault(const char* name, const char* expect, F launch) {
    ChildOutput child = run_in_child([&] {
        launch();
        cudaDeviceSynchronize();
    });
    std::string& err = child.text;
    bool ok = WIFEXITED(child.status) && WEXITSTATUS(child.status) == 3 && err.find(expect) != std::string::npos;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    size_t th_at = err.find(", thread (");
    if (th_at != std::string::npos) err.erase(th_at, err.find("): ", th_at) + 1 - th_at);
    for (size_t at = err.find("0x"); at != std::string::npos; at = err.find("0x", at + 2)) {
        size_t end = at + 2;
        while (end < err.size() && isxdigit((unsigned char)err[end])) end++;
        err.replace(at + 2, end - at - 2, "...");
    }
    report(ok, name, "exit=%d stderr: %s", WIFEXITED(child.status) ? WEXITSTATUS(child.status) : -1, err.c_str());
}
}  // namespace th
#endif

// ----------------------------------------------------------------------------
// Suite binaries

// A test that includes a trainer keeps its code, main included, in a namespace named after it, and
// TH_MAIN(name) makes that main the program's. For the CPU backend such tests are also built into
// one binary per trainer (TH_SUITE: test/gpt2_suite.cu, test/bert_suite.cu), which compiles the
// trainer's kernels once for all of them instead of once per test, most of each test's build time;
// the suite's main runs the test named by the file name it was started as (`make test` links each
// test's name to its suite), so a suite's tests run, and start themselves again, as separate programs.
#ifdef TH_SUITE
#define TH_MAIN(name)
#else
#define TH_MAIN(name) \
    int main(int argc, char** argv) { return name::main(argc, argv); }
#endif

namespace th {

// The program this test runs as, to start it again: argv[0], made absolute. Not /proc/self/exe, which
// names the file behind a link: a suite's test is a link whose name selects the test.
inline std::string self_path(const char* argv0) {
    char buf[4096];
    if (!strchr(argv0, '/')) {  // found on PATH: a binary of its own
        ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
        buf[n > 0 ? n : 0] = 0;
        return buf;
    }
    if (argv0[0] == '/' || !getcwd(buf, sizeof(buf))) return argv0;
    return std::string(buf) + "/" + argv0;
}

struct SuiteTest {
    const char* name;
    int (*main)(int argc, char** argv);
};

// Runs the test of `tests` whose name is argv[0]'s file name.
inline int suite_main(int argc, char** argv, const std::vector<SuiteTest>& tests) {
    const char* slash = strrchr(argv[0], '/');
    const char* name = slash ? slash + 1 : argv[0];
    for (const SuiteTest& t : tests)
        if (strcmp(t.name, name) == 0) return t.main(argc, argv);
    fprintf(stderr, "%s: a suite of tests; start it as one of them (a link named", name);
    for (const SuiteTest& t : tests) fprintf(stderr, " %s", t.name);
    fprintf(stderr, ")\n");
    return 2;
}

}  // namespace th
