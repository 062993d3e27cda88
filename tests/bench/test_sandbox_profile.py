"""``bench/sandbox_profile.py``: the sorting of perf samples by process and kind (always run), and one real profile
under ``perf`` (skipped where perf is missing); the loaded floor and the bare pipeline of ``bench/sandbox_bench.py``
that both report beside the floor."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import sandbox_bench as sb  # noqa: E402
import sandbox_profile as sp  # noqa: E402

# perf script --show-task-events -F comm,pid,ip,sym, shaped as perf prints it: parent 100, worker 200, zygote 300
SCRIPT = """\
          python   300 PERF_RECORD_FORK(400:400):(300:300)
          python   400 PERF_RECORD_FORK(500:500):(400:400)
          python   999 PERF_RECORD_FORK(998:998):(999:999)

          python   300
\tffffffff8123 copy_page_range
\tffffffff8124 copy_process
\tffffffff8125 kernel_clone
\t7f00 _Fork

          python   400
\tffffffff8200 unmap_page_range
\tffffffff8201 exit_mmap
\tffffffff8202 do_exit

          python   500
\tffffffff8300 clear_page
\tffffffff8301 exc_page_fault
\t1af8bb _PyObject_Malloc

          python   200
\tffffffff8400 pipe_read
\tffffffff8401 __x64_sys_read
\tffffffff8402 do_syscall_64

          python   100
\t1af8bb _PyEval_EvalFrameDefault

          python   998
\t1af8bb _PyEval_EvalFrameDefault

         swapper     0
\tffffffff8500 pv_native_safe_halt

          python   400 PERF_RECORD_EXIT(400:400):(300:300)
"""


def test_samples_sorted_by_process_and_kind() -> None:
    counts = sp.classify(SCRIPT, parent=100, worker=200, zygote=300)
    assert counts == {
        ("zygote", "fork"): 1,
        ("children", "exit"): 1,
        ("children", "fault"): 1,  # a grandchild (an isolated call's process) counts as the children's
        ("worker", "sys:read"): 1,
        ("parent", "user"): 1,
    }  # pid 998 (forked by another process) and idle are not the pool's


def test_kind_of_a_kernel_sample_without_a_system_call() -> None:
    assert sp.kind_of(["ffffffff8100 handle_softirqs", "ffffffff8101 irq_exit_rcu"]) == "kernel:other"
    assert sp.kind_of(["7f00 _PyEval_EvalFrameDefault"]) == "user"


def test_table_in_ms_per_program_and_multiples_of_the_floor() -> None:
    counts = {("zygote", "fork"): 300, ("children", "exit"): 200, ("parent", "user"): 500}
    # 1,000 samples at 1,000 Hz over 100 programs: 10 ms per program, of which fork + exit 5 ms
    lines = sp.table(counts, freq=1000, programs=100, floor_ms=2.5)
    assert "  all: 10.000 ms per program = 4.00 x the floor (2.500 ms)" in lines
    assert "  fork + exit + faults: 5.000 ms per program (50%) = 2.00 x the floor" in lines
    zygote = lines.index(next(line for line in lines if line.strip().startswith("zygote")))
    assert lines[zygote + 1].split() == ["fork", "3.000", "30.0%"]


@pytest.mark.e2e
@pytest.mark.skipif(
    shutil.which("perf") is None or not sys.platform.startswith("linux"), reason="needs Linux perf"
)
def test_a_real_profile_finds_the_forks_and_exits(capsys: pytest.CaptureFixture[str]) -> None:
    code = sp.main(["--programs", "200", "--freq", "2999"])
    out = capsys.readouterr()
    if code == 2 and "perf record failed" in out.err:
        pytest.skip(f"perf cannot sample system-wide here: {out.err.strip()[-200:]}")
    assert code == 0, out.err
    assert "statuses ok;" in out.out
    body = out.out.split("process")[1]
    assert " fork " in body and " exit " in body  # the zygote's forks and the children's exits were seen
    assert "fork + exit + faults:" in out.out and "x the floor" in out.out
    assert "loaded floor (fork+exit+wait of an interpreter holding the sandbox" in out.out


def test_the_loaded_floor_holds_the_sandbox_and_the_preloads() -> None:
    """The loaded floor's interpreter really imports what a zygote holds (a loop that forked a bare interpreter
    would measure the plain floor twice)."""
    probe = "print(sorted(m for m in ('sandbox.zygote', 'statistics') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-S", "-c", sb.LOAD + probe], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "['sandbox.zygote', 'statistics']", out.stdout
    assert sp.loaded_floor_ms(50) > 0


def test_the_bare_pipeline_checks_each_childs_result() -> None:
    """Each program's child really runs it: a result that is not the program's stops the bench (a pipeline
    whose children did nothing would measure the loaded floor)."""
    wrong = sb.BARE_PIPELINE.replace("repr(eval(", "repr(1 + eval(", 1)
    out = subprocess.run(
        [sys.executable, "-S", "-c", sb.LOAD + wrong, "5", "-"], capture_output=True, text=True
    )
    assert out.returncode == 1 and "bare pipeline: program 0 returned" in out.stderr, out.stderr
    assert sb.bare_pipeline_ms(50) > 0 and sb.bare_pipeline_ms(50, pin=False, preload=False) > 0


def test_a_missed_target_names_the_bare_pipeline_when_it_is_above(capsys: pytest.CaptureFixture[str]) -> None:
    assert sb.check_target(3.4, 2.0, bare=2.3) == 1
    assert "3.40 x, MISSED (the bare pipeline alone is 2.30 x)" in capsys.readouterr().out
    assert sb.check_target(3.4, 2.0, bare=1.5) == 1
    assert capsys.readouterr().out.rstrip().endswith("3.40 x, MISSED")
    assert sb.check_target(1.9, 2.0, bare=2.3) == 0
    assert capsys.readouterr().out.rstrip().endswith("1.90 x, met")
