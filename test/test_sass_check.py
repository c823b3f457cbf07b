#!/usr/bin/env python3
"""test/test_sass_check.py — scripts/sass_check.py's verdicts on planted SASS: a kernel with what the
check asks for passes, and each missing or forbidden thing (no LDSM, no LDGSTS, a generic LD, a spill,
too many registers for two blocks, no HMMA in a loop) fails it; its main-loop figures are counted, over
the whole body and over a turn without masks; a tool that cannot run is named in one line."""
import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import sass_check  # noqa: E402

NAME = "_Z28attention_forward_mma_kernelI13__nv_bfloat16Li64ELb0EEvPT_PfPKS1_iiibPKi11DropoutArgs"
GOOD = [
    "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;",
    "LDSM.16.M88.4 R4, [R5] ;",            # 0x0010: the loop starts here
    "HMMA.16816.F32.BF16 R8, R4, R6, R8 ;",
    "HMMA.16816.F32.BF16 R12, R4, R6, R12 ;",
    "FMUL R1, R2, R3 ;",
    "@!P0 BRA 0x10 ;",                     # 0x0050: back to 0x0010
    "EXIT ;",
]


def sass(lines):
    body = "\n".join(f"        /*{16 * i:04x}*/                   {l}   /* 0x0 */" for i, l in enumerate(lines))
    return f"\t\tFunction : {NAME}\n{body}\n"


def verdict(lines, regs=128, local=0):
    code = sass_check.parse_sass(sass(lines))[NAME]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ok = sass_check.check_kernel("90", NAME, code, {"REG": regs, "LOCAL": local})
    return ok, out.getvalue().strip()


passed = failed = 0


def expect(name, want, got):
    global passed, failed
    ok, line = got
    good = ok == want
    passed, failed = passed + good, failed + (not good)
    print(f"{'PASS' if good else 'FAIL'} {name}  ({'passes' if ok else 'fails'}: {line[line.find('LDSM'):]})")


expect("a kernel with LDSM, LDGSTS, HMMA in its loop passes", True, verdict(GOOD))
ok, line = verdict(GOOD)
expect("main loop counted: 5 instructions, 2 HMMA (40.0%)", True,
       (ok and "main loop 5 instructions, 2 HMMA (40.0%)" in line, line))
# A loop with a branch around mask selects (skipped on the turn without masks) and one around a
# global store (kept: the turn without masks runs the most global accesses).
BRANCHY = [
    "LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;",
    "LDSM.16.M88.4 R4, [R5] ;",            # 0x0010: the loop starts here
    "HMMA.16816.F32.BF16 R8, R4, R6, R8 ;",
    "@P0 BRA 0x60 ;",
    "FSEL R8, R8, -INF , P1 ;",
    "FSEL R9, R9, -INF , P1 ;",
    "@P2 BRA 0x80 ;",                      # 0x0060
    "STG.E desc[UR4][R2.64], R8 ;",
    "HMMA.16816.F32.BF16 R12, R4, R6, R12 ;",  # 0x0080
    "@!P3 BRA 0x10 ;",                     # 0x0090: back to 0x0010
    "EXIT ;",
]
ok, line = verdict(BRANCHY)
expect("main loop 9 instructions; a turn without masks skips the selects, keeps the store: 7", True,
       (ok and "main loop 9 instructions, 2 HMMA (22.2%); a turn without masks 7 (28.6%)" in line, line))
expect("no LDSM fails", False, verdict([l for l in GOOD if not l.startswith("LDSM")]))
expect("no LDGSTS fails", False, verdict([l for l in GOOD if not l.startswith("LDGSTS")]))
expect("a generic LD fails", False, verdict(GOOD[:2] + ["LD.E.64 R2, [R4.64] ;"] + GOOD[2:]))
expect("a spill (STL) fails", False, verdict(GOOD[:2] + ["STL [R1+0x8], R2 ;"] + GOOD[2:]))
expect("LOCAL bytes in the resource usage fail", False, verdict(GOOD, local=16))
expect("256 registers fit two blocks of 128 threads", True, verdict(GOOD, regs=256))
expect("257 registers (264 allocated) do not", False, verdict(GOOD, regs=257))
expect("no HMMA inside a loop fails", False, verdict([l for l in GOOD if not l.startswith("HMMA")]))
# A tool that is not there (a wrong --nvcc or --cuobjdump) is one FAIL line naming it, not a traceback.
try:
    sass_check.run(["/nonexistent/nvcc", "--version"])
    why = "it ran"
except RuntimeError as e:
    why = str(e)
good = why == "cannot run /nonexistent/nvcc: No such file or directory"
passed, failed = passed + good, failed + (not good)
print(f"{'PASS' if good else 'FAIL'} a missing tool is named: {why}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
