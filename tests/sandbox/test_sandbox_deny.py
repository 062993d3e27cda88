"""Deny by default: one hostile program per class of hole (each fails where its layer is missing).

1. a call rebinding the function under test (``globals()``, builtins) changed the expected value of
   every later call of the reference run; 2. kernel keyrings (the trusted parent's session keyring,
   keys left for the next program); 3. host daemons over pathname Unix sockets under /run, /var/run;
   4. the host's pty pool (/dev/ptmx); 5. channels between programs running at the same time (POSIX
   record locks on shared read-only files, inotify); 6. the cgroup's memory high-water mark left by the
   previous program; 7. the parent's decoder (real CPython sizes, a decode-time cap). Plus the syscall
   allow-list itself: the dangerous syscall families answer EPERM, and the worker lives.
"""

from __future__ import annotations

import ctypes
import os
import platform
import secrets
import socket
import sys
import time
import tracemalloc

import pytest

from codea1_core import values
from sandbox import ExecLimits, ProcessExecutor
from sandbox.decoding import DecodeBudget, decode_result

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the process sandbox needs Linux"
)

ROOT = os.geteuid() == 0
X86_64 = platform.machine() == "x86_64"
LIMITS = ExecLimits(call_timeout_s=2.0, program_timeout_s=10.0, memory_mb=512)
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (namespaces, uid drop, cgroups)")


def _pool(workers: int = 1, **limits) -> ProcessExecutor:
    limits = {"isolate_calls": True, **limits}  # (a limit this code does not know is left out)
    limits = {k: v for k, v in {**LIMITS.__dict__, **limits}.items() if k in ExecLimits.__dataclass_fields__}
    return ProcessExecutor(workers=workers, limits=ExecLimits(**limits))


def _project_pool() -> ProcessExecutor:
    """An executor as the pipeline builds it (``make_executor`` on the default config)."""
    from codea1_core.config import SandboxConfig
    from sandbox import make_executor

    return make_executor(SandboxConfig(workers=1))


@pytest.fixture(scope="module")
def ex():
    with _project_pool() as pool:
        yield pool


# --------------------------------------------------------------------------------------------------
# 1. Verdict forgery through the reference run
# --------------------------------------------------------------------------------------------------

REFERENCE = "def f(x):\n    return abs(x) + 1\n"


def test_a_call_cannot_change_the_value_of_another_call(ex):
    """Class 1: the calls of a problem's suites ran in order in one namespace, so a call whose argument
    rebinds ``f`` (through ``globals()``) or a builtin it uses changed every later expected value."""
    calls = [
        "f(-1)",
        "f((globals().__setitem__('f', lambda x: 0), 1)[1])",
        "f(-1)",
        "f((__import__('builtins').__setattr__('abs', lambda x: -100), 1)[1])",
        "f(-1)",
        "f((f.__globals__.update(f=lambda x: 7), 1)[1])",
        "f(-1)",
    ]
    out = ex.run(REFERENCE, calls)
    assert [o.status for o in out] == ["ok"] * len(calls), out
    assert [o.value for o in out] == [2, 2, 2, -99, 2, 2, 2], out  # (the 4th changes only itself)


def test_a_call_cannot_change_a_later_program(ex):
    """The same worker serves the next program with nothing of the poisoning call left."""
    ex.run(REFERENCE, ["(__import__('builtins').__setattr__('len', lambda x: -1), 0)[1]"])
    assert ex.run("def g(s):\n    return len(s)\n", ["g('abc')"])[0].value == 3


# --------------------------------------------------------------------------------------------------
# 2. Kernel keyrings
# --------------------------------------------------------------------------------------------------

_KEYS = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def add(desc, payload, ring):
    r = libc.syscall(248, b"user", desc.encode(), payload.encode(), len(payload), ring)
    return r if r >= 0 else -ctypes.get_errno()
def find(desc, ring):
    kid = libc.syscall(250, 10, ring, b"user", desc.encode(), 0)  # KEYCTL_SEARCH
    if kid < 0:
        return -ctypes.get_errno()
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(250, 11, kid, buf, 256)  # KEYCTL_READ
    return buf.raw[:n].decode() if n >= 0 else -ctypes.get_errno()
def session_id():
    return libc.syscall(250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring, no create
"""


@pytest.mark.skipif(not X86_64, reason="syscall numbers of x86_64")
def test_keyrings_are_neither_inherited_nor_shared():
    """Class 2: the child possessed the trusted parent's session keyring and read its keys; a key added
    by one program was readable by the next on that worker."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    desc, secret = f"codea1-test-{secrets.token_hex(4)}", secrets.token_hex(8)
    key = libc.syscall(248, b"user", desc.encode(), secret.encode(), len(secret), -3)
    if key < 0:
        pytest.skip(f"no session keyring here: errno {ctypes.get_errno()}")
    try:
        with _pool() as pool:
            first = pool.run(
                _KEYS, [f"find({desc!r}, -3)", "add('left-behind', 'x', -3)", "add('left', 'y', -4)"]
            )
            second = pool.run(_KEYS, ["find('left-behind', -3)", "find('left', -4)", "session_id()"])
        assert first[0].value != secret, first
        assert [o.value for o in first[1:]] == [-1, -1], first  # EPERM: keyctl/add_key are denied
        assert [o.value for o in second[:2]] == [-1, -1], second
        assert second[2].value != libc.syscall(250, 0, -3, 0), "the child saw the parent's session keyring"
    finally:
        libc.syscall(250, 9, key, -3)  # KEYCTL_UNLINK


# --------------------------------------------------------------------------------------------------
# 3. Host daemons over pathname Unix sockets
# --------------------------------------------------------------------------------------------------


@needs_root
def test_host_unix_sockets_are_out_of_reach():
    """Class 3: the network namespace does not cover pathname Unix sockets, and a read-only mount does
    not stop ``connect()``: a program reached any host daemon under /run or /var/run."""
    path = f"/run/codea1-test-{secrets.token_hex(4)}.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(4)
    server.setblocking(False)
    os.chmod(path, 0o666)  # as the system bus's socket
    program = (
        "import os, socket\n"
        "def reach(path):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    s.connect(path)\n"
        "    return 'connected'\n"
    )
    try:
        with _pool() as pool:
            out = pool.run(
                program, [f"reach({path!r})", f"reach({'/var' + path!r})", "sorted(os.listdir('/run'))"]
            )
        assert [o.status for o in out[:2]] == ["error", "error"], out
        with pytest.raises(BlockingIOError):
            server.accept()
        assert out[2].status == "error" or set(out[2].value) <= {"lock", "shm"}, out  # /run covered
    finally:
        server.close()
        os.unlink(path)


# --------------------------------------------------------------------------------------------------
# 4. The host's pty pool; a minimal /dev
# --------------------------------------------------------------------------------------------------

MINIMAL_DEV = {
    "null",
    "zero",
    "full",
    "random",
    "urandom",
    "shm",
    "mqueue",
    "fd",
    "stdin",
    "stdout",
    "stderr",
}


@needs_root
def test_dev_is_minimal_and_has_no_pty(ex):
    """Class 4: the host's /dev/ptmx was usable (enough programs exhaust ``kernel.pty.max``)."""
    program = "import os\ndef pty():\n    os.openpty()\n    return 'pty'\n"
    out = ex.run(
        program, ["pty()", "sorted(os.listdir('/dev'))", "open('/dev/urandom', 'rb').read(4) != b''"]
    )
    assert out[0].status == "error", out
    assert out[1].status == "ok" and set(out[1].value) <= MINIMAL_DEV, out
    assert out[2].value is True, out


# --------------------------------------------------------------------------------------------------
# 5. Channels between programs running at the same time
# --------------------------------------------------------------------------------------------------

_LOCKS = r"""
import ctypes, fcntl, os, struct, time
FLOCK = struct.Struct("hhqqi")
def hold(path, seconds):
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, FLOCK.pack(fcntl.F_RDLCK, 0, 4242, 17, 0))
    except OSError as exc:
        return exc.errno
    time.sleep(seconds)
    return 0
def probe(path, after):
    time.sleep(after)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, FLOCK.pack(fcntl.F_WRLCK, 0, 0, 0, 0)))
    except OSError as exc:
        return exc.errno
    return [got[2], got[3], got[4]] if got[0] != fcntl.F_UNLCK else 'unlocked'
def inotify():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    return fd if fd < 0 else libc.inotify_add_watch(fd, b"/etc", 0xfff)
"""


def test_programs_running_together_share_no_lock_or_watch():
    """Class 5: ``F_GETLK`` on a shared read-only file returned another program's lock range and pid;
    inotify watches saw other programs' file accesses."""
    shared = "/etc/passwd"
    with _pool(workers=2) as pool:
        holder, prober = pool.run_many(
            [(_LOCKS, [f"hold({shared!r}, 1.4)"]), (_LOCKS, [f"probe({shared!r}, 0.7)", "inotify()"])]
        )
    assert holder[0].status == "ok" and prober[0].status == "ok", (holder, prober)
    assert not isinstance(prober[0].value, list), f"a program saw another's lock: {prober[0].value}"
    assert holder[0].value != 0, "a program could take a record lock on a shared file"
    assert prober[1].value == -1, prober  # inotify_init1 denied


# --------------------------------------------------------------------------------------------------
# 6. Accounting left by the previous program
# --------------------------------------------------------------------------------------------------

_PEAK = r"""
def peak():
    for line in open('/proc/self/cgroup').read().splitlines():
        _, names, path = line.split(':', 2)
        if names == '':  # v2
            return int(open('/sys/fs/cgroup' + path + '/memory.peak').read())
        if 'memory' in names.split(','):  # v1
            return int(open('/sys/fs/cgroup/memory' + path + '/memory.max_usage_in_bytes').read())
    return 'none'
def hog(mb):
    block = bytearray(mb << 20)
    return len(block) >> 20
"""


@needs_root
def test_memory_high_water_mark_is_no_channel(ex):
    """Class 6: the worker cgroup's ``memory.peak`` was never reset between programs: a program could
    read how much memory the previous one used."""
    if str(ex.isolation.get("cgroup", "")).startswith("unavailable"):
        pytest.skip(f"no cgroup: {ex.isolation['cgroup']}")
    assert ex.run(_PEAK, ["hog(300)"])[0].value == 300
    out = ex.run(_PEAK, ["peak()"])
    assert out[0].status == "error" or (out[0].value != "none" and out[0].value < 200 << 20), out


# --------------------------------------------------------------------------------------------------
# 7. The trusted parent: real sizes, bounded decode time
# --------------------------------------------------------------------------------------------------

SAMPLES = {
    "1-item dicts": [{i: i} for i in range(300, 4300)],
    "empty dicts": [{} for _ in range(4000)],
    "5-item dicts": [{j: j for j in range(5)} for _ in range(1000)],
    "sets": [{i, i + 1} for i in range(300, 4300)],
    "tuples": [(i, -i) for i in range(300, 4300)],
    "ints": list(range(10**5, 10**5 + 20000)),
    "strs": [str(i) for i in range(4000)],
    "floats": [i / 7 for i in range(4000)],
    "big ints": [10**30 + i for i in range(4000)],
}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_decode_charges_real_cpython_sizes(name):
    """Class 7: the decode budget charged a one-item dict half of what CPython allocates, so the real
    memory per program was about 2x the documented bound. Calibrated against ``tracemalloc``."""
    data = values.encode(SAMPLES[name])
    budget = DecodeBudget(1 << 30)
    start = budget.left
    tracemalloc.start()
    try:
        value = decode_result(data, budget)
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert value == SAMPLES[name]
    charged = start - budget.left
    # tracemalloc also counts allocator slack that varies with what ran earlier in the process (a few percent
    # for floats in the full suite); the bug guarded, a charge of about half, still fails 0.9
    assert 0.9 * traced <= charged <= 1.6 * traced, f"{name}: charged {charged}, CPython holds {traced}"


def test_decode_time_is_capped_per_program():
    """Class 7: decoding a million empty dicts took the parent ~3x what the child spent building them;
    past the decode-time cap the call is ``unsupported_output`` and the parent moves on."""
    known = ExecLimits.__dataclass_fields__
    assert "max_decode_s" in known, "no decode-time cap"
    with _pool(
        max_decode_s=0.05, max_result_bytes=64 << 20, call_timeout_s=10.0, program_timeout_s=30.0
    ) as pool:
        t0 = time.process_time()
        out = pool.run("", ["[{} for _ in range(3 * 10**5)]", "[{} for _ in range(3 * 10**5)]", "1"])
        spent = time.process_time() - t0
    assert [o.status for o in out] == ["unsupported_output"] * 3, [o.status for o in out]
    assert all("decode time" in o.error for o in out), out  # (the rest of the program is refused)
    assert spent < 2.0, f"the parent spent {spent:.2f} s of CPU on one program's results"


# --------------------------------------------------------------------------------------------------
# The syscall allow-list
# --------------------------------------------------------------------------------------------------

DENIED = {  # x86_64 numbers; called with zero arguments (harmless where the call is allowed)
    "add_key": 248,
    "keyctl": 250,
    "request_key": 249,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "pidfd_getfd": 438,
    "mount": 165,
    "umount2": 166,
    "fsopen": 430,
    "open_tree": 428,
    "move_mount": 429,
    "unshare": 272,
    "setns": 308,
    "bpf": 321,
    "perf_event_open": 298,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "init_module": 175,
    "finit_module": 313,
    "kexec_load": 246,
    "inotify_init1": 294,
    "fanotify_init": 300,
    "socket": 41,
    "chroot": 161,
    "pivot_root": 155,
    "kcmp": 312,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "io_setup": 206,
    "flock": 73,
}

_CALL_ALL = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def errnos(table):
    out = {}
    for name, nr in table.items():
        args = (2, 1, 0) if name == 'socket' else (0, 0, 0)
        r = libc.syscall(nr, *args, 0, 0)
        out[name] = -ctypes.get_errno() if r < 0 else r
    return out
"""


@pytest.mark.skipif(not X86_64, reason="syscall numbers of x86_64")
def test_dangerous_syscalls_answer_eperm_and_the_worker_lives(ex):
    out = ex.run(_CALL_ALL, [f"errnos({DENIED!r})", "sum(range(10))"])
    assert out[0].status == "ok", out
    allowed = {name: r for name, r in out[0].value.items() if r != -1}
    assert allowed == {}, f"not EPERM: {allowed}"
    assert out[1].value == 45
    assert "seccomp" in ex.isolation and ex.isolation["seccomp"].startswith("on"), ex.isolation
    assert ex.run("def h():\n    return 1\n", ["h()"])[0].value == 1  # same worker, still serving


SET_UP_CALLS = (  # x86_64 numbers, called with the arguments the zygote's own set-up uses
    "import ctypes\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def call(nr, *args):\n"
    "    r = libc.syscall(nr, *args)\n"
    "    return r if r >= 0 else -ctypes.get_errno()\n"
    "def set_up_calls():\n"
    "    return {\n"
    "        'mount': call(165, b'tmpfs', b'/tmp', b'tmpfs', ctypes.c_ulong(6), b'size=1m'),\n"
    "        'umount2': call(166, b'/tmp', 2),\n"
    "        'unshare': call(272, 0x08000000),\n"
    "        'setgroups': call(116, 0, None),\n"
    "        'setresuid': call(117, 0, 0, 0),\n"
    "        'seccomp': call(317, 1, 0, None),\n"
    "        'keyctl': call(250, 1, None),\n"
    "    }\n"
)


@pytest.mark.skipif(not X86_64, reason="syscall numbers of x86_64")
@pytest.mark.parametrize("drop_privileges", [True, False], ids=["uid-dropped", "privileged-children"])
def test_the_zygotes_set_up_calls_are_useless_to_a_program(drop_privileges):
    """The zygote's filter allows its set-up calls (a fresh tmpfs, the uid drop, the IPC namespace) with
    their own arguments, and no child loads a filter of its own: the program, unprivileged, gets EPERM
    from the kernel for those arguments, from the filter for any other. Children that keep privileges
    (root, ``drop_privileges=False``) load a second filter that denies the calls outright."""
    if not drop_privileges and not ROOT:
        pytest.skip("children keep privileges only when the worker runs as root")
    with ProcessExecutor(workers=1, limits=LIMITS, drop_privileges=drop_privileges) as pool:
        if not pool.isolation.get("seccomp", "").startswith("on"):
            pytest.skip(f"no syscall filter here: {pool.isolation.get('seccomp')}")
        out = pool.run(SET_UP_CALLS, ["set_up_calls()", "open('/tmp/x', 'w').write('still /tmp')"])
        per_program = "more by each program" in pool.isolation["seccomp"]
    assert out[0].status == "ok", out
    assert out[0].value == dict.fromkeys(out[0].value, -1), f"not EPERM: {out[0].value}"
    assert out[1].value == 10
    privileged = not drop_privileges and ROOT
    assert per_program == privileged, pool.isolation["seccomp"]


def test_isolation_reports_every_layer(ex):
    for layer in ("seccomp", "landlock", "keyring", "dev"):
        assert layer in ex.isolation, (layer, ex.isolation)


@needs_root
def test_landlock_confines_files(ex):
    """Only the interpreter, system files, the minimal /dev and the private tmp are reachable; only tmp
    is writable (even where a mount would allow more)."""
    if not ex.isolation.get("landlock", "").startswith("on"):
        pytest.skip(f"no Landlock: {ex.isolation.get('landlock')}")
    program = (
        "import os, tempfile\n"
        "def can_read(path):\n"
        "    try:\n"
        "        os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(1)\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
        "def tmp_roundtrip():\n"
        "    with tempfile.NamedTemporaryFile('w+') as fh:\n"
        "        fh.write('x'); fh.flush(); fh.seek(0)\n"
        "        return fh.read()\n"
    )
    calls = ["can_read('/sys/kernel')", "can_read('/var/log')", "can_read('/etc/passwd')", "tmp_roundtrip()"]
    for _ in range(2):  # the second program runs on a fresh private tmpfs
        out = ex.run(program, calls + ["open(os.environ['HOME'] + '/f', 'w').write('abc')"])
        assert [o.value for o in out] == [False, False, True, "x", 3], out


def test_a_tampering_call_fails_alone_when_calls_are_isolated(ex):
    """With calls isolated (the pipeline's default) a call bringing code of its own (``os._exit``, forged
    frames on every descriptor, closing the result channel) runs in its own process: it fails itself
    and never reaches the result channel, and the program's other calls keep their honest values
    (without isolation every later call of the program is tainted, ``tests/sandbox/test_sandbox_hostile.py``).
    A call of the program's own function on constants runs in the program's process."""
    forge = (
        "import os, struct\n"
        "def forge():\n"
        "    junk = struct.pack('>I', 37) + b'\\x00' * 16 + struct.pack('>cBid', b'C', 0, 1, 0.0)"
        " + b'i' + b'\\x00' * 7 + b'\\x01'\n"
        "    for fd in range(3, 20000):\n"
        "        try:\n"
        "            os.write(fd, junk)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 'forged'\n"
    )
    close_std = (
        "import os\ndef close_std():\n    for fd in (0, 1, 2):\n        os.close(fd)\n    return 'closed'\n"
    )
    jobs = [
        ("import os\n", ["1", "os._exit(0)", "2"]),
        (forge, ["forge()", "1"]),
        (close_std, ["close_std()", "1", "print('x')"]),
        ("import os\n", ["os.closerange(3, 65536)", "2"]),
    ]
    jobs.append((forge.replace("def forge():", "def forge(unused):"), ["forge(__import__('os'))", "1"]))
    got = [[(o.status, o.value, o.error.split(":")[0]) for o in outs] for outs in ex.run_many(jobs)]
    assert got == [
        [("ok", 1, ""), ("error", None, "ChildExited"), ("ok", 2, "")],
        # the program's own function on constants runs in the program's process, as without isolation
        [("error", None, "SandboxViolation"), ("error", None, "SandboxViolation")],
        # print, with 0-2 closed: its output lands on the call's own result pipe (a malformed result)
        [("ok", "closed", ""), ("ok", 1, ""), ("error", None, "SandboxViolation")],
        [("error", None, "ChildExited"), ("ok", 2, "")],
        [("error", None, "SandboxViolation"), ("ok", 1, "")],  # a call with code of its own: apart
    ], got
