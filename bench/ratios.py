#!/usr/bin/env python3
"""Ratio table for bench-alloc (python3 standard library only).

Usage:
  bench-alloc --benchmark_format=json --benchmark_repetitions=N \
      --benchmark_report_aggregates_only=true > run.json
  python3 bench/ratios.py run.json          (or: ... | python3 bench/ratios.py -)

Uses the median aggregate of every benchmark (or the median of the
repetitions when the JSON holds individual runs) and prints, per size:
  regpool / malloc                      target <= 1.0
  malloc_register/host / regpool        target >= 100 at 64 KiB and above
  regpool 2 threads / 1 thread          target >= 1.7 (items_per_second)
plus the other figures for context. Times are wall-clock (real_time) by
default; --time=cpu uses cpu_time for the single-thread rows (the scaling
rows always use items_per_second of the real-time two-thread family).
Exit status: 0, or 1 with --strict when a target is missed or a benchmark
needed for a target is missing or failed.
"""

import argparse
import json
import re
import statistics
import sys

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}

MALLOC_REGISTER_SPEEDUP = 100.0
MALLOC_REGISTER_MIN_SIZE = 64 << 10
SCALING = 1.7
POOL_VS_MALLOC = 1.0


def human(size):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= (1 << shift) and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def fmt_ns(v):
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} ms"
    if v >= 1e3:
        return f"{v / 1e3:.2f} us"
    return f"{v:.1f} ns"


def load(path):
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    # The console reporter may share the stream; take the JSON object only.
    start = text.find("{")
    return json.loads(text[start:]), text


class Figures:
    """Median figures keyed by run name (e.g. 'regpool/64')."""

    def __init__(self, doc):
        self.time = {}      # run name -> {"real": ns, "cpu": ns}
        self.ips = {}       # run name -> items_per_second
        self.cv = {}        # run name -> {"real": cv, "cpu": cv} (fractions)
        self.errors = {}    # run name -> message
        self.reps = {}      # run name -> repetitions
        runs = {}           # run name -> list of iteration entries
        for b in doc.get("benchmarks", []):
            name = b.get("run_name", b.get("name"))
            if b.get("error_occurred"):
                self.errors[name] = b.get("error_message", "error")
                continue
            scale = UNIT_NS.get(b.get("time_unit", "ns"), 1.0)
            kind = b.get("run_type", "iteration")
            if kind == "aggregate":
                agg = b.get("aggregate_name")
                if agg == "median":
                    self.time[name] = {"real": b["real_time"] * scale, "cpu": b["cpu_time"] * scale}
                    if "items_per_second" in b:
                        self.ips[name] = b["items_per_second"]
                    self.reps[name] = b.get("repetitions")
                elif agg == "cv":
                    self.cv[name] = {"real": b["real_time"], "cpu": b["cpu_time"]}
            else:
                runs.setdefault(name, []).append(b)
        for name, entries in runs.items():
            if name in self.time:
                continue
            scale = [UNIT_NS.get(e.get("time_unit", "ns"), 1.0) for e in entries]
            self.time[name] = {
                "real": statistics.median(e["real_time"] * s for e, s in zip(entries, scale)),
                "cpu": statistics.median(e["cpu_time"] * s for e, s in zip(entries, scale)),
            }
            ips = [e["items_per_second"] for e in entries if "items_per_second" in e]
            if ips:
                self.ips[name] = statistics.median(ips)
            self.reps[name] = len(entries)
            cv = {}
            for which in ("real", "cpu"):
                vals = [e[f"{which}_time"] * s for e, s in zip(entries, scale)]
                if len(vals) > 1 and statistics.mean(vals) > 0:
                    cv[which] = statistics.stdev(vals) / statistics.mean(vals)
            if cv:
                self.cv[name] = cv

    def t(self, name, which):
        v = self.time.get(name)
        return None if v is None else v[which]

    def sizes(self):
        out = set()
        for name in list(self.time) + list(self.errors):
            m = re.match(r"^(regpool|malloc|malloc_register/\w+|bounce_copy)/(\d+)$", name)
            if m:
                out.add(int(m.group(2)))
        return sorted(out)

    def domains(self):
        out = []
        for name in list(self.time) + list(self.errors):
            m = re.match(r"^malloc_register/(\w+)/\d+$", name)
            if m and m.group(1) not in out:
                out.append(m.group(1))
        order = {"host": 0, "shm": 1, "tcp": 2}
        return sorted(out, key=lambda d: (order.get(d, 9), d))

    def mt(self, method, size, threads):
        for name in (f"{method}_mt/{size}/real_time/threads:{threads}", f"{method}_mt/{size}/threads:{threads}"):
            if name in self.ips:
                return self.ips[name]
        return None

    def mt_cpu(self, method, size, threads):
        for name in (f"{method}_mt/{size}/real_time/threads:{threads}", f"{method}_mt/{size}/threads:{threads}"):
            if name in self.time:
                return self.time[name]["cpu"]
        return None

    def cv_of(self, *names, which="real"):
        vals = [self.cv[n][which] for n in names if which in self.cv.get(n, {})]
        return max(vals) if vals else None


def verdict(ok):
    return "PASS" if ok else "MISS"


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="bench-alloc JSON output ('-' for stdin)")
    ap.add_argument("--time", choices=("real", "cpu"), default="real")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()

    doc, _ = load(args.json)
    f = Figures(doc)
    ctx = doc.get("context", {})
    which = args.time
    misses = 0
    missing = 0

    reps = sorted({r for r in f.reps.values() if r})
    print(f"# bench-alloc ratios ({which} time, medians of {'/'.join(map(str, reps)) or '?'} repetitions)")
    if ctx:
        print(f"# host {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} cpus @ {ctx.get('mhz_per_cpu', '?')} MHz,"
              f" load avg {', '.join(f'{x:.2f}' for x in ctx.get('load_avg', []))}, {ctx.get('date', '')}")
    print()

    sizes = f.sizes()
    domains = f.domains()

    # ---- medians
    header = ["size", "regpool", "malloc"] + [f"malloc_register/{d}" for d in domains] + ["bounce_copy"]
    rows = []
    for s in sizes:
        r = [human(s), fmt_ns(f.t(f"regpool/{s}", which)), fmt_ns(f.t(f"malloc/{s}", which))]
        for d in domains:
            n = f"malloc_register/{d}/{s}"
            r.append("skipped" if n in f.errors else fmt_ns(f.t(n, which)))
        r.append(fmt_ns(f.t(f"bounce_copy/{s}", which)))
        rows.append(r)
    print("Median time per operation (one thread):")
    print()
    table(rows, header)
    print()

    # ---- targets
    rows = []
    for s in sizes:
        rp = f.t(f"regpool/{s}", which)
        ml = f.t(f"malloc/{s}", which)
        if rp is None or ml is None:
            rows.append([human(s), "regpool / malloc", "missing", "<= 1.0", "MISS", "-"])
            missing += 1
        else:
            ratio = rp / ml
            ok = ratio <= POOL_VS_MALLOC
            misses += not ok
            cv = f.cv_of(f"regpool/{s}", f"malloc/{s}", which=which)
            rows.append([human(s), "regpool / malloc", f"{ratio:.2f}", "<= 1.0", verdict(ok),
                         "-" if cv is None else f"{100 * cv:.0f}%"])
    for s in sizes:
        one, two = f.mt("regpool", s, 1), f.mt("regpool", s, 2)
        if one is None or two is None:
            rows.append([human(s), "regpool 2T / 1T items/s", "missing", ">= 1.7", "MISS", "-"])
            missing += 1
        else:
            ratio = two / one
            ok = ratio >= SCALING
            misses += not ok
            cv = f.cv_of(f"regpool_mt/{s}/real_time/threads:1", f"regpool_mt/{s}/real_time/threads:2")
            rows.append([human(s), "regpool 2T / 1T items/s", f"{ratio:.2f}", ">= 1.7", verdict(ok),
                         "-" if cv is None else f"{100 * cv:.0f}%"])
    for s in sizes:
        if s < MALLOC_REGISTER_MIN_SIZE:
            continue
        rp = f.t(f"regpool/{s}", which)
        mr = f.t(f"malloc_register/host/{s}", which)
        if rp is None or mr is None:
            rows.append([human(s), "malloc_register/host / regpool", "missing", ">= 100", "MISS", "-"])
            missing += 1
        else:
            ratio = mr / rp
            ok = ratio >= MALLOC_REGISTER_SPEEDUP
            misses += not ok
            cv = f.cv_of(f"regpool/{s}", f"malloc_register/host/{s}", which=which)
            rows.append([human(s), "malloc_register/host / regpool", f"{ratio:.0f}", ">= 100", verdict(ok),
                         "-" if cv is None else f"{100 * cv:.0f}%"])
    print(f"Targets (cv: the larger coefficient of variation, {which} time, of the two figures compared):")
    print()
    table(rows, ["size", "ratio", "value", "target", "verdict", "cv"])
    print()

    # ---- context (no targets)
    rows = []
    for s in sizes:
        rp = f.t(f"regpool/{s}", which)
        r = [human(s)]
        for d in domains:
            mr = f.t(f"malloc_register/{d}/{s}", which)
            r.append("-" if rp is None or mr is None else f"{mr / rp:.1f}")
        bc = f.t(f"bounce_copy/{s}", which)
        r.append("-" if rp is None or bc is None else f"{bc / rp:.2f}")
        m1, m2 = f.mt("malloc", s, 1), f.mt("malloc", s, 2)
        r.append("-" if m1 is None or m2 is None else f"{m2 / m1:.2f}")
        for method in ("regpool", "malloc"):
            c1, c2 = f.mt_cpu(method, s, 1), f.mt_cpu(method, s, 2)
            r.append("-" if not c1 or not c2 else f"{2 * c1 / c2:.2f}")
        rows.append(r)
    print("Context (no targets): X / regpool time; malloc 2T / 1T items/s; and the 2T / 1T")
    print("throughput both methods would reach with two free cores, from cpu time per item")
    print("(2 x cpu/item 1T / cpu/item 2T: contention or false sharing lowers it, scheduling")
    print("noise from other processes mostly does not):")
    print()
    table(rows, ["size"] + [f"malloc_register/{d}" for d in domains] +
          ["bounce_copy", "malloc 2T/1T", "regpool 2T/1T (cpu)", "malloc 2T/1T (cpu)"])
    print()

    for name, msg in sorted(f.errors.items()):
        print(f"skipped/failed: {name}: {msg}")
    print(f"summary: {misses} target(s) missed, {missing} missing figure(s)")
    return 1 if args.strict and (misses or missing) else 0


if __name__ == "__main__":
    sys.exit(main())
