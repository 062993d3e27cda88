"""The Code LLM's warm-start data covers many parameter sets per family (else seeds spread).

Bug guarded: the warm start trained on the 12 training problems per family, 4 conversations each. The tiny
model could memorize those 12 constants instead of learning to copy the prompt's constants into the code,
and whether it learned to copy depended on the seed (held-out pass@1 6 -> 27 across seeds; seed 3's
samples carried training constants). The warm start now sees fresh parameter sets, never evaluated on.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from codea1_core.config import Config, ConfigError, load_config
from codea1_core.data.lab import check_lab_config, lab_problems, warmstart_code_problems
from codea1_core.data.warmstart_data import warmstart_examples

REPO = Path(__file__).resolve().parents[3]


def _key(problem) -> tuple[str, str]:
    return problem.metadata["family"], repr(sorted(problem.metadata["params"].items()))


WIDE = ["lab.warmstart_code_problems_per_family=48", "lab.warmstart_code_examples_per_problem=1"]
"""The wider warm start (``params.yaml``'s default since the 5-seed measurement)."""


def test_wide_warm_start_covers_fresh_parameter_sets_never_evaluated():
    lab_cfg = load_config(REPO / "params.yaml", WIDE).lab
    train = lab_problems(lab_cfg, "train")
    problems = warmstart_code_problems(lab_cfg, train)
    wanted = lab_cfg.warmstart_code_problems_per_family
    assert wanted > lab_cfg.train_per_family
    assert problems[: len(train)] == train  # the training problems stay, unchanged
    per_family = Counter(p.metadata["family"] for p in problems)
    assert set(per_family.values()) == {wanted}
    assert len({_key(p) for p in problems}) == len(problems)  # every parameter set distinct
    assert len({p.id for p in problems}) == len(problems)
    evaluated = {_key(p) for split in ("val", "test") for p in lab_problems(lab_cfg, split)}
    assert not evaluated & {_key(p) for p in problems}
    # One conversation per parameter set: the SFT sees each constant once per epoch, not 4 times.
    examples = warmstart_examples(problems, "code", lab_cfg, seed=1)
    assert len(examples) == len(problems) * lab_cfg.warmstart_code_examples_per_problem


def test_zero_or_small_keeps_the_training_problems():
    lab_cfg = load_config(REPO / "params.yaml", WIDE).lab
    train = lab_problems(lab_cfg, "train")
    for n in (0, lab_cfg.train_per_family):
        assert warmstart_code_problems(replace(lab_cfg, warmstart_code_problems_per_family=n), train) == train


def test_too_many_parameter_sets_name_the_key():
    lab_cfg = load_config(REPO / "params.yaml", []).lab
    big = replace(lab_cfg, warmstart_code_problems_per_family=500)
    with pytest.raises(ConfigError, match=r"lab\.warmstart_code_problems_per_family"):
        warmstart_code_problems(big, [])
    with pytest.raises(ConfigError, match=r"lab\.warmstart_code_problems_per_family"):
        check_lab_config(big)
    with pytest.raises(ConfigError, match=r"lab\.warmstart_code_problems_per_family"):
        Config.from_dict({"lab": {"warmstart_code_problems_per_family": -1}})


def test_warmstart_stage_feeds_the_extra_problems_to_the_code_role_only(tmp_path, monkeypatch):
    """The stage itself (not only the helper) trains the Code LLM on the wider set; the Test LLM keeps its data."""
    pytest.importorskip("transformers")
    import codea1_core.models.sft
    from flows import warmstart

    seen: dict[str, list[dict]] = {}

    def capture(base, examples, out_dir, **kwargs):
        seen[Path(out_dir).name] = examples
        return {"train_loss": 0.0}

    monkeypatch.setattr(codea1_core.models.sft, "supervised_finetune", capture)
    monkeypatch.setattr(warmstart, "_param_count", lambda model_dir: 0)
    lab = {"families": ["is_above", "first_or"], "train_per_family": 2, "heldout_per_family": 1,
           "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "vocab_size": 512,
           "warmstart_code_examples_per_problem": 1, "warmstart_test_examples_per_problem": 1,
           "warmstart_code_problems_per_family": 5}
    root = tmp_path / "ws"
    model = {"code_path": str(root / "code"), "test_path": str(root / "test")}
    cfg = Config.from_dict({"mode": "codea1", "lab": lab, "model": model, "tracking": {"backend": "null"},
                            "data": {"prepared_dir": str(tmp_path / "none")}})
    metrics = warmstart.warm_start(cfg, root=root)
    prompts = {role: {ex["messages"][-2]["content"] for ex in seen[role]} for role in ("code", "test")}
    assert len(seen["code"]) == 2 * 5 and len(prompts["code"]) == 2 * 5  # 5 distinct problems per family
    assert len(seen["test"]) == 2 * 2  # the Test LLM: the training problems
    assert metrics["code/n_examples"] == 10


def test_the_default_warm_start_copies_constants_from_many_parameter_sets():
    """The default run trains the Code LLM on 48 parameter sets per family, once each per epoch, for 12 epochs:
    the setting measured across 5 seeds; the 12 training sets x 4 left seed 3 at 2.7."""
    lab_cfg = load_config(REPO / "params.yaml", []).lab
    train = lab_problems(lab_cfg, "train")
    problems = warmstart_code_problems(lab_cfg, train)
    assert len(problems) == 48 * len({p.metadata["family"] for p in train})
    assert problems[: len(train)] == train
    assert lab_cfg.warmstart_code_examples_per_problem == 1 and lab_cfg.warmstart_code_epochs == 12
