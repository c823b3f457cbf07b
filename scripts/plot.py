#!/usr/bin/env python3
"""scripts/plot.py — charts training runs from the trainer's JSON Lines logs (format: llmc/logger.h).

One PNG with a 2x2 grid: train loss and val loss (dots), learning rate, throughput (tokens/s) and
gradient norm, by step or by tokens seen; noisy series are drawn faint with a smoothed line on top.
Several logs overlay in distinct colours; a dotted vertical line marks where a run was resumed, and
crosses along the top of the loss panel mark steps whose loss was null (a diverged run).

  scripts/plot.py LOG_OR_DIR [LOG_OR_DIR ...] [-o out.png] [--labels a,b] [--x step|tokens] [--smooth N]

A directory means DIR/log.jsonl (what `train_gpt2 -o DIR` writes). Needs matplotlib.
"""
import argparse
import io
import json
import math
import os
import sys

PROG = "plot.py"
STEP_FIELDS = ("loss", "grad_norm", "lr", "tokens_per_s", "tokens")


def die(msg):
    """Prints one error line and exits with status 1."""
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(1)


def number(v):
    """A JSON value as a float; NaN for null, a non-number or a non-finite value (matplotlib leaves a gap)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    v = float(v)
    return v if math.isfinite(v) else math.nan


class Run:
    """What one log holds: per-step metrics, val losses, resume points and the run's description."""

    def __init__(self, path):
        self.path = path
        self.label = None            # from the first "run" or "resume" line that has one
        self.tokens_per_step = None  # from the last "run" or "resume" line that has one
        self.steps = {}              # step -> {field: float or NaN}
        self.val = {}                # step -> val loss (float or NaN)
        self.resumes = []            # steps a resumed run started from
        self.malformed = []          # line numbers of lines that are not log lines

    def step_numbers(self):
        """The steps that have a step line, in order."""
        return sorted(self.steps)

    def series(self, field):
        """(steps, values) of one step-line field, in step order."""
        s = self.step_numbers()
        return s, [self.steps[k][field] for k in s]

    def tokens_at(self, step):
        """Tokens seen after `step` optimizer steps: the step line's own count, else step * tokens per step."""
        rec = self.steps.get(step)
        if rec is not None and not math.isnan(rec["tokens"]):
            return rec["tokens"]
        tps = self.tokens_per_step
        if tps is None:  # no run line says it: derive it from a step line that counts tokens
            for k, r in self.steps.items():
                if k > 0 and not math.isnan(r["tokens"]):
                    tps = r["tokens"] / k
                    break
        return None if tps is None else step * tps


def resolve(arg):
    """The log file an argument names: the file itself, or DIR/log.jsonl."""
    if os.path.isdir(arg):
        path = os.path.join(arg, "log.jsonl")
        if not os.path.isfile(path):
            die(f"no log.jsonl in the directory {arg}")
        return path
    if not os.path.exists(arg):
        die(f"no such file: {arg}")
    return arg


def read_log(path):
    """Parses one log. Lines that are not JSON objects with a string "event" and an integer "step" are
    counted as malformed and skipped; unknown events and fields are ignored so the format can grow.
    A step that appears twice keeps its later line (a log appended to by a resumed run)."""
    run = Run(path)
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if (not isinstance(obj, dict) or not isinstance(obj.get("event"), str)
                    or type(obj.get("step")) is not int):
                run.malformed.append(lineno)
                continue
            event, step = obj["event"], obj["step"]
            if event in ("run", "resume"):  # a resumed run describes itself again on its resume line
                label = obj.get("label")
                if run.label is None and isinstance(label, str) and label.strip():
                    run.label = label.strip()
                tps = number(obj.get("tokens_per_step"))
                if tps > 0:
                    run.tokens_per_step = tps
                if event == "resume" and step not in run.resumes:
                    run.resumes.append(step)
            elif event == "step":
                run.steps[step] = {k: number(obj.get(k)) for k in STEP_FIELDS}
            elif event == "val":
                run.val[step] = number(obj.get("loss"))
    if run.malformed:
        n = len(run.malformed)
        print(f"{PROG}: warning: {path}: skipped {n} malformed line{'s' if n != 1 else ''} "
              f"(first: line {run.malformed[0]})", file=sys.stderr)
    if not run.steps:
        die(f"{path} has no step lines (not a training log, or its run has not finished a step yet)")
    return run


def smooth(values, n):
    """Smooths a series with a least-squares line through a centred window of about n entries (n rounded
    up to odd), ignoring NaNs. Where the whole window fits this is the moving mean; near the ends the
    window is clipped to the data and the line keeps following the trend, so the curve neither jumps to
    the raw last value nor is pulled towards the middle of the run. NaN stays NaN (a null stays a gap)."""
    half = n // 2
    # prefix sums over the finite points j: count, sum j, sum j^2 (exact integers), sum y, sum j*y
    c0, c1, c2, sy, sxy = [0], [0], [0], [0.0], [0.0]
    for j, v in enumerate(values):
        finite = not math.isnan(v)
        c0.append(c0[-1] + finite)
        c1.append(c1[-1] + (j if finite else 0))
        c2.append(c2[-1] + (j * j if finite else 0))
        sy.append(sy[-1] + (v if finite else 0.0))
        sxy.append(sxy[-1] + (j * v if finite else 0.0))
    out = []
    for i in range(len(values)):
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        k, s1, s2 = c0[hi] - c0[lo], c1[hi] - c1[lo], c2[hi] - c2[lo]
        y, xy = sy[hi] - sy[lo], sxy[hi] - sxy[lo]
        if math.isnan(values[i]):
            out.append(math.nan)
            continue
        spread = k * s2 - s1 * s1  # k^2 times the variance of the window's positions
        slope = (k * xy - s1 * y) / spread if spread else 0.0
        out.append(y / k + slope * (i - s1 / k))
    return out


def default_smoothing(runs):
    """About 1/30 of the longest run, so a curve's trend shows through step-to-step noise."""
    return max(1, round(max(len(r.steps) for r in runs) / 30))


def run_labels(runs, paths_given, labels_arg):
    """Legend labels: --labels, else each run line's label, else the file (or directory) name; made unique."""
    if labels_arg is not None:
        labels = [s.strip() for s in labels_arg.split(",")]
        if len(labels) != len(runs):
            die(f"--labels has {len(labels)} label{'s' if len(labels) != 1 else ''} for {len(runs)} "
                f"log{'s' if len(runs) != 1 else ''}")
        return labels
    names = []
    for arg in paths_given:
        a = os.path.normpath(arg)
        if os.path.isdir(a) or os.path.basename(a) == "log.jsonl":
            d = a if os.path.isdir(a) else os.path.dirname(a)
            names.append(os.path.basename(os.path.abspath(d)))
        else:
            names.append(os.path.splitext(os.path.basename(a))[0])
    labels = [r.label or n for r, n in zip(runs, names)]
    # the same label twice (two fp32 runs): add the file or directory name
    return [f"{lab} ({n})" if labels.count(lab) > 1 and r.label else lab for lab, n, r in zip(labels, names, runs)]


def render(runs, labels, out, xmode, n_smooth):
    """Draws the 2x2 chart of all runs into out."""
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib import ticker, transforms
    from matplotlib.lines import Line2D

    def xs(run, steps):
        """x positions of a run's steps: the steps themselves, or the tokens seen by then."""
        if xmode == "step":
            return list(steps)
        x = [run.tokens_at(s) for s in steps]
        if any(v is None for v in x):
            die(f"{run.path}: --x tokens needs \"tokens\" in its step lines or \"tokens_per_step\" in its run line")
        return x

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axs = plt.subplots(2, 2, figsize=(12, 8), dpi=100, layout="constrained", sharex=True)
    ax_loss, ax_lr, ax_tps, ax_norm = axs.flat
    top_edge = transforms.blended_transform_factory(ax_loss.transData, ax_loss.transAxes)
    n_val = max(len(r.val) for r in runs)
    val_ms = 5.5 if n_val <= 40 else 3.5  # many val points: smaller dots, so the train curve stays visible
    any_diverged = False
    norms = [v for run in runs for v in run.series("grad_norm")[1] if v > 0]
    log_norm = bool(norms) and max(norms) / min(norms) > 100  # spans more than two decades

    for i, run in enumerate(runs):
        c = colors[i % len(colors)]
        steps = run.step_numbers()
        x = xs(run, steps)
        one = "o" if len(x) == 1 else None  # a single point draws no line
        # noisy per-step series: faint raw line under the smoothed one; the lr schedule is already smooth
        for field, ax in (("loss", ax_loss), ("tokens_per_s", ax_tps), ("grad_norm", ax_norm)):
            values = run.series(field)[1]
            if n_smooth > 1:
                ax.plot(x, values, color=c, lw=0.8, alpha=0.3)
            if ax is ax_norm and log_norm:  # on a log axis smooth the logarithm: spikes are multiplicative
                logs = [math.log(v) if v > 0 else math.nan for v in values]
                smoothed = [math.exp(v) for v in smooth(logs, n_smooth)]
            else:
                smoothed = smooth(values, n_smooth)
            ax.plot(x, smoothed, color=c, lw=1.8 if ax is ax_loss else 1.4, marker=one)
        ax_lr.plot(x, run.series("lr")[1], color=c, lw=1.4, marker=one)
        vsteps = sorted(run.val)
        ax_loss.plot(xs(run, vsteps), [run.val[s] for s in vsteps], "o", color=c, ms=val_ms, mec="white",
                     mew=0.8, zorder=3)
        # null losses (a diverged run) would be invisible gaps: mark them along the top edge
        nulls = [xv for xv, v in zip(x, run.series("loss")[1]) if math.isnan(v)]
        if nulls:
            any_diverged = True
            ax_loss.plot(nulls, [0.97] * len(nulls), "x", color=c, ms=5, transform=top_edge, clip_on=False)
        for xv in xs(run, run.resumes):
            for ax in axs.flat:
                ax.axvline(xv, color=c, ls=":", lw=1.3, alpha=0.9)

    # a diverged run's loss shoots up: keep the scale on the part that trained and clip the spike
    losses = [v for run in runs for v in run.series("loss")[1] + list(run.val.values()) if not math.isnan(v)]
    start = [v for run in runs for v in run.series("loss")[1][:3] + list(run.val.values()) if not math.isnan(v)]
    clip = None
    if start and max(losses) > 1.25 * max(start):
        clip = 1.15 * max(start)
        ax_loss.set_ylim(min(losses) - 0.05 * (clip - min(losses)), clip)
    if log_norm:
        ax_norm.set_yscale("log")

    xlabel = "step" if xmode == "step" else "tokens"
    ax_loss.set_title("loss", loc="left", fontweight="bold")
    if clip is not None:
        ax_loss.set_title(f"clipped at {clip:.3g} (max {max(losses):.3g})", loc="right", fontsize=9, color="0.35")
    ax_lr.set_title("learning rate", loc="left", fontweight="bold")
    ax_tps.set_title("throughput", loc="left", fontweight="bold")
    ax_norm.set_title("gradient norm" + (" (log scale)" if log_norm else ""), loc="left", fontweight="bold")
    ax_loss.set_ylabel("cross-entropy loss")
    ax_lr.set_ylabel("learning rate")
    ax_tps.set_ylabel("tokens/s")
    ax_norm.set_ylabel("global grad norm")
    ax_lr.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax_tps.yaxis.set_major_formatter(ticker.EngFormatter(sep=""))
    ax_tps.set_ylim(bottom=0)
    for ax in axs.flat:
        ax.grid(True, alpha=0.3, lw=0.6)
        if xmode == "tokens":
            ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
        else:
            ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, min_n_ticks=1))
    for ax in axs[1]:
        ax.set_xlabel(xlabel)
    for ax in axs[0]:  # sharex hides the top row's tick labels; keep them, the panels are far apart
        ax.tick_params(labelbottom=True)

    grey = "0.35"  # the loss panel's key to line styles; colours (runs) are in the figure legend
    style = [(Line2D([], [], color=grey, lw=1.8),
              f"train, smoothed ({n_smooth} steps)" if n_smooth > 1 else "train")]
    if n_smooth > 1:
        style.append((Line2D([], [], color=grey, lw=0.8, alpha=0.4), "train, raw"))
    if n_val:
        style.append((Line2D([], [], color=grey, marker="o", ls="", ms=5.5, mec="white"), "val"))
    if any_diverged:
        style.append((Line2D([], [], color=grey, marker="x", ls="", ms=5), "loss null (diverged)"))
    if any(r.resumes for r in runs):
        style.append((Line2D([], [], color=grey, ls=":", lw=1.3), "resumed here"))
    ax_loss.legend(*zip(*style), fontsize=8.5, loc="upper right", bbox_to_anchor=(1, 0.92), framealpha=0.85)

    if len(runs) > 1:  # one run is named in the title
        handles = [Line2D([], [], color=colors[i % len(colors)], lw=2.5) for i in range(len(runs))]
        kw = dict(ncol=min(len(runs), 4), frameon=False, fontsize=10)
        try:
            fig.legend(handles, labels, loc="outside lower center", **kw)
        except ValueError:  # matplotlib < 3.7 (e.g. Debian 12's): leave room for the legend by hand
            bottom = 0.02 + 0.03 * math.ceil(len(runs) / 4)  # and for the title, which that rect leaves out
            fig.get_layout_engine().set(rect=(0, bottom, 1, 0.955 - bottom))
            fig.legend(handles, labels, loc="lower center", **kw)
    what = f"train/val loss, learning rate, tokens/s and gradient norm by {xlabel}"
    fig.suptitle(f"{labels[0]}: {what}" if len(runs) == 1 else f"{len(runs)} runs: {what}", fontsize=13)

    # Rendered to memory, then written and closed here: matplotlib's own writer can drop the error of a
    # write that fails only when the file is flushed (a full disk), and the run would then claim a plot.
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format=os.path.splitext(out)[1][1:].lower() or None)
        with open(out, "wb") as f:
            f.write(buf.getvalue())
    except (OSError, ValueError) as e:
        die(f"cannot write {out}: {e.strerror if isinstance(e, OSError) else e}")
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Charts training runs from the trainer's JSON Lines logs (llmc/logger.h): one PNG with\n"
                    "a 2x2 grid of train/val loss, learning rate, tokens/s and gradient norm; several logs\n"
                    "overlay in distinct colours. Prints the path it wrote.",
        epilog="examples:\n  scripts/plot.py out/                      # out/log.jsonl -> out/plot.png\n"
               "  scripts/plot.py runs/fp32 runs/bf16 --labels fp32,bf16 -o cmp.png --x tokens",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", metavar="LOG_OR_DIR", help="a log.jsonl file, or a directory holding one")
    p.add_argument("-o", "--output", metavar="OUT.png",
                   help="image to write (a directory: OUT/plot.png); default plot.png next to the first log")
    p.add_argument("--labels", metavar="A,B,...",
                   help="legend labels, one per log (default: the log's run label, else its file/dir name)")
    p.add_argument("--x", choices=("step", "tokens"), default="step", help="x axis (default step)")
    p.add_argument("--smooth", type=int, metavar="N",
                   help="smooth loss, tokens/s and grad norm over a centred window of N steps (odd; 1 = raw; "
                        "default about 1/30 of the longest run)")
    args = p.parse_args(argv)
    if args.smooth is not None and args.smooth < 1:
        die("--smooth must be at least 1")
    try:
        import matplotlib  # noqa: F401  (checked before reading logs; render() uses it)
    except ImportError:
        die(f"matplotlib is not installed for {sys.executable}: pip install matplotlib")

    paths = [resolve(a) for a in args.logs]
    runs = [read_log(path) for path in paths]
    labels = run_labels(runs, args.logs, args.labels)
    out = args.output or os.path.join(os.path.dirname(paths[0]), "plot.png")
    if os.path.isdir(out):
        out = os.path.join(out, "plot.png")
    render(runs, labels, out, args.x, (args.smooth or default_smoothing(runs)) | 1)  # odd: centred windows
    print(out)


if __name__ == "__main__":
    main()
