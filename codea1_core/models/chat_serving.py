"""The ``python_function`` flavour of a registered codea1 model: chat messages in, the role's answer out.

What it does: ``mlflow models serve -m models:/codea1-code@champion`` (and ``mlflow.pyfunc.load_model``) load
this module as the model's pyfunc loader (:func:`_load_pyfunc`). A request's chat messages are put in the
role's own prompt format (the training prompts, docs/method.md §4: the role's system line, and the code role's
instruction and ``Question:`` section around the user's text, or the Test LLM's black-box sections), rendered
with the tokenizer's chat template (else the plain ``Role:`` form of :func:`codea1_core.method.prompts.render_plain`)
and answered with ``max_new_tokens`` / ``temperature`` (the model's params schema; a value out of range is
refused with one line, :func:`checked_params`). Each answer is ``{"text": the completion, "code": its first
fenced code block (else the whole text)}``.

What it does not: import mlflow, prefect or the rest of this project. The file is copied into every logged
model (``code/``), so a model served outside this checkout needs only torch and transformers; the prompt
template comes from the model's ``model_config`` (written from :mod:`codea1_core.method.prompts` at
registration: :func:`tracking.packaging.add_chat_flavour`), not from here.
"""

from __future__ import annotations

import re
from typing import Any, cast

DEFAULT_PARAMS = {"max_new_tokens": 256, "temperature": 0.0}
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


def checked_params(params: dict[str, Any] | None) -> dict[str, Any]:
    """``params`` over :data:`DEFAULT_PARAMS`, checked: a name not among them, ``max_new_tokens`` not an integer
    >= 1 or ``temperature`` not a number >= 0 is refused with one line (:func:`bad_request`)."""
    given = {k: v for k, v in (params or {}).items() if v is not None}
    unknown = sorted(set(given) - set(DEFAULT_PARAMS))
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
    import sys

    host = sys.modules.get("mlflow.exceptions")
    if host is None:
        return ValueError(message)
    return cast(Exception, host.MlflowException.invalid_parameter_value(message))


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

        p = checked_params(params)
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
    """MLflow's pyfunc entry point (``loader_module``): ``data_path`` is the model's HF folder."""
    return ChatModel(data_path, dict(model_config or {}))
