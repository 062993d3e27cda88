"""Behaviour of the sandbox executors: statuses, limits, ordering, retries, configuration, Docker (fake)."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import pytest

from codea1_core.config import Config
from sandbox import (
    CallOutcome,
    DockerExecutor,
    ExecLimits,
    ProcessExecutor,
    SandboxUnavailable,
    make_executor,
    namespaces,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox needs Linux"
)

LIMITS = ExecLimits(call_timeout_s=1.0, program_timeout_s=8.0, memory_mb=512, max_output_bytes=1000)
PROGRAM = (
    "import math\n\ndef f(x):\n    return x * 2\n\n"
    "state = []\n\ndef push(v):\n    state.append(v)\n    return len(state)\n"
)


@pytest.fixture(scope="module")
def ex():
    with ProcessExecutor(workers=2, limits=LIMITS) as executor:
        yield executor


def statuses(outcomes: list[CallOutcome]) -> list[str]:
    return [o.status for o in outcomes]


def test_values_come_back_decoded_in_order(ex):
    out = ex.run(PROGRAM, ["f(1)", "f([2, 3])", "f('ab')", "math.sqrt(2)", "{1: (2, b'x')}", "None"])
    assert statuses(out) == ["ok"] * 6
    assert [o.value for o in out] == [2, [2, 3, 2, 3], "abab", pytest.approx(2**0.5), {1: (2, b"x")}, None]
    assert all(0 <= o.duration_s < LIMITS.call_timeout_s for o in out)


def test_predicted_answers_are_plain_expressions(ex):
    out = ex.run("", ["[1, 2]", "sorted([3, 1])", "float('nan')", "{1, 2}", "frozenset()", "10**100"])
    assert statuses(out) == ["ok"] * 6
    assert out[0].value == [1, 2] and out[1].value == [1, 3] and out[2].value != out[2].value
    assert out[3].value == {1, 2} and out[4].value == frozenset() and out[5].value == 10**100


def test_namespace_persists_across_calls(ex):
    assert [o.value for o in ex.run(PROGRAM, ["push(1)", "push(2)", "len(state)"])] == [1, 2, 2]


def test_the_defaults_are_the_strictest_mode_the_project_uses():
    """``ExecLimits()`` and ``ProcessExecutor()`` with no arguments isolate each call that brings code of its
    own, as every executor the project builds: built directly (a bench, a script), they ran all calls in
    one namespace, where one test's call rebinds the function every later call sees."""
    assert ExecLimits().isolate_calls and not ExecLimits(isolate_calls=False).isolate_calls
    with ProcessExecutor(workers=1) as plain:
        assert plain.limits == ExecLimits()
        out = plain.run(PROGRAM, ["globals().update(f=lambda x: 0)", "f(4)"])
        assert [(o.status, o.value) for o in out] == [("ok", None), ("ok", 8)], out
        assert plain._settings["deny"] == "on" and plain._settings["mode"] == "auto"


def test_errors_carry_type_and_message(ex):
    out = ex.run(PROGRAM, ["1/0", "undefined_name", "f(", "f()", "[][1]"])
    assert statuses(out) == ["error"] * 5
    assert out[0].error == "ZeroDivisionError: division by zero"
    assert out[1].error.startswith("NameError:")
    assert out[2].error.startswith("SyntaxError:")
    assert out[3].error.startswith("TypeError:")
    assert out[4].error.startswith("IndexError:")


def test_unsupported_outputs(ex):
    program = "class MyInt(int):\n    def __eq__(self, other):\n        return True\n"
    out = ex.run(
        program, ["object()", "lambda: 1", "MyInt(3)", "[1, object()]", "range(3)", "iter([])", "MyInt"]
    )
    assert statuses(out) == ["unsupported_output"] * 7
    assert "MyInt" in out[2].error


@pytest.mark.parametrize(
    ("program", "needle"),
    [
        ("def f(:\n    pass\n", "SyntaxError"),
        ("import no_such_module_xyz\n", "ModuleNotFoundError"),
        ("raise ValueError('boom')\n", "ValueError: boom"),
        ("while True:\n    pass\n", "Timeout"),
        ("import sys\nsys.exit(0)\n", "SystemExit"),
        ("import os\nos._exit(0)\n", "exited during definition"),
    ],
)
def test_program_errors_fail_every_call(ex, program, needle):
    out = ex.run(program, ["1", "2"])
    assert statuses(out) == ["program_error", "program_error"]
    assert needle in out[0].error


def test_call_timeout_fails_only_that_call(ex):
    t0 = time.monotonic()
    out = ex.run("import time\n", ["1", "time.sleep(30)", "2", "3"])
    assert statuses(out) == ["ok", "timeout", "ok", "ok"]
    assert [out[0].value, out[2].value, out[3].value] == [1, 2, 3]
    assert time.monotonic() - t0 < 6


@pytest.mark.parametrize(
    "hang",
    [
        "sum(range(10**13))",  # C-level loop: SIGALRM cannot interrupt it, the worker kills the child
        "swallow()",  # catches the harness's time-out and keeps going
        "ignore_alarm()",  # replaces the SIGALRM handler
    ],
)
def test_hard_time_outs_restart_at_the_next_call(ex, hang):
    program = (
        "import signal, time\n"
        "def swallow():\n"
        "    while True:\n"
        "        try:\n"
        "            time.sleep(10)\n"
        "        except BaseException:\n"
        "            pass\n"
        "def ignore_alarm():\n"
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "    time.sleep(30)\n"
        "    return 'forged'\n"
        "counter = [0]\n"
        "def tick():\n"
        "    counter[0] += 1\n"
        "    return counter[0]\n"
    )
    out = ex.run(program, ["tick()", hang, "tick()"])
    assert statuses(out) == ["ok", "timeout", "ok"]
    assert out[2].value == 1  # a fresh child re-defined the program after the kill


def test_program_cap_turns_unrun_calls_into_timeouts():
    lim = ExecLimits(call_timeout_s=1.0, program_timeout_s=1.5)
    with ProcessExecutor(workers=1, limits=lim) as small:
        out = small.run("import time\n", ["time.sleep(0.6)"] * 6)
    got = statuses(out)
    assert set(got) <= {"ok", "timeout"} and got[-1] == "timeout" and got.count("ok") <= 3
    assert got == sorted(got)  # ok... then timeout...
    assert small.stats["timeouts"] == got.count("timeout")


def test_memory_limit(ex):
    out = ex.run("", ["bytearray(2 * 1024**3)", "len(bytearray(10**6))"])
    assert statuses(out) == ["memory", "ok"]
    assert out[1].value == 10**6


def test_output_is_captured_and_truncated(ex):
    ex.run("print('hello from the program')\n", ["1"])
    assert b"hello from the program" in ex.last_outputs[0]
    ex.run("import sys\nsys.stdout.write('x' * 100000)\nsys.stderr.buffer.write(b'\\xff' * 10)\n", ["1"])
    assert ex.last_outputs[0] == b"x" * LIMITS.max_output_bytes


def test_run_many_keeps_order_and_counts(ex):
    before = dict(ex.stats)
    jobs = [(f"def g():\n    return {i}\n", ["g()", "g() + 1"]) for i in range(30)] + [("", [])]
    results = ex.run_many(jobs)
    assert [[o.value for o in r] for r in results[:-1]] == [[i, i + 1] for i in range(30)]
    assert results[-1] == []
    assert ex.stats["programs"] - before["programs"] == 31
    assert ex.stats["calls"] - before["calls"] == 60
    assert ex.stats["seconds"] > before["seconds"]


def test_isolation_is_recorded(ex):
    assert set(ex.isolation) >= {"network", "filesystem", "uid", "rlimits"}
    if os.geteuid() == 0:
        assert ex.isolation["network"].startswith("netns")
        assert ex.isolation["uid"] == "dedicated per worker"
        assert "NPROC" in ex.isolation["rlimits"]


def test_hash_seed_is_fixed_across_workers(ex):
    """Regression: per-worker random hash seeds made list(set(strings)) differ between workers."""
    jobs = [("", ["list({'alpha', 'beta', 'gamma', 'delta', 'epsilon'})"])] * 6
    orders = {tuple(r[0].value) for r in ex.run_many(jobs)}
    assert len(orders) == 1


def test_programs_see_what_site_gives_without_its_pth_files(ex):
    """The worker starts without ``site`` (``python -S``: the ``.pth`` files of site-packages run no code
    and leave nothing in the interpreter every child is forked from), and gives programs what site would:
    the venv's prefix, its site-packages on ``sys.path``, the ``exit``/``quit``/``help`` builtins."""
    import site

    program = (
        "import sys\n"
        "def env():\n"
        "    return [sys.flags.no_site, type(exit).__name__, type(quit).__name__, callable(help),\n"
        "            sys.prefix, [p for p in sys.path if p.endswith('site-packages')]]\n"
    )
    out = ex.run(program, ["env()", "exit(3)"])
    assert out[0].status == "ok", out
    assert out[0].value == [1, "Quitter", "Quitter", True, sys.prefix, site.getsitepackages()]
    assert (out[1].status, out[1].error) == ("error", "SystemExit: 3"), out[1]


def test_isolation_off_runs_without_namespaces():
    with ProcessExecutor(workers=1, network_isolation="off", drop_privileges=False, hide_paths=[]) as plain:
        assert plain.isolation["network"] == "off"
        assert plain.run(PROGRAM, ["f(21)"])[0].value == 42


def test_require_fails_closed_without_privileges():
    """Regression guard: 'require' must raise, not silently run without namespaces."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        code = 3
        try:
            os.setresuid(65534, 65534, 65534)  # lose every capability
            try:
                namespaces.setup_worker_isolation("require", [], [], 16)
                code = 1
            except OSError:
                info = namespaces.setup_worker_isolation("auto", [], [], 16)
                code = 0 if info["network"].startswith("unavailable") else 2
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    result = os.read(r, 1)
    os.waitpid(pid, 0)
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another uid")
    assert result == b"\x00"


def test_worker_death_is_retried_then_reported():
    lim = ExecLimits(call_timeout_s=3.0, program_timeout_s=6.0)
    for retries, expected in ((1, "ok"), (0, "infra_error")):
        with ProcessExecutor(workers=1, limits=lim, infra_retries=retries) as one:
            victim = one._workers[0].proc.pid
            threading.Timer(0.7, lambda pid=victim: os.kill(pid, signal.SIGKILL)).start()
            out = one.run("import time\n", ["time.sleep(1.5) or 7"])
            assert out[0].status == expected, out
            if expected == "ok":
                assert out[0].value == 7 and one.stats["retries"] == 1
            else:
                assert out[0].error.startswith("InfraError: worker") and one.stats["infra_errors"] == 1
            assert one.run(PROGRAM, ["f(2)"])[0].value == 4  # the pool healed


def test_a_worker_reporting_infra_is_replaced_and_its_job_retried():
    """A worker whose machinery failed (here: its zygote was killed) answers infra; it must not stay in
    the pool answering infra_error: it is replaced and the job runs again on the new worker."""
    with ProcessExecutor(workers=1, limits=LIMITS, infra_retries=1) as one:
        worker = one._workers[0].proc.pid
        with open(f"/proc/{worker}/task/{worker}/children") as fh:
            zygotes = [int(pid) for pid in fh.read().split()]
        assert len(zygotes) == 1, "each worker forks its children from one zygote"
        os.kill(zygotes[0], signal.SIGKILL)
        time.sleep(0.1)
        out = one.run(PROGRAM, ["f(21)"])
        assert (out[0].status, out[0].value) == ("ok", 42), out
        assert one.stats["retries"] == 1 and one._workers[0].proc.pid != worker
        assert one.run(PROGRAM, ["f(2)"])[0].value == 4


def test_deep_tree_is_removed_without_namespaces():
    """Without namespaces the program's temp dir is removed by a walk. Bug guarded: a recursive removal
    raised RecursionError on a 1500-deep tree (infra_error for that job, and the worker kept failing)."""
    program = (
        "import os\ndef deep(n):\n    for _ in range(n):\n"
        "        os.mkdir('d')\n        os.chdir('d')\n    return os.getcwd()[:30]\n"
    )
    with ProcessExecutor(workers=1, network_isolation="off", drop_privileges=False, hide_paths=[]) as plain:
        out = plain.run(program, ["deep(1500)"])
        assert out[0].status == "ok", out
        tmp = out[0].value.split("/d/")[0]
        assert not os.path.exists(tmp), f"{tmp} was left behind"
        assert plain.run(PROGRAM, ["f(21)"])[0].value == 42 and plain.stats["infra_errors"] == 0


def test_isolation_records_the_hardening(ex):
    if os.geteuid() != 0:
        pytest.skip("namespaces and cgroups need root")
    assert ex.isolation["ipc"].startswith("ipcns per worker")
    assert "read-only" in ex.isolation["filesystem"]
    assert "/run/lock" in ex.isolation["filesystem"] or not os.path.isdir("/run/lock")
    assert ex.isolation["cgroup"].startswith(("v2 ", "v1 ", "unavailable ("))
    assert "zygote" in ex.isolation["children"]


DECODE_CORPUS = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    -(2**100),
    1.5,
    float("inf"),
    -0.0,
    1 + 2j,
    "",
    "h\u00e9",
    "\udcff",
    b"",
    b"\x00\xff",
    [],
    (),
    {},
    set(),
    frozenset(),
    [1, [2, (3, "x")]],
    {1: {2: [3]}, "k": None},
    {1, 2.5, "a", (1, 2), frozenset({3})},
    frozenset({(1, 2), "b"}),
    {(1, 2): {3, 4}, 1.0: "one"},
    list(range(1000)),
    {i: str(i) for i in range(500)},
    {-1, -2},
]


@pytest.mark.parametrize("value", DECODE_CORPUS, ids=range(len(DECODE_CORPUS)))
def test_parent_decoder_matches_values_decode(value):
    from codea1_core import values
    from sandbox.decoding import DecodeBudget, decode_result

    data = values.encode(value)
    got = decode_result(data, DecodeBudget(1 << 20))
    want = values.decode(data)
    assert type(got) is type(want) and repr(got) == repr(want)


def test_parent_decoder_rejects_malformed_bytes_like_values_decode():
    from codea1_core import values
    from sandbox.decoding import DecodeBudget, ResultRejected, decode_result

    for bad in (
        b"",
        b"x",
        b"s\x00\x00\x00\x09ab",
        values.encode([1]) + b"N",
        b"S\x00\x00\x00\x01l\x00\x00\x00\x00",
    ):
        with pytest.raises(ValueError) as info:
            decode_result(bad, DecodeBudget(1 << 20))
        assert not isinstance(info.value, ResultRejected)
        with pytest.raises(ValueError):
            values.decode(bad)


def test_parent_decoder_bounds_collisions_and_memory():
    from codea1_core import values
    from sandbox.decoding import MAX_SAME_HASH, DecodeBudget, ResultRejected, decode_result

    p = 2**61 - 1
    colliding = {i * p for i in range(1, 5001)}  # one hash for all: quadratic to build in a set
    encoded = [values.encode([colliding] * 50), values.encode([dict.fromkeys(colliding, 0)] * 50)]
    t0 = time.perf_counter()
    for data in encoded:
        with pytest.raises(ResultRejected, match="hash-colliding"):
            decode_result(data, DecodeBudget(64 << 20))
    assert time.perf_counter() - t0 < 1.0  # rejected at the first set: no quadratic work at all
    few = {i * p for i in range(1, MAX_SAME_HASH + 1)}
    assert decode_result(values.encode(few), DecodeBudget(1 << 20)) == few
    empties = values.encode([set()] * 100_000)  # 0.5 MB of encoding, ~20 MB of objects
    with pytest.raises(ResultRejected, match="too large"):
        decode_result(empties, DecodeBudget(len(empties)))
    budget = DecodeBudget(1 << 20)  # one budget shared by the calls of a program
    decode_result(values.encode("x" * 3_000_000), budget)
    with pytest.raises(ResultRejected):
        decode_result(values.encode("x" * 3_000_000), budget)


def test_make_executor_maps_the_config():
    cfg = Config().replace(
        **{"sandbox.workers": 1, "sandbox.program_cap_s": 7.5, "sandbox.call_timeout_s": 1.5}
    )
    with make_executor(cfg.sandbox) as built:
        assert isinstance(built, ProcessExecutor)
        assert built.limits.program_timeout_s == 7.5 and built.limits.call_timeout_s == 1.5
        assert built.limits.memory_mb == cfg.sandbox.memory_mb
        assert built.run(PROGRAM, ["f(5)"])[0].value == 10


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="network_isolation"):
        ProcessExecutor(network_isolation="sometimes")
    with pytest.raises(ValueError, match="call_timeout_s"):
        ExecLimits(call_timeout_s=0)


# --------------------------------------------------------------------------------------------------
# Docker backend
# --------------------------------------------------------------------------------------------------


def test_docker_without_engine_names_the_process_backend():
    pytest.importorskip("docker")
    import docker

    try:
        docker.from_env().ping()
        pytest.skip("a Docker engine is reachable here")
    except docker.errors.DockerException:
        pass
    with pytest.raises(SandboxUnavailable, match="backend=process"):
        DockerExecutor()


class _FakeContainer:
    """Runs the shipped one-shot worker locally on the files the executor copied in."""

    def __init__(self, kwargs: dict) -> None:
        self.kwargs = kwargs
        self.root = Path(tempfile.mkdtemp(prefix="fake-container-"))
        self.removed = False

    def put_archive(self, path: str, data: bytes) -> None:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(self.root / path.lstrip("/"), filter="data")

    def start(self) -> None:
        cmd = list(self.kwargs["command"])
        cmd[0] = sys.executable
        cmd[-1] = str(self.root / cmd[-1].lstrip("/"))
        env = {"PATH": os.environ["PATH"], **self.kwargs.get("environment", {})}
        subprocess.run(cmd, check=True, timeout=60, env=env)

    def wait(self, timeout: float) -> dict:
        return {"StatusCode": 0}

    def get_archive(self, path: str):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(self.root / path.lstrip("/"), arcname=os.path.basename(path))
        return iter([buf.getvalue()]), {}

    def remove(self, force: bool = False) -> None:
        self.removed = True
        shutil.rmtree(self.root, ignore_errors=True)


class _FakeClient:
    def __init__(self) -> None:
        self.created: list[_FakeContainer] = []
        self.containers = self

    def create(self, image: str, **kwargs) -> _FakeContainer:
        container = _FakeContainer({"image": image, **kwargs})
        self.created.append(container)
        return container


def test_docker_executor_with_a_fake_engine():
    client = _FakeClient()
    lim = ExecLimits(call_timeout_s=1.0, program_timeout_s=5.0, memory_mb=256)
    dex = DockerExecutor(workers=1, limits=lim, client=client, image="python:3.11-slim", infra_retries=0)
    out = dex.run(PROGRAM, ["f(4)", "1/0", "object()"])
    assert statuses(out) == ["ok", "error", "unsupported_output"] and out[0].value == 8
    (container,) = client.created
    kw = container.kwargs
    assert kw["image"] == "python:3.11-slim" and kw["network_disabled"] is True
    assert kw["mem_limit"] == kw["memswap_limit"] and kw["pids_limit"] > 0
    assert "no-new-privileges" in kw["security_opt"] and container.removed
    assert dex.stats["programs"] == 1 and dex.stats["calls"] == 3


def test_docker_engine_failure_is_infra_error():
    class Broken(_FakeClient):
        def create(self, image, **kwargs):
            raise RuntimeError("engine went away")

    dex = DockerExecutor(workers=1, client=Broken(), infra_retries=1)
    out = dex.run(PROGRAM, ["f(1)", "f(2)"])
    assert statuses(out) == ["infra_error", "infra_error"] and "engine went away" in out[0].error
    assert dex.stats["retries"] == 1


def test_stdlib_imports_work_with_home_pointed_elsewhere(tmp_path, monkeypatch) -> None:
    """CI runs `make run` with a fresh HOME; the interpreter may live in the account's real home (pyenv under a
    0700 /root). Children must still import any stdlib module (none of these is preloaded by the zygote)."""
    import pwd

    from codea1_core.config import Config
    from sandbox import make_executor
    from sandbox.mounts import default_hide_paths

    monkeypatch.setenv("HOME", str(tmp_path))
    assert pwd.getpwuid(os.getuid()).pw_dir in default_hide_paths() or os.path.samefile(
        pwd.getpwuid(os.getuid()).pw_dir, tmp_path
    )
    program = (
        "import threading, subprocess, fractions\ndef f():\n    return fractions.Fraction(1, 3).denominator\n"
    )
    with make_executor(Config().sandbox) as ex:
        [out] = ex.run(program, ["f()"])
    assert (out.status, out.value) == ("ok", 3), out
