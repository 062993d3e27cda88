"""A trained model as an MLflow model: the ``transformers`` flavour plus a chat ``python_function`` flavour.

What it does: :func:`save_transformers_model` writes an exported Hugging Face folder as an MLflow
``transformers`` model (text-generation pipeline; our model card, given pip requirements, the tokenizer also
beside the weights) and :func:`add_chat_flavour` makes it servable as a chat model (``mlflow models serve``:
messages in, ``text`` and ``code`` out) with the role's training prompt format (:func:`chat_config`).
What it does not: log or register it (``tracking.runs.MlflowTracker.register``, ``tracking.registry``).

Tests: ``pytest tests/tracking/test_packaging.py``; serving in ``tests/core/models/test_model_serving.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracking.registry import MODEL_NAMES

MODEL_CARD = """---
tags: [codea1, code-generation]
---
# {name}

The {role} LLM of a codea1 (Code-A1) co-evolution run, iteration {step}. Load it with
`mlflow.transformers.load_model("models:/{name}@champion")`, or download it and use
`AutoModelForCausalLM.from_pretrained(<download>/model)` (the tokenizer is in the same folder).
"""


def save_transformers_model(model_dir: str | Path, out: Path, role: str, step: int) -> Path:
    """An MLflow ``transformers``-flavour model (text-generation pipeline) in ``out`` from an HF model dir.

    Offline and quiet: the model card is ours (no Hub lookup), pip requirements are given (no probing of
    every installed package), and the tokenizer files are copied next to the weights too, so a download's
    ``model/`` folder also loads with plain ``from_pretrained``.
    """
    import shutil

    import mlflow.transformers
    from huggingface_hub import ModelCard
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    name = MODEL_NAMES[role]
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars stay off the console
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        mlflow.transformers.save_model(
            transformers_model={"model": model, "tokenizer": tokenizer},
            path=str(out),
            task="text-generation",
            pip_requirements=["torch", "transformers"],
            model_card=ModelCard(MODEL_CARD.format(name=name, role=role, step=step)),
        )
    finally:
        if was:
            hf_logging.enable_progress_bar()
    for item in (out / "components" / "tokenizer").iterdir():
        shutil.copy2(item, out / "model" / item.name)
    add_chat_flavour(out, role)
    return out


CHAT_LOADER = "codea1_chat_serving"
"""The pyfunc loader module's name inside a logged model (``code/``): :mod:`codea1_core.models.chat_serving`."""


def chat_config(role: str) -> dict[str, Any]:
    """The role's prompt format for serving, from the training prompts (§4): system line and user template."""
    from types import SimpleNamespace

    from codea1_core.method import prompts

    if role == "code":
        template = f"{prompts.CODE_INSTRUCTION}\n\nQuestion:\n{{content}}"
        return {"role": role, "system": prompts.CODE_SYSTEM, "user_template": template, "chat": True}
    stub = SimpleNamespace(entry_point="{entry_point}", description="{content}")
    messages = prompts.test_messages_blackbox(stub)  # type: ignore[arg-type]
    return {
        "role": role,
        "system": prompts.TEST_SYSTEM,
        "user_template": messages[1]["content"],
        "chat": True,
    }


def add_chat_flavour(out: Path, role: str) -> None:
    """Make a saved transformers-flavour model servable as a chat model (``mlflow models serve``).

    The ``transformers`` flavour stays (``mlflow.transformers.load_model`` still loads the pipeline); the
    ``python_function`` flavour is replaced by :mod:`codea1_core.models.chat_serving` (copied into ``code/``),
    with a signature (``messages`` in; ``text`` and ``code`` out), a params schema (``max_new_tokens``,
    ``temperature``) and the role's prompt format as its ``model_config``.
    """
    import shutil

    from mlflow.models import Model, ModelSignature
    from mlflow.types.schema import Array, ColSpec, DataType, Object, ParamSchema, ParamSpec, Property, Schema

    from codea1_core.models import chat_serving

    (out / "code").mkdir(exist_ok=True)
    shutil.copy2(chat_serving.__file__, out / "code" / f"{CHAT_LOADER}.py")
    model = Model.load(str(out / "MLmodel"))
    pyfunc = dict(model.flavors.get("python_function", {}))
    pyfunc.update(loader_module=CHAT_LOADER, code="code", data="model", model_config=chat_config(role))
    model.flavors["python_function"] = pyfunc
    message = Object([Property("role", DataType.string), Property("content", DataType.string)])
    model.signature = ModelSignature(
        inputs=Schema([ColSpec(Array(message), name="messages")]),
        outputs=Schema([ColSpec(DataType.string, name="text"), ColSpec(DataType.string, name="code")]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", DataType.long, chat_serving.DEFAULT_PARAMS["max_new_tokens"]),
                ParamSpec("temperature", DataType.double, chat_serving.DEFAULT_PARAMS["temperature"]),
            ]
        ),
    )
    model.save(str(out / "MLmodel"))
