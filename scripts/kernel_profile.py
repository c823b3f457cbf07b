"""scripts/kernel_profile.py — where one training step's GPU time goes, from Nsight Compute's CSV.

scripts/gpu_check.sh profiles one step of train_gpt2 (--profile-step) under
`ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file FILE`; this sums the
durations per kernel name over the step's launches, largest first, and prints each kernel's share of
the step. ncu runs the kernels one at a time, so the sum is the step's busy time with no overlap;
given the step's measured time (--step-ms, from an unprofiled run of the same shape), the rest is
time the GPU spent idle between kernels (launch gaps, host waits).

    python3 scripts/kernel_profile.py NCU_CSV [--step-ms MS] [--top N]

Prints a table, then one line `PROFILE_JSON {...}` with every kernel's figures.
"""
import argparse
import csv
import json
import sys

# Nsight Compute's duration units (long and short forms), in microseconds.
UNITS_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6,
            "s": 1e6}


def read_durations(path):
    """[(kernel name, microseconds)] for every gpu__time_duration.sum row of the ncu CSV at path."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r), None)
    if header is None:
        raise ValueError(f"{path}: no ncu CSV header (a row with 'Kernel Name' and 'Metric Value')")
    col = {name: k for k, name in enumerate(rows[header])}
    out = []
    for r in rows[header + 1:]:
        if len(r) != len(rows[header]) or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue  # ncu's own messages between the rows, other metrics
        unit = r[col["Metric Unit"]].strip()
        if unit not in UNITS_US:
            raise ValueError(f"{path}: duration unit '{unit}' is not one of {', '.join(UNITS_US)}")
        value = float(r[col["Metric Value"]].replace(",", ""))  # some ncu versions group thousands
        out.append((r[col["Kernel Name"]], value * UNITS_US[unit]))
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
    if step_ms:
        summary["step_ms"] = step_ms
        summary["idle_share"] = round(max(0.0, 1 - busy_us / 1e3 / step_ms), 4)
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu's CSV output (--csv --log-file FILE)")
    ap.add_argument("--step-ms", type=float, default=None, help="the step's time measured without the profiler")
    ap.add_argument("--top", type=int, default=20, help="kernels listed in the table (the JSON has all)")
    a = ap.parse_args()
    try:
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
