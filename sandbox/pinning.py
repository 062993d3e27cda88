"""Pages copied at fork instead of on first write: what the zygote pins so its children fault less.

What it does: a forked child shares its parent's pages copy-on-write, and each page either process then
writes costs a page fault (several microseconds on a VM: most of a trivial program's CPU, in the child
and in the zygote alike). Linux copies a *pinned* anonymous page at fork instead (the parent may have
I/O in flight to it), inside ``fork`` with no fault on either side, and the parent's page stays its own.
:func:`written_pages` lists the pages of this process's private writable mappings that are present and
mapped by it alone (``/proc/self/pagemap``): after a fork, those written since by either process.
:func:`pin` pins pages for as long as the descriptor it returns stays open, by registering them as
io_uring fixed buffers (the ring is never used for I/O). The zygote (``sandbox/zygote.py``,
``_pin_child_pages``) lists what a probe child running a trivial trusted program and the zygote itself
write, and pins that, once.

What it does not do: change what a child can see or do: each child gets its own copy of a pinned page,
as it would on its first write to it, and the ring's descriptor is closed in every child before its
program runs (``child_main`` keeps no descriptor above 2 but its result channel). The copies are made
at ``fork``, before the child joins the worker's cgroup, so they are charged to the zygote's: about 1 MB
per child that the worker's ``memory.max`` does not count, a fixed amount no program can grow. Where
io_uring is unavailable (disabled by ``kernel.io_uring_disabled``, denied by a container's syscall
filter, over the memlock limit) :func:`pin` raises ``OSError`` and children fault as they would without
it. Linux only.
"""

from __future__ import annotations

import ctypes
import os
import struct

from sandbox import linux as _linux

PAGE = os.sysconf("SC_PAGE_SIZE")
_PRESENT, _EXCLUSIVE = 1 << 63, 1 << 56  # pagemap bits: page present, mapped by this process alone
_ENTRY = struct.Struct("=Q")
_MAX_MAPPING = 1 << 30  # larger private writable mappings (reservations, not Python's heap) are not read
IO_URING_SETUP, IO_URING_REGISTER, IORING_REGISTER_BUFFERS = 425, 427, 0  # (one number on every arch)
MAX_BUFFERS = 1 << 14  # io_uring's limit on registered buffers


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def written_pages() -> list[tuple[int, int]]:
    """``(address, bytes)`` runs of this process's private writable pages that are present and mapped
    by it alone: right after a fork every page is mapped by both processes, so these are the pages one
    of them wrote since (or that were first touched since). Runs never span two mappings."""
    with open("/proc/self/maps", "rb") as fh:
        maps = fh.read().splitlines()
    fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    runs: list[tuple[int, int]] = []
    try:
        for line in maps:
            fields = line.split()
            if fields[1] != b"rw-p":
                continue
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
            if end - start > _MAX_MAPPING:
                continue
            entries = os.pread(fd, _ENTRY.size * ((end - start) // PAGE), _ENTRY.size * (start // PAGE))
            run = -1
            for i, (entry,) in enumerate(_ENTRY.iter_unpack(entries)):
                if entry & _PRESENT and entry & _EXCLUSIVE:
                    if run < 0:
                        run = i
                elif run >= 0:
                    runs.append((start + run * PAGE, (i - run) * PAGE))
                    run = -1
            if run >= 0:
                runs.append((start + run * PAGE, (end - start) - run * PAGE))
    finally:
        os.close(fd)
    return runs


def common_runs(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pages in both ``a`` and ``b`` (``(address, bytes)`` runs, page-aligned), as runs."""
    pages = {start + k for start, length in a for k in range(0, length, PAGE)}
    pages &= {start + k for start, length in b for k in range(0, length, PAGE)}
    runs: list[tuple[int, int]] = []
    for page in sorted(pages):
        if runs and runs[-1][0] + runs[-1][1] == page:
            runs[-1] = (runs[-1][0], runs[-1][1] + PAGE)
        else:
            runs.append((page, PAGE))
    return runs


def pin(runs: list[tuple[int, int]]) -> int:
    """Pin the pages of ``runs`` (``(address, bytes)``, page-aligned) until the returned descriptor is
    closed: a one-entry io_uring with the runs registered as its fixed buffers (at most
    :data:`MAX_BUFFERS`; the rest stay unpinned).

    Raises:
        OSError: io_uring is unavailable here, or the pages could not be pinned.
    """
    syscall = _linux.libc.syscall
    params = (ctypes.c_char * 120)()  # struct io_uring_params, all zero: the kernel's defaults
    ring = syscall(IO_URING_SETUP, 1, params)
    if ring < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"io_uring_setup: {os.strerror(err)}")
    runs = runs[:MAX_BUFFERS]
    iovecs = (_Iovec * len(runs))(*runs)
    if syscall(IO_URING_REGISTER, ring, IORING_REGISTER_BUFFERS, iovecs, len(runs)) != 0:
        err = ctypes.get_errno()
        os.close(ring)
        raise OSError(err, f"io_uring_register (pinning {len(runs)} runs of pages): {os.strerror(err)}")
    return ring
