"""The shared-prompt decode (``rollout.share_prompt: true``, the default) samples what ``generate`` samples.

It is not bitwise ``generate`` (one prefill and one key/value copy per prompt, inverse-CDF sampling
with its own uniforms, finished prompts dropped from the batch), so these tests check the two halves of
"the same distribution" separately and end to end:

* the logits: every recorded log-prob equals HF's own forward over the prompt and the sampled prefix
  (teacher forcing), to float rounding, on the lab's, a GQA, an eager and a LoRA model, with left padding
  and with prompts leaving the batch as they finish;
* the draw: the inverse CDF picks each token with its probability (chi-square against the exact warped
  softmax, many rows of one prompt), never a token a warper removed, and refuses what multinomial refuses;
* the decode processes: split over warm worker processes (one per core), the result is the one-process
  result bit for bit, on three model shapes, through ``Policy`` too, after in-place weight updates too; a
  worker that errs, dies or hangs costs time, never a token; a Ctrl-C in the caller leaves no stale answer.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from support import (  # the exact path's helpers and fixtures (two intra-op threads, the tiny model)
    DECODE_PROMPTS,
    both_paths,
    random_qwen2,
    two_threads,  # noqa: F401
)

from codea1_core.config import Config
from codea1_core.models import cpu_numerics
from codea1_core.models.cpu_decode import engine, prefill, shared
from codea1_core.models.policy import Policy, SamplingParams


def teacher_forced_logprobs(
    model, ids: torch.Tensor, mask: torch.Tensor, n: int, tokens: torch.Tensor, eos_ids: list[int]
) -> list[torch.Tensor]:
    """Per row, HF's log-softmax at each sampled token up to and including its stop (one full forward)."""
    out = []
    for r in range(tokens.shape[0]):
        row = tokens[r].tolist()
        stop = next((i for i, t in enumerate(row) if t in eos_ids), len(row) - 1)
        new = tokens[r, : stop + 1]
        p = r // n
        full = torch.cat([ids[p], new])[None]
        full_mask = torch.cat([mask[p], torch.ones_like(new)])[None]
        positions = (full_mask.cumsum(-1) - 1).masked_fill(full_mask == 0, 0)
        with torch.no_grad():
            logits = model(input_ids=full, attention_mask=full_mask, position_ids=positions).logits[0].float()
        logp = torch.log_softmax(logits[ids.shape[1] - 1 : -1], -1)
        out.append(logp.gather(1, new[:, None]).squeeze(1))
    return out


@pytest.mark.parametrize(("name", "lora"), [("lab", False), ("gqa", False), ("eager", False), ("gqa", True)])
def test_logprobs_equal_hf_forward_with_padding_and_finished_prompts(name, lora, monkeypatch):
    """The decode's logits are HF's (teacher-forced, 1e-5), while prompts finish and leave the batch."""
    kept = []
    real_keep = shared._SharedPromptCache.keep
    monkeypatch.setattr(
        shared._SharedPromptCache, "keep", lambda self, p, r: kept.append(len(p)) or real_keep(self, p, r)
    )
    model = random_qwen2(name, lora)
    vocab = engine._base_model(model).config.vocab_size
    ids = torch.randint(3, vocab, (6, 7), generator=torch.Generator().manual_seed(2))
    ids[0, :3], ids[3, :1] = 0, 0
    mask = (ids != 0).long()
    eos_ids = list(range(3, 3 + vocab // 12))  # ~8% of the vocabulary ends a row
    torch.manual_seed(3)
    out = engine.sample(
        model, ids, mask, n=3, max_new_tokens=30, eos_ids=eos_ids, pad_id=0, do_sample=True, share_prompt=True
    )
    assert kept, "no prompt left the batch: the test does not cover the compaction"
    expected = teacher_forced_logprobs(model, ids, mask, 3, out.tokens, eos_ids)
    for r, ref in enumerate(expected):
        got = out.logprobs[r, : len(ref)]
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), f"row {r}: max diff {(got - ref).abs().max()}"
        assert bool((out.tokens[r, len(ref) :] == 0).all())  # pad after the stop (log-probs there are unused)
    lengths = [len(ref) for ref in expected]
    assert len(set(lengths)) > 1 and out.tokens.shape[1] == max(lengths)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.9)],
    ids=["plain", "top-k", "top-p"],
)
def test_first_token_frequencies_match_the_warped_softmax(tiny_dir, temperature, top_k, top_p):  # noqa: F811
    """20,000 samples of one prompt's first token: chi-square against the exact probabilities, nothing removed drawn."""
    rows = 20_000
    cfg = Config().replace(**{"model.device": "cpu", "model.dtype": "float32", "model.finetune": "full"})
    pol = Policy(tiny_dir, cfg, role="code", total_steps=1)
    sp = SamplingParams(max_new_tokens=1, seed=1, temperature=temperature, top_k=top_k, top_p=top_p)
    enc = pol.tokenizer([pol.render(DECODE_PROMPTS[1])], add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        logits = pol.model(**enc).logits[:, -1].float()
    scores = logits
    for warp in pol._warpers(sp):
        scores = warp(enc["input_ids"], scores)
    probs = torch.softmax(scores, -1)[0]
    torch.manual_seed(4)
    out = engine.sample(
        pol.model,
        enc["input_ids"],
        enc["attention_mask"],
        n=rows,
        max_new_tokens=1,
        eos_ids=pol.eos_ids,
        pad_id=0,
        do_sample=True,
        warpers=pol._warpers(sp),
        share_prompt=True,
    )
    counts = torch.bincount(out.tokens[:, 0], minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0, "a token the warpers removed was drawn"
    expected = probs.double() * rows
    big = expected >= 5  # chi-square on the categories with enough mass, the rest pooled
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expect = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expect > 0
    chi2 = float(((observed[keep] - expect[keep]) ** 2 / expect[keep]).sum())
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5 + 10, f"chi2 {chi2:.1f} with {dof} degrees of freedom"
    # and the recorded log-probs are the raw (unwarped) ones Policy records
    assert torch.allclose(out.logprobs[:, 0], torch.log_softmax(logits, -1)[0, out.tokens[:, 0]], atol=1e-6)


def test_inverse_cdf_picks_by_cumulative_mass_and_refuses_bad_logits():
    scores = torch.log(torch.tensor([[0.1, 0.0, 0.6, 0.3]]))  # token 1 has probability 0 (-inf score)
    pick = shared._inverse_cdf
    assert [int(pick(scores, torch.tensor([u]))) for u in (0.0, 0.0999, 0.1001, 0.6999, 0.7001, 0.99999)] == [
        0,
        0,
        2,
        2,
        3,
        3,
    ]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="probability tensor"):
            pick(torch.tensor([[0.0, bad]]), torch.tensor([0.5]))
    with pytest.raises(RuntimeError, match="probability tensor"):
        pick(torch.full((1, 3), float("-inf")), torch.tensor([0.5]))


def test_same_seed_same_tokens_rng_advances_by_the_uniforms_and_threads_restored(tiny_dir):  # noqa: F811
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    ids = torch.tensor([[0, 0, 5, 9, 11], [3, 4, 5, 6, 7]])
    mask = (ids != 0).long()
    runs = []
    for _ in range(2):
        torch.manual_seed(8)
        runs.append(
            engine.sample(
                model,
                ids,
                mask,
                n=4,
                max_new_tokens=12,
                eos_ids=[1],
                pad_id=0,
                do_sample=True,
                share_prompt=True,
            )
        )
        after = torch.rand(3)
        assert torch.get_num_threads() == 2
    assert torch.equal(runs[0].tokens, runs[1].tokens) and torch.equal(runs[0].logprobs, runs[1].logprobs)
    torch.manual_seed(8)
    torch.rand((8, 12))
    assert torch.equal(torch.rand(3), after)  # the draw is rows x max_new_tokens uniforms, whatever stopped


def test_policy_default_uses_the_shared_decode_and_n1_stays_exact(tiny_dir, monkeypatch):  # noqa: F811
    """``rollout.share_prompt`` defaults to true; with one sample per prompt there is nothing to share: bitwise."""
    seen = []
    real_sample = engine.sample

    def spy(*args, **kwargs):
        seen.append(kwargs["share_prompt"])
        return real_sample(*args, **kwargs)

    monkeypatch.setattr(engine, "sample", spy)
    cfg = Config().replace(**{"model.device": "cpu", "model.dtype": "float32", "model.finetune": "full"})
    assert cfg.rollout.share_prompt is True
    pol = Policy(tiny_dir, cfg, role="test", total_steps=1)
    out = pol.generate(DECODE_PROMPTS, 3, SamplingParams(max_new_tokens=10, seed=2))
    assert seen == [True] and [len(g) for g in out] == [3, 3, 3]
    for c in (c for g in out for c in g):
        assert c.finish_reason in ("stop", "length") and len(c.logprobs) == len(c.token_ids) > 0
    fast, slow = both_paths(pol, DECODE_PROMPTS, 1, SamplingParams(max_new_tokens=10, seed=2), monkeypatch)
    assert fast == slow


# ------------------------------------------------------------------------------------------------
# Two decode processes: the second core decodes half of the prompts, the result is the same
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def workers(monkeypatch):
    """Decode workers: the pids forked during the test and the parts answered by one (all stopped afterwards)."""
    from codea1_core.models.cpu_decode import workers as worker_pool

    seen = {"pids": [], "answers": 0}
    real_fork, real_result = worker_pool.os.fork, worker_pool.DecodePool.result

    def fork() -> int:
        pid = real_fork()
        if pid:
            seen["pids"].append(pid)
        return pid

    def result(self, index, timeout):
        got = real_result(self, index, timeout)
        seen["answers"] += got is not None
        return got

    monkeypatch.setattr(worker_pool.os, "fork", fork)
    monkeypatch.setattr(worker_pool.DecodePool, "result", result)
    yield seen
    worker_pool.close_all()
    assert all(_gone(pid) for pid in seen["pids"]), "a decode worker outlived its pool"


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped: no zombie left
    return False


def _split_call(model, processes: int, warpers=(), seed: int = 6) -> prefill.Sampled:
    """One shared decode of 7 prompts x 3 samples with padding, ~1/6 of the vocabulary ending a row."""
    vocab = engine._base_model(model).config.vocab_size
    ids = torch.randint(3, vocab, (7, 9), generator=torch.Generator().manual_seed(5))
    ids[0, :3], ids[4, :1], ids[5, :2] = 0, 0, 0
    mask = (ids != 0).long()
    torch.manual_seed(seed)
    with torch.no_grad():  # as sample() calls it
        return shared.sample_shared(
            engine._base_model(model),
            ids,
            mask,
            3,
            40,
            list(range(3, 3 + vocab // 6)),
            0,
            True,
            list(warpers),
            processes=processes,
        )


def _same(a: prefill.Sampled, b: prefill.Sampled) -> bool:
    return torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)


SPLITS = cpu_numerics.batch_invariant_gemm()
"""MKL runs its COMPATIBLE branch (``model.cpu_numerics: reproducible``, the test session's default): the decode
splits over processes. In any other MKL mode it stays in one process (nothing to split, nothing to differ)."""
needs_split = pytest.mark.skipif(
    not SPLITS, reason="MKL outside its COMPATIBLE branch: the decode is not split"
)


@pytest.mark.parametrize("name", ["lab", "gqa", "eager"])
@pytest.mark.usefixtures("two_threads")
def test_two_or_three_decode_processes_give_the_one_process_result_bitwise(name, workers, monkeypatch):
    """Split over worker processes, the tokens and log-probs are the single process's, bit for bit.

    Each row's arithmetic must not depend on which rows share its batch; every process also drops finished
    prompts on its own schedule (the spy sees the caller's drops), so this covers the compaction too. Run it
    under every kernel level (``tests/flows/test_cpu_numerics.py`` does): outside MKL's COMPATIBLE branch, where a
    batched GEMM rounds with its batch count (an AMD EPYC, ``gqa``), no part may go to a worker.
    """
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    kept = []
    real_keep = shared._SharedPromptCache.keep
    monkeypatch.setattr(
        shared._SharedPromptCache, "keep", lambda self, p, r: kept.append(len(p)) or real_keep(self, p, r)
    )
    model = random_qwen2(name)
    warpers = [TemperatureLogitsWarper(0.8), TopPLogitsWarper(0.9)]
    one = _split_call(model, 1, warpers)
    assert not workers["pids"] and kept
    assert bool((one.tokens == 0).any()), "no row stopped early: the test would not cover the padding"
    for processes in (2, 3):
        kept.clear()
        answers = workers["answers"]
        split = _split_call(model, processes, warpers)
        want = processes - 1 if SPLITS else 0
        assert workers["answers"] - answers == want, "a part was (not) decoded by a worker"
        assert kept, "no prompt left the caller's batch: the test would not cover the compaction"
        assert _same(one, split)
        assert torch.get_num_threads() == 2
    assert len(workers["pids"]) == (2 if SPLITS else 0)  # one pool for the model, grown to 2 workers


@needs_split
@pytest.mark.usefixtures("two_threads")
def test_workers_are_forked_once_and_follow_the_weights(workers):
    """The second call reuses the warm worker; an in-place weight update (an optimizer step) reaches it."""
    model = random_qwen2("lab")
    first = _split_call(model, 2)
    again = _split_call(model, 2)
    assert _same(first, again) and len(workers["pids"]) == 1 and workers["answers"] == 2
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(1.5)  # what AdamW's in-place step does to the storage
    moved = _split_call(model, 2)
    assert _same(moved, _split_call(model, 1)) and not _same(moved, first)
    assert len(workers["pids"]) == 1 and workers["answers"] == 3


@needs_split
@pytest.mark.usefixtures("two_threads")
def test_a_decode_process_that_errs_dies_or_hangs_costs_time_not_results(workers, monkeypatch, caplog):
    """The caller decodes a failed part itself (same result) and the next call forks a fresh worker."""
    model = random_qwen2("lab")
    expected = _split_call(model, 1)
    real_job = shared._worker_job
    monkeypatch.setattr(shared, "SPLIT_GRACE_S", 0.5)
    for failure in ("raise", "exit", "hang"):

        def job(base, tensors, meta, failure=failure):
            if failure == "hang":
                time.sleep(600)
            real_job(base, tensors, meta)
            if failure == "exit":
                os._exit(3)
            raise RuntimeError("boom in the worker")

        monkeypatch.setattr(shared, "_worker_job", job)
        caplog.clear()
        start = time.monotonic()
        assert _same(_split_call(model, 2), expected)
        assert "decode worker 1" in caplog.text and "runs in the caller" in caplog.text
        assert time.monotonic() - start < 30
    assert workers["answers"] == 0 and len(workers["pids"]) == 3
    monkeypatch.setattr(shared, "_worker_job", real_job)
    assert _same(_split_call(model, 2), expected) and workers["answers"] == 1  # a fresh worker answers


@needs_split
@pytest.mark.usefixtures("two_threads")
def test_an_error_in_the_caller_leaves_no_answer_behind(workers, monkeypatch):
    """Ctrl-C while the caller decodes its part: the worker with a job in flight is killed, the next call is right."""
    model = random_qwen2("lab")
    expected = _split_call(model, 1)
    real_run = shared._Decode.run
    parent = os.getpid()

    def run(self, prompts):
        if os.getpid() == parent:
            raise KeyboardInterrupt
        return real_run(self, prompts)

    monkeypatch.setattr(shared._Decode, "run", run)
    with pytest.raises(KeyboardInterrupt):
        _split_call(model, 2)
    assert len(workers["pids"]) == 1 and _gone(workers["pids"][0])
    monkeypatch.setattr(shared._Decode, "run", real_run)
    assert _same(_split_call(model, 2), expected) and workers["answers"] == 1


def test_peft_models_stay_in_one_process(monkeypatch):
    """A worker's copy would not follow a PEFT adapter switched after the fork: no split for such models."""
    monkeypatch.setattr(shared.os, "sched_getaffinity", lambda pid: {0, 1})
    base = engine._base_model(random_qwen2("gqa", lora=True))
    assert shared._split_processes(base, torch.device("cpu"), 32, 100 * shared.SPLIT_MIN_TOKENS) == 1
    plain = engine._base_model(random_qwen2("gqa"))
    assert shared._split_processes(plain, torch.device("cpu"), 32, 100 * shared.SPLIT_MIN_TOKENS) == 2


def test_one_decode_process_per_core_where_the_decode_runs_on_one_thread(monkeypatch, caplog):
    lab = random_qwen2("lab")
    base = engine._base_model(lab)
    cpu, unit = torch.device("cpu"), shared.SPLIT_MIN_TOKENS
    split = shared._split_processes
    monkeypatch.delenv(shared.SPLIT_ENV, raising=False)
    monkeypatch.setattr(shared.os, "sched_getaffinity", lambda pid: {0, 1})
    assert split(base, cpu, 32, 2 * unit) == 2
    assert split(base, cpu, 32, 2 * unit - 1) == 1  # too little work for a second process
    assert split(base, cpu, 1, 2 * unit) == 1  # one prompt: nothing to split
    assert split(base, torch.device("meta"), 32, 2 * unit) == 1
    monkeypatch.setattr(base.config, "hidden_size", shared.SMALL_MODEL_HIDDEN * 2)
    assert split(base, cpu, 32, 2 * unit) == 1  # wide models decode on all threads in one process
    monkeypatch.setattr(base.config, "hidden_size", shared.SMALL_MODEL_HIDDEN)
    monkeypatch.setattr(shared.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert split(base, cpu, 32, 100 * unit) == 8
    assert split(base, cpu, 5, 100 * unit) == 5  # at most one process per prompt
    assert split(base, cpu, 32, 3 * unit) == 3
    monkeypatch.setenv(shared.SPLIT_ENV, "3")
    assert split(base, cpu, 32, 100 * unit) == 3
    monkeypatch.setenv(shared.SPLIT_ENV, "1")
    assert split(base, cpu, 32, 100 * unit) == 1
    monkeypatch.setenv(shared.SPLIT_ENV, "two")
    assert split(base, cpu, 32, 100 * unit) == 8 and "CODEA1_DECODE_PROCESSES='two'" in caplog.text
    monkeypatch.delenv(shared.SPLIT_ENV)
    monkeypatch.setattr(shared.os, "sched_getaffinity", lambda pid: {0})
    assert split(base, cpu, 32, 100 * unit) == 1


@needs_split
@pytest.mark.usefixtures("two_threads")
def test_policy_rollouts_do_not_depend_on_decode_processes(tiny_dir, workers, monkeypatch):  # noqa: F811
    cfg = Config().replace(**{"model.device": "cpu", "model.dtype": "float32", "model.finetune": "full"})
    pol = Policy(tiny_dir, cfg, role="test", total_steps=1)
    monkeypatch.setattr(shared.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(shared, "SPLIT_MIN_TOKENS", 1)
    sp = SamplingParams(max_new_tokens=24, seed=3, temperature=0.9, top_p=0.95)
    two = pol.generate(DECODE_PROMPTS, 4, sp)
    assert workers["answers"] >= 1
    monkeypatch.setenv(shared.SPLIT_ENV, "1")
    answers = workers["answers"]
    one = pol.generate(DECODE_PROMPTS, 4, sp)
    assert workers["answers"] == answers
    assert [[(c.token_ids, c.logprobs, c.text) for c in g] for g in one] == [
        [(c.token_ids, c.logprobs, c.text) for c in g] for g in two
    ]
