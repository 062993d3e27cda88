"""Bad values fail at load, in one line naming the dotted key.

Before, ``rollout.n_code=0``, ``reward.k=0``, a negative batch size or timeout, ``sandbox.workers=0`` failed
after 35-50 s of work with 110-200 lines; ``reward.alpha=2.0`` and ``rollout.temperature=-1`` were accepted;
an empty params file or ``data.epochs=-1`` exited 0 after 0 steps; ``grpo.lr=1e-6`` as a CLI override was
refused; ``tracking.backend: null`` (documented) was read as YAML null.
"""

from __future__ import annotations

import time

import pytest

from codea1_core.config import ConfigError, load_config
from flows.common import stage_main

BAD = [
    ("rollout.n_code=0", "rollout.n_code: must be >= 1, got 0"),
    ("rollout.n_tests=-2", "rollout.n_tests"),
    ("reward.k=0", "reward.k: must be >= 1"),
    ("reward.alpha=2.0", "reward.alpha: must be in [0, 1], got 2.0"),
    ("reward.alpha=-0.1", "reward.alpha"),
    ("rollout.temperature=-1", "rollout.temperature: must be > 0"),
    ("rollout.temperature=0", "rollout.temperature"),
    ("rollout.top_p=1.5", "rollout.top_p"),
    ("data.train_batch_size=-8", "data.train_batch_size"),
    ("data.epochs=-1", "data.epochs: must be >= 1"),
    ("data.epochs=0", "data.epochs"),
    ("sandbox.workers=0", "sandbox.workers"),
    ("sandbox.call_timeout_s=-2", "sandbox.call_timeout_s: must be > 0"),
    ("sandbox.program_cap_s=0", "sandbox.program_cap_s"),
    ("sandbox.max_infra_failure_frac=1.5", "sandbox.max_infra_failure_frac"),
    ("tests.max_rejected_frac=-1", "tests.max_rejected_frac"),
    ("grpo.lr=0", "grpo.lr"),
    ("grpo.lr=.nan", "grpo.lr"),
    ("eval.n_samples=0", "eval.n_samples"),
    ("eval.k_list=[1, 0]", "eval.k_list[1]: must be >= 1"),
    ("eval.k_list=[]", "eval.k_list: must not be empty"),
    ("data.train_sources=[]", "data.train_sources: must not be empty"),
    ("orchestration.keep_checkpoints=0", "orchestration.keep_checkpoints"),
    ("mistake_book.top_k=0", "mistake_book.top_k"),
]


@pytest.mark.parametrize("override, message", BAD)
def test_out_of_range_values_name_the_dotted_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config("params.yaml", [override])


@pytest.mark.parametrize("override, message", BAD[:4])
def test_a_stage_refuses_them_in_one_line_before_any_work(tmp_path, capsys, override, message):
    ran = []
    t0 = time.perf_counter()
    rc = stage_main(ran.append, "test", ["--params", "params.yaml", override])
    err = capsys.readouterr().err
    assert rc == 2 and ran == [] and time.perf_counter() - t0 < 5
    assert err.count("\n") == 1 and message.split(":")[0] in err and "Traceback" not in err


def test_the_defaults_and_the_shipped_params_are_in_range():
    load_config("params.yaml")
    load_config("configs/qwen2.5-coder-1.5b.yaml")


def test_exponent_floats_are_accepted_as_cli_overrides_but_yaml_files_still_say_why(tmp_path):
    assert load_config("params.yaml", ["grpo.lr=1e-6"]).grpo.lr == 1e-6
    assert load_config("params.yaml", ["sandbox.float_abs_tol=1E-9"]).sandbox.float_abs_tol == 1e-9
    assert load_config("params.yaml", ["tracking.experiment=1e5"]).tracking.experiment == "1e5"  # a str key
    bad = tmp_path / "p.yaml"
    bad.write_text("grpo:\n  lr: 1e-6\n")
    with pytest.raises(ConfigError, match=r"grpo.lr: expected float.*write 1.0e-6"):
        load_config(bad)


def test_an_empty_params_file_is_an_error_naming_the_file(tmp_path):
    for text in ("", "# only a comment\n", "{}\n"):
        empty = tmp_path / "params.yaml"
        empty.write_text(text)
        with pytest.raises(ConfigError, match=rf"{empty}: empty"):
            load_config(empty)


def test_tracking_backend_null_unquoted_means_the_null_tracker(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("tracking:\n  backend: null\n")
    assert load_config(path).tracking.backend == "null"
    assert load_config("params.yaml", ["tracking.backend=null"]).tracking.backend == "null"


def test_a_config_with_no_training_step_is_refused_before_the_flow(tmp_path, capsys):
    """Bug guarded: an ``epochs``/batch combination with 0 steps exited 0 and exported the warm start
    as "final"."""
    from flows.train import run

    params = tmp_path / "params.yaml"
    params.write_text(
        f"data:\n  train_batch_size: 100000\norchestration:\n  checkpoint_dir: {tmp_path}/t\n"
        "rollout:\n  max_new_tokens_code: 96\n  max_new_tokens_test: 128\n"  # the lab's 1,024-token context
    )
    t0 = time.perf_counter()
    assert stage_main(run, "train", ["--params", str(params)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # before it: the warning that the lab problems are built in memory
    assert last.startswith("error: no training step") and "data.train_batch_size=100000" in last
    assert "Traceback" not in err
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "t" / "final").exists()
