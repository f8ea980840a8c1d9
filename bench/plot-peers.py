#!/usr/bin/env python3
"""ASCII chart of `regpool-perf --peers ... --json` runs (issue 14).

    bench/plot-peers.py RUN.json [RUN.json ...]

For each run (one provider) prints, per number of peers N, the server's
receive memory, its resident-memory growth, the aggregate message rate and
the server's CPU time per message, each with a bar scaled to the largest
value of that column over all runs, and the ratio of receive memory at the
largest N to that at the smallest (the issue's goal: at most 1.5). Rows of
the same N (a run may repeat N to interleave) are reduced to their median.
"""
import json
import statistics
import sys

WIDTH = 30


def bar(value, top):
    if value is None or top <= 0:
        return ""
    return "#" * max(1, round(WIDTH * value / top)) if value > 0 else ""


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def reduce(run):
    by_n = {}
    for r in run["results"]:
        if r.get("error") is None:
            by_n.setdefault(r["peers"], []).append(r)
    out = []
    for n in sorted(by_n):
        rows = by_n[n]
        out.append({
            "peers": n,
            "recv": median([r["receive_memory_bytes"] for r in rows]),
            "endpoint": median([r["endpoint_memory_bytes"] for r in rows]),
            "rate": median([r["rate_Mops"] for r in rows]),
            "cpu": median([r.get("server_cpu_us_per_message") for r in rows]),
        })
    return out


def main(paths):
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    runs = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
        if d.get("mode") != "peers":
            print(f"{p}: not a regpool-perf --peers run", file=sys.stderr)
            return 1
        runs.append((p, d, reduce(d)))
    cols = {k: max([r[k] or 0 for _, _, rows in runs for r in rows] or [0]) for k in ("recv", "endpoint", "rate", "cpu")}
    for p, d, rows in runs:
        print(f"{d['provider']} ({p}): {d['iters']} messages per client, window {d['window']}, wait {d['wait']}")
        print(f"{'N':>4}  {'receive memory':<{WIDTH + 11}} {'endpoint memory':<{WIDTH + 11}} "
              f"{'rate Mops/s':<{WIDTH + 11}} server CPU us/msg")
        for r in rows:
            cells = []
            for k, scale, fmt in (("recv", 2**20, "{:7.2f} MiB"), ("endpoint", 2**20, "{:7.2f} MiB"),
                                  ("rate", 1, "{:9.5f}  ")):
                v = r[k]
                text = fmt.format(v / scale) if v is not None else "-"
                cells.append(f"{text:>11}{bar(v, cols[k]):<{WIDTH}}")
            cpu = f"{r['cpu']:.1f}" if r["cpu"] is not None else "-"
            print(f"{r['peers']:>4}  " + " ".join(cells) + f" {cpu}")
        if len(rows) >= 2 and rows[0]["recv"]:
            print(f"receive memory N={rows[-1]['peers']} / N={rows[0]['peers']}: "
                  f"{rows[-1]['recv'] / rows[0]['recv']:.2f}x; rate: {rows[-1]['rate'] / rows[0]['rate']:.2f}x")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
