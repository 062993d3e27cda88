"""``make run``: the default pipeline (``dvc repro``) and its learning table, under one Prefect API.

What it does, top to bottom:
  1. Start one Prefect API for the whole run (:func:`flows.prefect_server.shared_api`; a server the user
     points ``PREFECT_API_URL`` at is used as it is), so the five DVC stages connect to it instead of each
     starting a temporary one.
  2. Run ``dvc repro [ARGS]`` with this interpreter's ``bin/`` first on ``PATH`` (the stages' ``python`` is
     this environment's).
  3. Print the learning table (:mod:`flows.summary`).
  4. Stop the server — also after a failed stage, Ctrl-C (exit 130) or SIGTERM (exit 143, as a stage stopped by
     SIGTERM): ``dvc`` runs in its own process group, which gets SIGTERM first; the server stops once every
     process in it has exited (bounded wait), and its log is removed.
     Even SIGKILL of this process leaves nothing running: the server's guard process (:mod:`flows.guard`, the
     server's parent) learns of our death from the kernel (``PR_SET_PDEATHSIG``), stops the group the same
     way while the API still answers (the stage ends its flow and task runs, releases its lock), then stops
     the server and removes its log. The entries a killed ``dvc`` leaves in ``.dvc/tmp/rwlock`` are removed.

DVC experiments the same way: ``make exp ARGS="-S reward.alpha=0.25"`` or ``python -m flows.pipeline exp
[dvc exp run arguments]`` runs ``dvc exp run`` under one Prefect API. ``dvc exp run`` commits the experiment
and DVC refuses to without a git identity ("Git user name and email must be configured"): where git has none,
the experiment commit alone is made as :data:`FALLBACK_IDENTITY` (``GIT_AUTHOR_*``/``GIT_COMMITTER_*`` in the
child's environment; git's configuration is left alone), with one line saying how to set yours.

How to run: ``make run`` or ``python -m flows.pipeline [dvc repro arguments, e.g. train -f]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from flows import summary
from flows.common import child_env
from flows.guard import prune_rwlock, stop_process_group
from flows.prefect_server import (
    GUARD,
    ServerStartError,
    Terminated,
    active_guard,
    dvc_root,
    guard_preexec,
    shared_api,
    sigterm_as_interrupt,
)

CHILD_STOP_TIMEOUT_S = 120.0
"""After SIGTERM a stage finishes its current task and checkpoints; what is left of it then is killed."""


def _dvc() -> str:
    local = Path(sys.executable).parent / "dvc"
    return str(local) if local.exists() else "dvc"


FALLBACK_IDENTITY = {"NAME": "codea1", "EMAIL": "codea1@localhost"}
"""Who an experiment commit is made as where git has no user identity (:func:`git_identity_env`)."""


def git_identity_env() -> dict[str, str]:
    """``GIT_AUTHOR_*`` / ``GIT_COMMITTER_*`` from :data:`FALLBACK_IDENTITY` for a role git has no identity for
    here (``git var`` fails; variables already set are kept); ``{}`` when git has one."""
    env: dict[str, str] = {}
    for role in ("AUTHOR", "COMMITTER"):
        known = subprocess.run(["git", "var", f"GIT_{role}_IDENT"], capture_output=True, check=False)
        if known.returncode != 0:
            for part, value in FALLBACK_IDENTITY.items():
                env[f"GIT_{role}_{part}"] = os.environ.get(f"GIT_{role}_{part}") or value
    return env


def dvc_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``dvc repro ARGS``, or ``dvc exp run ARGS[1:]`` when ``ARGS[0]`` is ``exp`` (with :func:`git_identity_env`);
    the command and the environment it adds."""
    if not args or args[0] != "exp":
        return [_dvc(), "repro", *args], {}
    extra = git_identity_env()
    if extra:
        print(
            f"pipeline: git has no user identity here: the experiment commit is made as "
            f"{FALLBACK_IDENTITY['NAME']} <{FALLBACK_IDENTITY['EMAIL']}> "
            '(set yours: git config user.name "NAME" && git config user.email "EMAIL")',
            file=sys.stderr,
            flush=True,
        )
    return [_dvc(), "exp", "run", *args[1:]], extra


def run_child(
    cmd: list[str], stop_timeout_s: float = CHILD_STOP_TIMEOUT_S, extra_env: dict[str, str] | None = None
) -> int:
    """Run ``cmd`` to completion in its own process group; on interrupt stop the whole group (:func:`stop_group`)
    and re-raise.

    Its own group: Ctrl-C in a terminal reaches this process only, which then stops ``dvc`` and the stage it
    runs together; otherwise the stage (never signalled, or signalled while its Prefect API goes away) would
    be left training on, holding the workspace lock. Should this process be killed outright (SIGKILL, the OOM
    killer), a guard process stops the group instead: the guard of :func:`flows.prefect_server.shared_api`'s
    server when there is one (told the group's id: it stops the group before the server), else one started here.
    """
    shared = active_guard()
    proc = subprocess.Popen(cmd, env=child_env() | (extra_env or {}), start_new_session=True)
    guard = None
    if shared is not None:
        shared.stage_group(proc.pid)
    else:
        root = dvc_root()
        guard = subprocess.Popen(
            [sys.executable, "-I", GUARD, str(os.getpid()), str(stop_timeout_s), "--group", str(proc.pid)]
            + (["--dvc-root", str(root)] if root else []),
            start_new_session=True,
            preexec_fn=guard_preexec,
            stdin=subprocess.PIPE,  # held open here: EOF tells the guard the runner is gone
        )
    try:
        return proc.wait()
    except KeyboardInterrupt:
        stop_group(proc, stop_timeout_s)
        raise
    finally:
        if shared is not None:
            shared.stage_group(None)
        else:
            assert guard is not None
            guard.kill()  # the group is done (or stopped): nothing left to guard
            guard.wait()
            assert guard.stdin is not None
            guard.stdin.close()


def stop_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM ``proc``'s process group (``dvc`` and the running stage: the stage stops after its current task,
    checkpointed, its Prefect and MLflow runs ended), wait up to ``timeout_s`` for every process in it to exit,
    then SIGKILL what is left. A second Ctrl-C while waiting kills at once."""
    print(
        f"pipeline: stopping the running stage (up to {timeout_s:.0f} s: it finishes its current task; "
        "Ctrl-C again to kill it now)",
        file=sys.stderr,
        flush=True,
    )
    stop_process_group(proc.pid, timeout_s, poll=proc.poll)  # (poll reaps dvc itself)
    proc.wait()
    root = dvc_root()
    if root is not None:  # a dvc killed in the group leaves its entries in .dvc/tmp/rwlock
        prune_rwlock(root)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    start = time.monotonic()
    try:
        given = os.environ.get(
            "PREFECT_API_URL"
        )  # exported, the profile's or a running server's (flows.environment)
        with sigterm_as_interrupt(), shared_api() as api_url:
            how = "in use" if given else f"started in {time.monotonic() - start:.1f} s"
            print(f"pipeline: Prefect API {api_url} ({how})", flush=True)
            cmd, extra_env = dvc_command(args)
            rc = run_child(cmd, extra_env=extra_env)
            if rc != 0:
                what = "exp run" if cmd[1] == "exp" else "repro"
                print(
                    f"pipeline: `dvc {what}` failed (exit {rc}); fix the error above and rerun",
                    file=sys.stderr,
                )
                return rc
            return summary.main()
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C: 130; SIGTERM: 143, as a stage stopped by SIGTERM exits
        print(
            "pipeline: interrupted; the Prefect server is stopped. Rerun `make run` to resume.",
            file=sys.stderr,
        )
        return 143 if isinstance(exc, Terminated) else 130


if __name__ == "__main__":
    raise SystemExit(main())
