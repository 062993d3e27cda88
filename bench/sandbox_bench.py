"""Sandbox throughput: ProcessExecutor vs one fresh ``python3`` subprocess per program, isolation on vs off.

What it does: on the same workloads — (1) trivial programs with one call, (2) HumanEval+ canonical
solutions with their base inputs — it measures programs/s and calls/s of
  (a) ``ProcessExecutor`` with full isolation (namespaces, uid drop, rlimits),
  (b) a baseline that starts one fresh ``python3`` per program (same parallelism, same calls),
  (c) ``ProcessExecutor`` with isolation off (no namespaces, no uid drop, nothing hidden),
and prints the ratios. Targets (2 idle cores): (a)/(b) >= 5x on HumanEval+, >= 1,000 trivial programs/s,
<= 2 ms of CPU per trivial program, isolation costs <= 20 % throughput. The load average is printed: on a
shared machine wall-clock numbers are lower, so CPU seconds per program (parent, workers, zygotes and
children, from /proc) are printed too, with the CPU-bound throughput they imply on ``--workers`` idle
cores, beside the physical floor measured in the same run: a bare ``python3`` looping
``os.fork(); os._exit(0); os.waitpid()`` (CPU ms per fork, parent + child), and the ratio to it.

The CPU of the isolated pool is also split by process (the parent, the workers, the zygotes, the zygotes'
reaped children) with the minor page faults per program of zygotes and children: where a program's CPU goes.
The target (``--target-ratio``, default 2): a trivial program's CPU at most that multiple of the floor; the
ratio is printed and the bench exits with status 1 when it is missed (``--target-ratio 0``: no check).
Beside it, the same run measures the **bare pipeline** (:data:`BARE_PIPELINE`): what any sandbox that runs
each program in a fresh fork of a zygote must do, with nothing else. The zygote's interpreter (the sandbox and
the modules preloaded for programs, frozen, with the pages its children write pinned as the sandbox's zygote
pins them) forks a child per trivial program, which compiles and runs it and writes its result to a pipe that
the zygote reads before it reaps the child; no isolation layer, no supervisor. The bench prints it as a
multiple of the floor, and the sandbox as a multiple of it: the bare pipeline is a floor for any such design,
and the sandbox's excess over it is what its isolation and supervision cost. It also prints the bare pipeline
of a zygote without the modules preloaded for programs (lighter to fork; its programs would import them each
time).

With ``--compare-ref REF`` (e.g. ``main``) it instead measures this checkout's executor against the
one of git revision REF (extracted with ``git archive`` into a temporary directory) in ONE run: ABBA-
interleaved rounds, each a fresh process running the same workloads with full isolation, and prints the
median programs/s and CPU ms/program of each side, their ratios, and each side's CPU ms/program as a
multiple of the fork+exit+wait floor measured before and after the rounds (the machine may be loaded by
others: interleaving spreads that load over both sides).

What it does not do: check results beyond counting statuses (the tests do that).

Run: ``python bench/sandbox_bench.py [--trivial 2000] [--workers 2] [--data-dir DIR]``, or
``python bench/sandbox_bench.py --compare-ref main [--rounds 3]``.

With ``--deny-compare`` it measures instead the CPU per program with the deny-by-default layers (the
seccomp allow-list, Landlock, a fresh keyring per program) and without (``deny="off"``), and with each
call in its own process (``isolate_calls``, the pipeline's default), in one run of rounds whose arms
run in a shuffled order, as ratios within each round (median and range) beside an A/A control (the
noise of the machine alone) and the fork floor (goal: the filter within 5 % of without).

``--ray`` (needs ``pip install -e '.[ray]'``) measures instead, on the same two workloads in one run, the
process pool beside the Ray backend on one node (a local Ray runtime, one actor owning a pool of ``--workers``
workers): programs/s of both and the per-program overhead Ray adds, ``ray_s / process_s - 1`` (goal <= 10 %
on HumanEval+), best of ``--rounds`` alternating rounds so that a busy neighbour hurts both alike.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandbox import ExecLimits, ProcessExecutor  # noqa: E402
from sandbox.workloads import evalplus_workloads  # noqa: E402

BASELINE_HARNESS = """
import sys
ns = {"__name__": "program"}
exec(compile(sys.stdin.read(), "<program>", "exec"), ns)
for expr in CALLS:
    try:
        print(repr(eval(expr, ns))[:100])
    except BaseException as exc:
        print("error", type(exc).__name__)
"""


FLOOR = """
import os, resource, sys, time
n = int(sys.argv[1])
c0, r0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
child_s = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
print(1000 * (time.process_time() - c0 + child_s) / n)
"""


ROOT = Path(__file__).resolve().parents[1]
LOAD = f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom sandbox import child\nchild._preload()\n"
"""What a sandbox worker imports before it forks its zygote (``sandbox/executor.py``'s boot line, ``-S``)."""

BARE_PIPELINE = """
import gc, marshal, os, resource, sys, time
from sandbox import pinning
gc.collect()
gc.freeze()  # as the zygote does before its first child
n = int(sys.argv[1])
def run(i, probe=False):
    r, w = os.pipe()
    go_r, go_w = os.pipe() if probe else (-1, -1)
    pid = os.fork()
    if pid == 0:
        ns = {"__name__": "program"}
        exec(compile(f"def f(x):\\n    return x + {i}\\n", "<program>", "exec"), ns)
        os.write(w, marshal.dumps(repr(eval("f(1)", ns))))
        if probe:  # wait, every page it wrote its own, while the zygote lists them
            os.read(go_r, 1)
        os._exit(0)
    os.close(w)
    out = os.read(r, 65536)
    runs = pinning.written_pages() if probe else []
    if probe:
        os.write(go_w, b"x")
        os.close(go_r)
        os.close(go_w)
    os.close(r)
    os.waitpid(pid, 0)
    if marshal.loads(out) != repr(1 + i):
        sys.exit(f"bare pipeline: program {i} returned {out!r}")
    return runs
for i in range(200):
    run(i)
if sys.argv[2] == "pin":  # as the zygote pins (sandbox/zygote.py, _pin_child_pages); no io_uring: it faults
    try:
        ring = pinning.pin(pinning.common_runs(run(0, probe=True), run(1, probe=True)))
    except OSError:
        pass
c0, r0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
for i in range(n):
    run(i)
r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
child_s = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
print(1000 * (time.process_time() - c0 + child_s) / n)
"""
"""What every design that runs each program in a fresh fork of a zygote must do, and nothing else: a zygote's
interpreter (``LOAD``, frozen) forks a child per trivial program, which compiles and runs it and writes its
result to a pipe; the zygote reads it and reaps the child. No isolation, no supervisor; with ``pin``, the
pages a probe child and the zygote write are pinned first, as the sandbox's zygote pins them."""


def bare_pipeline_ms(programs: int = 2000, pin: bool = True, preload: bool = True) -> float:
    """CPU ms per trivial program (zygote + child) of :data:`BARE_PIPELINE`, started as a sandbox worker is;
    ``preload=False``: without the modules preloaded for programs (the sandbox's own modules only)."""
    load = LOAD if preload else LOAD.replace("child._preload()\n", "")
    proc = subprocess.run(
        [sys.executable, "-S", "-s", "-P", "-c", load + BARE_PIPELINE, str(programs), "pin" if pin else "-"],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(proc.stdout.strip())


def fork_floor_ms(forks: int = 2000) -> float:
    """CPU ms per fork+exit+wait of a bare interpreter (parent + child), in a fresh ``python3 -s -P``."""
    proc = subprocess.run(
        [sys.executable, "-s", "-P", "-c", FLOOR, str(forks)], capture_output=True, text=True, check=True
    )
    return float(proc.stdout.strip())


SET_UP = """
import os, resource, statistics, sys
sys.path.insert(0, sys.argv[2])
from sandbox import landlock, linux, mounts, syscall_filter
n = int(sys.argv[1])
load = syscall_filter.loader(syscall_filter.build_filters("eperm", children_privileged=True)[1])
linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)  # (this helper process only)
ruleset = landlock.make_ruleset(list(mounts.python_keep_paths()), ["/tmp"])[0]
restrict = landlock.restrict_function()
def child_us(kind):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            if kind != "landlock" and kind != "none":
                load()
            if kind != "seccomp" and kind != "none" and ruleset >= 0:
                restrict(446, ruleset, 0)
            os._exit(0)
        os.waitpid(pid, 0)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1e6 * (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n
kinds = ("none", "seccomp", "landlock", "both")
got = {k: [] for k in kinds}
for _ in range(5):
    for k in kinds:
        got[k].append(child_us(k))
base = statistics.median(got["none"])
print(" ".join(f"{statistics.median(got[k]) - base:.0f}" for k in kinds[1:]))
"""


def set_up_cost_us(forks: int = 2000) -> tuple[float, float, float]:
    """Microseconds of CPU a forked child spends loading a second seccomp filter (only children that keep
    privileges do: ``sandbox/syscall_filter.py``), joining the Landlock ruleset (every child), and both,
    over a bare fork+exit (medians of 5 rounds, in a fresh helper process that sets no-new-privs on
    itself): the deny layers' own per-program cost, with far less noise than whole pools."""
    proc = subprocess.run(
        [sys.executable, "-s", "-P", "-c", SET_UP, str(forks), str(Path(__file__).resolve().parents[1])],
        capture_output=True,
        text=True,
        check=True,
    )
    seccomp, landlock, both = (float(x) for x in proc.stdout.split())
    return seccomp, landlock, both


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process, its reaped children and (recursively) its live descendants: a worker's
    zygote is alive until the pool closes, and the children it reaped count in its own stat line."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    own = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(_tree_cpu_s(int(k)) for k in kids)


def _cpu_split(pids: list[int]) -> collections.Counter:
    """CPU seconds of the parent (this process), the workers ``pids``, their zygotes and the zygotes'
    reaped children, and the minor page faults of zygotes and children, summed over the workers."""
    tck, split = os.sysconf("SC_CLK_TCK"), collections.Counter(parent=time.process_time())
    for pid in pids:
        try:
            worker = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            zygotes = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            split["worker"] += (int(worker[11]) + int(worker[12])) / tck
            for z in zygotes:
                f = Path(f"/proc/{z}/stat").read_text().rsplit(")", 1)[1].split()
                split["zygote"] += (int(f[11]) + int(f[12])) / tck
                split["children"] += (int(f[13]) + int(f[14])) / tck
                split["zygote faults"] += int(f[7])
                split["children faults"] += int(f[8])
        except OSError:
            continue
    return split


def run_executor(
    jobs: list[tuple[str, list[str]]], workers: int, isolated: bool
) -> tuple[float, float, collections.Counter, dict[str, float]]:
    """Wall seconds and CPU seconds (workers, children, parent) of all jobs on a warm pool, the statuses,
    and the CPU seconds and faults by process (:func:`_cpu_split`) per program."""
    kwargs = {} if isolated else {"network_isolation": "off", "drop_privileges": False, "hide_paths": []}
    with ProcessExecutor(
        workers=workers, limits=ExecLimits(call_timeout_s=5.0, program_timeout_s=60.0), **kwargs
    ) as ex:
        ex.run_many(jobs[: 2 * workers])  # warm-up
        pids = [w.proc.pid for w in ex._workers]
        split0 = _cpu_split(pids)
        cpu0, t0 = sum(map(_tree_cpu_s, pids)) + time.process_time(), time.perf_counter()
        results = ex.run_many(jobs)
        seconds = time.perf_counter() - t0
        cpu_s = sum(map(_tree_cpu_s, pids)) + time.process_time() - cpu0
        split = _cpu_split(pids)
    per_program = {k: (split[k] - split0[k]) / len(jobs) for k in split}
    return seconds, cpu_s, collections.Counter(o.status for r in results for o in r), per_program


def cpu_per_program_ms(
    jobs: list[tuple[str, list[str]]], workers: int, deny: str, isolate_calls: bool
) -> float:
    """CPU ms per program (workers, zygotes, children, parent) on a warm fully isolated pool."""
    limits = ExecLimits(call_timeout_s=5.0, program_timeout_s=60.0, isolate_calls=isolate_calls)
    with ProcessExecutor(workers=workers, limits=limits, deny=deny) as ex:
        ex.run_many(jobs[: 2 * workers])  # warm-up
        pids = [w.proc.pid for w in ex._workers]
        cpu0 = sum(map(_tree_cpu_s, pids)) + time.process_time()
        ex.run_many(jobs)
        return 1000 * (sum(map(_tree_cpu_s, pids)) + time.process_time() - cpu0) / len(jobs)


def deny_compare(rounds: int, workers: int, suites: dict[str, list[tuple[str, list[str]]]]) -> None:
    """CPU per program with the deny-by-default layers (seccomp allow-list, Landlock, fresh keyrings) and
    without, and with each call in its own process (``isolate_calls``, the pipeline's default), in ONE
    run, beside the fork floor.

    How it estimates: each round measures every arm once, in an order shuffled per round (seeded), and
    the ratios are taken within the round (``on / off``), so a slow spell of the shared machine moves
    both sides of a ratio alike; the report is the median over rounds, with its range. An A/A arm
    (``off`` measured twice in the round) shows what ratio the machine's noise alone gives: a filter
    cost is only read as real where it stands clear of that.
    """
    floors = [fork_floor_ms()]
    arms = (("off", False), ("off (A/A)", False), ("on", False), ("on", True))
    got: dict[tuple[str, int], list[float]] = collections.defaultdict(list)  # (suite, arm) -> per round
    for r in range(rounds):
        order = list(range(len(arms)))
        random.Random(r).shuffle(order)
        for a in order:
            deny, isolate = arms[a]
            for suite, jobs in suites.items():
                got[suite, a].append(cpu_per_program_ms(jobs, workers, deny.split()[0], isolate))
    floors.append(fork_floor_ms())
    floor_ms = statistics.mean(floors)
    print(f"  fork+exit+wait floor (bare python3, before/after): {floors[0]:.3f} / {floors[1]:.3f} ms CPU")
    seccomp_us, landlock_us, both_us = set_up_cost_us()
    print(
        f"  per-child set-up over a bare fork (direct forks, medians of 5): Landlock {landlock_us:.0f} us"
        f" (the zygote's seccomp filter is inherited, none loaded per child); children that keep privileges"
        f" also load a second filter: {seccomp_us:.0f} us, both {both_us:.0f} us"
    )

    def ratio(suite: str, a: int, b: int) -> str:
        per_round = [x / y for x, y in zip(got[suite, a], got[suite, b], strict=True)]
        return f"{statistics.median(per_round):.3f} (rounds {min(per_round):.3f}-{max(per_round):.3f})"

    for suite, jobs in suites.items():
        off, _, on, iso = (statistics.median(got[suite, a]) for a in range(len(arms)))
        calls = sum(len(c) for _, c in jobs) / len(jobs)
        print(f"\n{suite} ({len(jobs)} programs, {calls:.1f} calls each; {rounds} rounds, shuffled)")
        print(
            f"  CPU ms/program (medians)  filter off {off:.3f}   filter on {on:.3f}   on + isolated calls {iso:.3f}"
        )
        print(f"  filter on / off:   {ratio(suite, 2, 0)}   goal <= 1.05")
        print(f"  off / off (A/A):   {ratio(suite, 1, 0)}   the machine's noise")
        print(f"  isolated calls / on: {ratio(suite, 3, 2)}")
        print(f"  vs the floor ({floor_ms:.2f} ms): off {off / floor_ms:.2f} x, on {on / floor_ms:.2f} x")
        print(
            f"  the layers' per-child set-up alone: {landlock_us / 1000 / off:.1%} of a program's CPU with the"
            " filter off"
        )


def run_baseline(jobs: list[tuple[str, list[str]]], workers: int) -> tuple[float, float]:
    """Wall and CPU seconds of all jobs with one fresh ``python3 -I`` per program, ``workers`` at a time."""

    def one(job: tuple[str, list[str]]) -> None:
        program, calls = job
        script = f"CALLS = {calls!r}\n{BASELINE_HARNESS}"
        subprocess.run(
            [sys.executable, "-I", "-c", script],
            input=program.encode(),
            capture_output=True,
            timeout=120,
            check=False,
        )

    usage0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, jobs))
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    return time.perf_counter() - t0, cpu_s


def report(
    name: str, jobs: list[tuple[str, list[str]]], workers: int, baseline_sample: int, floor_ms: float
) -> float:
    """Print one workload's table; returns its CPU per program (isolation on) as a multiple of the floor."""
    n_programs, n_calls = len(jobs), sum(len(c) for _, c in jobs)
    on_s, on_cpu, statuses, split = run_executor(jobs, workers, isolated=True)
    off_s, off_cpu, _, _ = run_executor(jobs, workers, isolated=False)
    sample = jobs[:baseline_sample]
    scale = n_programs / len(sample)  # the baseline is timed on a sample and extrapolated
    base_s, base_cpu = (x * scale for x in run_baseline(sample, workers))
    cores = min(workers, os.cpu_count() or 1)
    print(f"\n== {name}: {n_programs} programs, {n_calls} calls; statuses {dict(statuses)}")
    print(
        f"  {'':26s} {'programs/s':>10s} {'calls/s':>10s} {'CPU ms/program':>15s} {'CPU-bound programs/s':>21s}"
    )
    rows = (("executor, isolation on", on_s, on_cpu), ("executor, isolation off", off_s, off_cpu))
    for label, secs, cpu in (*rows, ("python3 per program", base_s, base_cpu)):
        print(
            f"  {label:26s} {n_programs / secs:10.1f} {n_calls / secs:10.1f} {1000 * cpu / n_programs:15.2f}"
            f" {cores * n_programs / cpu:21.1f}"
        )
    print(
        f"  speed-up vs subprocess baseline: wall {base_s / on_s:.1f}x, CPU {base_cpu / on_cpu:.1f}x (isolation on);"
        f" wall {base_s / off_s:.1f}x (off)"
    )
    print(
        f"  isolation cost: wall {100 * (1 - off_s / on_s):.1f} %, CPU {100 * (on_cpu / off_cpu - 1):.1f} %"
    )
    on_ms = 1000 * on_cpu / n_programs
    print(
        f"  CPU per program, isolation on: {on_ms:.2f} ms = {on_ms / floor_ms:.2f} x the fork+exit+wait floor"
        f" ({floor_ms:.2f} ms)"
    )
    print(
        "  by process (isolation on, CPU ms/program): "
        + ", ".join(f"{k} {1000 * split[k]:.3f}" for k in ("parent", "worker", "zygote", "children"))
        + f"; minor faults/program: zygote {split['zygote faults']:.0f}, child {split['children faults']:.0f}"
    )
    return on_ms / floor_ms


def check_target(ratio: float, target: float, bare: float = 0.0) -> int:
    """Print the trivial program's CPU as a multiple of the floor against ``target``; 1 when missed. ``bare``:
    the bare pipeline's multiple of the floor in the same run (0: not measured), which the line names when
    ``target`` is below it (no design with a fresh fork per program can then meet it)."""
    if target <= 0:
        return 0
    met = ratio <= target
    print(
        f"target: trivial program's CPU <= {target:g} x the fork floor: {ratio:.2f} x,"
        f" {'met' if met else 'MISSED'}"
        + (f" (the bare pipeline alone is {bare:.2f} x)" if not met and bare > target else "")
    )
    return 0 if met else 1


MEASURE = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from sandbox import ExecLimits, ProcessExecutor
from sandbox.workloads import evalplus_workloads
trivial = [(f"def f(x):\\n    return x + {i}\\n", ["f(1)"]) for i in range(int(sys.argv[3]))]
data = Path(sys.argv[4])
suites = {"trivial": trivial}
if (data / "humanevalplus").is_dir():
    suites["humaneval+"] = [(w.program, w.calls) for w in evalplus_workloads(data, "humanevalplus", ("base_input",))]
def tree_cpu(pid):
    # CPU seconds of pid, its reaped children and (recursively) its live descendants
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK") + sum(tree_cpu(int(k)) for k in kids)
import os
out = {"sandbox": sys.modules["sandbox"].__file__}
limits = ExecLimits(call_timeout_s=5.0, program_timeout_s=60.0, isolate_calls=True)  # (both sides: the project's mode)
with ProcessExecutor(workers=int(sys.argv[2]), limits=limits) as ex:
    pids = [w.proc.pid for w in ex._workers]
    for name, jobs in suites.items():
        ex.run_many(jobs[:8])  # warm-up
        cpu0, t0 = sum(map(tree_cpu, pids)) + time.process_time(), time.perf_counter()
        results = ex.run_many(jobs)
        out[name] = len(jobs) / (time.perf_counter() - t0)
        out[name + " cpu_ms"] = 1000 * (sum(map(tree_cpu, pids)) + time.process_time() - cpu0) / len(jobs)
        out[name + " ok"] = sum(o.status == "ok" for r in results for o in r)
print(json.dumps(out))
"""


def compare_ref(ref: str, rounds: int, workers: int, trivial: int, data_dir: Path) -> float:
    """Programs/s of this checkout vs revision ``ref``, interleaved ABBA in one run; prints the ratios and
    returns this checkout's CPU per trivial program as a multiple of the floor."""
    here = Path(__file__).resolve().parent.parent
    floors = [fork_floor_ms()]
    with tempfile.TemporaryDirectory(prefix="codea1-bench-ref-") as tmp:
        archive = subprocess.run(["git", "-C", str(here), "archive", ref], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        trees = {"ref": tmp, "this": str(here)}
        runs: dict[str, list[dict]] = {"ref": [], "this": []}
        for r in range(rounds):
            for side in ("ref", "this") if r % 2 == 0 else ("this", "ref"):
                proc = subprocess.run(
                    [sys.executable, "-c", MEASURE, trees[side], str(workers), str(trivial), str(data_dir)],
                    capture_output=True,
                    text=True,
                    cwd=trees[side],
                    check=False,
                )
                if proc.returncode != 0:
                    raise SystemExit(f"bench run of {side} failed: {proc.stderr.strip()[-2000:]}")
                runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                shown = {k: v for k, v in runs[side][-1].items() if k != "sandbox" and not k.endswith(" ok")}
                print(f"  round {r + 1} {side:4s}: " + ", ".join(f"{k} {v:.2f}" for k, v in shown.items()))
    floors.append(fork_floor_ms())
    floor_ms = statistics.mean(floors)
    print(
        f"\n== this checkout vs {ref} (full isolation, {workers} workers, median of {rounds} interleaved rounds)"
    )
    print(
        f"  fork+exit+wait floor (bare python3, before/after the rounds): {floors[0]:.3f} / {floors[1]:.3f}"
        f" ms CPU per fork"
    )
    for suite in [k for k in runs["this"][0] if k != "sandbox" and " " not in k]:
        ref_ps = statistics.median(x[suite] for x in runs["ref"])
        this_ps = statistics.median(x[suite] for x in runs["this"])
        ref_ms = statistics.median(x[suite + " cpu_ms"] for x in runs["ref"])
        this_ms = statistics.median(x[suite + " cpu_ms"] for x in runs["this"])
        oks = {side: runs[side][0][suite + " ok"] for side in runs}
        print(
            f"  {suite:11s} wall: ref {ref_ps:7.1f}, this {this_ps:7.1f} programs/s, ratio {this_ps / ref_ps:.3f};"
            f" CPU: ref {ref_ms:.2f}, this {this_ms:.2f} ms/program, throughput ratio {ref_ms / this_ms:.3f}"
            f"  (ok calls: ref {oks['ref']}, this {oks['this']})"
        )
        print(
            f"  {'':11s} CPU ms/program vs the floor ({floor_ms:.2f} ms): ref {ref_ms / floor_ms:.2f} x,"
            f" this {this_ms / floor_ms:.2f} x"
        )
    return statistics.median(x["trivial cpu_ms"] for x in runs["this"]) / floor_ms


def time_backend(ex, jobs: list[tuple[str, list[str]]]) -> tuple[float, collections.Counter]:
    """Wall seconds of one ``run_many`` of all jobs on a warm executor, and the statuses."""
    t0 = time.perf_counter()
    results = ex.run_many(jobs)
    return time.perf_counter() - t0, collections.Counter(o.status for r in results for o in r)


def report_ray(workloads: dict[str, list[tuple[str, list[str]]]], workers: int, rounds: int) -> None:
    """Process pool vs the Ray backend (one node, one actor of ``workers`` workers), same jobs, one run."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # a local runtime on 127.0.0.1 only
    from sandbox.ray_executor import RayExecutor

    limits = ExecLimits(call_timeout_s=5.0, program_timeout_s=60.0)
    with (
        ProcessExecutor(workers=workers, limits=limits) as pex,
        RayExecutor(actors_per_node=1, workers_per_actor=workers, limits=limits) as rex,
    ):
        print(
            f"\n== Ray backend vs process pool: {workers} workers each; Ray: {rex.isolation['nodes']} node(s)"
        )
        print(f"  {'workload':44s} {'process programs/s':>18s} {'ray programs/s':>15s} {'ray overhead':>13s}")
        for name, jobs in workloads.items():
            for ex in (pex, rex):
                ex.run_many(jobs[: 4 * workers])  # warm-up
            best = {"process": float("inf"), "ray": float("inf")}
            statuses = {}
            for _ in range(rounds):
                for label, ex in (("process", pex), ("ray", rex)):
                    secs, statuses[label] = time_backend(ex, jobs)
                    best[label] = min(best[label], secs)
            assert statuses["process"] == statuses["ray"], statuses  # the same outcomes on both
            n = len(jobs)
            print(
                f"  {name:44s} {n / best['process']:18.1f} {n / best['ray']:15.1f}"
                f" {100 * (best['ray'] / best['process'] - 1):12.1f} %"
            )
        print(f"  (best of {rounds} alternating rounds; statuses identical on both backends)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trivial", type=int, default=1000, help="number of trivial programs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline-sample", type=int, default=200, help="programs timed for the baseline")
    parser.add_argument("--data-dir", default=os.environ.get("CODEA1_DATA_DIR", ""))
    parser.add_argument("--compare-ref", default="", help="git revision to compare this executor against")
    parser.add_argument("--ray", action="store_true", help="process pool vs the Ray backend instead")
    parser.add_argument(
        "--deny-compare", action="store_true", help="CPU/program with the syscall filter vs without instead"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="--compare-ref, --deny-compare: interleaved rounds; --ray: alternating rounds",
    )
    parser.add_argument(
        "--target-ratio",
        type=float,
        default=2.0,
        help="default and --compare-ref: exit 1 when a trivial program's CPU exceeds this multiple of the"
        " fork floor (0: no check)",
    )
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} (shared machine: numbers vary)")
    data_dir = (
        Path(args.data_dir) if args.data_dir else Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    if args.compare_ref:
        ratio = compare_ref(args.compare_ref, args.rounds, args.workers, args.trivial, data_dir)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
        sys.exit(check_target(ratio, args.target_ratio))
    trivial = [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(args.trivial)]
    if args.deny_compare:
        suites = {"trivial programs (one call)": trivial}
        if (data_dir / "humanevalplus").is_dir():
            suites["HumanEval+ canonical solutions, base inputs"] = [
                (w.program, w.calls) for w in evalplus_workloads(data_dir, "humanevalplus", ("base_input",))
            ]
        deny_compare(args.rounds, args.workers, suites)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
        return
    if args.ray:
        main_ray(args, trivial)
        return
    floor_ms, bare_ms, lean_ms = fork_floor_ms(), bare_pipeline_ms(), bare_pipeline_ms(preload=False)
    print(f"fork+exit+wait floor (bare python3, this run): {floor_ms:.3f} ms CPU per fork")
    print(
        "bare pipeline (a fork of a zygote's interpreter per trivial program, its result through a pipe; no"
        f" isolation, no supervisor): {bare_ms:.3f} ms CPU per program = {bare_ms / floor_ms:.2f} x the floor;"
        f" without the modules preloaded for programs {lean_ms:.3f} ms = {lean_ms / floor_ms:.2f} x"
    )
    ratio = report("trivial programs (one call)", trivial, args.workers, args.baseline_sample, floor_ms)
    print(f"  the sandbox's trivial program = {ratio * floor_ms / bare_ms:.2f} x the bare pipeline")
    if (data_dir / "humanevalplus").is_dir():
        he = [(w.program, w.calls) for w in evalplus_workloads(data_dir, "humanevalplus", ("base_input",))]
        report("HumanEval+ canonical solutions, base inputs", he, args.workers, len(he), floor_ms)
    else:
        print(f"\n(HumanEval+ skipped: no data under {data_dir}; set --data-dir or CODEA1_DATA_DIR)")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    sys.exit(check_target(ratio, args.target_ratio, bare_ms / floor_ms))


def main_ray(args: argparse.Namespace, trivial: list[tuple[str, list[str]]]) -> None:
    """``--ray``: the two workloads on both backends (HumanEval+ only when its data is there)."""
    workloads = {"trivial programs (one call)": trivial}
    data_dir = (
        Path(args.data_dir) if args.data_dir else Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    if (data_dir / "humanevalplus").is_dir():
        he = [(w.program, w.calls) for w in evalplus_workloads(data_dir, "humanevalplus", ("base_input",))]
        workloads["HumanEval+ canonical solutions, base inputs"] = he
    else:
        print(f"(HumanEval+ skipped: no data under {data_dir}; set --data-dir or CODEA1_DATA_DIR)")
    report_ray(workloads, args.workers, args.rounds)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
