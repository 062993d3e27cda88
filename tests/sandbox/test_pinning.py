"""``sandbox/pinning.py``: which pages a process wrote since its last fork, and pinned pages copied at fork.

Each test forks this process: the pages of an anonymous private mapping are shared with the child
(copy-on-write) until one side writes them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import select
import sys

import pytest
from support import bare_zygote, fd_targets

from sandbox.pinning import PAGE, common_runs, pin, written_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def _mapping(pages: int) -> tuple[mmap.mmap, int]:
    """An anonymous private mapping of ``pages`` pages, every one present (written once), and its address."""
    buf = mmap.mmap(-1, pages * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, pages * PAGE, PAGE):
        buf[offset] = 1
    anchor = ctypes.c_char.from_buffer(buf)
    address = ctypes.addressof(anchor)
    del anchor  # (an exported buffer would keep the mapping from closing)
    return buf, address


def test_written_pages_are_the_pages_written_since_the_fork():
    buf, base = _mapping(64)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # shares every page of the mapping until told to go
        os.read(r, 1)
        os._exit(0)
    try:
        for page in (5, 6, 40):
            buf[page * PAGE] = 2
        listed = {address + k for address, length in written_pages() for k in range(0, length, PAGE)}
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
    ours = {base + page * PAGE for page in range(64)}
    assert ours & listed == {base + page * PAGE for page in (5, 6, 40)}
    buf.close()


def _child_write_faults(buf: mmap.mmap, first: int, pages: int) -> tuple[int, int]:
    """Minor faults a forked child takes writing one byte to each of ``pages`` pages from page ``first``
    (its own count, taken around the writes), and the first byte it then reads back."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for page in range(first, first + pages):
                buf[page * PAGE] = 9
            after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            os.write(w, f"{after - before} {buf[first * PAGE]}".encode())
        finally:
            os._exit(0)
    os.close(w)
    faults, seen = os.read(r, 64).split()
    os.close(r)
    os.waitpid(pid, 0)
    return int(faults), int(seen)


def test_a_pinned_page_is_copied_at_fork_instead_of_on_first_write():
    buf, base = _mapping(96)
    try:
        ring = pin([(base, 32 * PAGE)])  # pages 0-31; 32-95 are not pinned
    except OSError as exc:
        pytest.skip(f"no io_uring here: {exc}")
    try:
        pinned_faults, seen = _child_write_faults(buf, 0, 32)
        unpinned_faults, _ = _child_write_faults(buf, 48, 32)
    finally:
        os.close(ring)
    # one copy-on-write fault a page unpinned, none pinned (copied by fork); the loop's own few on both
    assert unpinned_faults - pinned_faults >= 30, (unpinned_faults, pinned_faults)
    assert seen == 9 and buf[0] == 1 and buf[48 * PAGE] == 1  # each side keeps its own copy
    buf.close()


def test_pin_raises_for_pages_that_are_not_mapped():
    with pytest.raises(OSError):
        pin([(PAGE, PAGE)])  # the first page above zero is never mapped


def test_common_runs_keeps_the_pages_in_both_as_runs():
    a = [(0, 4 * PAGE), (10 * PAGE, PAGE)]  # pages 0-3 and 10
    b = [(2 * PAGE, 3 * PAGE), (9 * PAGE, 3 * PAGE)]  # pages 2-4 and 9-11
    assert common_runs(a, b) == [(2 * PAGE, 2 * PAGE), (10 * PAGE, PAGE)]
    assert common_runs(a, []) == []


def test_a_zygote_that_cannot_pin_still_serves_children(monkeypatch):
    """Pinning is an optimisation: where io_uring is unavailable the zygote pins nothing and its children
    run as before. A zygote without namespaces, forked from this process with ``pin`` failing."""
    from sandbox import pinning

    def unavailable(runs):
        raise OSError(38, "io_uring_setup: Function not implemented")

    monkeypatch.setattr(pinning, "pin", unavailable)
    zyg = bare_zygote()
    try:
        pidfd, _tmp, job_w, chan_r, out_r = zyg.take()  # (offered after the probes)
        assert not any("io_uring" in target for target in fd_targets(zyg.pid).values())  # nothing pinned
        os.close(job_w)  # no job: the child reads EOF and exits by itself
        assert select.select([pidfd], [], [], 30)[0], "the child did not exit"  # before reap kills it
        for fd in (pidfd, chan_r, out_r):
            os.close(fd)
        status = zyg.reap()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 71, status
    finally:
        zyg.close()
