"""Tools built on the pipeline, not part of it: ``make lab-compare``, ``make readme-numbers``, ``codea1 ui``.

The top layer: a tool may import ``flows`` (and everything below); nothing in ``codea1_core``, ``sandbox``,
``tasks`` or ``flows`` imports a tool, except ``flows.cli`` (the console script, the front door) which
dispatches ``codea1 ui`` here. Importing this package imports :mod:`flows` first, so every
``python -m tools.<name>`` gets the entry-point process defaults (:mod:`flows.environment`) before anything
loads Prefect, MLflow or Great Expectations.
"""

import flows  # noqa: F401  (the entry-point process defaults, before Prefect and MLflow load)
