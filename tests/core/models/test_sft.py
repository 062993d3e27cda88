"""Supervised fine-tuning with TRL's SFTTrainer: answer-only loss, atomic output, clear input errors."""

from __future__ import annotations

import pytest
import torch

from codea1_core.models.sft import _to_prompt_completion, supervised_finetune
from codea1_core.models.tiny_model import build_tiny_model

ANSWERS = ["def inc(x):\n    return x + 1\n", "def neg(x):\n    return -x\n"]
EXAMPLES = [
    {
        "messages": [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    }
    for question, answer in zip(["Increment x.", "Negate x."], ANSWERS, strict=True)
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    corpus = ANSWERS * 20 + ["Increment x.", "Negate x.", "You write Python."] * 20
    return build_tiny_model(tmp_path_factory.mktemp("sft") / "base", corpus, vocab_size=300, seed=0)


def _mean_logprobs(model_dir) -> list[tuple[float, float]]:
    """Per example: (mean log-prob of the prompt tokens, mean log-prob of the answer tokens incl. <|im_end|>)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = (
        AutoTokenizer.from_pretrained(model_dir),
        AutoModelForCausalLM.from_pretrained(model_dir).eval(),
    )
    out = []
    for ex in EXAMPLES:
        prompt = tok.apply_chat_template(ex["messages"][:2], tokenize=False, add_generation_prompt=True)
        n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
        ids = torch.tensor(
            [
                tok(tok.apply_chat_template(ex["messages"], tokenize=False), add_special_tokens=False)[
                    "input_ids"
                ]
            ]
        )
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append((float(lp[: n_prompt - 1].mean()), float(lp[n_prompt - 1 :].mean())))
    return out


def test_sft_trains_the_answer_not_the_prompt(tiny_dir, tmp_path):
    from codea1_core.config import Config
    from codea1_core.models.policy import Policy, SamplingParams

    before = _mean_logprobs(tiny_dir)
    out = tmp_path / "sft"
    metrics = supervised_finetune(tiny_dir, EXAMPLES * 4, out, epochs=30, lr=3.0e-3, seed=0, batch_size=8)
    assert set(metrics) >= {"train_loss", "runtime_s"} and metrics["runtime_s"] > 0 and metrics["steps"] == 30
    assert not (tmp_path / "sft.tmp").exists()
    after = _mean_logprobs(out)
    for (p0, a0), (p1, a1) in zip(before, after, strict=True):
        assert a0 < -4.0 and a1 > -1.0, (a0, a1)  # the answer (and its end-of-turn token) is learned
        assert p1 < p0 + 1.0, (p0, p1)  # prompt tokens carry no loss: not memorised
    pol = Policy(str(out), Config().replace(**{"model.device": "cpu"}), role="code")  # a normal HF dir
    assert pol.generate([EXAMPLES[0]["messages"][:2]], 1, SamplingParams(max_new_tokens=4))[0][0].token_ids


def test_prompt_completion_rows_split_off_the_final_answer(tiny_dir):
    from transformers import AutoTokenizer

    rows = _to_prompt_completion(EXAMPLES, AutoTokenizer.from_pretrained(tiny_dir))
    assert rows[0]["prompt"] == EXAMPLES[0]["messages"][:2]
    assert rows[0]["completion"] == [{"role": "assistant", "content": ANSWERS[0]}]


def test_plain_rows_without_chat_template(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.chat_template = None
    row = _to_prompt_completion(EXAMPLES, tok)[1]
    assert isinstance(row["prompt"], str) and row["prompt"].rstrip().endswith("Assistant:")
    assert row["completion"] == ANSWERS[1] + tok.eos_token


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"text": "x"}, r"examples\[0\]: expected"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "a"}]}, "last message"),
        (
            {"messages": [{"role": "bot", "content": "q"}, {"role": "assistant", "content": "a"}]},
            r"messages\[0\]",
        ),
        ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]}, r"\.content"),
    ],
)
def test_malformed_examples_are_named(tiny_dir, tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        supervised_finetune(tiny_dir, [bad], tmp_path / "out", epochs=1, lr=1.0e-3, seed=0)
    assert not (tmp_path / "out").exists()


def test_sft_logs_one_line_per_epoch_with_loss(tiny_dir, tmp_path, caplog):
    """Regression: the warm start printed nothing for 33 minutes (progress and logging off)."""
    import logging

    with caplog.at_level(logging.INFO, logger="codea1.sft"):
        supervised_finetune(
            tiny_dir, EXAMPLES * 2, tmp_path / "sft", epochs=3, lr=1.0e-3, seed=0, batch_size=4
        )
    lines = [r.getMessage() for r in caplog.records if "epoch" in r.getMessage()]
    assert [line.split("  ")[0] for line in lines] == [
        "sft sft: epoch 1/3",
        "sft sft: epoch 2/3",
        "sft sft: epoch 3/3",
    ]
    assert all(" loss " in line and " ETA " in line for line in lines), lines
