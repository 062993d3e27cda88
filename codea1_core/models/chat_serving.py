"""The ``python_function`` flavour of a registered codea1 model: chat messages in, the role's answer out.

What it does: ``mlflow models serve -m models:/codea1-code@champion`` (and ``mlflow.pyfunc.load_model``) load
this module as the model's pyfunc loader (:func:`_load_pyfunc`). A request's chat messages are put in the
role's own prompt format (the training prompts, docs/method.md §4: the role's system line, and the code role's
instruction and ``Question:`` section around the user's text, or the Test LLM's black-box sections), rendered
with the tokenizer's chat template (else the plain ``Role:`` form of :func:`codea1_core.method.prompts.render_plain`)
and answered with ``max_new_tokens`` / ``temperature`` (the model's params schema; a value out of range or a
name that is not one of them is refused with one line, :func:`checked_params`). Each answer is ``{"text": the
completion, "code": its first fenced code block (else the whole text)}``.

Unknown names: MLflow's pyfunc keeps only the params schema's names and logs the others as a warning
(``Unrecognized params [...] are ignored for inference``, ``mlflow.models.utils``) before ``predict`` runs, for
``mlflow models serve`` and ``mlflow.pyfunc.load_model`` alike, and has no setting that refuses them instead.
:func:`_load_pyfunc` therefore adds a logging filter to that logger (:class:`DroppedParams`) that notes the
dropped names for the prediction under way, and ``predict`` refuses them. The warning is still logged. This
check relies on that warning: with MLflow's log level above WARNING (``MLFLOW_LOGGING_LEVEL=ERROR``) no record
is made and an unknown name is dropped as MLflow drops it.

What it does not: import mlflow, prefect or the rest of this project. The file is copied into every logged
model (``code/``), so a model served outside this checkout needs only torch and transformers; the prompt
template comes from the model's ``model_config`` (written from :mod:`codea1_core.method.prompts` at
registration: :func:`tracking.packaging.add_chat_flavour`), not from here.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
from contextvars import ContextVar
from typing import Any, cast

DEFAULT_PARAMS = {"max_new_tokens": 256, "temperature": 0.0}
MLFLOW_PARAMS_LOGGER = "mlflow.models.utils"
"""The logger of MLflow's params-schema check, whose warning names the parameters it drops."""
_DROPPED_WARNING = re.compile(r"Unrecognized params (\[.*\]) are ignored for inference", re.DOTALL)
_dropped: ContextVar[tuple[object, tuple[str, ...]]] = ContextVar("codea1_dropped_params", default=(None, ()))
_FENCE = re.compile(r"(`{3,})[ \t]*([\w+-]*)[^\n]*\n(.*?)\n?\1", re.DOTALL)
_ENTRY = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def first_code_block(text: str) -> str:
    """The first fenced block tagged python (else the first fenced block), else the whole text, stripped."""
    blocks = _FENCE.findall(text)
    for wanted in (lambda tag: tag.lower() in ("python", "py", "python3"), lambda tag: True):
        for _, tag, body in blocks:
            if wanted(tag):
                return body.strip()
    return text.strip()


def role_messages(messages: list[dict[str, str]], config: dict[str, Any]) -> list[dict[str, str]]:
    """``messages`` in the role's prompt format: the role's system line first unless the caller sent one; the
    last user message put into the role's user template (``{content}``, ``{entry_point}``: the first
    ``def name(`` in it, else ``f``)."""
    out = [dict(m) for m in messages]
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user" and config.get("user_template"):
            content = str(out[i].get("content", ""))
            found = _ENTRY.search(content)
            text = config["user_template"].replace("{entry_point}", found.group(1) if found else "f")
            out[i]["content"] = text.replace("{content}", content.strip())
            break
    if not out or out[0].get("role") != "system":
        out.insert(0, {"role": "system", "content": config.get("system", "")})
    return out


def render(tokenizer: Any, messages: list[dict[str, str]], use_chat_template: bool) -> str:
    """The prompt text for ``messages``: the tokenizer's chat template when it has one, else plain turns."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = [f"{m['role'].capitalize()}:\n{m['content']}" for m in messages]
    return "\n\n".join(parts) + "\n\nAssistant:\n"


def checked_params(params: dict[str, Any] | None, dropped: tuple[str, ...] = ()) -> dict[str, Any]:
    """``params`` over :data:`DEFAULT_PARAMS`, checked: a name not among them (in ``params`` or in ``dropped``,
    the names MLflow took out of the request: :func:`dropped_params`), ``max_new_tokens`` not an integer >= 1 or
    ``temperature`` not a number >= 0 is refused with one line (:func:`bad_request`)."""
    given = {k: v for k, v in (params or {}).items() if v is not None}
    unknown = sorted((set(given) | set(dropped)) - set(DEFAULT_PARAMS))
    if unknown:
        raise bad_request(f"unknown parameter {unknown[0]!r}: the parameters are {', '.join(DEFAULT_PARAMS)}")
    p = {**DEFAULT_PARAMS, **given}
    tokens, temperature = p["max_new_tokens"], p["temperature"]
    if isinstance(tokens, bool) or not isinstance(tokens, int | float) or tokens != int(tokens) or tokens < 1:
        raise bad_request(f"max_new_tokens={tokens!r}: expected an integer >= 1")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature >= 0:
        raise bad_request(f"temperature={temperature!r}: expected a number >= 0 (0: greedy)")
    return {"max_new_tokens": int(tokens), "temperature": float(temperature)}


def bad_request(message: str) -> Exception:
    """The error for a bad request: MLflow's ``MlflowException`` (INVALID_PARAMETER_VALUE, an HTTP 400 whose
    body is the message, no stack trace) when MLflow serves or loads the model, else ``ValueError``.

    Why through ``sys.modules``: whoever serves the model has imported ``mlflow.exceptions`` already, and this
    file imports nothing of MLflow (it is copied into every logged model and loads with torch and transformers
    alone); any other exception type becomes MLflow's generic 400 with the server's stack trace."""
    host = sys.modules.get("mlflow.exceptions")
    if host is None:
        return ValueError(message)
    return cast(Exception, host.MlflowException.invalid_parameter_value(message))


def _prediction_context() -> object:
    """MLflow's context of the prediction under way (one per ``PyFuncModel.predict`` call), else ``None``."""
    host = sys.modules.get("mlflow.pyfunc.context")
    return host.get_prediction_context() if host is not None else None


class DroppedParams(logging.Filter):
    """Notes the parameter names MLflow's params-schema check drops, for :func:`dropped_params`.

    Added to :data:`MLFLOW_PARAMS_LOGGER` by :func:`_load_pyfunc`; it passes every record on (the warning is
    still logged). The note is kept in a context variable with MLflow's prediction context, so it reaches only
    the ``predict`` of the same call: a call that MLflow refuses after its warning (a bad value beside the
    unknown name) leaves nothing for the next one."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Note the names a record of MLflow's dropped-params warning lists; keep every record."""
        found = _DROPPED_WARNING.search(record.getMessage())
        if found:
            try:
                names = tuple(sorted(str(name) for name in ast.literal_eval(found.group(1))))
            except (ValueError, SyntaxError):  # a name that breaks the list's repr: name the whole list
                names = (found.group(1),)
            _dropped.set((_prediction_context(), names))
        return True


_LISTENER = DroppedParams()


def dropped_params() -> tuple[str, ...]:
    """The names MLflow dropped from this prediction's params (noted by :class:`DroppedParams`), once."""
    context, names = _dropped.get()
    _dropped.set((None, ()))
    return names if context is not None and context is _prediction_context() else ()


class ChatModel:
    """What :func:`_load_pyfunc` returns: ``predict(model_input, params)`` as MLflow's pyfunc calls it."""

    def __init__(self, path: str, config: dict[str, Any]) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path)
        self.model.eval()

    def _rows(self, model_input: Any) -> list[list[dict[str, str]]]:
        if hasattr(model_input, "to_dict"):  # a DataFrame with a ``messages`` column
            return [list(m) for m in model_input["messages"]]
        if isinstance(model_input, dict):
            return [list(model_input["messages"])]
        return [list(row["messages"]) for row in model_input]

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """Answer each chat request (``max_new_tokens``/``temperature`` from ``params``): its text and code."""
        import torch

        p = checked_params(params, dropped_params())
        answers = []
        for messages in self._rows(model_input):
            msgs = [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in messages]
            prompt = render(self.tokenizer, role_messages(msgs, self.config), self.config.get("chat", True))
            ids = self.tokenizer(prompt, return_tensors="pt")
            sample = float(p["temperature"]) > 0
            kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": int(p["max_new_tokens"])}
            if sample:
                kwargs["temperature"] = float(p["temperature"])
            with torch.no_grad():
                out = self.model.generate(
                    **ids, **kwargs, pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
                )
            # one sequence of ids decodes to one str
            text = cast(
                str, self.tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
            )
            answers.append({"text": text, "code": first_code_block(text)})
        return answers


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> ChatModel:
    """MLflow's pyfunc entry point (``loader_module``): ``data_path`` is the model's HF folder. Unknown
    parameter names are noted from here on (:class:`DroppedParams`; adding the same filter twice is a no-op)."""
    logging.getLogger(MLFLOW_PARAMS_LOGGER).addFilter(_LISTENER)
    return ChatModel(data_path, dict(model_config or {}))
