"""test/oracle_checks.py — what the python oracle checks share: one PASS/FAIL line per check and the
final "N passed, N failed" tally, the fp32 logits comparison, and running a test binary's export mode.
Imported by test/hf_gpt2_roundtrip.py and test/hf_bert_roundtrip.py."""
import subprocess
import sys

EPS_FP32 = 2.0 ** -23

passed = failed = 0


def report(ok, name, detail=""):
    """Prints one result line and counts it."""
    global passed, failed
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f"  {detail}" if detail else ""), flush=True)
    if ok:
        passed += 1
    else:
        failed += 1


def check_logits(name, logits, ref, k):
    """transformers' logits against ours (torch tensors), both computed in fp32: each within k fp32
    roundings of the logits' scale plus k of its own magnitude."""
    if logits.shape != ref.shape:
        report(False, name, f"shapes {tuple(logits.shape)} vs {tuple(ref.shape)}")
        return
    err = (logits - ref).abs()
    budget = k * EPS_FP32 * ref.abs().max().item() + k * EPS_FP32 * ref.abs()
    used = (err / budget).max().item()
    report(bool((err <= budget).all()), name,
           f"max_err={err.max().item():.3g} budget_used={100 * used:.0f}% (n={err.numel()})")


def run_export(binary, directory, name):
    """Runs `binary --export directory`; reports and returns whether it succeeded."""
    run = subprocess.run([binary, "--export", directory], capture_output=True, text=True)
    ok = run.returncode == 0
    report(ok, name, (run.stdout + run.stderr).strip().replace("\n", " | "))
    return ok


def finish():
    """Prints the tally and exits non-zero if anything failed."""
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
