"""The hostile corpus: programs that attack the sandbox, each with the statuses it must get (shared data).

Used by ``test_sandbox_hostile.py`` (the process sandbox) and ``test_ray_executor.py`` (the same corpus inside
Ray actors). Importing it binds a listener on 127.0.0.1 (``LISTENER``): no program may ever connect to it.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path

from sandbox import ExecLimits

REPO = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_hex(6)
ROOT = os.geteuid() == 0
HOST_TARGETS = [
    f"/tmp/codea1-hostile-{TOKEN}",
    f"/var/tmp/codea1-hostile-{TOKEN}",
    f"/dev/shm/codea1-hostile-{TOKEN}",
    str(REPO / f"PWNED-{TOKEN}"),
    f"/root/codea1-hostile-{TOKEN}",
    f"/etc/codea1-hostile-{TOKEN}",
]
# The expectations are those of the shared namespace (a call that exits ends the program): the opt-in mode.
LIMITS = ExecLimits(
    call_timeout_s=1.0, program_timeout_s=8.0, memory_mb=512, max_output_bytes=4096, isolate_calls=False
)
OK, ERR, TO, MEM, UNS, PROG = "ok", "error", "timeout", "memory", "unsupported_output", "program_error"


@dataclass
class Case:
    name: str
    program: str
    calls: list[str]
    expected: list  # per call: a status or a set of allowed statuses
    check: object = None  # optional callable(outcomes, output) -> None
    needs_root: bool = False
    extra: dict = field(default_factory=dict)


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(5)
    sock.setblocking(False)
    return sock


LISTENER = _listener()
PORT = LISTENER.getsockname()[1]

CASES = [
    Case("infinite_loop", "def spin():\n    while True:\n        pass\n", ["spin()", "1"], [TO, OK]),
    Case("sleep", "import time\n", ["time.sleep(100)", "2"], [TO, OK]),
    Case("memory_bomb_call", "", ["[0] * (10**10)", "' ' * (10**10)", "3"], [MEM, MEM, OK]),
    Case("memory_bomb_top_level", "x = bytearray(10**10)\n", ["1"], [PROG]),
    Case(
        "fork_bomb_bounded_by_nproc",
        "import os, time\n"
        "def bomb():\n"
        "    n = 0\n"
        "    for _ in range(300):\n"
        "        try:\n"
        "            if os.fork() == 0:\n"
        "                time.sleep(60)\n"
        "                os._exit(0)\n"
        "            n += 1\n"
        "        except OSError:\n"
        "            break\n"
        "    return n\n",
        ["bomb()", "4"],
        [OK, OK],
        check=lambda out, _: _assert(not ROOT or out[0].value < LIMITS.max_processes, out[0]),
    ),
    Case(
        "fork_bomb_unbounded",
        "import os\ndef bomb():\n    while True:\n        os.fork()\n",
        ["bomb()"],
        [{ERR, TO}],
    ),
    Case("deep_recursion", "def r(n):\n    return r(n + 1)\n", ["r(0)", "5"], [ERR, OK]),
    Case(
        "deep_recursion_segfault",
        "import sys\nsys.setrecursionlimit(10**7)\ndef r(n):\n    return r(n + 1)\n",
        ["r(0)", "6"],
        [{ERR, MEM, TO}, {ERR, MEM, OK}],  # a C-stack overflow kills the child (or it runs out of time)
    ),
    Case(
        "os_system_and_subprocess",
        "import os, subprocess\n",
        [
            f"os.system('touch {HOST_TARGETS[0]} {HOST_TARGETS[3]} 2>/dev/null')",
            "subprocess.run(['id', '-u'], capture_output=True).stdout.strip() != b'0'",
        ],
        [OK, OK],
        check=lambda out, _: _assert(out[1].value is True or not ROOT, out),
    ),
    Case(
        "socket_connect",
        "import socket\n",
        [
            f"socket.create_connection(('127.0.0.1', {PORT}), timeout=0.5)",
            "socket.create_connection(('1.1.1.1', 53), timeout=0.5)",
            "socket.gethostbyname('example.com')",
        ],
        [ERR, ERR, ERR] if ROOT else [{ERR, UNS}, {ERR, UNS}, {ERR, OK}],
    ),
    Case(
        "writes_outside_temp_dir",
        "def write_all(paths):\n"
        "    done = []\n"
        "    for p in paths:\n"
        "        try:\n"
        "            with open(p, 'w') as fh:\n"
        "                fh.write('pwned')\n"
        "            done.append(p)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return done\n",
        [f"write_all({HOST_TARGETS!r})", "open('local.txt', 'w').write('fine in the temp dir')"],
        [OK, OK],
    ),
    Case(
        "reads_of_project_files",
        "import os\n"
        "def try_read(p):\n"
        "    try:\n"
        "        with open(p, 'rb') as fh:\n"
        "            return fh.read(10)\n"
        "    except OSError as exc:\n"
        "        return type(exc).__name__\n"
        "def try_list(p):\n"
        "    try:\n"
        "        return sorted(os.listdir(p))\n"
        "    except OSError as exc:\n"
        "        return type(exc).__name__\n",
        [
            f"try_read({str(REPO / 'pyproject.toml')!r})",
            f"try_read({str(REPO / 'sandbox' / 'child.py')!r})",
            f"try_list({str(REPO)!r})",
            f"try_read('/proc/{os.getpid()}/root{REPO / 'pyproject.toml'}')",
            "try_read('/proc/1/root/etc/hostname')",
            f"try_read({str(REPO.parent / 'shared' / 'data' / 'README.md')!r})",
        ],
        [OK] * 6,
        check=lambda out, _: _check_reads(out),
        needs_root=True,
    ),
    Case(
        "kill_the_parent",
        "import os, signal\n",
        [
            "os.kill(os.getppid(), signal.SIGKILL)",
            f"os.kill({os.getpid()}, signal.SIGKILL)",
            "os.kill(-1, signal.SIGKILL)",
            "7",
        ],
        [ERR, ERR, {OK, ERR}, OK],
        needs_root=True,
    ),
    Case("exit_at_top_level", "import sys\nsys.exit(0)\n", ["1", "2"], [PROG, PROG]),
    Case("os_exit_at_top_level", "import os\nos._exit(0)\n", ["1"], [PROG]),
    Case("sys_exit_in_a_call", "import sys\n", ["1", "sys.exit(0)", "2"], [OK, ERR, OK]),
    Case(
        "os_exit_after_some_calls",
        "import os\n",
        ["1", "os._exit(0)", "2"],
        [OK, ERR, ERR],
        check=lambda out, _: _assert("child exited" in out[1].error and out[0].value == 1, out),
    ),
    Case(
        "forged_markers_on_stdout",
        "print('__PASS__ all tests passed', flush=True)\n"
        "import sys\nsys.stdout.write('\\x00\\x00\\x00\\x20' + 'ok' * 16)\n"
        "def f():\n    return 'wrong'\n",
        ["f()"],
        [OK],
        check=lambda out, _: _assert(out[0].value == "wrong", out),
    ),
    Case(
        "forged_frames_on_every_fd",
        "import os, struct\n"
        "def forge():\n"
        "    junk = struct.pack('>I', 37) + b'\\x00' * 16 + struct.pack('>cBid', b'C', 0, 1, 0.0)"
        " + b'i' + b'\\x00' * 7 + b'\\x01'\n"
        "    for fd in range(3, 20000):\n"
        "        try:\n"
        "            os.write(fd, junk)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return 'forged'\n",
        ["forge()", "1"],
        [ERR, ERR],
        check=lambda out, _: _assert(all("SandboxViolation" in o.error for o in out), out),
    ),
    Case(
        "eq_override",
        "class Yes:\n    def __eq__(self, other):\n        return True\n"
        "class YesList(list):\n    def __eq__(self, other):\n        return True\n",
        ["Yes()", "YesList([1])", "[Yes()]", "{1: Yes()}"],
        [UNS, UNS, UNS, UNS],
    ),
    Case(
        "builtins_patching",
        "import builtins, os, struct, time, marshal\n"
        "builtins.type = lambda *a: int\n"
        "builtins.len = lambda x: 0\n"
        "builtins.isinstance = lambda *a: True\n"
        "os.write = lambda fd, data: len(data)\n"
        "struct.pack = lambda *a: b''\n"
        "time.monotonic = lambda: 0.0\n"
        "marshal.dumps = lambda *a: b''\n"
        "def f():\n    return [5, 'five']\n",
        ["f()", "time.sleep(5)"],
        [OK, TO],
        check=lambda out, _: _assert(out[0].value == [5, "five"], out),
    ),
    Case(
        "patching_the_harness_modules",
        "import sys\n"
        "for name in list(sys.modules):\n"
        "    if name.startswith(('sandbox', 'codea1_core')):\n"
        "        sys.modules[name].__dict__.clear()\n"
        "def f():\n    return 9\n",
        ["f()", "import_sandbox()"],
        [OK, ERR],
        extra={"program_suffix": "def import_sandbox():\n    import sandbox.child\n    return 1\n"},
    ),
    Case(
        "huge_output",
        "import sys\nfor _ in range(2000):\n    sys.stdout.write('y' * 5000)\n",
        ["1"],
        [OK],
        check=lambda out, output: _assert(output == b"y" * LIMITS.max_output_bytes, len(output)),
    ),
    Case(
        "non_utf8_output",
        "import os, sys\nos.write(1, b'\\xff\\xfe\\x80')\nsys.stderr.write('\\udcff')\n",
        ["'done'"],
        [OK],
        check=lambda out, output: _assert(output.startswith(b"\xff\xfe\x80"), output),
    ),
    Case(
        "threads_left_running",
        "import threading, os, time\n"
        "def noisy():\n"
        "    while True:\n"
        "        os.write(1, b'.')\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=noisy, daemon=False).start()\n"
        "def f(x):\n    return x + 1\n",
        ["f(1)", "f(2)"],
        [OK, OK],
        check=lambda out, _: _assert([o.value for o in out] == [2, 3], out),
    ),
    Case(
        "signal_handlers",
        "import signal, time\n"
        "for s in (signal.SIGALRM, signal.SIGTERM, signal.SIGXCPU, signal.SIGINT):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
        "def f():\n    time.sleep(30)\n    return 'survived'\n",
        ["f()", "8"],
        [TO, OK],
    ),
    Case(
        "closed_stdout",
        "import os\ndef close_std():\n    for fd in (0, 1, 2):\n        os.close(fd)\n    return 'closed'\n",
        ["close_std()", "1", "print('x')"],
        [OK, OK, ERR],
    ),
    Case("closed_result_channel", "import os\n", ["os.closerange(3, 65536)", "2"], [ERR, ERR]),
    Case(
        "hostile_exception_str",
        "class E(Exception):\n    def __str__(self):\n        while True:\n            pass\n"
        "def f():\n    raise E()\n",
        ["f()", "1"],
        [ERR, OK],
        check=lambda out, _: _assert(out[0].error.startswith("E: "), out),
    ),
    Case("keyboard_interrupt", "", ["(_ for _ in ()).throw(KeyboardInterrupt)", "1"], [ERR, OK]),
    Case("self_reference", "x = []\nx.append(x)\n", ["x", "[[[]]]"], [UNS, OK]),
    Case(
        "privilege_escalation",
        "import os\n",
        ["os.setuid(0)", "os.getuid() != 0"],
        [ERR, OK],
        needs_root=True,
    ),
    Case(
        "environment_and_cwd",
        "import os\n",
        ["sorted(os.environ)", "os.getcwd().startswith('/tmp/')", "os.access('.', os.W_OK)"],
        [OK, OK, OK],
        check=lambda out, _: _assert(
            set(out[0].value) <= {"PATH", "HOME", "TMPDIR", "LANG"} and out[1].value, out
        ),
    ),
    Case(
        "escaped_daemon",
        "import os, time\n"
        "def daemon():\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(120)\n"
        "        os._exit(0)\n"
        "    return 'spawned'\n",
        ["daemon()"],
        [OK],
    ),
]


def _assert(condition: bool, context: object) -> None:
    assert condition, context


def _check_reads(out) -> None:
    values = [o.value for o in out]
    assert values[0] in ("FileNotFoundError", "PermissionError"), values[0]
    assert values[1] in ("FileNotFoundError", "PermissionError"), values[1]
    # Only the interpreter's environment stays visible; a checkout under /tmp is not there at all (the
    # child's /tmp is a private tmpfs), which CI's clean clone may hit.
    assert values[2] in ([], [".venv"], "FileNotFoundError"), values[2]
    assert values[3] in ("FileNotFoundError", "PermissionError"), values[3]
    assert values[4] in ("FileNotFoundError", "PermissionError"), values[4]
    assert values[5] in ("FileNotFoundError", "PermissionError"), values[5]
