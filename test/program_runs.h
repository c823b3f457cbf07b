// test/program_runs.h — running a trainer program from a test, as a user runs it (one process, or
// several under mpirun), and reading what it printed and wrote.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "../llmc/file_io.h"
#include "harness.h"

namespace th {

// mpirun's options for the processes of one program context: under make test-asan they get
// MPI_LSAN_OPTIONS as their LSAN_OPTIONS (see the Makefile). An option given before a context is that
// context's, so a multi-program command (`A : B`) repeats them for each.
inline std::string mpirun_context_options() {
    const char* lsan = getenv("MPI_LSAN_OPTIONS");
    return lsan && *lsan ? " -x LSAN_OPTIONS=" + std::string(lsan) : "";
}

// The command prefix that starts `ranks` processes under mpirun ("" for 0: one process, no mpirun).
inline std::string mpirun_prefix(int ranks) {
    if (ranks <= 0) return "";
    return "mpirun --oversubscribe" + std::string(getuid() == 0 ? " --allow-run-as-root" : "") +
           mpirun_context_options() + " -np " + std::to_string(ranks) + " ";
}

inline bool exited_ok(const ChildOutput& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

// A row of the memory anatomy a trainer prints ("  activations   103.8 MiB  15.01 B/param  ..."): its
// bytes per parameter, the finer of its two figures; -1 when the output has no such row.
inline double anatomy_bytes_per_param(const std::string& out, const std::string& row) {
    size_t at = out.find("  " + row + " ");
    at = at == std::string::npos ? at : out.find("MiB", at);
    return at == std::string::npos ? -1.0 : atof(out.c_str() + at + 3);
}

// The "loss X" figures of the step lines of a run's output.
inline std::vector<double> step_losses(const std::string& out) {
    std::vector<double> losses;
    for (size_t at = out.find("step "); at != std::string::npos; at = out.find("\nstep ", at + 1)) {
        size_t l = out.find("| loss ", at), eol = out.find('\n', at + 1);
        if (l != std::string::npos && l < eol) losses.push_back(atof(out.c_str() + l + 7));
    }
    return losses;
}

// Values as "a, b, c" (%.6f each), for a test's detail.
inline std::string join(const std::vector<double>& v) {
    std::string s;
    char buf[32];
    for (double x : v) {
        snprintf(buf, sizeof(buf), "%s%.6f", s.empty() ? "" : ", ", x);
        s += buf;
    }
    return s;
}

// The validation lines of train_gpt2's output ("step N | val loss X"), as printed.
inline std::vector<std::string> val_loss_lines(const std::string& out) {
    std::vector<std::string> lines;
    for (size_t at = out.find("| val loss "); at != std::string::npos; at = out.find("| val loss ", at + 1)) {
        size_t bol = out.rfind('\n', at), eol = out.find('\n', at);
        bol = bol == std::string::npos ? 0 : bol + 1;
        lines.push_back(out.substr(bol, eol == std::string::npos ? std::string::npos : eol - bol));
    }
    return lines;
}

// A file's bytes as a string ("<missing PATH>" when it cannot be read).
inline std::string slurp(const std::string& path) {
    std::vector<uint8_t> b;
    std::string err;
    if (!read_whole_file(path, &b, &err)) return "<missing " + path + ">";
    return std::string(b.begin(), b.end());
}

// Runs `sh -c "exec COMMAND > out_file 2>&1"` (COMMAND's own pid, to send it signals) until its
// output holds `text`, then sends it sig; returns its wait status and output. If the text does not
// come (COMMAND ends first, or two minutes pass) the signal is not sent, and a COMMAND still running
// is killed. The command line is built before fork(): on a GPU the test's CUDA threads may hold
// malloc's lock, which the child's copy would never see released. COMMAND starts with sig's default
// action and sig unblocked, as from a terminal: a test run in the background by a non-interactive
// shell (scripts/run_tests.sh) inherits SIGINT ignored, which would otherwise stay ignored wherever
// the program does not install its own handler.
inline ChildOutput signal_when(const std::string& command, const std::string& out_file, const std::string& text,
                               int sig) {
    const std::string line = "exec " + command + " > " + out_file + " 2>&1";
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction dfl = {};
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, nullptr);
        sigset_t just;
        sigemptyset(&just);
        sigaddset(&just, sig);
        sigprocmask(SIG_UNBLOCK, &just, nullptr);
        execl("/bin/sh", "sh", "-c", line.c_str(), (char*)nullptr);
        _exit(127);
    }
    int status = 0;
    bool ended = false, seen = false;
    for (int waited_ms = 0; !ended && !seen && waited_ms < 120000; waited_ms += 10) {
        seen = slurp(out_file).find(text) != std::string::npos;
        ended = !seen && waitpid(pid, &status, WNOHANG) == pid;
        if (!seen && !ended) usleep(10000);
    }
    if (!ended) {
        kill(pid, seen ? sig : SIGKILL);
        waitpid(pid, &status, 0);
    }
    return {seen ? status : -1, slurp(out_file)};
}

// The first number after `prefix` in text; -1 if prefix is not there.
inline long long number_after(const std::string& text, const std::string& prefix) {
    size_t at = text.find(prefix);
    return at == std::string::npos ? -1 : atoll(text.c_str() + at + prefix.size());
}

// The end of a run's output, for a failure's detail.
inline std::string last_lines(const std::string& out) {
    return out.size() > 600 ? out.substr(out.size() - 600) : out;
}

// The options a program's --help lists (llmc/cli.h's layout), one per option without the prose:
// "-b --batch-size INT [4]", "-y --resume", "--label NAME [none]" — what a user's command lines and
// scripts rely on: the flags, the value each takes and its default.
inline std::vector<std::string> option_listing(const std::string& help) {
    std::vector<std::string> out;
    for (size_t at = 0; at < help.size();) {
        size_t end = help.find('\n', at);
        if (end == std::string::npos) end = help.size();
        std::string line = help.substr(at, end - at);
        at = end + 1;
        if (line.size() < 8 || line.compare(0, 2, "  ") != 0 || line.find("--", 2) != 7) continue;
        std::string alias = line.substr(2, 4);
        alias = alias.substr(0, alias.find_first_of(", "));
        size_t left_end = line.find("  ", 7);  // the left column ends at its padding
        std::string left = line.substr(7, left_end - 7);
        std::string entry = (alias.empty() ? "" : alias + " ") + left;
        if (left.find(' ') != std::string::npos) {  // an option with a value: its default ends the line
            size_t open = line.rfind(" [");
            if (open != std::string::npos && line.back() == ']') entry += line.substr(open);
        }
        out.push_back(entry);
    }
    return out;
}

// Compares the option listing of `help` with the expected one in `path` (one per line, '#' lines
// are comments); returns "" or the first difference.
inline std::string compare_option_listing(const std::string& help, const std::string& path) {
    std::vector<std::string> want, got = option_listing(help);
    std::string text = slurp(path);
    for (size_t at = 0; at < text.size();) {
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(at, end - at);
        at = end + 1;
        if (!line.empty() && line[0] != '#') want.push_back(line);
    }
    for (const std::string& w : want)
        if (std::find(got.begin(), got.end(), w) == got.end()) return "missing or changed: " + w;
    for (const std::string& g : got)
        if (std::find(want.begin(), want.end(), g) == want.end()) return "not expected: " + g;
    return want.empty() ? "no options in " + path : "";
}

}  // namespace th
