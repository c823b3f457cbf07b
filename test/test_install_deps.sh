#!/usr/bin/env bash
# test/test_install_deps.sh — scripts/install_deps.sh's detection and refusals, on file trees planted
# under DEPS_ROOT: the reference BLAS's cblas.h alone is not OpenBLAS; a tree with OpenBLAS's own
# header, Boost.Context's header and library and Open MPI's commands lacks nothing; Boost's headers
# without the library lack Boost.Context; without root or sudo a missing dependency stops the script
# with one line naming the command to run.
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
script="$root/scripts/install_deps.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
report() {  # ok name detail
    if [[ $1 == 1 ]]; then echo "PASS $2  $3"; passed=$((passed + 1)); else echo "FAIL $2  $3"; failed=$((failed + 1)); fi
}

# A machine with only netlib's reference BLAS (libblas-dev): its /usr/include/cblas.h.
mkdir -p "$tmp/ref/usr/include"
touch "$tmp/ref/usr/include/cblas.h"
out=$(DEPS_ROOT="$tmp/ref" "$script" --check build 2>&1); rc=$?
ok=0; [[ $rc -eq 1 && $out == *libopenblas-dev* && $out == *libboost-context-dev* && $out == *libopenmpi-dev* ]] && ok=1
report $ok "a reference cblas.h alone is not OpenBLAS" "exit $rc: $out"

# Everything the build uses.
full="$tmp/full"
mkdir -p "$full/usr/include/x86_64-linux-gnu/openblas-pthread" "$full/usr/include/boost/context/detail" "$full/usr/bin" \
    "$full/usr/lib/x86_64-linux-gnu"
touch "$full/usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h" "$full/usr/include/boost/context/detail/fcontext.hpp" \
    "$full/usr/lib/x86_64-linux-gnu/libboost_context.so"
printf '#!/bin/sh\n' > "$full/usr/bin/mpicxx"; cp "$full/usr/bin/mpicxx" "$full/usr/bin/mpirun"
chmod +x "$full/usr/bin/mpicxx" "$full/usr/bin/mpirun"
out=$(DEPS_ROOT="$full" "$script" --check build 2>&1); rc=$?
ok=0; [[ $rc -eq 0 && $out == *"nothing missing"* ]] && ok=1
report $ok "OpenBLAS's header, Boost.Context and Open MPI: nothing missing" "exit $rc: $out"

# Boost's headers without libboost_context.so (libboost1.74-dev alone): Boost.Context is missing.
rm "$full/usr/lib/x86_64-linux-gnu/libboost_context.so"
out=$(DEPS_ROOT="$full" "$script" --check build 2>&1); rc=$?
ok=0; [[ $rc -eq 1 && $out == *libboost-context-dev* && $out != *libopenblas* && $out != *openmpi* ]] && ok=1
report $ok "Boost.Context's header without its library: Boost.Context missing" "exit $rc: $out"
touch "$full/usr/lib/x86_64-linux-gnu/libboost_context.so"

# Only mpirun missing: Open MPI is.
rm "$full/usr/bin/mpirun"
out=$(DEPS_ROOT="$full" "$script" --check build 2>&1); rc=$?
ok=0; [[ $rc -eq 1 && $out == *"libopenmpi-dev openmpi-bin"* && $out != *libopenblas* ]] && ok=1
report $ok "mpicxx without mpirun: Open MPI missing" "exit $rc: $out"

# Not root, no sudo: one line naming the command (as the unprivileged user nobody).
if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null 2>&1; then
    # a copy the user can reach: the checkout may sit in a directory only root can enter
    mkdir -p "$tmp/repo/scripts" && cp "$script" "$tmp/repo/scripts/"
    chmod -R a+rX "$tmp"
    chmod a+x "$tmp"
    out=$(cd / && DEPS_ROOT="$tmp/ref" setpriv --reuid=65534 --regid=65534 --clear-groups "$tmp/repo/scripts/install_deps.sh" build 2>&1); rc=$?
    ok=0; [[ $rc -eq 1 && $(echo "$out" | wc -l) -eq 1 && $out == *"run  sudo apt-get install -y libboost-context-dev libopenblas-dev"* ]] && ok=1
    report $ok "without root or sudo: one line naming the command" "exit $rc: $out"
else
    echo "SKIP the no-root refusal (needs root and setpriv to become an unprivileged user)"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
