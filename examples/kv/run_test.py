#!/usr/bin/env python3
"""Runs the key-value example: a server, three clients, one of them killed.

  run_test.py KV_SERVER KV_CLIENT PROVIDER [WAIT]

WAIT is the --wait mode of the server and the clients (default spin).

1. kv-server starts (bounded run) and prints its port; three malformed
   joins (garbage, an absurd length, a name that is no endpoint name) must
   be refused by its regpool::Listener without effect.
2. Clients A and B put and get OPS keys each, verifying every byte, then
   wait; client V (the victim) does the same, then opens a write lease and
   holds it.
3. V is killed with SIGKILL while it holds the lease. A and B are told to
   go on: OPS more keys each, and a re-read of their first OPS.
4. A verifier client joins afterwards and reads every key of A and B, and
   the keys V committed before it died, byte for byte, and checks that V's
   uncommitted key does not exist.
5. The server must report V as died (its write lease released), see the
   other three leave, keep serving, and exit 0 once the four clients have
   come and gone.
6. A second server is killed under a waiting client X, which must notice
   it through its membership connection and exit 3 saying so.
Every process has a time bound; the script kills whatever is left.
"""
import os
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


def server_dies(server_exe, client_exe, provider, wait, deadline):
    """The other way round: a client waiting between requests must notice
    through its membership connection that the server was killed, and say
    so (exit 3), rather than hang or wait for a timeout."""
    server = subprocess.Popen([server_exe, "--provider", provider, "--wait", wait, "--max-seconds", str(BOUND)],
                              stdout=subprocess.PIPE, text=True)
    server_lines = Lines(server)
    m = server_lines.wait_for(r"listening on [\d.]+:(\d+)", deadline)
    if not m:
        fail("second server did not start: " + "".join(server_lines.transcript), [server])
    client = subprocess.Popen(
        [client_exe, "--provider", provider, "--wait", wait, "--port", m.group(1), "--name", "X", "--ops", "2",
         "--wait-go"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [server, client]
    if not Lines(client).wait_for(r"X: waiting", deadline):
        fail("client X did not reach its pause", procs)
    server.send_signal(signal.SIGKILL)
    server.wait()
    killed = time.monotonic()
    try:
        client.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        fail("client X did not notice that the server died", procs)
    err = client.stderr.read()
    print(err, end="")
    if client.returncode != 3 or "the server died" not in err:
        fail(f"client X exited with {client.returncode}, not 3 with 'the server died'", procs)
    print(f"killed the server; client X noticed after {time.monotonic() - killed:.2f} s")


def main():
    if len(sys.argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    server_exe, client_exe, provider = sys.argv[1:4]
    wait = sys.argv[4] if len(sys.argv) == 5 else "spin"
    # The hostile join below is crafted without a job key.
    os.environ.pop("REGPOOL_BOOTSTRAP_KEY", None)
    deadline = time.monotonic() + BOUND
    procs = []
    server = subprocess.Popen(
        [server_exe, "--provider", provider, "--wait", wait, "--op-timeout-ms", "2000",
         "--expect", "4", "--max-seconds", str(BOUND)],
        stdout=subprocess.PIPE, text=True)
    procs.append(server)
    server_lines = Lines(server)
    m = server_lines.wait_for(r"listening on [\d.]+:(\d+)", deadline)
    if not m:
        fail("server did not start: " + "".join(server_lines.transcript), procs)
    port = m.group(1)

    # Hostile joins first, in regpool's membership protocol (docs/membership.md,
    # "Protocol"): garbage, a join frame announcing 1 GiB, and a well-formed
    # join whose name is no endpoint name. The listener must drop or refuse
    # each (one log line each) and admit nobody; the server's loop goes on.
    frame = struct.pack("<IIQ", 0x4D524652, 0x4E494F4A, 1 << 30)  # "RFRM", "JOIN", length
    bad_name = bytes(16)
    join = struct.pack("<HHIQ", 1, 0, len(bad_name), 0) + bytes(32) + bad_name + bytes(32)
    for junk in (b"junk" * 4, frame, struct.pack("<IIQ", 0x4D524652, 0x4E494F4A, len(join)) + join):
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as s:
            s.settimeout(10)
            try:
                s.recv(40)  # the listener's challenge
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):  # a refusal, then the listener closes
                    pass
            except OSError:
                pass

    def client(name, *extra, stdin=None):
        p = subprocess.Popen(
            [client_exe, "--provider", provider, "--wait", wait, "--port", port, "--name", name,
             "--max-size", str(MAX_SIZE), *extra],
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
    # The listener's own lines: three hostile joins dropped or refused.
    if len(re.findall(r"kv-server: membership: (dropped|refused) ", text)) != 3:
        fail("server did not drop or refuse exactly the three hostile joins", procs)
    # V is one of the first three clients; its PeerId depends on the order
    # they joined in, so match any. It died holding its write lease, which
    # went with it.
    if len(re.findall(r"client \d+ \(epoch \d+\) died: [^\n]* \(released 1 leases\)", text)) != 1:
        fail("server did not report the killed client as died, with its write lease released", procs)
    if len(re.findall(r"client \d+ \(epoch \d+\) left: [^\n]* \(released 0 leases\)", text)) != 3:
        fail("server did not see three clients leave cleanly", procs)
    if not re.search(r"4 joined, 3 left, 1 died, \d+ requests, 0 rejected", text):
        fail("server summary does not show 4 joined, 3 left, 1 died, 0 rejected requests", procs)
    if not re.search(r"exposures: \d+ created \(\d+ scoped\), 0 live", text):
        fail("server still had live exposures (leases) after every client went", procs)
    server_dies(server_exe, client_exe, provider, wait, deadline)
    print("examples-kv: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
