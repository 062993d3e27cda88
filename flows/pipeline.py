"""``make run``: the default pipeline (``dvc repro``) and its learning table, under one Prefect API.

What it does, top to bottom:
  1. Start one Prefect API for the whole run (:func:`flows.prefect_server.shared_api`; a server the user
     points ``PREFECT_API_URL`` at is used as it is), so the five DVC stages connect to it instead of each
     starting a temporary one.
  2. Run ``dvc repro [ARGS]`` with this interpreter's ``bin/`` first on ``PATH`` (the stages' ``python`` is
     this environment's).
  3. Print the learning table (:mod:`flows.summary`).
  4. Stop the server — also after a failed stage, Ctrl-C or SIGTERM (the running stage gets SIGTERM first).

How to run: ``make run`` or ``python -m flows.pipeline [dvc repro arguments, e.g. train -f]``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from flows import summary
from flows.common import child_env
from flows.prefect_server import ServerStartError, shared_api, sigterm_as_interrupt

CHILD_STOP_TIMEOUT_S = 60.0
"""After SIGTERM a stage finishes its current task and checkpoints; then it is killed."""


def _dvc() -> str:
    local = Path(sys.executable).parent / "dvc"
    return str(local) if local.exists() else "dvc"


def run_child(cmd: list[str]) -> int:
    """Run ``cmd`` to completion; on interrupt, pass SIGTERM on, wait a while, then kill, and re-raise."""
    proc = subprocess.Popen(cmd, env=child_env())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=CHILD_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    start = time.monotonic()
    try:
        with sigterm_as_interrupt(), shared_api() as api_url:
            print(
                f"pipeline: Prefect API {api_url} (started in {time.monotonic() - start:.1f} s)", flush=True
            )
            rc = run_child([_dvc(), "repro", *args])
            if rc != 0:
                print(
                    f"pipeline: `dvc repro` failed (exit {rc}); fix the error above and rerun",
                    file=sys.stderr,
                )
                return rc
            return summary.main()
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "pipeline: interrupted; the Prefect server is stopped. Rerun `make run` to resume.",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
