#!/usr/bin/env python3
"""scripts/kernel_coverage.py — which of the sources' __global__ kernels the test suite launched.

Usage: kernel_coverage.py COVERAGE_DIR [SOURCE_ROOT]

COVERAGE_DIR holds what the CPU backend recorded with SIMT_COVERAGE_DIR set: one file per process,
<program>.<pid>, one kernel base name a line ("? <address>" for a kernel it could not name).
SOURCE_ROOT (default: this repository) is searched for __global__ definitions in SOURCES. Prints
"FAIL kernel never launched: name (file:line)" for each kernel no process launched, "N of M kernels
executed" and the suite's tally line ("N passed, K failed", a kernel being one check); exits 1 if
one is missing.

What counts as launched. A kernel defined in a header (llmc/, the trainers, which tests include) may
be launched by any program. A kernel defined in a test's or a dev/cuda validation's own .cu file
must be launched by that program (test/test_X.cu and test/simt/test_X.cu by test_X, dev/cuda/X.cu by
dev_X): files define kernels of the same name (row_sum_kernel in test_simt.cu and
test_cooperative_groups.cu), and each is a kernel of its own. The kernels tests define to plant bugs count too: a planted fault whose
launch no longer runs is a check that silently stopped checking.
"""
import glob
import os
import re
import sys

# The files whose __global__ functions the suite must launch. dev/cuda/bench_simt.cu is left out:
# its kernels time the backend for `make bench` and check no result, so the suite does not run them.
SOURCES = ["llmc/*.cuh", "llmc/*.h", "*.cu", "dev/cuda/*.cu", "dev/cuda/*.h", "test/*.cu", "test/*.h", "test/simt/*.cu"]
NOT_SOURCES = {"dev/cuda/bench_simt.cu"}

# `__global__`, then qualifiers (void, __launch_bounds__(...) with one level of nested parentheses),
# then the kernel's name and its parameter list.
KERNEL = re.compile(
    r"\b__global__\b(?:\s+(?:void|static|inline|__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)))*\s+(\w+)\s*\(")
BODY = re.compile(r"\s*\{")


def strip_comments(text):
    """The text with comments and string literals blanked out, line breaks kept (line numbers hold)."""
    # Character literals need a non-word character before them: 1'000 is a digit separator.
    literal = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|(?<!\w)\'(?:\\.|[^\'\\\n]){1,8}\''
    return re.sub(literal, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def definitions(root):
    """[(name, path, line)] of every __global__ function defined (not only declared) in SOURCES."""
    found = []
    paths = sorted({p for pattern in SOURCES for p in glob.glob(os.path.join(root, pattern))})
    for path in paths:
        rel = os.path.relpath(path, root)
        if rel in NOT_SOURCES:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = strip_comments(f.read())
        for m in KERNEL.finditer(text):
            # Past the parameter list: '{' begins a definition, ';' ends a declaration.
            depth, i = 1, m.end()
            while i < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            if BODY.match(text, i):
                found.append((m.group(1), rel, text.count("\n", 0, m.start()) + 1))
    return found


def program_of(rel):
    """The program that must launch the kernels of file rel; None: any program."""
    directory, name = os.path.split(rel)
    stem = os.path.splitext(name)[0]
    if directory in ("test", os.path.join("test", "simt")) and name.startswith("test_") and name.endswith(".cu"):
        return stem
    if directory == os.path.join("dev", "cuda") and name.endswith(".cu"):
        return "dev_" + stem
    return None


def recorded(coverage_dir):
    """({program: set of kernel names}, [(program, address)] of the kernels no name was found for)."""
    launched, unnamed = {}, []
    for path in glob.glob(os.path.join(coverage_dir, "*.*")):
        if not os.path.isfile(path):
            continue  # a folder named like a record is none
        program = os.path.basename(path).rsplit(".", 1)[0]
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("?"):
                    unnamed.append((program, line[1:].strip()))
                elif line:
                    launched.setdefault(program, set()).add(line)
    return launched, unnamed


def main():
    usage = __doc__.split("\n\n")[1]
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(sys.argv) not in (2, 3):
        print(usage, file=sys.stderr)
        return 2
    coverage_dir = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # A mistyped directory must not read as "no kernel launched" (every kernel a FAIL), nor a source
    # root without kernels as "0 passed, 0 failed": both are errors of the command, not results.
    if not os.path.isdir(coverage_dir):
        what = "not a directory" if os.path.exists(coverage_dir) else "no such directory"
        print(f"kernel_coverage.py: error: {what}: {coverage_dir} ({usage})", file=sys.stderr)
        return 2
    kernels = definitions(root)
    if not kernels:
        print(f"kernel_coverage.py: error: no __global__ kernel defined under {root} (is it the repository?)",
              file=sys.stderr)
        return 2
    launched, unnamed = recorded(coverage_dir)
    by_anyone = set().union(*launched.values()) if launched else set()
    executed, failed = 0, 0
    for name, rel, line in kernels:
        program = program_of(rel)
        if name in (launched.get(program, set()) if program else by_anyone):
            executed += 1
        else:
            print(f"FAIL kernel never launched: {name} ({rel}:{line})" +
                  (f", by {program}" if program else ""))
            failed += 1
    # A recorded launch the sources do not define means this check misread them (or a kernel lives
    # outside SOURCES): either way its count would be wrong.
    defined = {name for name, _, _ in kernels}
    for program in sorted(launched):
        for name in sorted(launched[program] - defined):
            print(f"FAIL kernel launched by {program} but not found among the sources' definitions: {name}")
            failed += 1
    for program, address in unnamed:
        print(f"FAIL kernel launched by {program} at {address} has no name (link with -rdynamic)")
        failed += 1
    print(f"{executed} of {len(kernels)} kernels executed")
    print(f"{executed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
