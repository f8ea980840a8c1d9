#!/usr/bin/env python3
"""Runs the key-value example: a server, three clients, one of them killed.

  run_test.py KV_SERVER KV_CLIENT PROVIDER

1. kv-server starts (lease 5 s, bounded run) and prints its port; three
   malformed joins (garbage, an absurd length, a name that is no endpoint
   name) must be refused without effect.
2. Clients A and B put and get OPS keys each, verifying every byte, then
   wait; client V (the victim) does the same, then opens a write lease and
   holds it.
3. V is killed with SIGKILL while it holds the lease. A and B are told to
   go on: OPS more keys each, and a re-read of their first OPS.
4. A verifier client joins afterwards and reads every key of A and B, and
   the keys V committed before it died, byte for byte, and checks that V's
   uncommitted key does not exist.
5. The server must drop V (lease expired, its write lease released), keep
   serving, and exit 0 once the four clients have come and gone.
Every process has a time bound; the script kills whatever is left.
"""
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

OPS = 12
MAX_SIZE = 150000
BOUND = 120  # seconds for the whole run


def fail(msg, procs=()):
    for p in procs:
        if p.poll() is None:
            p.kill()
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


class Lines:
    """Collects a process's stdout lines on a thread, so waiting for one line
    never blocks on a pipe (nor misses lines already buffered)."""

    def __init__(self, proc):
        self.proc = proc
        self.queue = queue.Queue()
        self.transcript = []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self):
        for line in self.proc.stdout:
            self.queue.put(line)
        self.queue.put(None)

    def wait_for(self, pattern, deadline):
        while True:
            try:
                line = self.queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            self.transcript.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def rest(self, deadline):
        """Everything until the process closes stdout (or the deadline)."""
        while self.wait_for(r"(?!)", deadline) is not None:
            pass
        return "".join(self.transcript)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    server_exe, client_exe, provider = sys.argv[1:]
    deadline = time.monotonic() + BOUND
    procs = []
    server = subprocess.Popen(
        [server_exe, "--provider", provider, "--lease-ms", "5000", "--op-timeout-ms", "2000",
         "--expect", "4", "--max-seconds", str(BOUND)],
        stdout=subprocess.PIPE, text=True)
    procs.append(server)
    server_lines = Lines(server)
    m = server_lines.wait_for(r"listening on [\d.]+:(\d+)", deadline)
    if not m:
        fail("server did not start: " + "".join(server_lines.transcript), procs)
    port = m.group(1)

    # Hostile joins first: garbage, an absurd length, a well-framed name that
    # is no endpoint name. Each costs the server one bounded handshake and is
    # counted as rejected; nothing else changes.
    for junk in (b"junk", struct.pack("<II", 0x3148564B, 1 << 30), struct.pack("<II", 0x3148564B, 16) + bytes(16)):
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(10)
            try:
                if s.recv(64):
                    fail("server answered a bad join", procs)
            except OSError:
                pass

    def client(name, *extra, stdin=None):
        p = subprocess.Popen(
            [client_exe, "--provider", provider, "--port", port, "--name", name, "--max-size", str(MAX_SIZE),
             *extra],
            stdin=stdin, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return p, Lines(p)

    a, a_lines = client("A", "--ops", str(OPS), "--wait-go", stdin=subprocess.PIPE)
    b, b_lines = client("B", "--ops", str(OPS), "--wait-go", stdin=subprocess.PIPE)
    v, v_lines = client("V", "--ops", str(OPS), "--hang")
    for name, lines, pattern in (("A", a_lines, r"A: waiting"), ("B", b_lines, r"B: waiting"),
                                 ("V", v_lines, r"V: holding a write lease")):
        if not lines.wait_for(pattern, deadline):
            fail(f"client {name} did not reach its pause: " + "".join(lines.transcript), procs)

    # The victim dies holding a write lease; the others carry on at once.
    v.send_signal(signal.SIGKILL)
    v.wait()
    print(f"killed V (pid {v.pid}) while it held a write lease")
    for p in (a, b):
        p.stdin.write("go\n")
        p.stdin.flush()
    for name, p, lines in (("A", a, a_lines), ("B", b, b_lines)):
        print(lines.rest(deadline), end="")
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            fail(f"client {name} did not finish", procs)
        if p.returncode != 0:
            fail(f"client {name} exited with {p.returncode}", procs)

    verifier, w_lines = client("W", "--verify", f"A:{2 * OPS}", "--verify", f"B:{2 * OPS}", "--verify",
                               f"V:{OPS}", "--verify-missing", "V/pending")
    print(w_lines.rest(deadline), end="")
    try:
        verifier.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        fail("verifier did not finish", procs)
    if verifier.returncode != 0:
        fail(f"verifier exited with {verifier.returncode}", procs)

    text = server_lines.rest(deadline)
    try:
        server.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        fail("server did not exit after the clients left: " + text, procs)
    print(text, end="")
    if server.returncode != 0:
        fail(f"server exited with {server.returncode}", procs)
    # V is the third client to join (id 2); the joins are A, B, V in order
    # only if they connected in that order, so match any id.
    if not re.search(r"client \d+ lease expired \(released 1 leases\)", text):
        fail("server did not drop the killed client with its write lease", procs)
    if not re.search(r"4 joined, 1 dropped, \d+ requests, 3 rejected", text):
        fail("server summary does not show 4 joined, 1 dropped, 3 rejected joins", procs)
    if len(re.findall(r"client \d+ left", text)) != 3:
        fail("server did not see three clients leave", procs)
    print("examples-kv: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
