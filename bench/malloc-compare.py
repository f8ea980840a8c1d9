#!/usr/bin/env python3
"""bench-alloc under glibc, tcmalloc, jemalloc and mimalloc, in one go.

Usage:
  python3 bench/malloc-compare.py BUILD/bench/bench-alloc [--rounds 3] [--min-time 0.2]
      [--families single,mt,mixed,handoff] [--json out.json] [--strict]
      [--baseline OTHER/bench/bench-alloc]

Runs the malloc rows of bench-alloc once per allocator and round, each
allocator taken over with LD_PRELOAD (Debian: libtcmalloc-minimal4,
libjemalloc2, libmimalloc2.0; glibc is the unpreloaded run), and the regpool
rows in a process of their own, in a rotating order so that every column
sees the same machine load. Before measuring it checks that the preload
took: the dynamic linker's binding of `malloc` in bench-alloc
(LD_DEBUG=bindings) must name the allocator's library, and so must the
"malloc_library" bench-alloc reports from dladdr(&malloc) in every run.

Prints medians over the rounds (wall clock per operation; for two-thread
rows the time per item of both threads together) and the ratios
regpool / allocator, with the targets of issue 15:
  regpool <= 1.0 x glibc                      (must)
  regpool <= 1.25 x faster of tcmalloc, mimalloc  (must)
  regpool <= 1.0 x fastest of the four        (goal)
  regpool 2 threads / 1 thread >= 1.8         (goal)
--baseline adds the regpool rows of another build (e.g. the commit before a
change) as a column "before", run in the same rotation, and the ratio
regpool / before: a before/after comparison under the same machine load.
Missing allocators are reported with the package to install and left out.
Exit status: 0; with --strict 1 when a must-target is missed or an
allocator is missing.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

# One formatter for every bench table (bench/ratios.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ratios import fmt_ns as fmt  # noqa: E402

ALLOCATORS = [
    # name, library (None = glibc, no preload), Debian package
    ("glibc", None, "libc6"),
    ("tcmalloc", "libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    ("jemalloc", "libjemalloc.so.2", "libjemalloc2"),
    ("mimalloc", "libmimalloc.so.2", "libmimalloc2.0"),
]
LIB_DIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]

FAMILIES = {
    # family: (regpool regex, malloc regex) on bench-alloc's names
    "single": (r"regpool/[0-9]+$", r"malloc/[0-9]+$"),
    "mt": (r"regpool_mt/[0-9]+/real_time/threads:[0-9]$", r"malloc_mt/[0-9]+/real_time/threads:[0-9]$"),
    "mixed": (r"mixed_regpool$", r"mixed_malloc$"),
    "handoff": (r"handoff_regpool/[0-9]+/real_time$", r"handoff_malloc/[0-9]+/real_time$"),
}


def find_library(name):
    for d in LIB_DIRS:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return os.path.realpath(p)
    return None


def check_binding(bench, lib):
    """The library `malloc` of the bench-alloc executable binds to (LD_DEBUG)."""
    env = dict(os.environ, LD_DEBUG="bindings")
    if lib:
        env["LD_PRELOAD"] = lib
    out = subprocess.run([bench, "--benchmark_list_tests=true"], env=env, capture_output=True, text=True)
    for line in out.stderr.splitlines():
        m = re.search(r"binding file (\S+) \[0\] to (\S+) \[0\]: normal symbol `malloc'", line)
        if m and os.path.basename(m.group(1)) == os.path.basename(bench):
            return os.path.realpath(m.group(2))
    return None


def run(bench, lib, regex, min_time):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib:
        env["LD_PRELOAD"] = lib
    cmd = [bench, "--benchmark_format=json", f"--benchmark_filter={regex}", f"--benchmark_min_time={min_time}"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench-alloc failed ({' '.join(cmd)}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def ns_per_item(b, time):
    # Multi-thread and handoff rows: wall-clock time per item of all threads
    # together (cpu time would not show waiting for the other thread).
    if "threads:" in b["name"] or "handoff" in b["name"]:
        return 1e9 / b["items_per_second"]
    unit = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
    return b[f"{time}_time"] * unit


def row_key(name):
    """One label for the regpool and the malloc spelling of a benchmark."""
    m = re.match(r"(regpool|malloc)/([0-9]+)$", name)
    if m:
        return f"alloc+release {m.group(2)}"
    m = re.match(r"(regpool|malloc)_mt/([0-9]+)/real_time/threads:([0-9])$", name)
    if m:
        return f"threads:{m.group(3)} {m.group(2)}"
    m = re.match(r"handoff_(regpool|malloc)/([0-9]+)/real_time$", name)
    if m:
        return f"handoff {m.group(2)}"
    return name.replace("_regpool", "").replace("_malloc", "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--families", default="single,mt,mixed,handoff")
    ap.add_argument("--time", choices=["cpu", "real"], default="cpu",
                    help="single-thread rows: cpu time (default; robust on a shared machine) or wall clock")
    ap.add_argument("--json", help="write the raw per-round figures here")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--baseline", help="another bench-alloc whose regpool rows form the column 'before'")
    args = ap.parse_args()
    bench = os.path.realpath(args.bench)
    fams = [f for f in args.families.split(",") if f]
    for f in fams:
        if f not in FAMILIES:
            sys.exit(f"unknown family {f!r} (have {', '.join(FAMILIES)})")
    reg_re = "^(" + "|".join(FAMILIES[f][0] for f in fams) + ")"
    mal_re = "^(" + "|".join(FAMILIES[f][1] for f in fams) + ")"

    present, missing = [], []
    for name, lib, pkg in ALLOCATORS:
        path = find_library(lib) if lib else None
        if lib and not path:
            missing.append((name, pkg))
            continue
        bound = check_binding(bench, path)
        want = path if path else "libc.so.6"
        if not bound or (path and bound != path) or (not path and "libc.so" not in bound):
            sys.exit(f"{name}: malloc in {bench} binds to {bound}, not {want} (LD_DEBUG=bindings)")
        present.append((name, path))
        print(f"# {name:9s} malloc -> {bound} (LD_DEBUG=bindings)", file=sys.stderr)
    for name, pkg in missing:
        print(f"# {name}: not installed; apt-get install {pkg} (tools/setup-debian does)", file=sys.stderr)

    # figures[column][row] = [per-round ns]
    figures = {}
    jobs = [("regpool", None, reg_re, bench)] + [(n, p, mal_re, bench) for n, p in present]
    if args.baseline:
        jobs.insert(1, ("before", None, reg_re, os.path.realpath(args.baseline)))
    for r in range(args.rounds):
        order = jobs[r % len(jobs):] + jobs[:r % len(jobs)]
        for col, lib, regex, exe in order:
            data = run(exe, lib, regex, args.min_time)
            got = data["context"].get("malloc_library", "?")
            if col not in ("regpool", "before"):
                expect = lib if lib else "libc.so"
                if expect not in os.path.realpath(got) and expect not in got:
                    sys.exit(f"{col}: bench-alloc reports malloc from {got}, expected {expect}")
            for b in data["benchmarks"]:
                if b.get("error_occurred"):
                    sys.exit(f"{col}: {b['name']} failed: {b.get('error_message')}")
                figures.setdefault(col, {}).setdefault(row_key(b["name"]), []).append(ns_per_item(b, args.time))
        print(f"# round {r + 1}/{args.rounds} done", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)

    cols = ["regpool"] + (["before"] if args.baseline else []) + [n for n, _ in present]
    med = {c: {k: statistics.median(v) for k, v in figures.get(c, {}).items()} for c in cols}
    rows = list(med["regpool"].keys())
    load = os.getloadavg()
    print(f"# bench-alloc under each malloc: medians of {args.rounds} interleaved rounds, "
          f"{args.time} time per operation (two-thread and handoff rows: wall clock per item, both threads together)")
    print(f"# load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print()
    extra = ["/ before"] if args.baseline else []
    print("| benchmark | " + " | ".join(cols + extra) + " | / glibc | / min(tc, mi) | / fastest |")
    print("|---|" + "---:|" * (len(cols) + len(extra) + 3))
    missed = False
    for k in rows:
        vals = {c: med[c].get(k) for c in cols}
        rp = vals["regpool"]
        others = {c: v for c, v in vals.items() if c not in ("regpool", "before") and v}
        tm = [vals[c] for c in ("tcmalloc", "mimalloc") if vals.get(c)]
        r_glibc = rp / vals["glibc"] if vals.get("glibc") else None
        r_tm = rp / min(tm) if tm else None
        r_fast = rp / min(others.values()) if others else None
        single = k.startswith("alloc+release")

        def verdict(v, limit):
            nonlocal missed
            if v is None:
                return "-"
            ok = v <= limit
            if single and not ok:
                missed = True
            return f"{v:.2f}" + ("" if ok else " (MISS)" if single else " (over)")

        cells = [fmt(vals[c]) for c in cols]
        if args.baseline:
            cells.append(f"{rp / vals['before']:.2f}" if rp and vals.get("before") else "-")
        print(f"| {k} | " + " | ".join(cells) + " | " +
              verdict(r_glibc, 1.0) + " | " + verdict(r_tm, 1.25) + " | " +
              (f"{r_fast:.2f}" if r_fast else "-") + " |")
    # Two-thread scaling: items/s with two threads over one.
    scal = []
    for k in rows:
        if k.startswith("threads:2"):
            one = "threads:1" + k[len("threads:2"):]
            for c in cols:
                if med[c].get(one) and med[c].get(k):
                    scal.append((k.split()[1], c, med[c][one] / med[c][k]))
    if scal:
        print()
        print("Two threads / one thread, items per second (goal >= 1.8 for regpool):")
        print()
        sizes = sorted({s for s, _, _ in scal}, key=int)
        print("| size | " + " | ".join(cols) + " |")
        print("|---|" + "---:|" * len(cols))
        for s in sizes:
            d = {c: v for sz, c, v in scal if sz == s}
            print(f"| {s} | " + " | ".join(f"{d[c]:.2f}" if c in d else "-" for c in cols) + " |")
    if args.strict and (missed or missing):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
