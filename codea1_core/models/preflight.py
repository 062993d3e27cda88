"""Checks of a loaded config against this machine and the model files it names, before any model work.

What it does: :func:`check_models` raises :class:`~codea1_core.config.ConfigError` in one line naming the key
and the fix for what would fail minutes later: ``model.device`` naming a CUDA device this torch cannot see, a
generation budget (``rollout.max_new_tokens_*``, ``eval.max_new_tokens``) above the model's context, and a Hub
id in ``model.code_path``/``model.test_path`` that is neither in the Hugging Face cache nor reachable (offline:
``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``, or no route to the Hub).
Cheap: torch is imported only when ``model.device`` names CUDA, ``huggingface_hub`` only for a Hub id, and the
Hub probe is one TCP connect with a short time-out instead of the loader's minutes of retries.
What it does not: load a model, check a local folder's contents (``flows/train_run.py``'s
``check_model_path`` says a missing warm start), or check prompts' actual lengths (the rollout does).

Run: ``pytest tests/core/models/test_preflight.py``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from codea1_core.config import Config, ConfigError

WARMSTART_DIR = Path("outputs/warmstart")
"""Where the warmstart stage builds the lab's models from ``lab.*`` (``flows/warmstart.py``)."""
HUB_PROBE_TIMEOUT_S = 3.0
"""How long the Hub's host may take to accept a connection before it counts as unreachable."""
_TRUE = ("1", "true", "yes", "on")


def check_models(cfg: Config, roles: tuple[str, ...], *, hub: bool = True) -> None:
    """Device, generation budgets and (``hub``) model sources of ``roles`` (``code``/``test``)."""
    check_device(cfg.model.device)
    for role in roles:
        path = role_path(cfg, role)
        if hub:
            check_model_source(path, f"model.{role}_path")
        check_budgets(cfg, role, path)


def role_path(cfg: Config, role: str) -> str:
    """The start model of ``role``; in ``selfplay`` the Code LLM plays both roles (docs/method.md D10)."""
    return cfg.model.code_path if role == "code" or cfg.mode == "selfplay" else cfg.model.test_path


def check_device(device: str) -> None:
    """``cuda`` / ``cuda:N`` must be a device this torch sees (``auto`` and ``cpu`` always are)."""
    if not device.startswith("cuda"):
        if device not in ("auto", "cpu"):
            raise ConfigError(f"model.device: {device!r} is not auto, cpu, cuda or cuda:N")
        return
    index_text = device.removeprefix("cuda").removeprefix(":") or "0"
    if not index_text.isdigit():
        raise ConfigError(f"model.device: {device!r} is not auto, cpu, cuda or cuda:N")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        why = (
            "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        )
        raise ConfigError(f"model.device={device}: {why}: use model.device=auto or cpu")
    if int(index_text) >= count:
        raise ConfigError(f"model.device={device}: only {count} CUDA device(s) (cuda:0..cuda:{count - 1})")


def _is_hub_id(path: str) -> bool:
    """``org/name`` that is not a folder here: what ``from_pretrained`` would fetch from the Hub."""
    return not (
        Path(path).is_absolute() or path.startswith(".") or path.count("/") != 1 or Path(path).exists()
    )


def _is_warmstart(path: str) -> bool:
    resolved, root = Path(path).expanduser().resolve(), WARMSTART_DIR.resolve()
    return resolved.is_relative_to(root) and resolved != root


def _cached_config(path: str) -> str | None:
    """The Hub model's ``config.json`` in the local Hugging Face cache, if there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(path, "config.json")
    return found if isinstance(found, str) else None


def check_model_source(path: str, key: str) -> None:
    """A Hub id must be in the Hugging Face cache or its host reachable now: else one line saying how to
    supply the weights offline. Local folders and the lab's warm start are left to the stages."""
    if _is_warmstart(path) or not _is_hub_id(path) or _cached_config(path):
        return
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    offline = next(
        (v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(v, "") in _TRUE), ""
    )
    why = f"{offline} is set" if offline else _unreachable(host, urlparse(constants.ENDPOINT).port or 443)
    if not why:
        return
    raise ConfigError(
        f"{key}={path}: not a local folder, not in the Hugging Face cache ({constants.HF_HUB_CACHE}), and {why}: "
        f"on a machine with network run `huggingface-cli download {path} --local-dir models/{path.split('/')[1]}`, "
        f"copy that folder here and set {key}=models/{path.split('/')[1]} (or copy the cache to HF_HOME)"
    )


def _unreachable(host: str, port: int) -> str:
    """Why ``host:port`` cannot be reached (empty when it accepts a connection within the time-out)."""
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S):
            return ""
    except OSError as exc:
        return f"{host} cannot be reached ({exc.strerror or type(exc).__name__})"


def model_context(cfg: Config, path: str) -> tuple[int, str] | None:
    """(context length in tokens, where it was read) of the model at ``path``: ``lab.max_position_embeddings``
    for the lab's warm start, else ``max_position_embeddings`` of its ``config.json`` (a local folder or the
    Hugging Face cache); None when unknown here."""
    if _is_warmstart(path):
        return cfg.lab.max_position_embeddings, "lab.max_position_embeddings"
    local = Path(path) / "config.json"
    found = str(local) if local.is_file() else (_cached_config(path) if _is_hub_id(path) else None)
    if found is None:
        return None
    try:
        data: Any = json.loads(Path(found).read_text(encoding="utf-8"))
        value = data.get("max_position_embeddings") or data.get("text_config", {}).get(
            "max_position_embeddings"
        )
    except (OSError, ValueError, AttributeError):
        return None
    return (int(value), f"{path}/config.json") if isinstance(value, int) and value > 0 else None


def check_budgets(cfg: Config, role: str, path: str) -> None:
    """No generation budget of ``role`` may exceed its model's context: the decode sizes its buffers for the
    whole budget, and tokens past the context are ones the model was never built to attend over. A budget
    equal to the context is let through: the default ``eval.max_new_tokens`` equals a 1,024-token model's.
    """
    found = model_context(cfg, path)
    if found is None:
        return
    context, where = found
    keys = [f"rollout.max_new_tokens_{role}", "eval.max_new_tokens"]
    flat = cfg.flat()
    for key in keys:
        if flat[key] > context:
            raise ConfigError(
                f"{key}={flat[key]}: above model.{role}_path's context of {context} tokens ({where}): set it "
                f"to at most {context} minus the longest prompt"
            )
