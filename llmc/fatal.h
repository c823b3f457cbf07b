// llmc/fatal.h — how a fatal error ends the program, shared by the CUDA and the host-only code.
//
// Fatal errors print their message after fatal_error_prefix, then end the program with fatal_exit().
// A single process leaves both alone; a multi-process run (llmc/distributed.h) sets the prefix to
// "rank R/W: " and the hook to MPI_Abort, so the message names the rank and the whole job stops
// instead of leaving the other ranks waiting in a collective.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

inline const char* fatal_error_prefix = "";
inline void (*fatal_error_hook)(int status) = nullptr;
// status: EXIT_FAILURE for an error; 2 for an option that turned out wrong after parsing (--help's codes).
[[noreturn]] inline void fatal_exit(int status = EXIT_FAILURE) {
    if (fatal_error_hook) fatal_error_hook(status);
    exit(status);
}

// Prints one error line ("error: ..."; in a multi-rank run the rank's prefix) and ends the program
// with status through fatal_exit: what data_error, option_error and the BERT loader's errors share.
[[noreturn]] inline void error_line_exit(int status, const char* fmt, va_list ap) {
    fprintf(stderr, "%s", *fatal_error_prefix ? fatal_error_prefix : "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    fatal_exit(status);
}
