#!/usr/bin/env python3
"""scripts/sass_check.py — reads the machine code (SASS) nvcc makes of the bf16 FlashAttention-2 kernels
(head size 64, dropout off and on; test/sass/attention_kernels.cu) and checks what makes them fast:

  LDSM     fragments come from shared memory through ldmatrix;
  LDGSTS   tiles go from global to shared memory through cp.async, without registers;
  no LD    no generic-address load (what a fragment load becomes when the compiler loses track of
           the shared-memory space);
  no local no spills: no local memory (LDL/STL), LOCAL 0 in the resource usage;
  2 blocks two blocks of 128 threads fit an SM's 65536 registers (registers are allocated per warp
           in units of 8 per thread) — test/sass/attention_kernels.cu asserts the same of shared memory.

The wgmma forward (sm_90a targets only; elsewhere it is a trap) must have its 8 HGMMA (warpgroup MMA:
S and P V, 4 k16 steps each), LDGSTS, no generic LD, no local memory and registers for 4 blocks; the
wgmma backward, with dQ added at once and deferred, its 20 HGMMA per query tile (deferred: 25, the
last tile's 4 of dQ after the loop and the one that ptxas makes of the first tile's empty commit
group), LDGSTS, no generic LD, no local memory and registers for 2 blocks (for 3 in the instances capped
for 3); the instances adding dQ by reductions in L2 must have their 16 REDG per query tile (those
summing the tiles' slices themselves included).

It also reports the share of HMMA (tensor-core) instructions in each kernel's main loop: the backward
branch whose body holds the most HMMA (for the forward the key-tile loop), counted twice: every
instruction of the body (branches that run only on some tiles, like the masks of the diagonal tiles,
included), and the fewest instructions a turn can execute that runs every HMMA and the most global
memory accesses of the body (the turn of a tile without masks; a loop nested in the body counted once).

    scripts/sass_check.py --nvcc NVCC --arch 80 --arch 90a [--cuobjdump PATH]
    scripts/sass_check.py --nvcc NVCC --which-tools     the cuobjdump and nvdisasm it would use (exit 1: none)

One PASS/FAIL line per (architecture, kernel) and a final "N passed, N failed"; exit 1 if any failed.
cuobjdump and the nvdisasm it runs come from the toolkit when it has them, else from PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm; without them it prints SKIP and exits 0, or fails with
REQUIRE_SASS=1.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "test", "sass", "attention_kernels.cu")
# nvcc's flags as the project ships them (the Makefile's NVCC flags for a GPU build).
NVCC_FLAGS = ["-std=c++17", "-O3", "--use_fast_math", "-Xptxas", "-warn-spills", "--Werror", "all-warnings"]
REGISTERS_PER_SM, THREADS, BLOCKS = 65536, 128, 2


def find_tool(name, nvcc):
    """The toolkit's `name` (beside nvcc), else one on PATH, else PyPI's (nvidia-cuda-<name>, in
    site-packages/nvidia/cu<N>/bin of this python or Debian's); None if there is none."""
    toolkit = os.path.join(os.path.dirname(os.path.realpath(shutil.which(nvcc) or nvcc)), name)
    if os.access(toolkit, os.X_OK):
        return toolkit
    on_path = shutil.which(name)
    if on_path:
        return on_path
    roots = list(sys.path)
    try:
        out = subprocess.run(["/usr/bin/python3", "-c", "import sys; print('\\n'.join(sys.path))"],
                             capture_output=True, text=True, check=False).stdout
        roots += out.split()
    except OSError:
        pass
    for r in roots:
        found = sorted(glob.glob(os.path.join(r, "nvidia", "*", "bin", name)))
        if found:
            return found[-1]
    return None


def find_tools(given, nvcc):
    """(cuobjdump, nvdisasm): cuobjdump -sass runs nvdisasm, which it looks for on PATH."""
    return given or find_tool("cuobjdump", nvcc), find_tool("nvdisasm", nvcc)


def run(cmd, env=None):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    except OSError as e:  # no such program, or not one that runs
        raise RuntimeError(f"cannot run {cmd[0]}: {e.strerror}") from None
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} ... failed: {(p.stdout + p.stderr).strip()[-800:]}")
    return p.stdout


def demangled(name):
    """attention_forward_mma_kernel<bf16, 64, dropout> (attention_backward_wgmma_kernel<bf16, dQ deferred>)
    from the mangled name (no c++filt needed)."""
    m = re.match(r"_Z\d+(attention_\w+_kernel)I13__nv_bfloat16Li(\d+)ELb([01])E(Lb[01]ELb([01])E)?", name)
    if not m:
        # the wgmma kernels: the backward's template arguments (dQ deferred, blocks per SM, dQ by
        # reductions in L2, dQ summed by the tiles' last writers)
        w = re.match(r"_Z\d+(attention_\w+_kernel)I13__nv_bfloat16(Lb([01])E(Li(\d+)E)?(Lb([01])E)?(Lb([01])E)?)?E",
                     name)
        if not w:
            return name
        if not w.group(2):
            return f"{w.group(1)}<bf16>"
        blocks = f", {w.group(5)} blocks" if w.group(5) else ""
        red = ", reductions" if w.group(7) == "1" else ""
        summed = ", summed by the last writers" if w.group(9) == "1" else ""
        return f"{w.group(1)}<bf16, dQ {'deferred' if w.group(3) == '1' else 'at once'}{blocks}{red}{summed}>"
    summed = ", summed by the last writers" if m.group(5) == "1" else ""
    return f"{m.group(1)}<bf16, HS={m.group(2)}, dropout {'on' if m.group(3) == '1' else 'off'}{summed}>"


def parse_sass(text):
    """{function: [(address, opcode with modifiers, operands, predicated)]} from cuobjdump -sass."""
    functions, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = functions.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);", line)
        if m and current is not None:
            predicated = m.group(2) is not None and m.group(2).strip() not in ("@PT", "@UPT")
            current.append((int(m.group(1), 16), m.group(3), m.group(4), predicated))
    return functions


def parse_resources(text):
    """{function: {"REG": n, "LOCAL": n, ...}} from cuobjdump -res-usage."""
    res, current = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            current = m.group(1)
            continue
        if current and "REG:" in line:
            res[current] = {k: int(v) for k, v in re.findall(r"([A-Z]+):(\d+)", line)}
    return res


def branch_target(operands):
    m = re.match(r"\s*(0x[0-9a-f]+)", operands)
    return int(m.group(1), 16) if m else None


def hot_path(body):
    """Fewest instructions from the first of `body` to its last (the back edge) on a path through its
    forward branches that executes every HMMA of it and, among those, the most global memory accesses
    (loads, stores, cp.async, prefetches: where the compiler made two versions of a stretch, one);
    backward branches inside (nested loops) are not taken. None if no path runs every HMMA."""
    index = {addr: i for i, (addr, _, _, _) in enumerate(body)}
    score = lambda op: (int(op.startswith("HMMA")), int(op.startswith(("LDGSTS", "LDG", "STG", "CCTL"))), -1)
    add = lambda a, b: tuple(x + y for x, y in zip(a, b))
    best = [None] * len(body)  # (HMMA, global accesses, -instructions) of the best path to i
    best[0] = score(body[0][1])
    for i, (addr, op, operands, predicated) in enumerate(body[:-1]):
        if best[i] is None:
            continue
        nexts = []
        target = branch_target(operands) if op.startswith("BRA") else None
        if target is not None and target > addr and target in index:
            nexts.append(index[target])
        if not (op.startswith("BRA") and not predicated and target is not None and target > addr) \
                and not op.startswith(("EXIT", "RET")):
            nexts.append(i + 1)
        for j in nexts:
            cand = add(best[i], score(body[j][1]))
            if best[j] is None or cand > best[j]:
                best[j] = cand
    hmma = sum(op.startswith("HMMA") for _, op, _, _ in body)
    return -best[-1][2] if best[-1] is not None and best[-1][0] == hmma else None


def main_loop(code):
    """(instructions, HMMA, instructions on the hot path) of the backward branch's body holding the most
    HMMA."""
    best = (0, 0, None)
    for i, (addr, op, operands, _) in enumerate(code):
        if not op.startswith("BRA") or op.startswith("BRA.DIV"):
            continue
        start = branch_target(operands)
        if start is None or start >= addr:
            continue
        body = [c for c in code if start <= c[0] <= addr]
        hmma = sum(o.startswith("HMMA") for _, o, _, _ in body)
        if hmma > best[1]:
            best = (len(body), hmma, hot_path(body))
    return best


def check_kernel(arch, name, code, res):
    ops = [op for _, op, _, _ in code]
    count = lambda pred: sum(1 for o in ops if pred(o))
    ldsm = count(lambda o: o.startswith("LDSM"))
    ldgsts = count(lambda o: o.startswith("LDGSTS"))
    generic = count(lambda o: o == "LD" or o.startswith("LD."))
    local = count(lambda o: o.startswith(("LDL", "STL")))
    regs = res.get("REG", 0)
    regs_2_blocks = BLOCKS * THREADS * (-(-regs // 8) * 8)
    loop, hmma, hot = main_loop(code)
    ok = ldsm > 0 and ldgsts > 0 and generic == 0 and local == 0 and res.get("LOCAL", 1) == 0 \
        and regs_2_blocks <= REGISTERS_PER_SM and hmma > 0
    share = f"{100.0 * hmma / loop:.1f}%" if loop else "?"
    hot_share = f"{100.0 * hmma / hot:.1f}%" if hot else "?"
    print(f"{'PASS' if ok else 'FAIL'} sass sm_{arch} {demangled(name)}  LDSM {ldsm}, LDGSTS {ldgsts}, "
          f"generic LD {generic}, local {local} (LOCAL {res.get('LOCAL', '?')}), {regs} registers "
          f"({BLOCKS} blocks: {regs_2_blocks} of {REGISTERS_PER_SM}); main loop {loop} instructions, "
          f"{hmma} HMMA ({share}); a turn without masks {hot or '?'} ({hot_share})")
    return ok


def check_wgmma_kernel(arch, name, code, res):
    ops = [op for _, op, _, _ in code]
    count = lambda pred: sum(1 for o in ops if pred(o))
    hgmma = count(lambda o: o.startswith("HGMMA"))
    ldgsts = count(lambda o: o.startswith("LDGSTS"))
    generic = count(lambda o: o == "LD" or o.startswith("LD."))
    local = count(lambda o: o.startswith(("LDL", "STL")))
    regs = res.get("REG", 0)
    what = demangled(name)
    if "forward" in what:  # S and O += P V; registers for 4 blocks, as the mma.sync forward's
        want, why, blocks = 8, "2 products of 4 k16 steps", 4
    elif "deferred" in what:
        want, why, blocks = 25, "5 products of 4 k16 steps, the last dQ, an empty group", BLOCKS
    else:
        m = re.search(r", (\d+) blocks", what)
        want, why, blocks = 20, "5 products of 4 k16 steps", int(m.group(1)) if m else BLOCKS
    regs_blocks = blocks * THREADS * (-(-regs // 8) * 8)
    redg = count(lambda o: o.startswith("REDG"))
    want_redg = 16 if "reductions" in what else 0  # 2 rows x 8 pairs of columns of a query tile's dQ
    ok = hgmma == want and ldgsts > 0 and generic == 0 and local == 0 and res.get("LOCAL", 1) == 0 \
        and regs_blocks <= REGISTERS_PER_SM and redg == want_redg
    print(f"{'PASS' if ok else 'FAIL'} sass sm_{arch} {what}  HGMMA {hgmma} ({want}: {why}), LDGSTS {ldgsts}, "
          f"generic LD {generic}, local {local} (LOCAL {res.get('LOCAL', '?')}), {regs} registers ({blocks} blocks: "
          f"{regs_blocks} of {REGISTERS_PER_SM}), REDG {redg} ({want_redg})")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--arch", action="append", help="the target without sm_, e.g. 80 or 90a (what the Makefile builds for 9.0)")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--which-tools", action="store_true", help="print the cuobjdump and nvdisasm found and stop")
    args = ap.parse_args()
    cuobjdump, nvdisasm = find_tools(args.cuobjdump, args.nvcc)
    missing = " and ".join(t for t, have in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if not have)
    if args.which_tools:
        if missing:
            print(f"sass_check: no {missing} found (the toolkit's, or pip install nvidia-cuda-cuobjdump "
                  "nvidia-cuda-nvdisasm)", file=sys.stderr)
            return 1
        print(cuobjdump, nvdisasm)
        return 0
    if not args.arch:
        ap.error("--arch is required (e.g. --arch 80 --arch 90a)")
    if missing:
        why = f"no {missing} (the toolkit's, or pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
        if os.environ.get("REQUIRE_SASS") == "1":
            print(f"FAIL sass checks: {why}")
            print("0 passed, 1 failed")
            return 1
        print(f"SKIP sass checks: {why}")
        print("0 passed, 0 failed")
        return 0
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ.get("PATH", ""))
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.arch:
            cubin = os.path.join(tmp, f"sm_{arch}.cubin")
            try:
                run([args.nvcc, *NVCC_FLAGS, "-gencode", f"arch=compute_{arch},code=sm_{arch}", "-cubin",
                     SOURCE, "-o", cubin])
                functions = parse_sass(run([cuobjdump, "-sass", cubin], env))
                resources = parse_resources(run([cuobjdump, "-res-usage", cubin], env))
            except RuntimeError as e:
                print(f"FAIL sass sm_{arch}: {e}")
                failed += 1
                continue
            kernels = sorted(f for f in functions if "_mma_kernel" in f)
            if len(kernels) != 5:
                print(f"FAIL sass sm_{arch}: found {len(kernels)} of the 5 kernels ({', '.join(kernels)})")
                failed += 1
            for k in kernels:
                if check_kernel(arch, k, functions[k], resources.get(k, {})):
                    passed += 1
                else:
                    failed += 1
            if arch.endswith("a"):  # an arch-specific target: sm_90a has wgmma
                wg = [f for f in functions if "wgmma_kernel" in f]
                if len(wg) != 8:
                    print(f"FAIL sass sm_{arch}: found {len(wg)} wgmma kernels, want 8")
                    failed += 1
                for k in wg:
                    if check_wgmma_kernel(arch, k, functions[k], resources.get(k, {})):
                        passed += 1
                    else:
                        failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
