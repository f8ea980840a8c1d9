"""The machine's state, for bench/compare-peers and bench/verbs-vs-perftest.

On a VM the host places the two vCPUs near each other or far apart and moves
them every few minutes, and every cross-process latency follows (this
machine: bench-shm-floor's 8-byte half round trip 0.08 against 0.39 us).
Both scripts run bench-shm-floor as a probe before and after every tool run
and compare two tools' figures only within one state (docs/peer-comparison.md,
"The floor and the machine's state").
"""
import statistics

# Probes within this factor of the one before them: one state.
SAME_STATE = 1.5


def machine_states(values):
    """Groups probe values into states: sorted, a probe more than SAME_STATE
    times the one before starts a new state. Returns {probe: its state's
    median probe} (the state's name)."""
    groups = []
    for v in sorted(values):
        if groups and v <= SAME_STATE * groups[-1][-1]:
            groups[-1].append(v)
        else:
            groups.append([v])
    return {v: statistics.median(g) for g in groups for v in g}


def state_name(label, probes):
    """The state all `probes` are in (its name, two decimals), 'mixed' when
    they span two, None when there are none or one is missing."""
    if not probes or any(p is None for p in probes):
        return None
    states = {label[p] for p in probes}
    return f"{states.pop():.2f}" if len(states) == 1 else "mixed"
