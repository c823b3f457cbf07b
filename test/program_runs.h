// test/program_runs.h — running a trainer program from a test, as a user runs it (one process, or
// several under mpirun), and reading what it printed and wrote.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

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

// The "loss X" figures of the step lines of a run's output.
inline std::vector<double> step_losses(const std::string& out) {
    std::vector<double> losses;
    for (size_t at = out.find("step "); at != std::string::npos; at = out.find("\nstep ", at + 1)) {
        size_t l = out.find("| loss ", at), eol = out.find('\n', at + 1);
        if (l != std::string::npos && l < eol) losses.push_back(atof(out.c_str() + l + 7));
    }
    return losses;
}

// A file's bytes as a string ("<missing PATH>" when it cannot be read).
inline std::string slurp(const std::string& path) {
    std::vector<uint8_t> b;
    std::string err;
    if (!read_whole_file(path, &b, &err)) return "<missing " + path + ">";
    return std::string(b.begin(), b.end());
}

// The end of a run's output, for a failure's detail.
inline std::string last_lines(const std::string& out) {
    return out.size() > 600 ? out.substr(out.size() - 600) : out;
}

}  // namespace th
