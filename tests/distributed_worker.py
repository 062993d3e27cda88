"""One rank of the data-parallel update checks (``tests/flows/test_distributed.py``), started by ``torchrun``.

``torchrun --nproc-per-node 2 tests/distributed_worker.py MODEL_DIR OUT_DIR``: for every (finetune, strategy)
of ``CASES`` and both roles, build the policy as one process would (same seed), wrap it
(``codea1_core.models.distributed.wrap_policy``), take this rank's shard of the fixed batch (:func:`problem_batch`)
and run one GRPO step; rank 0 writes the full trainable parameters and the step's metrics to
``OUT_DIR/<finetune>-<strategy>-<role>.pt``. ``world size 1`` (no torchrun) runs the single-process reference.
FSDP2 cases also sample, checkpoint and resume (:func:`sample_save_resume`), as the training flow does.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass

import torch

from codea1_core.config import Config
from codea1_core.models import distributed as dp
from codea1_core.models.policy import Policy, TrainBatch

CASES = [("full", "ddp"), ("lora", "ddp"), ("full", "fsdp2"), ("lora", "fsdp2")]
PROBLEMS, PER_PROBLEM = 4, 3


@dataclass(frozen=True)
class Matrix:
    """The part of an OutcomeMatrix the Mistake Book update reads (§8); picklable for the gather."""

    problem_id: str
    failed: tuple
    passed: tuple
    replay_passed: tuple = ()
    problem_infra: bool = False

    def failed_tests(self) -> list:
        return list(self.failed)

    def passed_replay(self) -> list:
        return list(self.passed)


def book_run(world: int, rank: int) -> dict:
    """4 steps of B=4 problems (ids recurring across steps, so on other ranks): outcomes drawn from a seeded
    stream (the same on every rank), replay retrieved from THIS rank's book, this rank's shard gathered through
    ``flows.distributed.gather_outcomes`` and merged by the training task. Returns the final book."""
    from codea1_core.method.mistake_book import MistakeBook
    from codea1_core.types import TestCase
    from flows.distributed import gather_outcomes
    from tasks.mistake_book import merge_mistake_book

    book = MistakeBook.from_config(Config().replace(**{"mistake_book.max_per_problem": 3}).mistake_book)
    rng = random.Random(0)
    for it in range(1, 5):
        matrices = []
        for b in range(PROBLEMS):
            pid = f"p{(3 * it + b) % 6}"
            replay = book.retrieve(pid, 8)
            failed = tuple(
                TestCase(f"f({rng.randint(0, 5)})", rng.randint(0, 3)) for _ in range(rng.randint(0, 4))
            )
            matrices.append(Matrix(pid, failed, tuple(t for t in replay if rng.random() < 0.5)))
        mine = dp.shard(matrices, rank, world) if world > 1 else matrices
        merge_mistake_book.fn(book, gather_outcomes(mine), it, None)
    return book.to_dict()


RANK_ROWS = [  # one step's rank-local metrics on each rank (flows.distributed.reduce_row)
    {
        "test/rejected_rate": 0.5,
        "test/gate_rows": 2.0,
        "sandbox/timeout_rate": 0.0,
        "sandbox/calls": 10.0,
        "code/reward_mean": 0.25,
        "time/execute_s": 1.0,
    },
    {
        "test/rejected_rate": 0.1,
        "test/gate_rows": 10.0,
        "sandbox/timeout_rate": 0.2,
        "sandbox/calls": 5.0,
        "code/reward_mean": 0.25,
        "time/execute_s": 3.0,
    },
]


def make_cfg(finetune: str) -> Config:
    # Tiny micro-batches and 2 mini-batches: ranks then hold different numbers of micro-batches (padding)
    # and a mini-batch straddles the ranks' shards (the global-order slices of distributed.py).
    return Config().replace(
        **{
            "model.device": "cpu",
            "model.finetune": finetune,
            "model.lora_target_modules": ["q_proj", "v_proj"],
            "grpo.lr": 1.0e-3,
            "grpo.warmup_steps": 1,
            "grpo.mini_batches": 2,
            "grpo.micro_batch_tokens": 40,
            "grpo.weight_decay": 0.0,
        }
    )


def problem_batch(role: str, vocab: int) -> list[TrainBatch]:
    """The step's B=4 problems, PER_PROBLEM samples each, as one TrainBatch per problem (problem-major)."""
    g = torch.Generator().manual_seed(0 if role == "code" else 1)
    out = []
    for b in range(PROBLEMS):
        n_prompt = 5 + 3 * b  # problems differ in length: the ranks' token counts differ
        prompt = torch.randint(3, vocab, (n_prompt,), generator=g).tolist()
        comps = [
            torch.randint(3, vocab, (2 + (b * 5 + m * 3) % 9,), generator=g).tolist()
            for m in range(PER_PROBLEM)
        ]
        adv = [float(x) for x in torch.randn(PER_PROBLEM, generator=g)]
        out.append(TrainBatch([prompt] * PER_PROBLEM, comps, adv))
    return out


def concat(parts: list[TrainBatch]) -> TrainBatch:
    return TrainBatch(
        [p for b in parts for p in b.prompt_ids],
        [c for b in parts for c in b.completion_ids],
        [a for b in parts for a in b.advantages],
    )


def trainable(pol: Policy) -> dict[str, torch.Tensor]:
    names = {k for k, p in pol.model.named_parameters() if p.requires_grad}
    return {k: v for k, v in dp.full_state_dict(pol).items() if k in names}


def run(model_dir: str, out_dir: str, cases: list[tuple[str, str]], world: int, rank: int) -> None:
    """One step per case and role; ``world == 1``: the single-process reference (no process group used)."""
    for finetune, strategy in cases:
        for role in ("code", "test"):
            torch.manual_seed(7)  # LoRA A matrices: the same initialisation on every rank and in one process
            pol = Policy(model_dir, make_cfg(finetune), role=role, total_steps=10)
            problems = problem_batch(role, len(pol.tokenizer))
            if world > 1:
                dp.wrap_policy(pol, strategy)
                problems = dp.shard(problems, rank, world)
            before = trainable(pol)
            sampled_before = sample(pol) if strategy == "fsdp2" else {}
            metrics = pol.step(concat(problems))
            params = trainable(pol)
            record = {
                "params": params,
                "before": before,
                "metrics": metrics,
                "sampled_before": sampled_before,
            }
            if strategy == "fsdp2":  # what the training flow does with FSDP2 beyond the update
                record |= sample_save_resume(
                    pol, model_dir, out_dir, finetune, strategy, role, problems, world
                )
            if rank == 0 or world == 1:
                torch.save(record, os.path.join(out_dir, f"{finetune}-{strategy}-{role}-w{world}.pt"))


def sample(pol: Policy) -> dict[str, list]:
    """Seeded completions of two prompts with their log-probs (the fast decoder, from the whole weights)."""
    from codea1_core.models.sampling import SamplingParams

    prompts = [
        [{"role": "user", "content": "def add(a, b):"}],
        [{"role": "user", "content": "assert f(3) =="}],
    ]
    out = [c for row in pol.generate(prompts, 2, SamplingParams(seed=3, max_new_tokens=8)) for c in row]
    return {"tokens": [c.token_ids for c in out], "logprobs": [c.logprobs for c in out]}


def sample_save_resume(
    pol: Policy,
    model_dir: str,
    out_dir: str,
    finetune: str,
    strategy: str,
    role: str,
    problems: list,
    world: int,
) -> dict:
    """After the step: sample greedily, checkpoint (gathered to rank 0), restore into a fresh policy laid out
    like this run, step again and sample again. One process also restores the 2-rank checkpoint (2 -> 1)."""
    ckpt = os.path.join(out_dir, f"ckpt-{finetune}-{strategy}-{role}-w{world}")
    sampled = sample(pol)
    dp.gather_for_save([pol])  # a no-op in one process
    if dp.is_main():
        pol.save(ckpt)
    if world > 1:
        torch.distributed.barrier()

    def resumed(path: str) -> tuple[dict, list]:
        torch.manual_seed(7)
        fresh = Policy(model_dir, make_cfg(finetune), role=role, total_steps=10)
        if world > 1:
            dp.wrap_policy(fresh, strategy)
        fresh.load(path)
        fresh.step(concat(problems))
        return trainable(fresh), sample(fresh)

    out = dict(zip(("resumed", "resumed_sampled"), resumed(ckpt), strict=True))
    if world == 1:
        out |= dict(zip(("from_w2", "from_w2_sampled"), resumed(ckpt.replace("-w1", "-w2")), strict=True))
    return {"sampled": sampled, **out}


if __name__ == "__main__":
    torch.set_num_threads(1)
    dp.init_from_env("gloo", timeout_s=120)
    cases = CASES if len(sys.argv) < 4 else [tuple(c.split(":")) for c in sys.argv[3:]]
    world, rank = dp.world_size(), dp.rank()
    book = book_run(world, rank)
    if rank == 0:
        torch.save(book, os.path.join(sys.argv[2], f"book-w{world}.pt"))
    if world == 2:
        from flows.distributed import reduce_row

        row = reduce_row(RANK_ROWS[rank])
        if rank == 0:
            torch.save(row, os.path.join(sys.argv[2], "row-w2.pt"))
    run(sys.argv[1], sys.argv[2], cases, world, rank)
    if world > 1:
        torch.distributed.destroy_process_group()
    # The same steps in one process (no process group used): the test's reference, split over the ranks.
    run(sys.argv[1], sys.argv[2], cases[rank::world], 1, 0)
    if rank == 0:
        torch.save(book_run(1, 0), os.path.join(sys.argv[2], "book-w1.pt"))
