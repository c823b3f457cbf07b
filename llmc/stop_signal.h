// llmc/stop_signal.h — stopping a training run on a signal at the end of a step, with a checkpoint,
// instead of losing the work since the last one.
//
// Ctrl-C (SIGINT), a scheduler's SIGTERM (Slurm sends it at the time limit, then SIGKILL after its
// KillWait, 30 s by default) and SIGUSR1 (a plain request to stop: Slurm's `--signal=USR1@120`
// sends it two minutes before the limit, and Open MPI's mpirun passes it on to every rank) each
// ask the run to stop after the step in progress. The trainers then write a checkpoint of that
// step when they have an output directory, so that --resume continues from it, and exit with
// 128 + the signal's number: what a shell reports for a process the signal ended (130 for Ctrl-C),
// so that a job script sees the run did not finish. A second signal ends the process at once (the
// signal's default action), for a step that takes too long to wait for.
//
// The ranks of a multi-process run stop after the same step, whichever of them got the signal: at
// each step's end every rank takes the largest signal number any rank received (one integer
// all-gather on the host, next to the loss's). The handler only records the number and writes a
// line to stderr: both are async-signal-safe; everything else happens at the step's end.
#pragma once
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

#include "distributed.h"

// The first stop signal received while a StopOnSignal is installed (0: none).
inline volatile sig_atomic_t& stop_signal_received() {
    static volatile sig_atomic_t sig = 0;
    return sig;
}

// Whether the handler says so on stderr (rank 0 only: mpirun passes a signal on to every rank).
inline volatile sig_atomic_t& stop_signal_announce() {
    static volatile sig_atomic_t on = 1;
    return on;
}

extern "C" inline void stop_signal_handler(int sig) {
    if (stop_signal_received() != 0) {  // the second: the default action (the process ends)
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, nullptr);
        raise(sig);
        return;
    }
    stop_signal_received() = sig;
    if (!stop_signal_announce()) return;
    static const char msg[] = "\nsignal received: stopping after the step in progress (again to stop at once)\n";
    ssize_t written = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)written;  // nothing to do in a handler if stderr is gone
}

// The name a message gives a stop signal.
inline const char* stop_signal_name(int sig) {
    switch (sig) {
    case SIGINT: return "SIGINT (Ctrl-C)";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
    }
}

// While it lives (a run's training loop), SIGINT, SIGTERM and SIGUSR1 ask the run to stop after
// the step in progress; it restores the handlers it found when it goes (or at uninstall()). One at a
// time.
class StopOnSignal {
  public:
    explicit StopOnSignal(const Distributed& dist) {
        stop_signal_received() = 0;
        stop_signal_announce() = dist.rank == 0;
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = stop_signal_handler;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;  // reads and writes the signal interrupts go on
        for (int i = 0; i < kCount; i++) sigaction(kSignals[i], &sa, &previous_[i]);
    }
    ~StopOnSignal() { uninstall(); }
    // Restores the handlers it found (once: the destructor then has nothing to do).
    void uninstall() {
        if (!installed_) return;
        for (int i = 0; i < kCount; i++) sigaction(kSignals[i], &previous_[i], nullptr);
        installed_ = false;
    }
    StopOnSignal(const StopOnSignal&) = delete;
    StopOnSignal& operator=(const StopOnSignal&) = delete;

    // The signal that asks the run to stop after this step (0: none), the same on every rank.
    // Collective: every rank calls it at the end of every step.
    int requested(const Distributed& dist) const { return all_reduce_max_scalar(dist, (int)stop_signal_received()); }

  private:
    static constexpr int kCount = 3;
    static constexpr int kSignals[kCount] = {SIGINT, SIGTERM, SIGUSR1};
    struct sigaction previous_[kCount];
    bool installed_ = true;
};

// Says where a run a signal stopped ended (after step `done` of `steps`) and returns its exit status,
// 128 + the signal's number. With an output_dir, a checkpoint of step `done` is there.
inline int report_stop_on_signal(int sig, int done, int steps, const std::string& output_dir) {
    if (!output_dir.empty())
        printf("stopped by %s after step %d of %d; continue with --resume (checkpoint in %s)\n", stop_signal_name(sig),
               done, steps, output_dir.c_str());
    else
        printf("stopped by %s after step %d of %d; nothing saved (no --output-dir)\n", stop_signal_name(sig), done,
               steps);
    fflush(stdout);
    return 128 + sig;
}
