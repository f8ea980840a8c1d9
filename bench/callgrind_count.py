"""Total instructions of one program run, counted by callgrind.

Shared by bench/alloc-insns and bench/rma-insns: each runs its loop program
at two iteration counts and divides the difference by the difference in
iterations, which leaves out the setup both runs share.
"""
import os
import re
import shutil
import subprocess
import tempfile


def have_valgrind() -> bool:
    return shutil.which("valgrind") is not None


def instructions(cmd: list[str], env: dict | None = None) -> int:
    """Instructions callgrind counted in the process `cmd` starts (children
    it forks are not followed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        with open(out) as f:
            for line in f:
                m = re.match(r"(?:summary|totals):\s+(\d+)", line)
                if m:
                    return int(m.group(1))
    raise RuntimeError(f"{cmd[0]}: no instruction total in callgrind's output")


def per_iteration(cmd, short: int, long: int, env: dict | None = None, repeat: int = 1) -> float:
    """(instructions at `long` - at `short`) / (long - short); `cmd` is a
    function of the iteration count that returns the command line. With
    `repeat` > 1 each count is the least of that many runs: work a program
    does by the clock (a periodic check) only adds instructions, and more of
    them under callgrind, which runs it tens of times slower."""
    def least(n: int) -> int:
        return min(instructions(cmd(n), env) for _ in range(repeat))
    return (least(long) - least(short)) / (long - short)
