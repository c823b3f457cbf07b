"""scripts/kernel_profile.py — what Nsight Compute measured, from its CSV (ncu --csv --log-file FILE).

Time per kernel: scripts/gpu_check.sh profiles one step of train_gpt2 (--profile-step) under
`ncu --profile-from-start off --metrics gpu__time_duration.sum`; this sums the durations per kernel
name over the step's launches, largest first, and prints each kernel's share of the step. ncu runs
the kernels one at a time, so the sum is the step's busy time with no overlap; given the step's
measured time (--step-ms, from an unprofiled run of the same shape), the rest is time the GPU spent
idle between kernels (launch gaps, host waits).

    python3 scripts/kernel_profile.py NCU_CSV [--step-ms MS] [--top N]

Prints a table, then one line `PROFILE_JSON {...}` with every kernel's figures.

Sections per launch (--metrics): for ncu runs with --section (gpu_check: the attention kernels'
throughput, occupancy, warp states, compute and memory workloads), one line per launch with the
figures that say what bounds a kernel, then one line `METRICS_JSON [...]` with every metric of every
launch ("section / metric": "value unit").

    python3 scripts/kernel_profile.py --metrics NCU_CSV
"""
import argparse
import csv
import json
import math
import sys

# Nsight Compute's duration units (long and short forms), in microseconds.
UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6,
            "s": 1e6}


# The figures --metrics prints per launch (where the ncu version names them so): time, how busy the SMs
# and DRAM were against their peaks, occupancy, and the cycles between a warp's instructions.
BRIEF = ["Duration", "Compute (SM) Throughput", "DRAM Throughput", "Achieved Occupancy", "Issue Slots Busy",
         "Warp Cycles Per Issued Instruction"]


def read_rows(path):
    """ncu's CSV rows at path as dicts by column name (its header row found past ncu's own messages)."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not text (ncu's CSV is)") from None
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r), None)
    if header is None:
        raise ValueError(f"{path}: no ncu CSV header (a row with 'Kernel Name' and 'Metric Value')")
    names = rows[header]
    # A measurement row may end after its value (ncu 2025 leaves the rule columns off); shorter rows
    # are ncu's own messages.
    need = names.index("Metric Value") + 1
    return [dict(zip(names, r + [""] * (len(names) - len(r)))) for r in rows[header + 1:] if need <= len(r) <= len(names)]


def read_metrics(path):
    """[{"id", "kernel", "metrics": {"section / metric": "value unit"}}] per launch, in launch order."""
    launches = {}
    for r in read_rows(path):
        if not r.get("Metric Name"):
            continue  # a rule's advice, not a measurement
        launch = launches.setdefault(r["ID"], {"id": r["ID"], "kernel": r["Kernel Name"], "metrics": {}})
        unit = r.get("Metric Unit", "").strip()
        launch["metrics"][f"{r.get('Section Name', '')} / {r['Metric Name']}"] = \
            r["Metric Value"] + (" " + unit if unit else "")
    return sorted(launches.values(), key=lambda l: int(l["id"]) if l["id"].isdigit() else 0)


def read_durations(path):
    """[(kernel name, microseconds)] for every gpu__time_duration.sum row of the ncu CSV at path."""
    out = []
    for r in read_rows(path):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue  # other metrics
        if "Metric Unit" not in r:
            raise ValueError(f"{path}: no 'Metric Unit' column (ncu --csv writes one beside 'Metric Value')")
        unit = r["Metric Unit"].strip()
        if unit not in UNITS_US:
            raise ValueError(f"{path}: duration unit '{unit}' is not one of {', '.join(UNITS_US)}")
        try:
            value = float(r["Metric Value"].replace(",", ""))  # some ncu versions group thousands
        except ValueError:
            raise ValueError(f"{path}: {r['Kernel Name']}: duration '{r['Metric Value']}' is not a number") from None
        out.append((r["Kernel Name"], value * UNITS_US[unit]))
    return out


def summarize(durations, step_ms=None):
    """Per kernel name: launches, total µs and share of the kernels' sum, largest first."""
    by_name = {}
    for name, us in durations:
        n, t = by_name.get(name, (0, 0.0))
        by_name[name] = (n + 1, t + us)
    busy_us = sum(t for _, t in by_name.values())
    kernels = [{"kernel": k, "launches": n, "us": round(t, 3), "share": round(t / busy_us, 4) if busy_us else 0.0}
               for k, (n, t) in sorted(by_name.items(), key=lambda kv: (-kv[1][1], kv[0]))]
    summary = {"launches": len(durations), "busy_ms": round(busy_us / 1e3, 3), "kernels": kernels}
    if step_ms is not None:
        summary["step_ms"] = step_ms
        summary["idle_share"] = round(max(0.0, 1 - busy_us / 1e3 / step_ms), 4)
    return summary


def print_metrics(launches):
    """One line per launch: its kernel and the BRIEF figures it has; then METRICS_JSON."""
    for l in launches:
        brief = {m.split(" / ", 1)[1]: v for m, v in l["metrics"].items()}
        figures = ", ".join(f"{name} {brief[name]}" for name in BRIEF if name in brief)
        print(f"{l['kernel'][:60]}: {figures or 'none of ' + ', '.join(BRIEF)}")
    print("METRICS_JSON " + json.dumps(launches, separators=(",", ":")))


def positive_ms(text):
    """--step-ms's value: a time in milliseconds, finite and above 0."""
    try:
        ms = float(text)
    except ValueError:
        ms = float("nan")
    if not math.isfinite(ms) or ms <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a time in ms above 0")
    return ms


def count(text):
    """--top's value: a whole number of at least 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of at least 0")
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu's CSV output (--csv --log-file FILE)")
    ap.add_argument("--step-ms", type=positive_ms, default=None,
                    help="the step's time measured without the profiler")
    ap.add_argument("--top", type=count, default=20, help="kernels listed in the table (the JSON has all)")
    ap.add_argument("--metrics", action="store_true", help="every metric per launch (ncu run with --section)")
    a = ap.parse_args()
    try:
        if a.metrics:
            launches = read_metrics(a.csv)
            if not launches:
                raise ValueError(f"{a.csv}: no metrics (did the profiled kernels run?)")
            print_metrics(launches)
            return 0
        s = summarize(read_durations(a.csv), a.step_ms)
    except (OSError, ValueError) as e:
        print(f"kernel_profile: {e}", file=sys.stderr)
        return 1
    if not s["kernels"]:
        print(f"kernel_profile: {a.csv}: no kernel durations (did the profiled step run?)", file=sys.stderr)
        return 1
    idle = ""
    if "step_ms" in s:
        idle = f" of a {s['step_ms']:.3f} ms step ({100 * s['idle_share']:.1f}% idle between kernels)"
    print(f"{s['launches']} launches, {len(s['kernels'])} kernels, {s['busy_ms']:.3f} ms busy{idle}")
    print(f"{'share':>6} {'ms':>9} {'launches':>8}  kernel")
    for k in s["kernels"][:a.top]:
        print(f"{100 * k['share']:5.1f}% {k['us'] / 1e3:9.3f} {k['launches']:8d}  {k['kernel'][:100]}")
    rest = s["kernels"][a.top:]
    if rest:
        print(f"{100 * sum(k['share'] for k in rest):5.1f}% {sum(k['us'] for k in rest) / 1e3:9.3f} "
              f"{sum(k['launches'] for k in rest):8d}  ({len(rest)} other kernels)")
    print("PROFILE_JSON " + json.dumps(s, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
