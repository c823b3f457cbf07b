#!/usr/bin/env python3
"""test/test_plot.py — checks scripts/plot.py on synthetic training logs: it renders a valid PNG of the
expected size (several runs, a resumed run, null values, unknown events and fields), counts malformed
lines, and fails with one clear line and exit status 1 on bad input or without matplotlib.

  python3 test/test_plot.py [--keep DIR]    # --keep: leave the synthetic logs and charts in DIR

Prints PASS/FAIL per check and "N passed, N failed"; exits non-zero on failure. Skips (exit 0) only
when matplotlib is not installed.
"""
import importlib.util
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLOT = os.path.join(ROOT, "scripts", "plot.py")
WIDTH, HEIGHT = 1200, 800  # plot.py draws 12 x 8 inches at 100 dpi

passed = failed = 0


def check(name, ok, detail=""):
    """Records and prints one check."""
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}")
    else:
        failed += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))


def line(event, step, **fields):
    """One log line as llmc/logger.h writes it: "event" and "step" first; None becomes null."""
    return json.dumps({"event": event, "step": step, **fields}, separators=(",", ":"))


def synthetic_run(label, steps, lr_max, seed, tokens_per_step=512, diverge_at=None, resume_at=None,
                  val_every=25, unknown=False):
    """Log lines of a plausible run: decaying noisy loss, warmup + cosine lr, steady tokens/s after a
    slow first step, grad norm falling from its start; a diverging run's loss and norm blow up and
    then turn null; a resumed run has a checkpoint, a sample, then a resume line."""
    rnd = random.Random(seed)
    header = dict(label=label, params=7.25e6, precision="fp32", B=4, T=128,
                  tokens_per_step=tokens_per_step, steps=steps, device="SIMT CPU backend (virtual device)")
    out = [line("run", 0, **header), line("val", 0, loss=10.83)]
    for s in range(1, steps + 1):
        warm = 10
        lr = lr_max * s / warm if s <= warm else \
            lr_max * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm))))
        loss = 5.4 + 5.5 * math.exp(-s / 28) + rnd.gauss(0, 0.18)
        norm = 0.9 + 3.2 * math.exp(-s / 20) + abs(rnd.gauss(0, 0.15))
        if diverge_at is not None and s >= diverge_at:
            k = s - diverge_at
            loss = None if k >= 6 else loss + 1.5 * 2 ** k
            norm = None if k >= 8 else norm * 12 ** k
        tps = (310 if s == 1 else 522) + rnd.gauss(0, 6)
        fields = dict(loss=loss, grad_norm=norm, lr=lr, ms=tokens_per_step / tps * 1000, tokens_per_s=tps,
                      mfu=None, tokens=s * tokens_per_step)
        if unknown:
            fields["loss_scale"] = 65536.0  # a field a later trainer may add
        out.append(line("step", s, **fields))
        if unknown and s == 7:
            out.append(line("skipped", s, reason="inf grads"))  # an event a later trainer may add
        if s % val_every == 0 or s == steps:
            val = None if loss is None else 5.9 + 5.0 * math.exp(-s / 30) + rnd.gauss(0, 0.1)
            out.append(line("val", s, loss=val))
        if resume_at is not None and s == resume_at:
            out.append(line("checkpoint", s, path=f"out/model_{s:08d}.bin"))
            out.append(line("sample", s, text="ROMEO:\nwhat \"light\" through\tyonder\u00e9"))
            out.append(line("resume", s, **header))  # as train_gpt2 writes it: the run line's fields
    return out


def write_logs(d):
    """The synthetic log set: two runs in directories, a diverging run as a bare file, a malformed log."""
    files = {
        "fp32/log.jsonl": synthetic_run("d4 fp32", 150, 1e-3, seed=1, unknown=True),
        "bf16/log.jsonl": synthetic_run("d4 bf16", 150, 6e-4, seed=2, resume_at=75),
        "diverged.jsonl": synthetic_run("d4 lr 1e-2 fp32", 90, 1e-2, seed=3, diverge_at=60),
    }
    bad = synthetic_run("d4 fp32", 40, 1e-3, seed=4)
    bad[5] = bad[5][: len(bad[5]) // 2]               # a line cut off mid-write
    bad.insert(9, "not json at all")
    bad.insert(12, '["an", "array"]')
    bad.insert(15, '{"event":"step","loss":3.0}')  # no step number
    bad.insert(20, "")                              # blank lines are not malformed
    files["malformed/log.jsonl"] = bad
    unlabelled = synthetic_run("", 30, 1e-3, seed=5, resume_at=15)  # empty labels: the directory names it
    unlabelled = [json.dumps({k: v for k, v in json.loads(x).items() if k != "tokens_per_step"},
                             separators=(",", ":")) for x in unlabelled]
    files["unlabelled/log.jsonl"] = unlabelled
    files["nosteps.jsonl"] = [line("run", 0, label="empty", tokens_per_step=512), line("val", 0, loss=10.8)]
    files["onestep.jsonl"] = [line("run", 0, label="one step", tokens_per_step=512),
                              line("step", 1, loss=10.9, grad_norm=2.0, lr=1e-3, ms=900.0, tokens_per_s=570.0,
                                   tokens=512),
                              line("val", 1, loss=10.8)]
    for name, lines in files.items():
        os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
        with open(os.path.join(d, name), "w") as f:
            f.write("\n".join(lines) + "\n")


def run_plot(*args, env=None):
    """Runs plot.py; returns (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, PLOT, *args], capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def png_size(path):
    """(width, height) of a PNG file, or None when it is not one (signature and IHDR chunk checked)."""
    with open(path, "rb") as f:
        head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def check_png(name, path):
    """A chart was written as a PNG of the expected size."""
    if not os.path.isfile(path):
        check(name, False, f"{path} not written")
        return
    size = png_size(path)
    check(name, size == (WIDTH, HEIGHT), f"{path}: size {size}, expected {(WIDTH, HEIGHT)}")


def one_error_line(name, status, err, *needles):
    """A failure: exit status 1 and one stderr line that holds every needle."""
    lines = err.strip().splitlines()
    ok = status == 1 and len(lines) == 1 and all(n in lines[0] for n in needles)
    check(name, ok, f"status {status}, stderr {err.strip()!r}, expected one line with {needles}")


def main():
    keep = None
    if sys.argv[1:2] == ["--keep"] and len(sys.argv) == 3:
        keep = sys.argv[2]
    if importlib.util.find_spec("matplotlib") is None:
        print("SKIP test_plot (matplotlib not installed)")
        return 0
    d = tempfile.mkdtemp(prefix="test_plot_")
    try:
        write_logs(d)
        j = lambda *p: os.path.join(d, *p)

        status, out, err = run_plot("--help")
        check("help", status == 0 and "usage:" in out and "--smooth" in out, f"status {status}")

        status, out, err = run_plot(j("fp32"), j("bf16"), j("diverged.jsonl"), "-o", j("three.png"))
        check("three runs: exit 0, no warnings", status == 0 and err == "", f"status {status}, stderr {err!r}")
        check("three runs: prints the path written", out.strip() == j("three.png"), repr(out))
        check_png("three runs: PNG 1200x800", j("three.png"))

        status, out, err = run_plot(j("bf16"), j("fp32"), "--x", "tokens", "--smooth", "1",
                                    "--labels", "bf16,fp32", "-o", j("tokens.png"))
        check("--x tokens --smooth 1 --labels: exit 0", status == 0, err)
        check_png("--x tokens: PNG 1200x800", j("tokens.png"))

        status, out, err = run_plot(j("fp32"))
        check("default output: DIR/plot.png", status == 0 and out.strip() == j("fp32", "plot.png"), repr(out))
        check_png("default output: PNG 1200x800", j("fp32", "plot.png"))

        status, out, err = run_plot(j("malformed", "log.jsonl"), "-o", j("malformed.png"))
        check("malformed lines: still renders", status == 0, err)
        check("malformed lines: 4 counted (blank line not) on stderr",
              "skipped 4 malformed lines" in err and "log.jsonl" in err and "first: line 6" in err, repr(err))
        check_png("malformed lines: PNG 1200x800", j("malformed.png"))

        one_error_line("no step lines: exit 1 naming the file", *run_plot(j("nosteps.jsonl"))[::2],
                       "nosteps.jsonl", "no step lines")
        one_error_line("missing file: exit 1", *run_plot(j("fp32"), j("absent.jsonl"))[::2],
                       "no such file", "absent.jsonl")
        one_error_line("directory without log.jsonl: exit 1", *run_plot(d)[::2], "no log.jsonl", d)
        one_error_line("--labels count mismatch: exit 1",
                       *run_plot(j("fp32"), j("bf16"), "--labels", "a")[::2], "--labels")
        one_error_line("unwritable output: exit 1",
                       *run_plot(j("fp32"), "-o", j("no", "such", "dir", "x.png"))[::2], "cannot write")
        one_error_line("a full device (/dev/full): exit 1", *run_plot(j("fp32"), "-o", "/dev/full")[::2],
                       "cannot write /dev/full")

        # matplotlib missing: a stand-in package that fails to import shadows the real one
        fake = j("fake_site", "matplotlib")
        os.makedirs(fake)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write("raise ImportError('No module named matplotlib')\n")
        env = dict(os.environ, PYTHONPATH=j("fake_site"))
        one_error_line("matplotlib missing: exit 1 with pip install", *run_plot(j("fp32"), env=env)[::2],
                       "pip install matplotlib")

        # the parser itself: last line wins per step, nulls become NaN, unknown events ignored
        spec = importlib.util.spec_from_file_location("plot", PLOT)
        plot = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plot)
        r = plot.read_log(j("bf16", "log.jsonl"))
        check("parse: resumed run has 150 steps, resume at 75, label from the run line",
              sorted(r.steps) == list(range(1, 151)) and r.resumes == [75] and r.label == "d4 bf16",
              f"{len(r.steps)} steps, resumes {r.resumes}, label {r.label!r}")
        r = plot.read_log(j("diverged.jsonl"))
        nulls = [s for s in r.steps if math.isnan(r.steps[s]["loss"])]
        check("parse: null losses read as NaN", nulls == list(range(66, 91)), str(nulls[:5]))
        check("parse: tokens at a val step", r.tokens_at(25) == 25 * 512, str(r.tokens_at(25)))
        r = plot.read_log(j("unlabelled", "log.jsonl"))
        check("parse: without tokens_per_step, tokens per step come from the step lines",
              r.tokens_at(15) == 15 * 512, str(r.tokens_at(15)))
        runs = [plot.read_log(j(p, "log.jsonl")) for p in ("fp32", "unlabelled", "fp32")]
        got = plot.run_labels(runs, [j("fp32"), j("unlabelled", "log.jsonl"), j("fp32", "log.jsonl")], None)
        check("labels: run label, else the directory name; repeated labels get the file's name",
              got == ["d4 fp32 (fp32)", "unlabelled", "d4 fp32 (fp32)"], str(got))
        got = plot.smooth([1.0, 3.0, math.nan, 7.0, 9.0], 3)
        check("smooth: a straight line stays exact, ends included; a null stays a gap",
              got[:2] + got[3:] == [1.0, 3.0, 7.0, 9.0] and math.isnan(got[2]), str(got))
        got = plot.smooth([0.0, 3.0, 0.0, 3.0, 0.0, 3.0, 0.0], 3)
        check("smooth: a full window gives the moving mean", abs(got[3] - 1.0) < 1e-12, str(got))

        # x ticks by step are whole steps, also when a log has one step (matplotlib's default view of
        # one point spans a tenth of a step); the figure is kept by replacing plt.close while it draws
        import matplotlib.pyplot as plt
        closed = []
        close, plt.close = plt.close, closed.append
        try:
            r = plot.read_log(j("onestep.jsonl"))
            plot.render([r], ["one step"], j("onestep.png"), "step", 1)
        finally:
            plt.close = close
        ticks = [t for ax in closed[0].axes for t in ax.get_xticks()
                 if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]] if closed else []
        check("x by step: one step's chart has whole-step ticks only", ticks and all(t == int(t) for t in ticks),
              str(ticks))
        if closed:
            close(closed[0])

        if keep:
            shutil.copytree(d, keep, dirs_exist_ok=True)
            print(f"logs and charts kept in {keep}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
