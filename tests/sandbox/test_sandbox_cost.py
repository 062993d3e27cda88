"""Per-program cost of the process sandbox (faults, wake-ups), and the child state cheaper set-up keeps.

A forked child pays a copy-on-write page fault for every page it writes (every Python object it
touches: its reference count is written), and on this kind of VM a minor fault costs several
microseconds: faults are most of a trivial program's CPU. Unlike CPU time they do not grow when other
processes share the cores, so the cost test counts them. The guards check that what the zygote now
prepares once for every child (``sandbox/zygote.py``: ``_prepare_zygote``, ``_prepare_child``) is still
what each child runs with.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import pytest
from support import bare_zygote, fd_targets

from sandbox import ExecLimits, ProcessExecutor

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox needs Linux"
)

# The shared namespace, opt-in: the child holds one descriptor above 2, its channel (fds() below).
LIMITS = ExecLimits(call_timeout_s=2.0, program_timeout_s=10.0, isolate_calls=False)
ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def ex():
    with ProcessExecutor(workers=2, limits=LIMITS) as executor:
        yield executor


def _minor_faults(pid: int) -> int:
    """Minor page faults of ``pid``, of its reaped children and (recursively) of its live descendants."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(fields[7]) + int(fields[8]) + sum(_minor_faults(int(k)) for k in kids)


def test_a_trivial_program_costs_few_page_faults():
    """Minor faults per trivial program (worker, zygote and child). Bugs guarded: each child walked
    ``sys.modules``, built its text streams, signal dispositions and environment, ran ``random``'s and
    ``threading``'s at-fork handlers and two full ctypes calls; each child called ``signal.signal``'s
    Python wrapper (an enum conversion that failed into a formatted ValueError), read its job with 1 MiB
    buffers (mmap, mremap, munmap), dropped the trusted modules itself and looked its set-up up through
    module globals, and the zygote's loop went through helpers and ``os.environ``'s encoders."""
    jobs = [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(120)]
    with ProcessExecutor(workers=1, limits=LIMITS) as one:
        one.run_many(jobs[:20])  # warm-up: the first programs fault in what every later one shares
        worker = one._workers[0].proc.pid
        before = _minor_faults(worker)
        results = one.run_many(jobs[20:])
        per_program = (_minor_faults(worker) - before) / 100
    assert all(r[0].status == "ok" and r[0].value == i + 21 for i, r in enumerate(results))
    assert per_program <= 400, f"{per_program:.0f} minor page faults per trivial program"


def test_a_trivial_programs_child_costs_few_page_faults():
    """The forked child alone (the zygote's reaped children): the bugs of the test above, and a harness
    that uses ``signal.signal`` or a child that joins its cgroup and process group itself, each fault
    pages in every child."""
    jobs = [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(120)]
    with ProcessExecutor(workers=1, limits=LIMITS) as one:
        one.run_many(jobs[:20])
        worker = one._workers[0].proc.pid
        zygote = int(Path(f"/proc/{worker}/task/{worker}/children").read_text().split()[0])

        def reaped_faults() -> int:
            return int(Path(f"/proc/{zygote}/stat").read_text().rsplit(")", 1)[1].split()[8])

        before = reaped_faults()
        results = one.run_many(jobs[20:])
        per_child = (reaped_faults() - before) / 100
    assert all(r[0].status == "ok" and r[0].value == i + 21 for i, r in enumerate(results))
    assert per_child <= 260, f"{per_child:.0f} minor page faults per child of a trivial program"


def _voluntary_switches(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


def _worker_waits_per_program(jobs: list, warm: int) -> tuple[list, float]:
    """Run ``jobs`` on one worker; its blocking waits per program after the first ``warm`` (start-up excluded)."""
    with ProcessExecutor(workers=1, limits=LIMITS) as one:
        one.run_many(jobs[:warm])
        worker = one._workers[0].proc.pid
        before = _voluntary_switches(worker)
        results = one.run_many(jobs[warm:])
        return results, (_voluntary_switches(worker) - before) / len(jobs[warm:])


def test_fast_calls_wake_the_worker_once_not_once_each():
    """Bug guarded: the worker woke up for every frame of the child (set-up done, defined, one per
    call); frames arriving together are read together (``_supervise``), since each wake-up is a context
    switch and a pass of its loop."""
    jobs = [(f"def f(x):\n    return x + {i}\n", ["f(1)"] * 10) for i in range(120)]
    results, per_program = _worker_waits_per_program(jobs, warm=20)
    assert all([o.value for o in r] == [i + 21] * 10 for i, r in enumerate(results))
    assert per_program <= 9, f"the worker blocked {per_program:.1f} times per program of 10 calls"


def test_slow_calls_still_wake_the_worker_once_each():
    """Guard: reading fast frames together must not cost programs with slow calls more wake-ups than
    one per frame (the bug: waiting a window after every frame, even when none follows)."""
    program = "import time\ndef f(x):\n    time.sleep(0.003)\n    return x\n"
    jobs = [(program, ["f(1)"] * 10)] * 30
    results, per_program = _worker_waits_per_program(jobs, warm=5)
    assert all([o.value for o in r] == [1] * 10 for r in results)
    assert per_program <= 19, f"the worker blocked {per_program:.1f} times per program of 10 slow calls"


def test_a_worker_gets_many_small_jobs_in_few_messages(monkeypatch):
    """Small jobs travel to a worker in batches, one message each (``ProcessExecutor._dispatch``), so the
    parent's writes and the worker's reads are paid per batch, not per program; each job still runs in
    its own child and comes back with its own result, in order."""
    sent: list[int] = []
    with ProcessExecutor(workers=1, limits=LIMITS) as one:
        worker = one._workers[0]
        real_send = worker.send

        def send(msg: tuple) -> None:
            sent.append(len(msg[1]) if msg[0] == "jobs" else 1)
            real_send(msg)

        monkeypatch.setattr(worker, "send", send)
        jobs = [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(64)]
        results = one.run_many(jobs)
        monkeypatch.undo()
    assert [[o.value for o in r] for r in results] == [[i + 1] for i in range(64)]
    assert len(sent) <= 16, f"{len(sent)} messages for 64 jobs: {sent}"


def test_the_parent_reads_results_without_a_buffer_per_read():
    """Bug guarded: every read of a worker's pipe allocated a 1 MiB bytes object for a result of a few
    hundred bytes (glibc mapped, remapped and unmapped it each time: a fifth of the parent's CPU per
    trivial program); reads land in one preallocated buffer per worker (``_Worker.feed``)."""
    import tracemalloc

    jobs = [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(40)]
    with ProcessExecutor(workers=1, limits=LIMITS) as one:
        one.run_many(jobs[:2])
        tracemalloc.start()
        try:
            results = one.run_many(jobs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert [[o.value for o in r] for r in results] == [[i + 1] for i in range(40)]
    assert peak < 256 * 1024, f"the parent's peak allocation was {peak} bytes for 40 trivial results"


def test_the_zygote_offers_a_child_in_one_message():
    """The worker takes each child with one receive: its temp dir, the worker's ends of its three pipes
    and its pidfd come in one message, after the fork; the child has closed the worker's ends before
    it waits for its job (a worker gone means EOF on the job pipe). A zygote without namespaces, forked
    from this process."""
    import select
    import socket
    import time

    zyg = bare_zygote()
    try:
        msg, fds, _flags, _addr = socket.recv_fds(zyg.sock, 4096, 8)
        assert msg[:1] == b"C" and len(fds) == 4, (msg, fds)
        job_w, chan_r, out_r, pidfd = fds
        pid = int(Path(f"/proc/self/fdinfo/{pidfd}").read_text().split("Pid:")[1].split()[0])
        # the child's own ends: the job pipe's read end, the channel's and the output's write ends
        own = {os.readlink(f"/proc/self/fd/{job_w}"): os.O_RDONLY}
        own.update({os.readlink(f"/proc/self/fd/{fd}"): os.O_WRONLY for fd in (chan_r, out_r)})
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "S":
            assert time.monotonic() < deadline, "the child never waited for its job"
            time.sleep(0.01)
        held = {target: fd for fd, target in fd_targets(pid).items() if target in own}
        assert len(held) == 3, held
        for target, fd in held.items():
            flags = int(Path(f"/proc/{pid}/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
            assert flags & os.O_ACCMODE == own[target], f"the child holds the worker's end of {target}"
        os.close(job_w)  # no job: the child reads EOF (no end of the job pipe is left open) and exits
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        assert poller.poll(10_000), "the child's exit was not seen on the pidfd"
        for fd in (pidfd, chan_r, out_r):
            os.close(fd)
        status = zyg.reap()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 71, status
    finally:
        zyg.close()


def test_children_carry_no_thread_or_subprocess_machinery(ex):
    """Regression: ``sandbox/__init__.py`` imported ``sandbox.executor`` and ``limits.py`` imported
    ``ctypes.util``, so every worker, hence every zygote and child, held ``subprocess`` and ``threading``;
    threading's at-fork handler alone cost ~0.6 ms of CPU per child."""
    out = ex.run("import sys\n", ["sorted({'threading', 'subprocess', 'tempfile'} & set(sys.modules))"])
    assert out[0].status == "ok" and out[0].value == [], out


def test_every_child_draws_its_own_random_numbers(ex):
    """Guard: ``random``'s at-fork reseed is replaced by the zygote reseeding before each fork; children
    (of one worker and of both) must still not share a generator state."""
    jobs = [("import random\n", ["random.random()", "random.getrandbits(64)"])] * 8
    draws = {tuple(o.value for o in r) for r in ex.run_many(jobs)}
    assert len(draws) == 8


def test_each_child_runs_with_the_set_up_it_had_itself(ex):
    """Guard: what the zygote does once is inherited unchanged by every child (no-new-privs, no core
    dumps, signal dispositions, scrubbed environment, unbuffered output) and the child's own steps still
    hold (its temp dir as cwd and HOME, only descriptors 0-2 and the hidden channel open)."""
    program = (
        "import os, resource, signal, sys\n"
        "def nnp():\n"
        "    return open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0]\n"
        "def sigs():\n"
        "    return [signal.getsignal(s) == want for s, want in ((signal.SIGINT, signal.SIG_DFL),"
        " (signal.SIGTERM, signal.SIG_DFL), (signal.SIGCHLD, signal.SIG_DFL),"
        " (signal.SIGPIPE, signal.SIG_IGN), (signal.SIGXFSZ, signal.SIG_IGN))]\n"
        "def fds():\n"
        "    open_fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))\n"
        "    return [f for f in open_fds if f <= 2], len([f for f in open_fds if f >= 1024])\n"
        "print('to the output pipe')\n"
    )
    calls = [
        "nnp()",
        "sigs()",
        "resource.getrlimit(resource.RLIMIT_CORE)",
        "sorted(os.environ)",
        "os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd()",
        "fds()",
        "os.getuid() != 0" if ROOT else "True",
    ]
    for outcomes, output in zip(ex.run_many([(program, calls)] * 3), ex.last_outputs, strict=True):
        assert [o.status for o in outcomes] == ["ok"] * len(calls), outcomes
        values = [o.value for o in outcomes]
        assert values[0] == "1" and values[1] == [True] * 5 and values[2] == (0, 0)
        assert values[3] == ["HOME", "LANG", "PATH", "TMPDIR"] and values[4] is True
        assert values[5] == ([0, 1, 2], 1) and values[6] is True
        assert output == b"to the output pipe\n"


def test_closing_leaves_no_temp_dir_without_namespaces():
    """Guard: the waiting child's temp dir is now made before its fork; closing the pool must remove it
    (before, the zygote's close handshake failed on its unread offer and it exited without clean-up)."""
    before = set(glob.glob("/tmp/codea1-run-*"))
    with ProcessExecutor(workers=2, network_isolation="off", drop_privileges=False, hide_paths=[]) as plain:
        assert plain.run("def f():\n    return 1\n", ["f()"])[0].value == 1
    assert set(glob.glob("/tmp/codea1-run-*")) - before == set()


def test_an_unused_private_tmpfs_costs_one_stat(tmp_path):
    """The zygote's clean-up after every program (``sandbox/mounts.py``, ``wipe_private_tmp``): a tmpfs
    whose root's change time is the one recorded after the last clean-up is neither replaced nor has its
    times rewritten (ten syscalls per program on the five private tmpfs). Its times are those the last
    clean-up set, since setting a time changes the change time; a used one is reset
    (``test_sandbox_reach.py``: a kept tmpfs carries no counter or time)."""
    from sandbox.mounts import wipe_private_tmp

    os.utime(tmp_path, ns=(7, 7))  # stand-in for times a clean-up set: any rewrite would change them
    stamps = {str(tmp_path): tmp_path.stat().st_ctime_ns}
    before = dict(stamps)
    assert wipe_private_tmp([str(tmp_path)], 1, stamps) == 0
    after = tmp_path.stat()
    assert (after.st_atime_ns, after.st_mtime_ns) == (7, 7)
    assert stamps == before and after.st_ctime_ns == before[str(tmp_path)]


def test_the_worker_watches_each_child_through_the_zygotes_pidfd():
    """The zygote's child is handed over as a pidfd that the worker polls for the child's exit, and the
    reap names no pid: the worker reads no ``/proc`` file and opens no pidfd of its own per program (five
    syscalls of the worker's ~28). A zygote without namespaces, forked from this process."""
    import select

    zyg = bare_zygote()
    try:
        pidfd, tmp, job_w, chan_r, out_r = zyg.take()
        os.close(job_w)  # no job: the child reads EOF and exits by itself
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        assert poller.poll(10_000), "the child's exit was not seen on the pidfd"
        for fd in (pidfd, chan_r, out_r):
            os.close(fd)
        status = zyg.reap()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 71, status
    finally:
        zyg.close()
    assert not os.path.exists(tmp)


def test_the_pages_every_child_writes_are_copied_at_fork():
    """The zygote pins the pages a trivial program's child and the zygote itself write
    (``sandbox/pinning.py``, ``sandbox/zygote.py``: ``_pin_child_pages``), so each fork copies them and
    neither process faults on them. Bug guarded: every child took ~250 copy-on-write faults and the
    zygote ~100 per trivial program, most of them on the same pages every time."""
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    if disabled.exists() and disabled.read_text().strip() != "0":
        pytest.skip("io_uring is disabled on this machine: nothing can be pinned")
    jobs = [(f"def f(x):\n    return x + {i}\n", ["f(1)"]) for i in range(120)]
    with ProcessExecutor(workers=1, limits=LIMITS) as one:
        one.run_many(jobs[:20])
        worker = one._workers[0].proc.pid
        zygote = int(Path(f"/proc/{worker}/task/{worker}/children").read_text().split()[0])
        rings = [fd for fd, target in fd_targets(zygote).items() if "io_uring" in target]
        assert len(rings) == 1, "the zygote holds no pinned pages"
        info = Path(f"/proc/{zygote}/fdinfo/{rings[0]}").read_text()
        assert "UserBufs:\t0" not in info, info[:400]

        def faults() -> tuple[int, int]:
            fields = Path(f"/proc/{zygote}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[7]), int(fields[8])

        before = faults()
        results = one.run_many(jobs[20:])
        zygote_faults, child_faults = ((a - b) / 100 for a, b in zip(faults(), before, strict=True))
    assert all(r[0].status == "ok" and r[0].value == i + 21 for i, r in enumerate(results))
    assert child_faults <= 150, f"{child_faults:.0f} minor page faults per child of a trivial program"
    assert zygote_faults <= 60, f"{zygote_faults:.0f} minor page faults of the zygote per trivial program"
