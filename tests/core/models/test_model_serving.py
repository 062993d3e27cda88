"""Registered models are servable chat models: ``mlflow models serve -m models:/codea1-code@champion``.

Regression: the registered versions' pyfunc was the transformers text-generation pipeline: served, it answered
usefully only to a hand-rendered chat-template string, ignored ``max_new_tokens`` (no params schema) and had
no signature. Now the ``python_function`` flavour takes chat messages, puts them in the role's own prompt
format and honours ``max_new_tokens`` / ``temperature``; the ``transformers`` flavour still loads
(``tests/tracking/test_packaging.py``). The serving test starts the real ``mlflow models serve`` on loopback.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support import free_port

from codea1_core.config import Config
from codea1_core.method.prompts import CODE_INSTRUCTION, CODE_SYSTEM, TEST_SYSTEM
from codea1_core.models.chat_serving import checked_params, first_code_block, role_messages
from tracking import registry
from tracking.packaging import add_chat_flavour, chat_config
from tracking.runs import MlflowTracker

REPO = Path(__file__).resolve().parents[3]
STUB = 'def add(a, b):\n    """Return a + b."""'


def test_code_role_messages_are_the_training_prompt() -> None:
    msgs = role_messages([{"role": "user", "content": STUB}], chat_config("code"))
    assert msgs == [
        {"role": "system", "content": CODE_SYSTEM},
        {"role": "user", "content": f"{CODE_INSTRUCTION}\n\nQuestion:\n{STUB}"},
    ]


def test_test_role_messages_name_the_function_and_keep_a_callers_system_line() -> None:
    msgs = role_messages([{"role": "user", "content": STUB}], chat_config("test"))
    assert msgs[0] == {"role": "system", "content": TEST_SYSTEM}
    assert "tests for the function `add`" in msgs[1]["content"] and STUB in msgs[1]["content"]
    own = role_messages(
        [{"role": "system", "content": "mine"}, {"role": "user", "content": "x"}], chat_config("code")
    )
    assert own[0] == {"role": "system", "content": "mine"} and len(own) == 2


def test_first_code_block() -> None:
    assert first_code_block("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1"
    assert first_code_block("no fence") == "no fence"


def test_params_are_checked_in_one_line() -> None:
    """Regression: ``max_new_tokens=-1`` reached ``generate`` (a stack trace in the 400) and an unknown parameter
    was silently ignored by a direct ``predict``."""
    assert checked_params(None) == {"max_new_tokens": 256, "temperature": 0.0}
    assert checked_params({"max_new_tokens": 8, "temperature": None}) == {
        "max_new_tokens": 8,
        "temperature": 0.0,
    }
    for bad, line in [
        ({"max_new_tokens": -1}, "max_new_tokens=-1: expected an integer >= 1"),
        ({"max_new_tokens": 2.5}, "max_new_tokens=2.5: expected an integer >= 1"),
        ({"max_new_tokens": "8"}, "max_new_tokens='8': expected an integer >= 1"),
        ({"temperature": -0.5}, "temperature=-0.5: expected a number >= 0 (0: greedy)"),
        ({"temperature": float("nan")}, "temperature=nan: expected a number >= 0 (0: greedy)"),
        ({"top_k": 5}, "unknown parameter 'top_k': the parameters are max_new_tokens, temperature"),
    ]:
        with pytest.raises(Exception) as info:
            checked_params(bad)
        assert str(info.value) == line


def _chat_model(tiny_model_dir: Path, out: Path) -> Path:
    """A model folder as registration writes it, less the ``transformers`` flavour: the HF folder in
    ``model/`` and the chat pyfunc flavour (:func:`tracking.packaging.add_chat_flavour`)."""
    import shutil

    from mlflow.models import Model

    shutil.copytree(tiny_model_dir, out / "model")
    Model().save(str(out / "MLmodel"))
    add_chat_flavour(out, "code")
    return out


def test_a_parameter_mlflow_drops_is_refused_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Regression: MLflow's pyfunc keeps only the params schema's names and logs the others as a warning, so
    ``{"max_new_tokenz": 5}`` was answered with the defaults; the loaded model refuses it, naming it and the
    parameters there are, and still answers a request without it."""
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    model = mlflow.pyfunc.load_model(str(_chat_model(tiny_model_dir, tmp_path / "chat")))
    chat = {"messages": [{"role": "user", "content": STUB}]}
    for params in ({"max_new_tokenz": 5}, {"max_new_tokens": 2, "top_k": 5}):
        with pytest.raises(MlflowException) as info:
            model.predict(chat, params=params)
        unknown = next(iter(set(params) - {"max_new_tokens"}))
        line = f"unknown parameter {unknown!r}: the parameters are max_new_tokens, temperature"
        assert info.value.message == line and info.value.get_http_status_code() == 400
    with pytest.raises(MlflowException, match="Invalid parameters"):  # MLflow's own check, after its warning
        model.predict(chat, params={"max_new_tokenz": 5, "max_new_tokens": "many"})
    (answer,) = model.predict(chat, params={"max_new_tokens": 2})  # no name left over from a refused call
    assert set(answer) == {"text", "code"}


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as response:
        return json.load(response)


def _post_status(url: str, body: dict) -> tuple[int, dict]:
    """The HTTP status and JSON body of a request the server may refuse."""
    try:
        return 200, _post(url, body)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def _serve(
    cfg: Config, cwd: Path, model_dir: Path, max_new_tokens: int = 6, params: tuple[dict, ...] = ()
) -> tuple[list[dict], list[tuple[int, dict]]]:
    """Register ``model_dir`` as the code champion, serve it with ``mlflow models serve``, ask for a chat; then
    the same chat with each of ``params``: the predictions and each of those answers (status, body)."""
    tracker = MlflowTracker(cfg)
    version = tracker.register("code", model_dir, 1)
    tracker.end()
    registry.set_alias(cfg, "codea1-code", version, "champion")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_REGISTRY_URI"}  # the one export a user makes:
    env |= {"MLFLOW_TRACKING_URI": cfg.tracking.tracking_uri, "PYTHONPATH": str(REPO)}
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    env["PATH"] = f"{mlflow_bin.parent}:{env.get('PATH', '')}"  # the venv active, as a user has it (uvicorn)
    cmd = [
        str(mlflow_bin),
        "models",
        "serve",
        "-m",
        "models:/codea1-code@champion",
        "--env-manager",
        "local",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
        "-w",
        "1",
    ]
    cwd.mkdir(exist_ok=True)
    log = cwd / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(1)
        body = {
            "inputs": {"messages": [{"role": "user", "content": STUB}]},
            "params": {"max_new_tokens": max_new_tokens},
        }
        url = f"http://127.0.0.1:{port}/invocations"
        answers = [_post_status(url, dict(body, params=p)) for p in params]
        return _post(url, body)["predictions"], answers
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited on its own
            os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.mark.e2e  # `mlflow models serve`, a server
def test_the_champion_is_served_as_a_chat_model(
    mlflow_cfg: Config, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    bad = ({"max_new_tokens": -1}, {"temperature": -1.0}, {"max_new_tokens": "many"}, {"max_new_tokenz": 5})
    predictions, refused = _serve(mlflow_cfg, tmp_path / "elsewhere", tiny_model_dir, params=bad)
    lines = [
        "max_new_tokens=-1: expected",
        "temperature=-1.0: expected",
        "max_new_tokens",
        "unknown parameter 'max_new_tokenz': the parameters are max_new_tokens, temperature",
    ]
    for (status, body), line in zip(refused, lines, strict=True):
        # a 400 naming the parameter, without the server's stack trace
        assert status == 400 and line in body["message"] and "stack_trace" not in body, (status, body)
    assert isinstance(predictions, list) and len(predictions) == 1, predictions
    answer = predictions[0]
    assert set(answer) == {"text", "code"}
    tokens = AutoTokenizer.from_pretrained(tiny_model_dir)(answer["text"], add_special_tokens=False)[
        "input_ids"
    ]
    assert len(tokens) <= 6, answer  # the params schema's max_new_tokens reached the model (random weights)
    assert not (tmp_path / "elsewhere" / "mlflow.db").exists(), "no stray store where it was served from"


TRAINED = REPO / "outputs" / "train" / "final" / "code"


@pytest.mark.slow
@pytest.mark.skipif(
    not (TRAINED / "config.json").is_file(), reason="no trained Code LLM: run `make run` first"
)
def test_the_trained_champion_answers_a_chat_with_a_parsable_function(
    mlflow_cfg: Config, tmp_path: Path
) -> None:
    answer = _serve(mlflow_cfg, tmp_path / "elsewhere", TRAINED, max_new_tokens=256)[0][0]
    tree = ast.parse(answer["code"])
    assert any(isinstance(node, ast.FunctionDef) for node in tree.body), answer


def test_the_experiment_opens_on_its_runs(mlflow_cfg: Config) -> None:
    """MLflow 3's UI opened the experiment on an empty GenAI overview: its kind tag makes it open on runs."""
    tracker = MlflowTracker(mlflow_cfg)
    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
