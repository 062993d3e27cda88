"""Where a sandboxed program's CPU goes, by process and by kernel path: ``perf`` over a pool of trivial programs.

What it does: runs ``--programs`` trivial programs (one call each) on a warm ``ProcessExecutor`` of one worker under
``perf record -a -g -e cpu-clock`` and sorts every sample of that process tree by process (the parent, the worker,
its zygote, the zygote's children and their descendants, followed through perf's fork records) and by what it was
doing: ``fork`` (inside ``copy_process``: the zygote's page tables and mappings copied), ``exit`` (``do_exit``: the
child's address space torn down), ``fault`` (page faults), a named system call, other kernel work, or ``user``
(the interpreter). It prints CPU ms per program for each beside the bare fork+exit+wait floor measured in the same
run (``sandbox_bench.fork_floor_ms``), and the memory-management part (fork + exit + faults, every process) as a
multiple of that floor. perf's own recording of each fork and exit adds to them (the profile's total is above
``sandbox_bench.py``'s CPU per program): read the shares. Without perf, the same run measures the loaded floor: the
floor's fork+exit+wait loop in an interpreter that holds what a zygote holds (the sandbox's modules and those
preloaded for programs, ``sandbox.child._preload``), which every program pays, before its child runs a line, for
as long as each program is a fresh fork of such a process.

What it does not: measure throughput (``bench/sandbox_bench.py`` does), or run without ``perf`` (exit 2: Debian's
``linux-perf``; system-wide sampling needs root or ``kernel.perf_event_paranoid`` <= 0).

Run: ``python bench/sandbox_profile.py [--programs 3000] [--freq 4999]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("parent", "worker", "zygote", "children")
MEMORY = ("fork", "exit", "fault")
"""The kinds that are the kernel's work on address spaces: page tables copied, torn down, filled."""
_FORK = re.compile(r"PERF_RECORD_FORK\((\d+):\d+\):\((\d+):\d+\)")
_HEADER = re.compile(r"^\s*\S.*?\s(\d+)\s*$")
_KERNEL = "ffffffff"


DRIVER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from sandbox.executor import ProcessExecutor
from sandbox.limits import ExecLimits
n = int(sys.argv[1])
jobs = [(f"def f(x):\\n    return x + {i}\\n", ["f(1)"]) for i in range(n)]
with ProcessExecutor(workers=1, limits=ExecLimits(call_timeout_s=5.0, program_timeout_s=60.0)) as ex:
    ex.run_many(jobs[:4])  # warm-up: the zygote is up and its pages pinned
    worker = ex._workers[0].proc.pid
    zygote = Path(f"/proc/{worker}/task/{worker}/children").read_text().split()[0]
    Path(sys.argv[2]).write_text(f"{os.getpid()} {worker} {zygote}")
    statuses = {o.status for r in ex.run_many(jobs) for o in r}
    Path(sys.argv[2]).write_text(f"{os.getpid()} {worker} {zygote} {','.join(sorted(statuses))}")
"""


def kind_of(frames: list[str]) -> str:
    """What one sample was doing, from its call chain (``ADDR SYMBOL`` lines, innermost first)."""
    syms = [f.split(None, 1)[1] if len(f.split(None, 1)) > 1 else "" for f in frames]
    names = set(syms)
    if "copy_process" in names:
        return "fork"
    if names & {"do_exit", "do_group_exit", "exit_mmap", "__mmput"}:
        return "exit"
    if names & {"exc_page_fault", "asm_exc_page_fault"}:
        return "fault"
    if not frames or not frames[0].startswith(_KERNEL):
        return "user"
    for sym in reversed(syms):  # the outermost system call entry
        for prefix in ("__x64_sys_", "__do_sys_", "__se_sys_"):
            if sym.startswith(prefix):
                return "sys:" + sym[len(prefix) :]
    return "kernel:other"


def classify(script: str, parent: int, worker: int, zygote: int) -> collections.Counter:
    """Samples of ``perf script --show-task-events -F comm,pid,ip,sym`` output by (role, kind); pids outside
    the parent's tree (the machine's other processes, perf itself, idle) are left out. The zygote's
    descendants are found through the fork records, which precede their samples."""
    roles = {parent: "parent", worker: "worker", zygote: "zygote"}
    counts: collections.Counter = collections.Counter()
    pid: int | None = None
    frames: list[str] = []

    def flush() -> None:
        role = roles.get(pid) if pid is not None else None
        if role is not None and frames:
            counts[(role, kind_of(frames))] += 1

    for line in script.splitlines():
        if fork := _FORK.search(line):
            child, by = int(fork[1]), int(fork[2])
            if roles.get(by) in ("zygote", "children") and child not in roles:
                roles[child] = "children"
            continue
        if not line.strip():
            flush()
            pid, frames = None, []
        elif line.startswith("\t"):
            frames.append(line.strip())
        elif header := _HEADER.match(line):
            flush()
            pid, frames = int(header[1]), []
    flush()
    return counts


def table(counts: collections.Counter, freq: int, programs: int, floor_ms: float) -> list[str]:
    """CPU ms per program by process and kind (kinds under 1 % of the whole folded into ``other``), the
    memory-management part and the whole as multiples of the floor."""
    ms = 1000.0 / freq / programs
    total = sum(counts.values())
    lines = [f"  {'process':9s} {'kind':26s} {'ms/program':>10s} {'share':>7s}"]
    for role in ROLES:
        own = {k: v for (r, k), v in counts.items() if r == role}
        lines.append(
            f"  {role:9s} {'(all)':26s} {sum(own.values()) * ms:10.3f} {sum(own.values()) / total:7.1%}"
        )
        small = 0
        for kind, n in sorted(own.items(), key=lambda kv: -kv[1]):
            if n / total < 0.01:
                small += n
                continue
            lines.append(f"  {'':9s} {kind:26s} {n * ms:10.3f} {n / total:7.1%}")
        if small:
            lines.append(f"  {'':9s} {'other':26s} {small * ms:10.3f} {small / total:7.1%}")
    memory = sum(v for (_, k), v in counts.items() if k in MEMORY)
    lines += [
        f"  all: {total * ms:.3f} ms per program = {total * ms / floor_ms:.2f} x the floor ({floor_ms:.3f} ms)",
        f"  fork + exit + faults: {memory * ms:.3f} ms per program ({memory / total:.0%}) ="
        f" {memory * ms / floor_ms:.2f} x the floor",
    ]
    return lines


def loaded_floor_ms(forks: int = 2000) -> float:
    """CPU ms per fork+exit+wait (parent + child) of an interpreter started as a sandbox worker is (``-S``) that
    has imported ``sandbox.child`` and the modules preloaded for programs: a zygote's memory, less its pins."""
    from sandbox_bench import FLOOR, LOAD

    done = subprocess.run(
        [sys.executable, "-S", "-s", "-P", "-c", LOAD + FLOOR, str(forks)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip())


def profile(programs: int, freq: int, perf: str) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    from sandbox_bench import fork_floor_ms

    floors = [fork_floor_ms()]
    loaded = loaded_floor_ms()
    with tempfile.TemporaryDirectory(prefix="codea1-profile-") as tmp:
        data, pids = Path(tmp) / "perf.data", Path(tmp) / "pids"
        record = [perf, "record", "-q", "-a", "-g", "-e", "cpu-clock", "-F", str(freq), "-o", str(data), "--"]
        drive = [sys.executable, "-c", DRIVER, str(programs), str(pids), str(ROOT)]
        done = subprocess.run(record + drive, capture_output=True, text=True)
        if done.returncode != 0 or not pids.exists():
            print(
                f"perf record failed (exit {done.returncode}): {done.stderr.strip()[-500:]}", file=sys.stderr
            )
            return 2
        floors.append(fork_floor_ms())
        parent, worker, zygote, statuses = pids.read_text().split()
        script = subprocess.run(
            [perf, "script", "-i", str(data), "--show-task-events", "-F", "comm,pid,ip,sym"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    counts = classify(script, int(parent), int(worker), int(zygote))
    floor_ms = sum(floors) / len(floors)
    print(
        f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; {programs} trivial programs, 1 worker"
    )
    print(f"fork+exit+wait floor (bare python3, before/after): {floors[0]:.3f} / {floors[1]:.3f} ms CPU")
    print(f"statuses {statuses}; {sum(counts.values())} samples at {freq} Hz")
    print("\n".join(table(counts, freq, programs, floor_ms)))
    print(
        f"  loaded floor (fork+exit+wait of an interpreter holding the sandbox and the preloaded modules, no perf):"
        f" {loaded:.3f} ms = {loaded / floor_ms:.2f} x the floor"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=3000, help="trivial programs to profile")
    ap.add_argument("--freq", type=int, default=4999, help="samples per second of CPU (perf -F)")
    args = ap.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        print("perf not found: apt-get install linux-perf", file=sys.stderr)
        return 2
    return profile(args.programs, args.freq, perf)


if __name__ == "__main__":
    sys.exit(main())
