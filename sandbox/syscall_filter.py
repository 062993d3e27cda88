"""The syscall allow-list (seccomp-bpf) every child loads before the program runs: deny by default.

What it does: :func:`build_filters` compiles :data:`ALLOWED` (plus the argument-checked rules below) with
the system's libseccomp into classic BPF whose default action is ``EPERM`` (the program gets an ordinary
``PermissionError``; the worker lives). The zygote loads it once and every child inherits it: no child
loads a filter of its own. The few calls the zygote's work and a child's set-up need (:data:`SET_UP_ONLY`:
a fresh private tmpfs, the Landlock rulesets, the uid drop and sweep, the child's IPC namespace) are
allowed only with the exact arguments that work uses (:func:`_set_up_rules`), and each of those needs a
privilege the program no longer has once its child dropped to the worker's unprivileged uid: so a
program that calls them gets ``EPERM`` from the filter (other arguments) or from the kernel (no
capability). Where children keep privileges (running as root with ``drop_privileges=False``), each
child also loads, just before the harness, a short second filter denying those calls whatever their
arguments (``children_privileged=True``). Built once per worker (in the trusted worker, before its
zygote is forked), so no child calls into libseccomp.

Why libseccomp, and through ctypes: libseccomp is the maintained library Docker, systemd, podman and
nsjail use; it knows every architecture's syscall numbers (and the x32/compat ABIs that a hand-written
filter must remember to reject) and emits an optimised filter (a binary search over the allowed
numbers). Its official Python binding is not on PyPI (it needs Cython and libseccomp's headers), Debian's
``python3-seccomp`` serves only the system interpreter, and ``pyseccomp`` (a ctypes wrapper) has not been
released since 2021; the six functions used here are bound below in a few lines instead, against
``libseccomp.so.2``, which every Debian/Ubuntu system has (apt itself depends on it; ``make setup``
installs it where missing). Where it cannot be loaded the filter is off and ``ex.isolation["seccomp"]``
says why (``network_isolation="require"`` then refuses to start).

The allow-list is measured, not guessed: the lab programs, the HumanEval+/MBPP+ canonical solutions and the
hostile corpus run under a filter whose default action kills the process, and no correct program is
killed (``tests/sandbox/test_sandbox_allowlist.py``). Anchors: Docker's default profile (minus everything a
container's root may need), nsjail's and gVisor's host lists. Denied, among everything not listed:
keyrings (``add_key``, ``keyctl``, ``request_key``), ``ptrace``, ``process_vm_readv/writev``,
``pidfd_getfd``, ``kcmp``, the mount family (``mount``, ``umount2``, ``fsopen``, ``fsmount``,
``open_tree``, ``move_mount``, ``mount_setattr``, ``pivot_root``, ``chroot``), namespace creation
(``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag; ``clone3`` answers ENOSYS so libc falls
back to ``clone``, whose flags can be checked), ``bpf``, ``perf_event_open``, ``userfaultfd``,
``io_uring_*``, AIO, module and kexec calls, ``reboot``, ``swapon``, ``acct``, ``inotify``, ``fanotify``,
file locks (``flock``; ``fcntl`` lock, lease and notify commands), file handles, SysV IPC and POSIX
message queues, ``socket`` (every family; ``socketpair`` only for ``AF_UNIX``), ``connect``, ``bind``,
``listen``, ``accept``, the uid/gid/capability setters (but ``setgroups``/``setresuid``/``setresgid`` to
the worker's own uid: a no-op for a child that already is it), ``personality``, ``mknod``,
extended-attribute writes, ``seccomp``, the clock setters. ``mount``, ``umount2`` and ``unshare`` pass
the filter only with the zygote's own flags, and then fail for want of a capability.

What it does not cover: the allowed calls' own kernel bugs; ``landlock_create_ruleset`` and
``landlock_add_rule`` are allowed (the zygote renews its rules with them; a ruleset can only ever
restrict the process that joins it); ``ioctl`` is allowed on any descriptor the
program can open (the minimal /dev leaves no terminal, see ``sandbox/mounts.py``); timing channels.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable

from sandbox.credentials import call_uid
from sandbox.linux import CLONE_NEWIPC, MNT_DETACH
from sandbox.mounts import TMPFS_FLAGS

ALLOWED = """
read write readv writev pread64 pwrite64 preadv preadv2 pwritev pwritev2 open openat openat2 close
close_range creat lseek _llseek stat fstat lstat newfstatat statx statfs fstatfs access faccessat
faccessat2 readlink readlinkat getdents getdents64 getcwd chdir fchdir mkdir mkdirat rmdir unlink
unlinkat rename renameat renameat2 link linkat symlink symlinkat chmod fchmod fchmodat fchmodat2 chown
fchown fchownat lchown truncate ftruncate fallocate fsync fdatasync sync_file_range syncfs sync umask
utime utimes utimensat futimesat fadvise64 readahead copy_file_range sendfile splice tee vmsplice
getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr
dup dup2 dup3 pipe pipe2 poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait
epoll_pwait epoll_pwait2 eventfd eventfd2 signalfd signalfd4 timerfd_create timerfd_settime
timerfd_gettime ioctl
mmap munmap mprotect mremap madvise brk msync mincore mlock mlock2 munlock membarrier get_mempolicy
set_mempolicy mbind memfd_create remap_file_pages
rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigsuspend rt_sigtimedwait rt_sigqueueinfo
rt_tgsigqueueinfo sigaltstack kill tgkill tkill pidfd_open pidfd_send_signal pause alarm
nanosleep clock_nanosleep clock_gettime clock_getres gettimeofday time getitimer setitimer timer_create
timer_settime timer_gettime timer_getoverrun timer_delete times
getpid getppid gettid getuid geteuid getgid getegid getresuid getresgid getgroups getpgid getpgrp
getsid setpgid setsid getpriority setpriority getrlimit setrlimit prlimit64 getrusage sysinfo uname
getcpu sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler
sched_get_priority_max sched_get_priority_min sched_rr_get_interval sched_getattr capget capset
futex futex_waitv set_robust_list get_robust_list set_tid_address rseq arch_prctl prctl
exit exit_group wait4 waitid restart_syscall fork vfork execve execveat getrandom
sendmsg recvmsg sendto recvfrom shutdown getsockname getpeername getsockopt setsockopt
landlock_restrict_self
""".split()
"""Allowed whatever their arguments (names unknown on an architecture are skipped). ``landlock_restrict_self``
only ever restricts further: each call's process joins a signal-scoping domain with it; so does ``capset``
under no-new-privs (it can only lower what a process holds: each call's process drops ``CAP_SETUID``)."""

_CLONE_NEW = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
_FCNTL_OK = (0, 1, 2, 3, 4, 1030, 1031, 1032, 1033, 1034)
"""F_DUPFD F_GETFD F_SETFD F_GETFL F_SETFL F_DUPFD_CLOEXEC F_SETPIPE_SZ F_GETPIPE_SZ F_ADD_SEALS
F_GET_SEALS; not the lock (F_GETLK...: another program's lock and pid), lease, notify or owner commands."""
_AF_UNIX = 1

_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_CMP_EQ, _CMP_MASKED_EQ = 4, 7
_ATTR_BADARCH, _ATTR_OPTIMIZE = 2, 8
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1, 4


def _act_errno(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _libseccomp() -> ctypes.CDLL:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def syscall_number(name: str) -> int | None:
    """This architecture's number of syscall ``name`` (from libseccomp); None where unknown."""
    try:
        nr = _libseccomp().seccomp_syscall_resolve_name(name.encode())
    except OSError:
        return None
    return nr if nr >= 0 else None


SET_UP_ONLY = (
    "mount umount2 setgroups setresgid setresuid landlock_create_ruleset landlock_add_rule unshare seccomp"
).split()
"""What the zygote (fresh private tmpfs, Landlock rulesets, the uid sweep) and a child's set-up (its IPC
namespace, uid drop; with privileged children, its own filter) still need after the zygote's filter is
loaded. (Keyrings are not among them: the worker joins its fresh keyring before any filter, and a child
joins its own only where there is no filter.)"""

_SET_UP_FLAGS = {"mount": TMPFS_FLAGS, "umount2": MNT_DETACH, "unshare": CLONE_NEWIPC}
"""The flags of the zygote's only mount (a fresh private tmpfs), umount (of the used one, detached) and a
child's only unshare (its IPC namespace), as ``sandbox/mounts.py`` (``wipe_private_tmp``) and
``sandbox/namespaces.py`` (``enter_private_ipc``) pass them."""


def build_filters(
    default: str = "eperm", *, uid: int | None = None, children_privileged: bool = False
) -> tuple[bytes, bytes | None]:
    """The allow-list as classic BPF (``struct sock_filter`` array bytes): the zygote's, and a child's
    where children keep privileges.

    Why the zygote's alone: loading a filter costs the kernel a check, a JIT compilation and a pass of
    the filter over every syscall number (its action cache): for the whole list, about half a trivial
    program's CPU (``bench/sandbox_bench.py``). So the zygote loads the list once and every child
    inherits it. The set-up calls it must allow (:data:`SET_UP_ONLY`) are narrowed to the arguments the
    set-up uses; each then needs a capability an unprivileged child does not have. A child that keeps its
    privileges (``children_privileged``: no uid drop, running with capabilities) would keep them usable, so
    it loads a second, short filter denying :data:`SET_UP_ONLY` whatever the arguments (a syscall passes
    only if both filters allow it; its cost per child is measured by ``bench/sandbox_bench.py``).

    Args:
        default: ``eperm`` (production: a denied call fails with EPERM) or ``kill`` (the measurement:
            a denied call kills the process with SIGSYS, so no swallowed EPERM goes unseen).
        uid: the worker's unprivileged uid (gid = uid) its children drop to, and the uid sweep becomes;
            ``setresuid`` also to its call uid (``sandbox/credentials.py``, ``call_uid``), which each
            isolated call's process becomes; None where there is no uid drop (``setresuid``/``setresgid``
            are then denied).
        children_privileged: the children keep capabilities (see above).

    Returns:
        ``(zygote_filter, child_filter)``; ``child_filter`` is None unless ``children_privileged``.

    Raises:
        OSError: libseccomp cannot be loaded or refuses a rule.
    """
    lib = _libseccomp()
    deny = _act_errno(errno.EPERM) if default == "eperm" else _ACT_KILL_PROCESS
    if children_privileged:
        return (
            _compile(lib, deny, lambda add: _zygote_rules(add, True, uid)),
            _compile(lib, _ACT_ALLOW, lambda add: _child_rules(add, deny)),
        )
    return _compile(lib, deny, lambda add: _zygote_rules(add, False, uid)), None


def _zygote_rules(add: Callable[..., None], children_privileged: bool, uid: int | None) -> None:
    for name in ALLOWED:
        add(name)
    if children_privileged:  # whatever the arguments: each child's own filter denies them
        for name in SET_UP_ONLY:
            add(name)
    else:
        _set_up_rules(add, uid)
    add("clone", _ACT_ALLOW, (0, _CMP_MASKED_EQ, _CLONE_NEW, 0))  # no new namespace
    add("clone3", _act_errno(errno.ENOSYS))  # flags behind a pointer: libc falls back to clone
    for name in ("fcntl", "fcntl64"):
        for cmd in _FCNTL_OK:
            add(name, _ACT_ALLOW, (1, _CMP_EQ, cmd, 0))
    add("socketpair", _ACT_ALLOW, (0, _CMP_EQ, _AF_UNIX, 0))


def _set_up_rules(add: Callable[..., None], uid: int | None) -> None:
    """:data:`SET_UP_ONLY` with the set-up's own arguments (no ``seccomp``: nothing loads a filter after
    the zygote's)."""
    for name, arg in (("mount", 3), ("umount2", 1), ("unshare", 0)):  # (the flags' argument)
        add(name, _ACT_ALLOW, (arg, _CMP_EQ, _SET_UP_FLAGS[name], 0))
    add("landlock_create_ruleset")
    add("landlock_add_rule")
    add("setgroups", _ACT_ALLOW, (0, _CMP_EQ, 0, 0))  # setgroups(0, NULL): no supplementary group
    if uid is not None:
        for name in ("setresuid", "setresgid"):
            add(name, _ACT_ALLOW, *((arg, _CMP_EQ, uid, 0) for arg in range(3)))
        call = call_uid(uid)  # each isolated call's process becomes it (sandbox/confinement.py)
        add("setresuid", _ACT_ALLOW, *((arg, _CMP_EQ, call, 0) for arg in range(3)))


def _child_rules(add: Callable[..., None], deny: int) -> None:
    for name in SET_UP_ONLY:
        if name not in _RESTRICT_ONLY:
            add(name, deny)


_RESTRICT_ONLY = ("landlock_create_ruleset", "landlock_add_rule")
"""Set-up calls a privileged child keeps: a Landlock ruleset can only ever restrict its joiner, and each
isolated call's process makes its own signal scope with them (``sandbox/landlock.py``, ``scope_joiner``)."""


def _compile(lib: ctypes.CDLL, default_action: int, rules: Callable[[Callable[..., None]], None]) -> bytes:
    ctx = lib.seccomp_init(default_action)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        lib.seccomp_attr_set(ctx, _ATTR_OPTIMIZE, 2)  # binary tree (libseccomp >= 2.5; ignored before)

        def add(name: str, action: int = _ACT_ALLOW, *cmps: tuple[int, int, int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return  # not a syscall of this architecture
            arr = (_ArgCmp * max(len(cmps), 1))(*[_ArgCmp(*c) for c in cmps])
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr)
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")

        rules(add)
        return _export(lib, ctx)
    finally:
        lib.seccomp_release(ctx)


def _export(lib: ctypes.CDLL, ctx: int) -> bytes:
    fd = os.memfd_create("codea1-seccomp", os.MFD_CLOEXEC)
    try:
        rc = lib.seccomp_export_bpf(ctx, fd)
        if rc < 0:
            raise OSError(-rc, f"seccomp_export_bpf: {os.strerror(-rc)}")
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def loader(program: bytes) -> Callable[[], int]:
    """``load()`` for a child: installs ``program`` on the calling thread with one ``seccomp(2)`` call
    (``SECCOMP_FILTER_FLAG_SPEC_ALLOW``: the untrusted code is the whole process, so no speculative
    store bypass mitigation is forced on it); returns 0 or -1. Everything is bound here, once, in the
    trusted worker: a child only makes the call. The caller must have set no-new-privs."""
    if len(program) % 8 or not program:
        raise ValueError("a BPF program is a non-empty array of 8-byte instructions")
    struct.unpack_from("HBBI", program)  # (a well-formed first instruction)
    nr = syscall_number("seccomp")
    if nr is None:
        raise OSError(errno.ENOSYS, "no seccomp syscall on this architecture")
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _Fprog(len(program) // 8, ctypes.addressof(buf))
    call = ctypes.CDLL(None, use_errno=True)["syscall"]
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_void_p]
    keep = (buf, prog)
    addr = ctypes.addressof(prog)
    flags = _SECCOMP_FILTER_FLAG_SPEC_ALLOW

    def load(_call=call, _nr=nr, _op=_SECCOMP_SET_MODE_FILTER, _flags=flags, _addr=addr, _keep=keep) -> int:
        return _call(_nr, _op, _flags, _addr)

    return load
