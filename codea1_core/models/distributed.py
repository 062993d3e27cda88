"""Data-parallel training on ``torch.distributed``: shard a step's problems, wrap both policies, reduce exactly.

What it does: with W ranks (``torchrun --nproc-per-node W``), rank r takes the contiguous r-th shard of the
step's B problems (:func:`shard`: a pure function of the batch, so of (step, seed, rank)); it rolls out,
executes, scores and computes GRPO advantages locally (groups are per problem: nothing crosses ranks). The
update of each policy then runs on torch's own engines (:func:`wrap_policy`): ``ddp``
(``DistributedDataParallel``: LoRA and models whose training state fits one device) or ``fsdp2``
(``torch.distributed.fsdp.fully_shard``: parameters, gradients and AdamW state sharded over the ranks, for full
fine-tuning of models that do not fit). :class:`DataParallel` is what :class:`~codea1_core.models.policy.Policy`
asks during ``step`` so that the reduced update EQUALS the single-process update over the same B problems:

* the GRPO loss is a token mean over a mini-batch (docs/method.md §10): each rank divides its token sum by the
  mini-batch's GLOBAL token count (all-reduced) and multiplies by W, because DDP and FSDP2 average gradients;
* mini-batch k is the k-th slice of the GLOBAL sample order (rank 0's samples, then rank 1's, ...), as in one
  process, intersected with this rank's samples (:meth:`DataParallel.mini_batch`);
* every rank runs the same number of forward/backward calls (FSDP2 all-gathers in every forward; DDP reduces in
  the last backward of a mini-batch): shorter ranks pad with a zero-weight dummy micro-batch
  (:meth:`DataParallel.pad`); gradient sync happens only on the last micro-batch (:func:`grad_sync`);
* metrics are token-weighted sums reduced over ranks, then divided by the global token count.

FSDP2 inside ``codea1 train``: each rank samples from a whole copy of the weights (:func:`whole_copy`, refreshed
by :func:`sync_whole` after every update and load), never through the shards; checkpoints keep the
single-process format (:func:`gather_for_save` brings the state to rank 0; :func:`load_whole_state` and
:func:`shard_optimizer_state` slice it back), so a run resumes at any world size.

What it does not: launch processes (``flows/distributed.py`` re-executes under ``torchrun``), own MLflow or the
checkpoint (rank 0 does, in ``flows/train.py``), or run vLLM (one engine per rank, ``docs/distributed.md``).
No prefect/mlflow here (core purity).

Run: ``pytest tests/flows/test_distributed.py``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import torch
import torch.distributed as dist

T = TypeVar("T")
Strategy = Literal["ddp", "fsdp2"]


def world_size() -> int:
    """Ranks of the default process group (1 when torch.distributed is not initialised)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 when torch.distributed is not initialised)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that owns tracking and checkpoints."""
    return rank() == 0


def resolve_backend(backend: str) -> str:
    """``auto`` -> ``nccl`` where CUDA is available, else ``gloo``; anything else as given."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def init_from_env(backend: str = "auto", timeout_s: float = 600.0) -> bool:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``...).

    ``timeout_s`` bounds every collective: a rank that died or hangs makes the others fail with a
    ``DistBackendError`` after at most this long instead of waiting forever. Returns False (nothing done)
    outside ``torchrun`` or when ``WORLD_SIZE`` is 1.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    name = resolve_backend(backend)
    if name == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(name, timeout=datetime.timedelta(seconds=timeout_s))
    return True


def shard(items: Sequence[T], rank_: int, world: int) -> list[T]:
    """The ``rank_``-th of ``world`` contiguous equal shards of ``items`` (``len(items) % world == 0``)."""
    if world < 1 or not 0 <= rank_ < world:
        raise ValueError(f"shard: rank {rank_} of world size {world}")
    if len(items) % world:
        raise ValueError(
            f"data.train_batch_size={len(items)} is not divisible by the world size {world}: "
            "every rank takes an equal shard of the step's problems"
        )
    per = len(items) // world
    return list(items[rank_ * per : (rank_ + 1) * per])


def all_gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj``, in rank order (picklable objects; one process: ``[obj]``)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce(values: Sequence[float], op: str = "sum") -> list[float]:
    """Element-wise sum (or max) of ``values`` over ranks, in float64 (one process: unchanged)."""
    if world_size() == 1:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.tolist()


def reduce_metrics(metrics: dict[str, float], weight: float) -> dict[str, float]:
    """Weighted mean over ranks of each metric (``weight``: this rank's samples); keys must match on all ranks."""
    keys = sorted(metrics)
    sums = all_reduce([metrics[k] * weight for k in keys] + [weight])
    total = sums[-1]
    return {k: (s / total if total else metrics[k]) for k, s in zip(keys, sums[:-1], strict=True)}


@dataclass(frozen=True)
class DataParallel:
    """What a policy's ``step`` needs to know about the other ranks (see the module docstring)."""

    world: int
    rank: int
    strategy: Strategy

    def total(self, value: float) -> float:
        """Sum of ``value`` over ranks."""
        return all_reduce([value])[0]

    def sums(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over ranks."""
        return all_reduce(values)

    def mini_batch(self, local_idx: list[int], k: int, n_mb: int) -> list[int]:
        """This rank's part of global mini-batch ``k`` of ``n_mb``: the k-th slice of the global sample order."""
        counts = [int(c) for c in all_gather_objects(len(local_idx))]
        offset, n = sum(counts[: self.rank]), sum(counts)
        lo, hi = k * n // n_mb, (k + 1) * n // n_mb
        return [i for j, i in enumerate(local_idx) if lo <= offset + j < hi]

    def pad(self, micro_batches: list[list[int]]) -> list[list[int]]:
        """Pad with empty (dummy) micro-batches up to the largest count over ranks."""
        most = int(all_reduce([len(micro_batches)], op="max")[0])
        return micro_batches + [[] for _ in range(most - len(micro_batches))]


@contextlib.contextmanager
def grad_sync(module: Any, enabled: bool) -> Iterator[None]:
    """Gradient reduction on (the last micro-batch) or off (accumulate locally) for a DDP or FSDP2 module."""
    if isinstance(module, torch.nn.parallel.DistributedDataParallel):
        with contextlib.nullcontext() if enabled else module.no_sync():
            yield
        return
    setter = getattr(module, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)
    yield


class LogprobModule(torch.nn.Module):
    """Root module handed to DDP / FSDP2: its forward is the policy's completion log-prob computation.

    Why: the policy computes log-probs through the decoder and the LM head separately (blocked, no full-vocab
    logits); both engines need the whole computation inside ONE forward of the wrapped root (DDP prepares its
    reducer there; FSDP2's root hook gathers the embedding/head parameters).
    """

    def __init__(self, model: torch.nn.Module, fn: Any) -> None:
        super().__init__()
        self.model = model
        self._fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped log-prob forward over the model (what DDP / FSDP2 hooks around)."""
        return self._fn(self.model, *args, **kwargs)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (through a peft wrapper): FSDP2's sharding units."""
    base = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(
            f"fsdp2: cannot find the decoder layers of {type(base).__name__} (expected .model.layers)"
        )
    return list(layers)


def wrap_policy(policy: Any, strategy: Strategy) -> None:
    """Wrap ``policy.model`` for data-parallel updates; rebuild its optimizer over the (possibly sharded) params.

    ``ddp``: every rank keeps the whole model; gradients are all-reduced (averaged) in the last backward of a
    mini-batch. ``fsdp2``: each decoder layer and the root are ``fully_shard``-ed over a 1-D mesh of all ranks;
    parameters become DTensor shards, AdamW state is sharded with them. Call before any step or load.
    """
    world = world_size()
    root = LogprobModule(policy.model, policy.logprob_forward())
    if strategy == "ddp":
        # "cuda" without an index is the rank's device (init_from_env set it from LOCAL_RANK)
        device_ids = None
        if policy.device.type == "cuda":
            index = policy.device.index
            device_ids = [index if index is not None else torch.cuda.current_device()]
        # buffers (the rotary tables) are equal on every rank: synced once at init, never in forward
        policy.dist_module = torch.nn.parallel.DistributedDataParallel(
            root, device_ids=device_ids, forward_sync_buffers=False
        )
    elif strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        policy.whole_model = whole_copy(policy)  # before sharding: rollouts, validation, checkpoints, export
        mesh = init_device_mesh(policy.device.type, (world,))
        for layer in decoder_layers(policy.model):
            fully_shard(layer, mesh=mesh)
        policy.dist_module = fully_shard(root, mesh=mesh)
    else:
        raise ValueError(f"distributed.strategy: expected 'ddp' or 'fsdp2', got {strategy!r}")
    policy.data_parallel = DataParallel(world, rank(), strategy)
    policy.rebuild_optimizer()


def full_state_dict(policy: Any) -> dict[str, torch.Tensor]:
    """The policy's whole trainable model state on CPU (FSDP2 shards gathered; on every rank)."""
    sd = policy.model.state_dict()
    return {k: _whole(v).detach().to("cpu", copy=True) for k, v in sd.items()}


# ------------------------------------------------------------------------------------------------------
# FSDP2 inside the training flow: a whole copy to sample from, checkpoints in the single-process format
# ------------------------------------------------------------------------------------------------------
def _whole(t: Any) -> Any:
    """A DTensor's whole value (an all-gather: every rank must call it, in the same order); others as they are."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def whole_copy(policy: Any) -> torch.nn.Module:
    """A plain (unsharded) copy of ``policy.model`` for sampling: FSDP2's hooks gather per forward, and each rank
    generates a different number of tokens, so generating through the shards would desynchronise the ranks.

    Kept in the compute dtype (full fine-tuning in bf16 keeps float32 masters in the shards, as vLLM would
    sample from bf16 weights); in float32, as on CPU, it holds exactly the trained weights. Refreshed by
    :func:`sync_whole` after every update and load.
    """
    whole = copy.deepcopy(policy.model)
    if policy.autocast_dtype is not None:
        whole.to(policy.autocast_dtype)
    return whole.requires_grad_(False)


@torch.no_grad()
def sync_whole(policy: Any) -> None:
    """Copy the sharded trained parameters into the sampling copy (every rank: one all-gather per parameter)."""
    whole = dict(policy.whole_model.named_parameters())
    for name, p in policy.model.named_parameters():
        if p.requires_grad:
            whole[name].copy_(_whole(p.detach()))
    policy.gathered = None


@torch.no_grad()
def gather_for_save(policies: Iterable[Any]) -> None:
    """FSDP2: gather each policy's checkpoint state to rank 0 (every rank must call it; a no-op otherwise).

    Rank 0 then holds, in ``policy.gathered``, the optimizer state and (full fine-tuning) the master weights
    whole on CPU, in the single-process format of ``Policy.save``: so one checkpoint, resumable at any world
    size. Gathered one tensor at a time; the other ranks drop each whole tensor at once. Repeated calls
    without an update in between gather nothing.
    """
    keep = is_main()
    for policy in policies:
        if policy.whole_model is None or policy.gathered is not None:
            continue
        model: dict[str, torch.Tensor] = {}
        if policy.ref_model is not None:  # full fine-tuning: the float32 masters (LoRA: the copy is exact)
            for key, value in policy.model.state_dict().items():
                whole = _whole(value.detach())
                if keep:
                    model[key] = whole.to("cpu", copy=True)
        saved = policy.optimizer.state_dict()
        state: dict[int, dict[str, Any]] = {}
        for index in sorted(saved["state"]):
            entry = {k: _whole(v) for k, v in saved["state"][index].items()}
            if keep:
                state[index] = {
                    k: v.to("cpu", copy=True) if torch.is_tensor(v) else v for k, v in entry.items()
                }
        optimizer = {"state": state, "param_groups": saved["param_groups"]}
        policy.gathered = {"model": model, "optimizer": optimizer} if keep else {}


def _sharded_like(param: Any, whole: torch.Tensor) -> Any:
    """``whole`` (the same on every rank) as a DTensor laid out like ``param``: each rank slices its own part."""
    from torch.distributed.tensor import distribute_tensor

    value = whole.to(device=param.device, dtype=param.dtype)
    return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)


@torch.no_grad()
def load_whole_state(policy: Any, weights: dict[str, torch.Tensor]) -> None:
    """Load whole trained weights (a single-process checkpoint's) into an FSDP2 policy's shards and its
    sampling copy; each rank reads the same file and keeps its own slice (no collective)."""
    whole = dict(policy.whole_model.named_parameters())
    for name, p in policy.model.named_parameters():
        if p.requires_grad:  # full fine-tuning: every weight; LoRA: the adapters (the base is the base)
            p.copy_(_sharded_like(p, weights[name]))
            whole[name].copy_(weights[name])
    policy.gathered = None


def shard_optimizer_state(policy: Any, saved: dict[str, Any]) -> dict[str, Any]:
    """A single-process AdamW state dict laid out over an FSDP2 policy's sharded parameters (same indices:
    both optimizers are built over ``model.parameters()`` in the same order)."""
    params = [p for group in policy.optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in saved["state"].items():
        p = params[int(index)]
        state[index] = {
            k: _sharded_like(p, v) if torch.is_tensor(v) and tuple(v.shape) == tuple(p.shape) else v
            for k, v in entry.items()
        }
    return {"state": state, "param_groups": saved["param_groups"]}
