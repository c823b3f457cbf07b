// test/harness_mpi.h — test results of a multi-rank test (under mpirun): every rank judges, rank 0
// prints one line per test and keeps the tally (test/harness.h).
#pragma once
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "../llmc/distributed.h"
#include "harness.h"

namespace th {

// Collects every rank's verdict on rank 0, which prints one line: rank 0's detail when all passed,
// otherwise each failing rank's detail. Returns this rank's verdict.
inline bool report_all(const Distributed& d, const char* name, bool ok, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
inline bool report_all(const Distributed& d, const char* name, bool ok, const char* fmt, ...) {
    struct Msg {
        int ok;
        char detail[240];
    } mine{ok, ""};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mine.detail, sizeof(mine.detail), fmt, ap);
    va_end(ap);
    std::vector<Msg> all(d.world);
    MPI_Gather(&mine, sizeof(Msg), MPI_BYTE, all.data(), sizeof(Msg), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (d.rank != 0) return ok;
    bool all_ok = true;
    std::string text;
    for (int r = 0; r < d.world; r++)
        if (!all[r].ok) {
            all_ok = false;
            text += "rank " + std::to_string(r) + ": " + all[r].detail + "; ";
        }
    return report(all_ok, name, "%s", all_ok ? mine.detail : text.c_str());
}

}  // namespace th
