// llmc/fatal.h — how a fatal error ends the program, shared by the CUDA and the host-only code.
//
// Fatal errors print their message after fatal_error_prefix, then end the program with fatal_exit().
// A single process leaves both alone; a multi-process run (llmc/distributed.h) sets the prefix to
// "rank R/W: " and the hook to MPI_Abort, so the message names the rank and the whole job stops
// instead of leaving the other ranks waiting in a collective.
#pragma once
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <thread>

inline const char* fatal_error_prefix = "";
inline void (*fatal_error_hook)(int status) = nullptr;
inline int fatal_error_rank = 0;  // this process's rank in a multi-process run (llmc/distributed.h)
inline const char* fatal_error_program = "";  // the program's name (llmc/cli.h's Cli sets it)

// What an error line starts with: the rank's prefix in a multi-process run, else "PROGRAM: error: "
// (as the command-line parser's own errors), or "error: " before a program is named. Written into
// buf (n bytes); returns its length.
inline int fatal_error_lead(char* buf, size_t n) {
    if (*fatal_error_prefix) return snprintf(buf, n, "%s", fatal_error_prefix);
    if (*fatal_error_program) return snprintf(buf, n, "%s: error: ", fatal_error_program);
    return snprintf(buf, n, "error: ");
}

// A bad option is met by every rank alike (each parses the same command line): rank 0 says it, and
// the launcher ends the job when rank 0 stops. Another rank waits a moment before it says the same,
// so that the line is printed once, not once per rank; if the error was its own, it still says it.
inline void let_rank0_report_first() {
    if (fatal_error_rank > 0) std::this_thread::sleep_for(std::chrono::seconds(3));
}

// status: EXIT_FAILURE for an error; 2 for an option that turned out wrong after parsing (--help's codes).
[[noreturn]] inline void fatal_exit(int status = EXIT_FAILURE) {
    if (fatal_error_hook) fatal_error_hook(status);
    exit(status);
}

// Prints one error line ("train_gpt2: error: ..."; in a multi-rank run the rank's prefix) and ends the program
// with status through fatal_exit: what data_error, option_error and the BERT loader's errors share.
[[noreturn]] inline void error_line_exit(int status, const char* fmt, va_list ap) {
    if (status == 2) let_rank0_report_first();
    char lead[64];
    fatal_error_lead(lead, sizeof(lead));
    fprintf(stderr, "%s", lead);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fatal_exit(status);
}
