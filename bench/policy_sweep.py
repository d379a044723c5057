#!/usr/bin/env python3
"""Eviction policy sweep: `expertctl replay --policy all --json` over pool sizes and traces.

Replays the real Mixtral-8x7B traces (tests/data/traces/mixtral-8x7b) at 64, 96, 128 and 192
bundles (of 256) and one synthetic DeepSeek-shaped trace (`expertctl trace synth --preset
deepseek`, modelled, not measured) at the same fractions of its distinct bundles. Writes a CSV,
prints a Markdown table with the bar cycle must meet (LRU + 0.35 x (Belady - LRU)), and draws
the hit rates with matplotlib when it is importable (Debian: apt-get install python3-matplotlib,
then run with /usr/bin/python3).

Usage: bench/policy_sweep.py [--expertctl build/bin/expertctl] [--csv bench/results/...]
                             [--png docs/policy-hit-rate.png] [--tokens 1000]
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REAL = os.path.join(ROOT, "tests", "data", "traces", "mixtral-8x7b")
CAPACITIES = [64, 96, 128, 192]
FRACTIONS = [c / 256 for c in CAPACITIES]  # the same share of the model for the synthetic trace
POLICIES = ["lru", "lfu", "cycle", "belady"]
BAR = 0.35  # cycle must recover this share of the gap from LRU to Belady


def replay(expertctl, trace, capacity_args):
    out = subprocess.run([expertctl, "replay", "--trace", trace, "--policy", "all", "--json"] +
                         capacity_args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--expertctl", default=os.path.join(ROOT, "build", "bin", "expertctl"))
    ap.add_argument("--csv", default=os.path.join(ROOT, "bench", "results", "policy_sweep.csv"))
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "policy-hit-rate.png"))
    ap.add_argument("--tokens", type=int, default=1000, help="tokens of the synthetic trace")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    runs = []  # (label, source, path, [(capacity args, nominal label)])
    for name in ["humaneval_2_routing", "gsm8k_2_routing", "routing_raw"]:
        runs.append((name, "real", os.path.join(REAL, name + ".jsonl"),
                     [(["--capacity", str(c)], c) for c in CAPACITIES]))
    tmp = tempfile.mkdtemp(prefix="policy_sweep_")
    synth = os.path.join(tmp, "deepseek_synth.jsonl")
    subprocess.run([args.expertctl, "trace", "synth", "--preset", "deepseek", "--tokens",
                    str(args.tokens), "--seed", str(args.seed), "--out", synth], check=True,
                   capture_output=True)
    runs.append(("deepseek_synth_%d" % args.tokens, "synthetic", synth,
                 [(["--capacity-fraction", repr(f)], f) for f in FRACTIONS]))

    rows = []
    for label, source, path, points in runs:
        for cap_args, nominal in points:
            d = replay(args.expertctl, path, cap_args)
            rate = {r["policy"]: r for r in d["results"]}
            lru, best = rate["lru"]["hit_rate"], rate["belady"]["hit_rate"]
            bar = lru + BAR * (best - lru)
            for p in POLICIES:
                r = rate[p]
                rows.append({
                    "trace": label, "source": source, "capacity": d["capacity"],
                    "capacity_fraction": round(d["capacity"] / d["distinct_bundles"], 4),
                    "policy": p, "hit_rate": round(r["hit_rate"], 4), "hits": r["hits"],
                    "accesses": r["accesses"], "bar": round(bar, 4),
                    "gap_share": round((r["hit_rate"] - lru) / (best - lru), 3)
                    if best > lru else 0.0})
            print("%-26s %6d  " % (label, d["capacity"]) + "  ".join(
                "%s %.4f" % (p, rate[p]["hit_rate"]) for p in POLICIES), file=sys.stderr)

    os.makedirs(os.path.dirname(args.csv), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)

    print("| trace | source | capacity | LRU | LFU | cycle | Belady | bar | cycle share of gap | met |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for label, source, _, points in runs:
        for i in range(len(points)):
            sel = [r for r in rows if r["trace"] == label][i * 4:(i + 1) * 4]
            h = {r["policy"]: r for r in sel}
            print("| %s | %s | %d (%.3f) | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f | %s |" % (
                label, source, h["cycle"]["capacity"], h["cycle"]["capacity_fraction"],
                h["lru"]["hit_rate"], h["lfu"]["hit_rate"], h["cycle"]["hit_rate"],
                h["belady"]["hit_rate"], h["cycle"]["bar"], h["cycle"]["gap_share"],
                "yes" if h["cycle"]["hit_rate"] >= h["cycle"]["bar"] else "no"))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: wrote %s only" % args.csv, file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), sharey=True)
    for ax, (label, source, _, _) in zip(axes, runs):
        sel = [r for r in rows if r["trace"] == label]
        for p, style in zip(POLICIES, ["o-", "s-", "D-", "k--"]):
            pts = [r for r in sel if r["policy"] == p]
            ax.plot([r["capacity_fraction"] for r in pts], [r["hit_rate"] for r in pts], style,
                    label=p, markersize=4)
        bars = [r for r in sel if r["policy"] == "cycle"]
        ax.plot([r["capacity_fraction"] for r in bars], [r["bar"] for r in bars], ":",
                color="grey", label="bar: LRU + 0.35 gap")
        ax.set_title("%s (%s)" % (label, source), fontsize=9)
        ax.set_xlabel("pool / distinct bundles")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("hit rate (demand only)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.png), exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print("wrote %s and %s" % (args.csv, args.png), file=sys.stderr)


if __name__ == "__main__":
    main()
