#!/usr/bin/env python3
"""Shape and sanity checks for the regpool command-line tools.

    check_tools.py info    REGPOOL_INFO    README
    check_tools.py regcost REGPOOL_REGCOST README
    check_tools.py perf    REGPOOL_PERF    README [PROVIDER]
    check_tools.py badargs TOOL            (exit code 2 on bad arguments)
    check_tools.py perf-hostile REGPOOL_PERF
                                           (--server under bootstrap attacks)
    check_tools.py perf-cold REGPOOL_PERF    (--cold: rotating buffers, payload
                                           checked, reported as "buffers")
    check_tools.py perf-kill REGPOOL_PERF PROVIDER
    check_tools.py perf-peers REGPOOL_PERF PROVIDER   (--peers 2,4: one server,
                   N client processes; memory and rate fields)
                                           (kill -9 one side mid-run: the other
                                           exits 1 in bounded time, naming it)

Each mode runs the tool on a small configuration and checks what it prints:
JSON parses, the expected fields are there, numbers are positive, simulated
domains are flagged. Never timing: the machine these run on is shared and
busy. Every option named in a tool's --help must also appear in README.
Python 3 standard library only.
"""

import hashlib
import hmac
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what, file=sys.stderr)
    return cond


def run(argv, timeout=300, env=None):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                       env=env, text=True)
    return p.returncode, p.stdout, p.stderr


def help_options(tool):
    """The options `tool --help` lists, after checking that it exits 0."""
    rc, out, _ = run([tool, "--help"], timeout=30)
    check(rc == 0, f"{tool} --help exits 0 (got {rc})")
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", out))


def check_help_documented(tool, readme):
    options = sorted(help_options(tool))
    check(len(options) > 0, f"{tool} --help lists options")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    name = os.path.basename(tool)
    check(name in text, f"README mentions {name}")
    for opt in options:
        check(opt in text, f"README documents {name} {opt}")


def positive(x):
    return isinstance(x, (int, float)) and x > 0


def mode_info(tool, readme):
    check_help_documented(tool, readme)
    rc, out, err = run([tool, "--json"])
    check(rc == 0, f"regpool-info --json exits 0 (got {rc}: {err})")
    d = json.loads(out)
    for key in ("libfabric", "verbs", "memlock", "transparent_hugepages", "hugetlbfs", "numa"):
        check(key in d, f"info JSON has {key}")
    fab = d["libfabric"]
    if fab["available"]:
        check(isinstance(fab["providers"], list), "libfabric providers is a list")
        for p in fab["providers"] + fab["rdm_providers"]:
            check(p["ep_type"] in ("MSG", "RDM", "DGRAM", "other"), f"ep_type of {p['provider']}")
            check(isinstance(p["caps"], list) and isinstance(p["mr_mode"], list), "caps and mr_mode are lists")
        for p in fab["rdm_providers"]:
            check(p["ep_type"] == "RDM", "RDM query returns RDM endpoints only")
            check("MSG" in p["caps"] and "RMA" in p["caps"], f"RDM entry {p['provider']} has MSG and RMA")
    check(isinstance(d["verbs"]["devices"], list), "verbs devices is a list (possibly empty)")
    for dev in d["verbs"]["devices"]:
        check(dev["name"] != "", "verbs device has a name")
    m = d["memlock"]
    check(m["soft_limit_bytes"] is None or m["soft_limit_bytes"] >= 0, "memlock soft limit")
    check(isinstance(m["can_exceed"], bool), "memlock can_exceed is a bool")
    check(isinstance(d["numa"]["nodes"], list), "numa nodes list")
    check_info_exposures(d)
    check_info_open_time(tool, d)
    rc, out, _ = run([tool])
    check(rc == 0, "regpool-info text exits 0")
    for needle in ("libfabric:", "verbs devices:", "memlock limit", "transparent huge pages", "hugetlbfs", "NUMA"):
        check(needle in out, f"info text has '{needle}'")
    if not d["verbs"]["devices"]:
        check(re.search(r"verbs devices:\n\s+(none|unavailable)", out) is not None, "no verbs device prints none")
    check("exposures (Endpoint::enforcement()" in out, "info text has the exposures section")
    for b in d.get("exposures", {}).get("backends", []):
        if b["error"] is not None:
            continue
        for e in b["enforcement"]:
            mode = e["mode"] + (", per peer" if e["per_peer"] else "")
            cols = ["yes" if e[k] else "no" for k in ENFORCEMENT_KEYS]
            pattern = r"\n\s+" + re.escape(b["provider"]) + r"\s+" + re.escape(b["domain"]) + r"\s+" + \
                re.escape(mode) + r"\s+" + r"\s+".join(cols) + r"\n"
            check(re.search(pattern, out) is not None, f"info text row {b['provider']} {mode} matches the JSON")


def check_info_open_time(tool, d):
    # Shape only (timings are the tool's output, never checked): shm, whose
    # native atomics need no control endpoint in any mode.
    if not any(p["provider"] == "shm" for p in d["libfabric"].get("rdm_providers", [])):
        return
    rc, out, err = run([tool, "--open-time", "shm", "--runs", "1", "--json"])
    check(rc == 0, f"regpool-info --open-time shm exits 0 (got {rc}: {err})")
    rows = json.loads(out)["open_time"]
    check([r["emulated_atomics"] for r in rows] == ["serve", "on_demand", "off"], "open_time: one row per mode")
    for r in rows:
        check(r["provider"] == "shm" and r["runs"] == 1, "open_time: provider and runs")
        e = r["endpoint_ms"]
        check(positive(e["median"]) and e["min"] <= e["median"] <= e["max"], "open_time: endpoint_ms median in range")
        check(r["control_endpoint"] is False, "open_time: shm (native atomics) opens no control endpoint")
    rc, out, _ = run([tool, "--open-time", "shm", "--runs", "1", "--emulated-atomics", "serve"])
    check(rc == 0 and re.search(r"\nshm\s+serve\s+none\s+[0-9.]+", out) is not None, "open_time text row")


ENFORCEMENT_KEYS = ("keys", "bounds", "rights", "revocation")
# What Endpoint::enforcement() answers, measured by the forged-reference
# probes of test/transport/exposures_test.cpp: shm's CMA path checks nothing;
# tcp;ofi_rxm checks keys always, and the scoped registration's bounds,
# rights and revocation too.
EXPECTED_ENFORCEMENT = {
    ("shm", "standard"): (False, False, False, False),
    ("shm", "scoped"): (False, False, False, False),
    ("tcp;ofi_rxm", "standard"): (True, False, False, False),
    ("tcp;ofi_rxm", "scoped"): (True, True, True, True),
}


def check_info_exposures(d):
    check("exposures" in d, "info JSON has exposures")
    x = d.get("exposures", {})
    check(isinstance(x.get("revoke_quarantine_ms"), int) and x["revoke_quarantine_ms"] >= 0,
          "exposures: revoke_quarantine_ms")
    backends = x.get("backends", [])
    check(isinstance(backends, list), "exposures: backends is a list")
    if d["libfabric"]["available"]:
        listed = {p["provider"] for p in d["libfabric"]["rdm_providers"]}
        fabric = [b["provider"] for b in backends if b["backend"] == "fabric"]
        check(sorted(fabric) == sorted(listed), f"exposures: one entry per RDM provider ({fabric} vs {sorted(listed)})")
    for b in backends:
        check(b["backend"] in ("fabric", "verbs"), f"exposures: backend of {b['provider']}")
        if b["error"] is not None:
            check(b["enforcement"] == [], f"exposures: {b['provider']} failed to open, no rows")
            continue
        modes = sorted((e["mode"], e["per_peer"]) for e in b["enforcement"])
        want = [("scoped", False), ("standard", False)]
        if b["backend"] == "verbs":
            want = [("scoped", False), ("scoped", True), ("standard", False), ("standard", True)]
        check(modes == want, f"exposures: {b['provider']} modes {modes}")
        for e in b["enforcement"]:
            check(all(isinstance(e[k], bool) for k in ENFORCEMENT_KEYS), f"exposures: {b['provider']} booleans")
            key = (b["provider"], e["mode"])
            if key in EXPECTED_ENFORCEMENT:
                got = tuple(e[k] for k in ENFORCEMENT_KEYS)
                check(got == EXPECTED_ENFORCEMENT[key], f"exposures: {key} enforces {got}")
            if b["backend"] == "verbs":
                # The device checks rkeys; a window or slice MR binds the rest.
                scoped = e["mode"] == "scoped" or e["per_peer"]
                check(e["keys"] and all(e[k] == scoped for k in ("bounds", "rights", "revocation")),
                      f"exposures: verbs {e['mode']} per_peer={e['per_peer']}")
    for prov in ("shm", "tcp;ofi_rxm"):
        if any(p["provider"] == prov for p in d["libfabric"].get("rdm_providers", [])):
            ok = [b for b in backends if b["provider"] == prov and b["error"] is None]
            check(len(ok) == 1, f"exposures: {prov} opened")


def mode_regcost(tool, readme):
    check_help_documented(tool, readme)
    sizes = [4096, 65536, 262144]
    base = [tool, "--sizes", "4K,64K,256K", "--reps", "2"]
    domains = "host,shm,tcp"
    rc, out, err = run(base + ["--domain", domains, "--json"])
    check(rc == 0, f"regcost --json exits 0 (got {rc}: {err})")
    d = json.loads(out)
    check(d["sizes"] == sizes, "regcost sizes echoed")
    check(set(d["methods"]) == {"register_deregister", "register", "deregister", "memcpy", "pool"},
          "regcost methods")
    check("crossover_definition" in d, "crossover definition present")
    names = [x["spec"] for x in d["domains"]]
    check(names == ["host", "shm", "tcp"], f"one entry per domain in order (got {names})")
    for dom in d["domains"]:
        spec = dom["spec"]
        if not dom["opened"]:
            # Reported, not aborted: acceptable only for host (memlock) here.
            check(spec == "host" and dom["error"], f"{spec}: unopened domain must say why")
            continue
        if spec in ("shm", "tcp"):
            check(dom["simulated"] is True and dom["pins_memory"] is False, f"{spec} flagged simulated")
            check("SIMULATED" in dom["note"], f"{spec} note says SIMULATED")
        if spec == "host":
            check(dom["simulated"] is False, "host is not simulated")
        check(dom["pool_registrations_during_measurement"] == 0, f"{spec}: pool registered nothing while measured")
        states = [s["state"] for s in dom["memory"]]
        check(states == ["touched", "fresh"], f"{spec}: both memory states (got {states})")
        for st in dom["memory"]:
            check("crossover_bytes" in st and "crossover" in st, f"{spec}/{st['state']}: crossover reported")
            x = st["crossover_bytes"]
            check(x is None or x in sizes, f"{spec}/{st['state']}: crossover is a measured size or null")
            check((x is None) == (st["crossover"] == "none in range"), "crossover text matches bytes")
            check([r["size"] for r in st["results"]] == sizes, f"{spec}/{st['state']}: a row per size")
            for r in st["results"]:
                for meth, cell in r["methods"].items():
                    if "error" in cell:
                        check(spec == "host" and meth != "memcpy", f"{spec} {meth} {r['size']}: {cell['error']}")
                        continue
                    for k in ("median_us", "q1_us", "q3_us", "min_us", "max_us"):
                        check(positive(cell[k]), f"{spec} {meth} {r['size']} {k} positive")
                    check(cell["min_us"] <= cell["median_us"] <= cell["max_us"], f"{spec} {meth} min<=median<=max")
                    check(cell["n"] == 2, f"{spec} {meth}: n equals --reps")
    # CSV: header plus sizes x methods x states rows per opened domain.
    rc, out, err = run(base + ["--domain", "shm", "--memory", "touched", "--csv"])
    check(rc == 0, f"regcost --csv exits 0 ({err})")
    lines = out.strip().splitlines()
    check(lines[0].startswith("domain,simulated,memory,size_bytes,method,median_us"), "CSV header")
    check(len(lines) == 1 + 3 * 5, f"CSV rows (got {len(lines) - 1})")
    check(all(l.split(",")[1] == "1" for l in lines[1:]), "CSV flags shm simulated")
    # A saved CSV renders again without measuring (the guest has no gnuplot).
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "run.csv")
        with open(saved, "w", encoding="utf-8") as f:
            f.write(out)
        rc, again, err = run([tool, "--from-csv", saved, "--json"])
        check(rc == 0, f"regcost --from-csv exits 0 ({err})")
        doc = json.loads(again)
        check(doc["domains"][0]["simulated"] is True, "--from-csv keeps the simulated flag")
        check("crossover_bytes" in doc["domains"][0]["memory"][0], "--from-csv recomputes the crossover")
        with open(saved, "w", encoding="utf-8") as f:
            f.write(out.splitlines()[0] + "\n\"x\",0,touched,4096,teleport,1,1,1,1,1,2,,\n")
        rc, _, err = run([tool, "--from-csv", saved])
        check(rc == 1 and "teleport" in err, f"--from-csv names a bad line (got {rc}: {err})")
    # Defaults: a quick run (4 KiB..16 MiB, 3 reps) unless --full (1 GiB, 5
    # reps); --max and --reps override either. Only the cheap touched state
    # of shm is measured here. --progress without a terminal: plain lines.
    quick = [4096 << i for i in range(13)]
    rc, out, err = run([tool, "--domain", "shm", "--memory", "touched", "--json"])
    check(rc == 0, f"regcost default run exits 0 ({err})")
    d = json.loads(out)
    check(d["sizes"] == quick and d["reps"] == 3, f"quick default: 4K..16M, 3 reps (got {d['sizes']}, {d['reps']})")
    rc, out, err = run([tool, "--full", "--max", "64K", "--domain", "shm", "--memory", "touched", "--json",
                        "--progress"])
    check(rc == 0, f"regcost --full --max 64K exits 0 ({err})")
    d = json.loads(out)
    check(d["sizes"] == [4096 << i for i in range(5)] and d["reps"] == 5, "--full: 5 reps, --max still applies")
    lines = [l for l in err.splitlines() if l.startswith("regpool-regcost: ")]
    check(len(lines) == 5 and "\033" not in err and "\r" not in err,
          f"--progress without a terminal: one plain line per size (got {err!r})")
    # Table.
    rc, out, _ = run(base + ["--domain", "shm", "--memory", "fresh"])
    check(rc == 0 and "crossover" in out and "SIMULATED" in out and "fresh" in out, "regcost table")
    # Plot (when gnuplot is here), and the message when it is not.
    with tempfile.TemporaryDirectory() as tmp:
        svg = os.path.join(tmp, "x.svg")
        have_gnuplot = any(os.access(os.path.join(p, "gnuplot"), os.X_OK)
                           for p in os.environ.get("PATH", "").split(os.pathsep) if p)
        if have_gnuplot:
            rc, _, err = run(base + ["--domain", "shm", "--plot", svg])
            check(rc == 0, f"regcost --plot exits 0 ({err})")
            check(os.path.exists(svg) and "<svg" in open(svg, encoding="utf-8").read(), "plot is an SVG")
        env = dict(os.environ, PATH=tmp)
        rc, _, err = run(base + ["--domain", "shm", "--plot", svg], env=env)
        check(rc == 1 and "gnuplot" in err, f"missing gnuplot: exit 1 with a message (got {rc}: {err})")


def mode_perf(tool, readme, provider):
    check_help_documented(tool, readme)
    rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "8,4K", "--iters", "20",
                        "--window", "4", "--json"], timeout=240)
    check(rc == 0, f"perf {provider} exits 0 (got {rc}: {err})")
    d = json.loads(out)
    check(d["iters"] == 20 and d["window"] == 4 and d["wait"] == "spin", "perf echoes its configuration")
    seen = {(r["op"], r["size"]) for r in d["results"]}
    want = {("put", 8), ("put", 4096), ("get", 8), ("get", 4096), ("send", 8), ("send", 4096),
            ("fetch_add", 8), ("compare_swap", 8), ("expose", 8), ("expose", 4096)}
    check(seen == want, f"perf rows (got {sorted(seen)})")
    check(d.get("expose_mode") == "standard", "perf: default expose mode is standard")
    for r in d["results"]:
        what = f"{provider} {r['op']} {r['size']}"
        check(r["error"] is None, f"{what}: no error ({r['error']})")
        lat = r["latency_us"]
        check(lat is not None and positive(lat["median"]) and lat["min"] <= lat["median"] <= lat["max"],
              f"{what}: latency sane")
        check(lat is not None and lat["iters"] == 20, f"{what}: latency over --iters ops")
        if r["op"] != "expose":
            # The mean compare-peers sets beside fi_pingpong's usec/xfer.
            check(lat is not None and lat.get("mean") is not None and lat["min"] <= lat["mean"] <= lat["max"],
                  f"{what}: mean latency between min and max ({lat and lat.get('mean')})")
        check(lat is None or lat.get("loop_mean") is None, f"{what}: no loop_mean without --loop-mean")
        if r["op"] == "expose":
            # Standard exposures reuse the object's registration: neither
            # process's domain registers anything while the server loops.
            check(r["domain_registrations"] == 0, f"{what}: 0 domain registrations in standard mode "
                  f"(got {r['domain_registrations']})")
            check(r["bandwidth_MBps"] is None, f"{what}: no bandwidth")
        elif r["op"] != "compare_swap":
            check(positive(r["bandwidth_MBps"]) and positive(r["rate_Mops"]), f"{what}: bandwidth positive")
            check(r["domain_registrations"] is None, f"{what}: domain_registrations only on expose rows")
    # --loop-mean: the send and tagged ping-pongs again, unmarked, timed as a
    # whole (the server must serve those iterations too, or the client waits
    # out its pongs and fails).
    rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "8,4K", "--iters", "20",
                        "--window", "4", "--ops", "send,tagged", "--loop-mean", "--json"], timeout=240)
    check(rc == 0, f"perf {provider} --loop-mean exits 0 (got {rc}: {err})")
    if rc == 0:
        d = json.loads(out)
        check([(r["op"], r["size"]) for r in d["results"]] ==
              [("send", 8), ("send", 4096), ("tagged", 8), ("tagged", 4096)],
              "perf --ops send,tagged --loop-mean: the send and tagged rows")
        for r in d["results"]:
            lat = r["latency_us"]
            check(r["error"] is None and lat is not None and positive(lat.get("loop_mean")),
                  f"--loop-mean {r['op']} {r['size']}: loop_mean reported ({lat})")
    # Scoped: libfabric registers exactly the slice once per exposure (the
    # server's domain; the client's makes none).
    rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "64,64K", "--iters", "30",
                        "--ops", "expose", "--expose-mode", "scoped", "--json"], timeout=240)
    check(rc == 0, f"perf {provider} scoped expose exits 0 (got {rc}: {err})")
    if rc == 0:
        d = json.loads(out)
        check(d["expose_mode"] == "scoped", "perf echoes --expose-mode")
        check([(r["op"], r["size"]) for r in d["results"]] == [("expose", 64), ("expose", 65536)],
              "perf --ops expose runs expose only")
        for r in d["results"]:
            check(r["error"] is None, f"scoped expose {r['size']}: no error ({r['error']})")
            check(r["domain_registrations"] == 30, f"scoped expose {r['size']}: one registration per exposure "
                  f"(got {r['domain_registrations']})")
            lat = r["latency_us"]
            check(lat is not None and lat["iters"] == 30 and lat["min"] <= lat["median"] <= lat["p99"] <= lat["max"],
                  f"scoped expose {r['size']}: latency sane")
    # Tagged messaging (Messenger): an eager and a rendezvous size, next to send.
    rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "8,1M", "--iters", "20",
                        "--window", "4", "--ops", "send,tagged", "--json"], timeout=240)
    check(rc == 0, f"perf {provider} --ops send,tagged exits 0 (got {rc}: {err})")
    if rc == 0:
        d = json.loads(out)
        check([(r["op"], r["size"]) for r in d["results"]] ==
              [("send", 8), ("send", 1048576), ("tagged", 8), ("tagged", 1048576)], "perf --ops send,tagged rows")
        for r in d["results"]:
            lat = r["latency_us"]
            check(r["error"] is None and lat is not None and lat["iters"] == 20 and positive(lat["median"]) and
                  positive(r["bandwidth_MBps"]), f"{r['op']} {r['size']}: latency and bandwidth")
    # The send ping-pong's receives and sends, kept (the default) and
    # fresh, in each pairing: all deliver every pong, and the output says
    # which.
    for recv_mode, send_mode in (("kept", "kept"), ("fresh", "kept"), ("kept", "fresh"), ("fresh", "fresh")):
        label = f"perf {provider} --recv {recv_mode} --sends {send_mode}"
        rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "8", "--iters", "20",
                            "--window", "4", "--ops", "send", "--recv", recv_mode, "--sends", send_mode, "--json"],
                           timeout=240)
        check(rc == 0, f"{label} exits 0 (got {rc}: {err})")
        if rc == 0:
            d = json.loads(out)
            r = d["results"]
            check(d.get("receives") == recv_mode and d.get("sends") == send_mode,
                  f"{label} reports receives {recv_mode}, sends {send_mode} "
                  f"(got {d.get('receives')}, {d.get('sends')})")
            check(len(r) == 1 and r[0]["error"] is None and r[0]["latency_us"]["iters"] == 20 and
                  positive(r[0]["latency_us"]["median"]), f"{label}: one send row")
    # The ping-pongs' receives posted one message ahead (the default) and
    # not: every pong arrives, --loop-mean's extra rounds included, and no
    # receive is left posted to take a later phase's message (the bandwidth
    # streams, their acks and verdicts, and the next size's ping-pong would
    # fail or hang), in the plain and the perftest definitions.
    # With --pingpong separate (pongs from and into buffers of their own)
    # too: the same rounds, rows and leftovers.
    for ahead, pingpong in (("on", "echo"), ("off", "echo"), ("on", "separate")):
        for extra in (["--ops", "send,tagged", "--loop-mean"], ["--ops", "send", "--perftest"]):
            label = f"perf {provider} --ahead {ahead} --pingpong {pingpong} {' '.join(extra)}"
            rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "8,4K", "--iters", "20",
                                "--window", "4", "--ahead", ahead, "--pingpong", pingpong, "--json"] + extra,
                               timeout=240)
            check(rc == 0, f"{label} exits 0 (got {rc}: {err})")
            if rc == 0:
                d = json.loads(out)
                check(d.get("receives_ahead") == (ahead == "on"),
                      f"{label} reports receives_ahead {ahead == 'on'} (got {d.get('receives_ahead')})")
                # --perftest's ping-pongs always have separate buffers.
                want = "separate" if "--perftest" in extra else pingpong
                check(d.get("pingpong") == want, f"{label} reports pingpong {want} (got {d.get('pingpong')})")
                ops = ["send", "tagged"] if "tagged" in extra[1] else ["send"]
                check([(r["op"], r["size"]) for r in d["results"]] == [(o, n) for o in ops for n in (8, 4096)],
                      f"{label}: rows")
                check(all(r["error"] is None and r["latency_us"]["iters"] == 20 and
                          positive(r["latency_us"]["median"]) for r in d["results"]), f"{label}: every row measured")
    # --perftest's put and get loops with kept operations (the default) and
    # fresh ones: every row measured, the output says which; a kept put or
    # get left parked or failed would fail the next row or size.
    for rma in ("kept", "fresh"):
        label = f"perf {provider} --perftest --rma {rma}"
        rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "8,4K", "--iters", "20",
                            "--ops", "put,get", "--perftest", "--rma", rma, "--json"], timeout=240)
        check(rc == 0, f"{label} exits 0 (got {rc}: {err})")
        if rc == 0:
            d = json.loads(out)
            check(d.get("rma") == rma, f"{label} reports rma {rma} (got {d.get('rma')})")
            check([(r["op"], r["size"]) for r in d["results"]] == [("put", 8), ("put", 4096), ("get", 8), ("get", 4096)],
                  f"{label}: rows")
            check(all(r["error"] is None and r["latency_us"]["iters"] == 20 and positive(r["latency_us"]["median"])
                      for r in d["results"]), f"{label}: every row measured")
    # The Messenger's two splits, set and off, each one tagged row:
    # --tagged-split (the split rendezvous; passed to the server, which
    # receives and decides) at 1 MiB, a rendezvous either way;
    # --tagged-eager-split (both sides take it) at 8 KiB, three messages on
    # shm, one elsewhere and with off; --tagged-gather at 8 KiB, gathered
    # (tcp) or not; --tagged-gather-max at 8 KiB, copied (a 4 KiB cap) or
    # gathered (no cap) on tcp; --tagged-copy at 8 KiB, copied into the ring by send()
    # (shm) or posted; --tagged-choice at 32 KiB, copied or by rendezvous as
    # measured (shm) or never; --tagged-recv, both sides' receives handed over (ldo)
    # or copied, each reported in the JSON.
    for option, size, values in (("--tagged-split", "1M", ("4K", "off")),
                                 ("--tagged-eager-split", "8K", ("8K", "off")),
                                 ("--tagged-gather", "8K", ("4K", "off")),
                                 ("--tagged-gather-max", "8K", ("4K", "off")),
                                 ("--tagged-copy", "8K", ("4K", "off")),
                                 ("--tagged-choice", "32K", ("20K", "off")),
                                 ("--tagged-recv", "8K", ("ldo", "copy"))):
        for value in values:
            rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", size, "--iters", "10",
                                "--window", "4", "--ops", "tagged", option, value, "--json"], timeout=240)
            check(rc == 0, f"perf {provider} {option} {value} exits 0 (got {rc}: {err})")
            if rc == 0:
                r = json.loads(out)["results"]
                check(len(r) == 1 and r[0]["op"] == "tagged" and r[0]["error"] is None and
                      positive(r[0]["latency_us"]["median"]) and positive(r[0]["bandwidth_MBps"]),
                      f"perf {option} {value}: one tagged {size} row")
                reported = {"--tagged-gather": ("tagged_gather", 4096 if value == "4K" else None),
                            "--tagged-gather-max": ("tagged_gather_max", 4096 if value == "4K" else None),
                            "--tagged-copy": ("tagged_copy", 4096 if value == "4K" else None),
                            "--tagged-choice": ("tagged_choice", 20480 if value == "20K" else None),
                            "--tagged-recv": ("tagged_recv", value)}.get(option)
                if reported:
                    check(json.loads(out).get(reported[0], "missing") == reported[1],
                          f"perf {option} {value}: JSON {reported[0]} is {reported[1]!r}")
    # Text output and a subset of ops.
    rc, out, err = run([tool, "--loopback", "--provider", provider, "--sizes", "64", "--iters", "5",
                        "--ops", "put", "--progress"], timeout=240)
    check(rc == 0, f"perf text exits 0 ({err})")
    rows = [l for l in out.splitlines() if l.startswith("put")]
    check(len(rows) == 1 and "get" not in out.split("\n", 2)[-1], "perf --ops put runs put only")
    check("regpool-perf: put" in err, "--progress writes a progress line to stderr")


def mode_perf_cold(tool):
    # Tiny cold span (64 KiB per side): 4 KiB ops rotate over 16 slots, and
    # every op's bytes are checked after timing; hot runs say "hot".
    rc, out, err = run([tool, "--loopback", "--provider", "shm", "--sizes", "4K,64K", "--iters", "20",
                        "--window", "4", "--ops", "put,get,send,memcpy", "--cold-bytes", "64K", "--json"],
                       timeout=240)
    check(rc == 0, f"perf --cold exits 0 (got {rc}: {err})")
    if rc == 0:
        d = json.loads(out)
        check(d.get("buffers") == "cold" and d.get("cold_bytes") == 65536,
              f"perf --cold-bytes reports buffers cold over 64 KiB (got {d.get('buffers')}, {d.get('cold_bytes')})")
        check([(r["op"], r["size"]) for r in d["results"]] ==
              [(op, n) for op in ("put", "get", "send", "memcpy") for n in (4096, 65536)], "perf --cold rows")
        for r in d["results"]:
            what = f"cold {r['op']} {r['size']}"
            check(r["error"] is None, f"{what}: no error ({r['error']})")
            check(positive(r["bandwidth_MBps"]), f"{what}: bandwidth positive")
            # --cold covers the span: at least one operation per slot.
            check(r["bandwidth_ops"] >= max(20, 65536 // r["size"]), f"{what}: one op per slot at least")
    # --cold alone takes its span from the cache size (at least 256 MiB).
    rc, out, err = run([tool, "--loopback", "--provider", "shm", "--sizes", "1M", "--iters", "4",
                        "--window", "2", "--ops", "put", "--cold", "--json"], timeout=240)
    check(rc == 0, f"perf --cold exits 0 (got {rc}: {err})")
    if rc == 0:
        d = json.loads(out)
        check(d.get("buffers") == "cold" and d["cold_bytes"] >= 256 << 20, f"perf --cold span ({d.get('cold_bytes')})")
        check(d["results"][0]["bandwidth_ops"] == d["cold_bytes"] // (1 << 20), "perf --cold: one op per slot")
    rc, out, err = run([tool, "--loopback", "--provider", "shm", "--sizes", "4K", "--iters", "5",
                        "--ops", "put", "--json"], timeout=240)
    check(rc == 0 and json.loads(out).get("buffers") == "hot" and json.loads(out).get("cold_bytes") is None,
          f"perf without --cold reports buffers hot (got {rc}: {err})")


def mode_perf_peers(tool, provider):
    # One server and 2, then 4 client processes streaming tagged messages;
    # the JSON carries per N the aggregate rate and the server's receive
    # memory. Receive memory is a property of the configuration (a fixed
    # ring of bounces plus small copies of unexpected messages), not a
    # timing: it must not grow by more than half from 2 to 4 senders.
    iters = 200
    rc, out, err = run([tool, "--peers", "2,4", "--provider", provider, "--iters", str(iters), "--wait", "sleep",
                        "--json"], timeout=280)
    check(rc == 0, f"perf --peers exits 0 (got {rc}: {err})")
    if rc != 0:
        return
    d = json.loads(out)
    check(d.get("mode") == "peers", "perf --peers: mode peers")
    rows = d["results"]
    check([r["peers"] for r in rows] == [2, 4], f"perf --peers rows for 2 and 4 ({[r['peers'] for r in rows]})")
    for r in rows:
        what = f"peers {r['peers']}"
        check(r["error"] is None, f"{what}: no error ({r['error']})")
        check(r["size"] == 8, f"{what}: default size 8")
        check(r["messages"] == r["peers"] * iters, f"{what}: every message counted ({r['messages']})")
        check(positive(r["rate_Mops"]) and positive(r["seconds"]), f"{what}: rate and time positive")
        check(positive(r["receive_buffer_bytes"]), f"{what}: receive buffers reported")
        check(r["receive_memory_bytes"] >= r["receive_buffer_bytes"], f"{what}: receive memory covers the buffers")
        check(r["receive_memory_bytes"] <= r["receive_buffer_bytes"] + r["unexpected_peak_bytes"],
              f"{what}: receive memory is at most the buffers' and the unexpected messages' peaks")
        check(r["endpoint_memory_bytes"] is None or isinstance(r["endpoint_memory_bytes"], int),
              f"{what}: endpoint memory an integer or null")
        check(r["queue_pairs"] is None, f"{what}: queue pairs only on verbs ({r['queue_pairs']})")
    if len(rows) == 2 and all(r["error"] is None for r in rows):
        check(rows[1]["receive_memory_bytes"] <= 1.5 * rows[0]["receive_memory_bytes"],
              f"perf --peers: receive memory at 4 peers ({rows[1]['receive_memory_bytes']}) within 1.5x of 2 peers "
              f"({rows[0]['receive_memory_bytes']})")


# ------------------------------------------------ bootstrap under attack
# The attacker speaks the bootstrap's wire format (lib/transport/
# bootstrap_wire.hpp) with Python's own hmac/hashlib, so a hello it signs with
# the right key would be admitted: the refusals below are about the key, not
# about an encoding the server does not understand.
HELLO_CTX = b"regpool-bootstrap-v2 hello"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port):
    """A connected socket, or a failed check and None (e.g. a full backlog)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError as e:
            if time.monotonic() > deadline:
                check(False, f"attacker connects to the server ({e})")
                return None
            time.sleep(0.05)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            return None
        buf += part
    return buf


def hello(rank, size, key=None, server_nonce=None):
    nonce = os.urandom(32)
    mac = bytes(32)
    if key is not None:
        mac = hmac.new(key, HELLO_CTX + server_nonce + nonce + struct.pack("<II", rank, size), hashlib.sha256).digest()
    return struct.pack("<IHHII", 0x4C484252, 2, 1 if key is not None else 0, rank, size) + nonce + mac


def forge(port, rank, size, key=None):
    """Full handshake; returns the verdict code (0 = admitted) or None."""
    s = connect(port)
    if s is None:
        return None, socket.socket()
    ch = recv_exact(s, 40)
    if ch is None:
        return None, s
    magic, version, flags = struct.unpack("<IHH", ch[:8])
    check(magic == 0x48434252 and version == 2, "server sends a v2 challenge")
    s.sendall(hello(rank, size, key, ch[8:40]))
    v = recv_exact(s, 44)
    return (None if v is None else struct.unpack("<I", v[4:8])[0]), s


def start_server(tool, port, env, tmp, tag):
    err = open(os.path.join(tmp, f"server-{tag}.err"), "w+", encoding="utf-8")
    p = subprocess.Popen([tool, "--server", "--bind", "127.0.0.1", "--port", str(port)], stdout=subprocess.PIPE,
                         stderr=err, env=env, text=True)
    deadline = time.monotonic() + 30
    while "listening on" not in open(err.name, encoding="utf-8").read():
        if p.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return p, err.name


def client(tool, port, env):
    try:
        return run([tool, "--client", f"127.0.0.1:{port}", "--provider", "shm", "--sizes", "8", "--iters", "5",
                    "--ops", "put", "--json"], timeout=60, env=env)
    except subprocess.TimeoutExpired:
        return -1, "", "client not served within 60 s"


def finish_server(p, errname, what):
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        check(False, f"{what}: server did not exit after serving its client")
    return open(errname, encoding="utf-8").read()


def mode_perf_hostile(tool):
    base = {k: v for k, v in os.environ.items() if k != "REGPOOL_BOOTSTRAP_KEY"}
    servers = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            hostile_scenarios(tool, base, tmp, servers)
    finally:
        for p in servers:
            if p.poll() is None:
                p.kill()
                p.wait()


def hostile_scenarios(tool, base, tmp, servers):
    # 1. No key: silent, slow, garbage, a frame header announcing 64 MiB
    # instead of a hello, out-of-range rank, wrong job size. The real
    # client is served at once, not after the 5 s handshake bound.
    port = free_port()
    srv, errname = start_server(tool, port, base, tmp, "nokey")
    servers.append(srv)
    attackers = [connect(port) for _ in range(6)]
    if None in attackers:
        return
    attackers[1].sendall(b"GET / HTTP/1.0\r\n\r\n")
    attackers[2].sendall(struct.pack("<IIQ", 0x4D524652, 1, 64 << 20))
    attackers[3].sendall(hello(5, 2))
    attackers[4].sendall(hello(1, 7))
    attackers[5].sendall(hello(1, 2)[:30])  # slow: a third of a hello, then nothing
    t0 = time.monotonic()
    rc, out, err = client(tool, port, base)
    took = time.monotonic() - t0
    check(rc == 0, f"no key, under attack: client exits 0 (got {rc}: {err})")
    if rc == 0:
        check(json.loads(out)["results"][0]["error"] is None, "no key, under attack: the put ran")
    log = finish_server(srv, errname, "no key")
    check(srv.returncode == 0, f"no key, under attack: server exits 0 ({log})")
    check("bad magic" in log, "server logs the garbage connections")
    check("refused a hello for rank 5 of 2" in log, "server logs the out-of-range rank")
    check("refused a hello for rank 1 of 7" in log, "server logs the wrong job size")
    check(took < 60, f"client served in bounded time ({took:.1f} s)")
    for a in attackers:
        a.close()

    # 2. With REGPOOL_BOOTSTRAP_KEY on both sides: forged hellos (wrong
    # key, no proof) and a client with the wrong key are refused and
    # logged; the real client still gets in.
    key = os.urandom(16).hex()
    env = dict(base, REGPOOL_BOOTSTRAP_KEY=key)
    port = free_port()
    srv, errname = start_server(tool, port, env, tmp, "key")
    servers.append(srv)
    silent = connect(port)
    huge = connect(port)
    if silent is None or huge is None:
        return
    huge.sendall(struct.pack("<IIQ", 0x4D524652, 1, 64 << 20))
    code1, f1 = forge(port, 1, 2, key=b"guessed")
    code2, f2 = forge(port, 1, 2)
    check(code1 == 1, f"forged hello (wrong key) refused as bad key (verdict {code1})")
    check(code2 == 2, f"hello without proof refused as missing key (verdict {code2})")
    rc, out, err = client(tool, port, dict(base, REGPOOL_BOOTSTRAP_KEY="not-" + key))
    check(rc == 1 and "job key does not match" in err, f"wrong-key client refused clearly (got {rc}: {err})")
    rc, out, err = client(tool, port, env)
    check(rc == 0, f"with a key, under attack: real client exits 0 (got {rc}: {err})")
    log = finish_server(srv, errname, "key")
    check(srv.returncode == 0, f"with a key: server exits 0 ({log})")
    check("job key required" in log, "server says it requires a job key")
    check(log.count("with a wrong proof of the job key") >= 2, "forged and wrong-key hellos logged")
    check("without proof of the job key" in log, "keyless hello logged")
    check(key not in log and key not in out, "the key is never printed")
    for s in (silent, huge, f1, f2):
        s.close()

    # 3. An admitted client (no key) whose configuration is hostile: cut
    # short, sizes out of order, a provider name with a control byte. The
    # server refuses it by name and exits 1 (never a crash, never a run).
    good = ("provider=shm\nwait=spin\niters=5\nwindow=4\nops=put,\ncold_bytes=0\ntagged_threshold=0\n"
            "tagged_split=0\ntagged_eager_split=0\ntagged_gather=0\ntagged_gather_max=0\ntagged_copy=0\ntagged_choice=0\ntagged_recv=copy\nexpose_mode=standard\n"
            "perftest=0\nverbs_inline=-1\n"
            "verbs_signal=selective\nverbs_inject=on\nloop_mean=0\nrecv=kept\nsends=kept\nahead=on\npingpong=echo\nrma=kept\nshm_rings=on\n"
            "shm_ring_copy_max=66560\nshm_ring_adaptive=on\nmessenger=locked\nsizes=8\n")
    for tag, payload, named in (("cut", good[:40], "missing or unterminated"),
                                ("order", good.replace("sizes=8", "sizes=4096,8"), "sizes: bad value '4096,8'"),
                                ("provider", good.replace("provider=shm", "provider=sh\x07m"), "provider: bad value"),
                                ("copy", good.replace("copy_max=66560", "copy_max=66561"),
                                 "shm_ring_copy_max: bad value '66561'"),
                                ("adaptive", good.replace("adaptive=on", "adaptive=yes"),
                                 "shm_ring_adaptive: bad value 'yes'"),
                                ("pingpong", good.replace("pingpong=echo", "pingpong=both"),
                                 "pingpong: bad value 'both'")):
        port = free_port()
        srv, errname = start_server(tool, port, base, tmp, "config-" + tag)
        servers.append(srv)
        code, f = forge(port, 1, 2)
        check(code == 0, f"hostile configuration ({tag}): the forged client is admitted (verdict {code})")
        if code == 0:
            data = payload.encode()
            f.sendall(struct.pack("<IIQ", 0x4D524652, 1, len(data)) + data)
        log = finish_server(srv, errname, f"hostile configuration ({tag})")
        f.close()
        check(srv.returncode == 1 and "the client's configuration: " in log and named in log,
              f"hostile configuration ({tag}): server refuses it by name and exits 1 (rc {srv.returncode}: {log})")


# A peer killed with SIGKILL must end the survivor's run within this (the
# transport notices on shm by pid within 50 ms, on tcp through the
# connection or the bootstrap socket); seconds, generous for a busy machine.
KILL_BOUND = 15


def mode_perf_kill(tool, provider):
    # Both directions on both providers. On tcp the transport alone does not
    # always tell (a server that only progresses while its client puts has
    # nothing in flight that rxm could fail; a client waiting for a pong or
    # an atomic's reply has only an unbound receive posted): regpool-perf
    # watches the bootstrap connection it keeps open to the other side
    # (TcpBootstrap::lost_peer), which a killed process's kernel closes.
    ops = ["put", "get", "send", "atomic"]
    with tempfile.TemporaryDirectory() as tmp:
        for op in ops:
            for victim in ("client", "server"):
                perf_kill_once(tool, provider, op, victim, tmp)


def perf_kill_once(tool, provider, op, victim, tmp):
    what = f"{provider} {op}, {victim} killed"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REGPOOL_BOOTSTRAP_KEY"}
    srv, errname = start_server(tool, port, env, tmp, f"kill-{op}-{victim}")
    cerr = open(os.path.join(tmp, f"client-{op}-{victim}.err"), "w+", encoding="utf-8")
    cli = subprocess.Popen([tool, "--client", f"127.0.0.1:{port}", "--provider", provider, "--sizes", "1M",
                            "--iters", "100000000", "--ops", op, "--progress"], stdout=subprocess.DEVNULL,
                           stderr=cerr, env=env)
    try:
        # Kill only once the run is inside its operations (large transfers:
        # the kill lands inside one, where shm holds a lock in shared
        # memory): the client's progress line says so. A fixed sleep was not
        # enough on a busy machine (the kill landed in the bootstrap).
        started = time.monotonic()
        while time.monotonic() - started < 90:
            with open(cerr.name, encoding="utf-8", errors="replace") as f:
                if " lat " in f.read():
                    break
            if cli.poll() is not None or srv.poll() is not None:
                break
            time.sleep(0.1)
        check(time.monotonic() - started < 90, f"{what}: the client reached its operations")
        time.sleep(0.3)
        dead, survivor, labels = ((cli, srv, ("the client", "rank 1")) if victim == "client"
                                  else (srv, cli, ("the server at", "rank 0")))
        dead.kill()
        dead.wait()
        t0 = time.monotonic()
        try:
            rc = survivor.wait(timeout=KILL_BOUND)
        except subprocess.TimeoutExpired:
            rc = None
        took = time.monotonic() - t0
        err = open(errname if survivor is srv else cerr.name, encoding="utf-8").read()
        check(rc is not None, f"{what}: survivor exits within {KILL_BOUND} s (still running; stderr: {err!r})")
        if rc is not None:
            check(rc == 1, f"{what}: survivor exits 1 (got {rc}: {err!r})")
            check(any(l in err for l in labels) and ("unreachable" in err or "closed its connection" in err or "send failed" in err),
                  f"{what}: survivor names the dead peer ({err!r})")
            last = err.strip().splitlines()[-1] if err.strip() else ""
            print(f"{what}: survivor exited {rc} after {took:.2f} s: {last}", file=sys.stderr)
    finally:
        for p in (srv, cli):
            if p.poll() is None:
                p.kill()
                p.wait()
        cerr.close()


BAD_ARGS = {
    "regpool-info": [["--bogus"], ["--json", "extra"], ["--open-time"], ["--open-time", "shm", "--runs", "0"],
                     ["--open-time", "shm", "--emulated-atomics", "lazy"], ["--runs", "3"]],
    "regpool-regcost": [["--bogus"], ["--min", "0"], ["--sizes", "4X"], ["--reps", "0"], ["--reps", "abc"],
                        ["--domain", "nosuch"], ["--plot", "out.pdf"], ["--min", "1M", "--max", "4K"],
                        ["--csv", "--json"], ["--memory", "lukewarm"], ["--sizes", "4K", "--min", "4K"],
                        ["--max"], ["--max", "100T"], ["--from-csv"]],
    "regpool-perf": [[], ["--bogus"], ["--server", "--client", "x"], ["--loopback", "--ops", "fly"],
                     ["--loopback", "--iters", "-1"], ["--client", "host:99999"], ["--loopback", "--window", "0"], ["--loopback", "--sizes", "0"],
                     ["--client"], ["--loopback", "--expose-mode", "loose"], ["--loopback", "--wait", "nap"],
                     ["--loopback", "--cold-bytes", "0"], ["--loopback", "--cold-bytes", "3G"],
                     ["--peers", "0"], ["--peers", "2,x"], ["--peers", "2", "--server"],
                     ["--peers", "2", "--ops", "put"], ["--peers", "2", "--cold"], ["--peers", "2", "--port", "9"],
                     ["--loopback", "--perftest", "--loop-mean"], ["--loopback", "--ops", "put", "--loop-mean"],
                     ["--peers", "2", "--loop-mean"],
                     ["--loopback", "--tagged-split", "0"], ["--loopback", "--tagged-split", "sometimes"],
                     ["--loopback", "--tagged-eager-split", "0"], ["--loopback", "--tagged-eager-split", "always"],
                     ["--loopback", "--recv", "sometimes"], ["--peers", "2", "--recv", "fresh"],
                     ["--loopback", "--sends", "always"], ["--peers", "2", "--sends", "fresh"],
                     ["--loopback", "--ahead", "maybe"], ["--peers", "2", "--ahead", "off"],
                     ["--loopback", "--pingpong", "both"], ["--peers", "2", "--pingpong", "echo"],
                     ["--loopback", "--rma", "sometimes"], ["--peers", "2", "--rma", "fresh"],
                     ["--loopback", "--provider", "sh m"], ["--loopback", "--provider", ""],
                     ["--loopback", "--sizes", ",".join(str(n) for n in range(1, 66))]],
}


# regpool-perf's options by where they belong. The server takes the
# measurement's settings from its client, so every setting is refused
# with --server (a server told --sizes and silently measuring something
# else would mislead); each is given here with a value it accepts, so the
# refusal is the server rule's and not the value's. Every option --help
# lists must be in one of the two: a new option has to be placed.
PERF_ANY_MODE = {"--help", "--server", "--client", "--loopback", "--peers", "--port", "--bind", "--json",
                 "--progress", "--no-progress"}
PERF_CLIENT_ONLY = {
    "--provider": ["tcp"], "--sizes": ["8"], "--iters": ["10"], "--wait": ["spin"], "--batch": ["1"],
    "--window": ["4"], "--ops": ["send"], "--tagged-threshold": ["4096"], "--tagged-split": ["off"],
    "--tagged-eager-split": ["off"], "--tagged-gather": ["off"], "--tagged-gather-max": ["off"],
    "--tagged-copy": ["off"], "--tagged-choice": ["off"], "--tagged-recv": ["copy"], "--expose-mode": ["scoped"], "--cold": [],
    "--cold-bytes": ["1M"], "--loop-mean": [], "--recv": ["kept"], "--sends": ["kept"], "--shm-rings": ["on"],
    "--shm-ring-copy-max": ["4K"], "--shm-ring-adaptive": ["on"], "--messenger": ["locked"], "--ahead": ["on"],
    "--pingpong": ["echo"], "--rma": ["kept"], "--perftest": [], "--verbs-inline": ["0"],
    "--verbs-signal": ["all"], "--verbs-inject": ["off"],
}


def perf_client_only_refused_by_server(tool):
    listed = help_options(tool)
    check(len(listed) > 0, "regpool-perf --help lists options")
    for opt in sorted(listed - PERF_ANY_MODE - set(PERF_CLIENT_ONLY)):
        check(False, f"regpool-perf {opt}: not placed in check_tools.py (PERF_ANY_MODE or PERF_CLIENT_ONLY)")
    for opt in sorted(set(PERF_CLIENT_ONLY) - listed):
        check(False, f"regpool-perf {opt}: in PERF_CLIENT_ONLY but not in --help")
    for opt, value in sorted(PERF_CLIENT_ONLY.items()):
        args = ["--server", opt] + value
        try:
            rc, out, err = run([tool] + args, timeout=10)
        except subprocess.TimeoutExpired:
            # Accepted: the server is waiting for a client.
            check(False, f"regpool-perf {' '.join(args)}: refused as a client-only option (it served)")
            continue
        check(rc == 2 and "the server takes" in err,
              f"regpool-perf {' '.join(args)}: refused as a client-only option (exit {rc}, {err.strip()!r})")
        check(out == "", f"regpool-perf {' '.join(args)}: nothing on stdout")


def mode_badargs(tool):
    name = os.path.basename(tool)
    for args in BAD_ARGS[name]:
        rc, out, err = run([tool] + args, timeout=30)
        check(rc == 2, f"{name} {' '.join(args)}: exit 2 (got {rc})")
        check(err.strip() != "" and name in err, f"{name} {' '.join(args)}: message on stderr naming the tool")
        check(out == "", f"{name} {' '.join(args)}: nothing on stdout")
    if name == "regpool-perf":
        perf_client_only_refused_by_server(tool)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    mode, tool = sys.argv[1], sys.argv[2]
    if mode == "info":
        mode_info(tool, sys.argv[3])
    elif mode == "regcost":
        mode_regcost(tool, sys.argv[3])
    elif mode == "perf":
        mode_perf(tool, sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "shm")
    elif mode == "badargs":
        mode_badargs(tool)
    elif mode == "perf-hostile":
        mode_perf_hostile(tool)
    elif mode == "perf-cold":
        mode_perf_cold(tool)
    elif mode == "perf-kill":
        mode_perf_kill(tool, sys.argv[3])
    elif mode == "perf-peers":
        mode_perf_peers(tool, sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
