"""Prefect flows, one per DVC stage, and the ``codea1`` CLI.

Importing this package applies the process defaults of :mod:`flows.environment` first, before any flow
module imports Prefect, MLflow or Great Expectations (Prefect reads its settings once, at import).
"""

from flows import environment as _environment

_environment.apply()
