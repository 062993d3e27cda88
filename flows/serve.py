"""``codea1 serve``: serve the Prefect deployments (train, evaluate, pipeline) from this process, so runs can be
started and scheduled from the Prefect UI.

What it does: builds the deployments of ``flows/deploy.py`` (:func:`flows.deploy.build_deployments`, the one
place they are defined: ``train/codea1-train``, ``evaluate/codea1-evaluate``, ``pipeline/codea1-pipeline``) —
the same flows the DVC stages run, with the parameters every flow takes (``params``, ``overrides``, e.g.
``["mode=golden"]``) plus ``run_dir`` (default ``"auto"``: each run writes to its own ``runs/<flow run
name>-<id>/``, never into the DVC workspace) — and serves them, optionally training on a cron schedule (Ctrl-C
stops serving; schedules pause on shutdown).
What it does not: start the Prefect server (``codea1 ui`` or ``prefect server start`` does; point
``PREFECT_API_URL`` at it), or run anything by itself. ``codea1 deploy`` puts the same deployments on a work pool.

Run::

    prefect server start &                       # or: codea1 ui
    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.serve [--params params.yaml] [--cron "0 3 * * *"]
    # then: prefect deployment run 'train/codea1-train' -p overrides='["mode=golden", "reward.alpha=0.25"]'
"""

from __future__ import annotations

import argparse

from flows.common import run_user_errors
from flows.deploy import build_deployments


def parser() -> argparse.ArgumentParser:
    """The options of ``codea1 serve`` (also shown by ``codea1 serve --help``)."""
    p = argparse.ArgumentParser(
        prog="codea1 serve",
        description="Serve the train / evaluate / pipeline deployments for the Prefect UI",
    )
    p.add_argument("--params", default="params.yaml", help="params file passed to every run")
    p.add_argument("--cron", default=None, help='optional schedule for training, e.g. "0 3 * * *"')
    p.add_argument("--limit", type=int, default=1, help="concurrent runs (default 1: one GPU/CPU budget)")
    p.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse args, build the deployments and serve them until interrupted."""
    args = parser().parse_args(argv)

    def go() -> None:
        from prefect import serve

        deployments = build_deployments(args.params, args.overrides, args.cron)
        print(f"serving {', '.join(d.name for d in deployments)}; start runs from the Prefect UI")
        serve(*deployments, limit=args.limit)

    return run_user_errors(go)


if __name__ == "__main__":
    raise SystemExit(main())
