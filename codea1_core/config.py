"""Typed configuration: one frozen dataclass per ``params.yaml`` section.

``params.yaml`` is the single source of truth for every knob. ``Config.from_dict`` (and
``load_config``) reject unknown keys and wrong types with the dotted key path in the message, e.g.
``reward.alpha: expected float, got str '0.5x'``. ``key=value`` overrides from the CLI go through the
same path (:func:`apply_overrides`). Defaults follow ``docs/method.md`` §11 and §19 where it gives one;
the built-in CPU lab overrides sizes in ``params.yaml``.

This module is pure: it reads YAML and builds dataclasses, nothing else.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, cast


class ConfigError(ValueError):
    """A malformed configuration: the message names the file (if any) and the dotted key."""


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataConfig:
    """Which problems to train, validate and evaluate on, and how to sample them."""

    data_dir: str = ""
    """Folder with the offline EvalPlus/MBPP files. Empty: ``$CODEA1_DATA_DIR``, else ``data/benchmarks``
    (``codea1 data fetch``) if present, else ``../shared/data`` if present."""
    train_sources: list[str] = field(default_factory=lambda: ["lab"])
    """Training sources: any of ``lab``, ``mbpp``, ``kodcode``, ``humaneval``."""
    val_sources: list[str] = field(default_factory=lambda: ["lab"])
    """Validation sources (held-out problems scored during training)."""
    eval_benchmarks: list[str] = field(default_factory=lambda: ["lab_heldout"])
    """Benchmarks prepared for ``evaluate``: ``humanevalplus``, ``mbppplus``, ``humaneval``, ``mbpp_val``,
    ``lab_heldout``."""
    max_problems_per_source: int = 0
    """Cap on problems taken from each source (0 = all), applied after a seeded shuffle."""
    kodcode_path: str = ""
    """KodCode-V1 location: a local parquet/jsonl file or folder, or a hub id (needs network)."""
    kodcode_difficulty: str = "hard"
    """Keep KodCode rows with this ``gpt_difficulty`` (empty = all)."""
    prepared_dir: str = "data/prepared"
    """Where the prepare stage writes parquet files and ``report.json``."""
    reference_call_timeout_s: float = 60.0
    """Per-call time limit when ``prepare`` runs reference solutions (some EvalPlus inputs are heavy). An input
    whose reference times out is dropped (``reference_timeout`` in prepare's report), never given an expected
    value."""
    reference_memory_mb: int = 4096
    """Memory limit (address space and cgroup, as ``sandbox.memory_mb``) of each reference program ``prepare``
    runs: EvalPlus' own 4 GiB, not the samples' limit; an input over it is dropped (``reference_memory``). One
    input is dropped whatever the limits tried here: Mbpp/255's largest plus input (an expected output of
    1,663,740 tuples) needs over 4 GiB, and over 60 s at 8 GiB; evalplus itself fails the canonical solution
    on it (``bench/eval_bench.py``'s documented defects)."""
    train_batch_size: int = 256
    """B: problems per training step (docs/method.md §2)."""
    epochs: int = 3
    """Passes over the training set; steps = floor(|D| / B) * epochs (last partial batch dropped)."""
    seed: int = 1
    """Seed of the shuffled problem sampler (official: 1)."""
    max_prompt_tokens: int = 4096
    """Code prompts longer than this are filtered out of the training set (0 = no limit)."""


@dataclass(frozen=True)
class ModelConfig:
    """The two policies: where they start, how they are fine-tuned."""

    code_path: str = "outputs/warmstart/code"
    """Code-LLM start: a local HF model directory or a hub id (e.g. ``Qwen/Qwen2.5-Coder-1.5B-Instruct``)."""
    test_path: str = "outputs/warmstart/test"
    """Test-LLM start (ignored in ``golden`` and ``selfplay`` modes)."""
    finetune: Literal["lora", "full"] = "lora"
    """``lora`` (adapters; reference = adapter disabled) or ``full`` (frozen reference copy). docs/method.md D8."""
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: int = 32
    """LoRA scaling alpha."""
    lora_dropout: float = 0.0
    """LoRA dropout."""
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Module names that receive adapters."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype: ``auto`` = bfloat16 on CUDA, float32 on CPU."""
    device: str = "auto"
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    use_chat_template: bool = True
    """Use the tokenizer's chat template when it has one (plain-text prompts otherwise)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the update."""
    gpu_memory_gb: float = 0.0
    """GPU memory (GB) the train-start memory plan checks against; 0 = the CUDA device's own (no check on CPU)."""
    cpu_threads: int = 0
    """torch's CPU threads (intra-op) in every stage; 0 = torch's default, one per core. CPU kernels split their
    sums by thread count, so on the CPU the same seed gives other numbers with another count: pin it to get the
    same numbers on machines with different core counts (the lab pins 2, so its numbers match across
    machines). No effect on GPU kernels."""
    cpu_numerics: Literal["reproducible", "native"] = "reproducible"
    """Which CPU kernels round the numbers. ``reproducible``: the kernel levels are pinned (MKL's conditional
    numerical reproducibility ``MKL_CBWR=COMPATIBLE``, ATen's ``ATEN_CPU_CAPABILITY=avx2``, ``MKL_DYNAMIC=FALSE``,
    oneDNN's ISA capped at AVX2: ``flows/environment.py``), so a seed gives the same numbers on any x86-64 CPU
    with AVX2, whatever its vendor or AVX-512, with the same torch wheel and ``cpu_threads``. ``native``: the
    fastest kernels this CPU has (other CPUs round otherwise; the decode then runs in one process). Environment
    variables the user set win in ``native``; in ``reproducible`` a conflicting one is an error. No effect on
    GPU kernels."""


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling of code and tests (docs/method.md §3, §11)."""

    backend: Literal["hf", "vllm"] = "hf"
    """``hf`` (transformers ``generate``, CPU or GPU) or ``vllm`` (GPU, ``pip install -e .[gpu]``)."""
    n_code: int = 8
    """M: Code-LLM samples per problem."""
    n_tests: int = 8
    """N: Test-LLM suites per (problem, code) pair."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling for training rollouts."""
    top_k: int = 0
    """Top-k for training rollouts (0 = off)."""
    max_new_tokens_code: int = 4096
    """Response length limit for code."""
    max_new_tokens_test: int = 4096
    """Response length limit for test suites."""
    max_prompt_tokens_test: int = 8192
    """Test-LLM prompt limit; a longer prompt is an error, not truncated (§3 step 5). 0 = no limit."""
    batch_size: int = 64
    """Prompts per ``generate`` call (HF backend)."""
    overlap_execution: bool = True
    """Gate, plan and run a problem's tests in the sandbox as soon as its test rollout is done, while later
    problems still generate (``tasks.overlap``): the same outcomes and metrics as false. HF hands over chunks of
    ``batch_size`` prompts (nothing to overlap when one chunk holds the step's B x M test prompts), vLLM each
    prompt as it finishes."""
    share_prompt: bool = True
    """CPU fast decode (``codea1_core.models.cpu_decode.engine``): prefill each prompt once, let its samples attend over
    one copy of its keys/values, draw by inverse CDF from uniforms drawn up front, drop finished prompts. The
    same distribution as HF ``generate`` from other random numbers (a seed gives other tokens than with
    false); logits equal to float rounding. false: bit for bit ``generate``'s tokens (slower)."""
    gpu_memory_utilization: float = 0.8
    """vLLM: fraction of GPU memory for the engine."""
    max_model_len: int = 8192
    """vLLM: context length of the engine."""
    enable_prefix_caching: bool = True
    """vLLM: reuse KV cache across prompts sharing a prefix."""
    shared_engine: bool = True
    """vLLM: both roles as LoRA adapters on one engine (else one engine per role)."""
    tensor_parallel_size: int = 1
    """vLLM: GPUs each engine's weights are split over (``tensor_parallel_size`` engine argument)."""
    data_parallel_size: int = 1
    """vLLM: engine replicas (``data_parallel_size`` engine argument, passed only when > 1). Whether the
    offline ``vllm.LLM`` accepts it is vLLM's call: recent releases refuse it in a single process and say so
    at engine start (then launch one run per GPU group, or use ``tensor_parallel_size``)."""


@dataclass(frozen=True)
class GrpoConfig:
    """The GRPO update (docs/method.md §10, D8, D9)."""

    clip_low: float = 0.2
    """PPO clip ratio below 1."""
    clip_high: float = 0.28
    """PPO clip ratio above 1 (clip-higher)."""
    dual_clip_c: float = 10.0
    """Dual-clip constant c for negative advantages."""
    kl_coef: float = 0.001
    """Weight of the k3 KL loss to the frozen initial policy."""
    kl_clamp: float = 10.0
    """Clamp of the per-token k3 estimate."""
    adv_eps: float = 1.0e-6
    """Epsilon in (R - mean) / (std + eps)."""
    lr: float = 1.0e-5
    """Learning rate (LoRA default; the official full fine-tuning lr is 1e-6)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Gradient-norm clipping."""
    warmup_steps: int = 10
    """Linear warm-up steps, then cosine to 0 over the run."""
    mini_batches: int = 2
    """Optimizer steps per training step (the batch is split into this many mini-batches)."""
    micro_batch_tokens: int = 32768
    """Token budget per forward/backward micro-batch."""
    update_n: int = 1
    """TOPVAR: codes per problem whose suites train the Test LLM (§9)."""
    skip_zero_variance_groups: bool = False
    """D9: skip zero-variance groups in the backward pass (changes the loss; default off)."""


@dataclass(frozen=True)
class RewardConfig:
    """Reward formulas (docs/method.md §7, D7)."""

    alpha: float = 0.5
    """Weight of validity against the adversarial term in the test reward."""
    k: int = 8
    """K: tests requested per suite and the reward's fixed denominator."""
    adv_mode: Literal["official", "per_suite"] = "official"
    """``official``: fail_new = failures among the first K valid tests / K; ``per_suite``: / V."""
    validity_mode: Literal["official", "fraction"] = "official"
    """``official``: clip(min(V/K, 1 - I/K), 0, 1); ``fraction``: V / (V + I)."""
    nonprintable_penalty: bool = True
    """Subtract the non-printable character ratio from the test reward (official)."""


@dataclass(frozen=True)
class TestsConfig:
    """Parsing and gating of generated tests (docs/method.md §5.2, D5)."""

    parse_mode: Literal["strict", "official"] = "strict"
    """``strict`` (D5: call on either side, other forms counted invalid) or ``official``."""
    max_call_chars: int = 2000
    """Longest accepted call source."""
    max_answer_chars: int = 4000
    """Longest accepted predicted-answer source."""
    literal_answers: bool = True
    """Ours (not official): a predicted answer must be plain data, else it counts invalid
    (``expected_not_literal``) in both parse modes and in the gate; ``false`` = official (any expression,
    so ``assert f(2) == f(2)`` is a valid test). See ``codea1_core/method/parsing.py``."""
    max_rejected_frac: float = 0.98
    """The quality gate raises (with its report path) when more than this share of rows is rejected."""


@dataclass(frozen=True)
class MistakeBookConfig:
    """The Mistake Book (docs/method.md §8, D6)."""

    enabled: bool = True
    """Replay and update the book (``false`` = the no-Mistake-Book ablation)."""
    top_k: int = 8
    """Tests replayed per problem."""
    tie_break: Literal["recent", "official"] = "recent"
    """Ties in frequency: most recent first (ours) or the official in-place stable order."""
    max_per_problem: int = 64
    """Cap per problem (0 = unbounded, official); evicts lowest frequency, then oldest."""


@dataclass(frozen=True)
class SandboxConfig:
    """Execution of untrusted code (docs/method.md D2-D4)."""

    backend: Literal["process", "docker", "ray"] = "process"
    """``process`` (fork-server pool, everywhere), ``docker`` (needs an engine) or ``ray`` (the process pool in
    warm Ray actors on every node of a Ray cluster; ``pip install -e '.[ray]'``, ``sandbox/ray_executor.py``)."""
    workers: int = 2
    """Warm worker processes."""
    call_timeout_s: float = 2.0
    """Per-call time limit (D3)."""
    program_cap_s: float = 60.0
    """Per-program cap; calls left unrun count as time-outs."""
    memory_mb: int = 1024
    """Address-space limit per program."""
    max_output_bytes: int = 65536
    """Captured stdout/stderr is truncated to this size."""
    float_rel_tol: float = 1.0e-6
    """Relative float tolerance of the trusted comparison (official: 0)."""
    float_abs_tol: float = 1.0e-6
    """Absolute float tolerance of the trusted comparison (official: 0)."""
    infra_retries: int = 2
    """Retries of a program whose worker failed, before reporting ``infra_error``."""
    max_infra_failure_frac: float = 0.1
    """A step aborts when more than this share of its calls hit infrastructure errors (D4)."""
    max_reference_failure_frac: float = 0.5
    """Train and evaluate stop, naming the sandbox limit to raise, when more than this share of the
    references fail under these limits: of a sample of references on their own golden tests at the start
    (train and evaluate), and of a training step's problems (a reference program that does not load masks its
    problem; one whose every call hits a limit leaves every test invalid). Limits that fail every reference
    would otherwise train on zero rewards; 1.0 turns the check off (``tasks/execute.py``)."""
    network_isolation: Literal["auto", "require", "off"] = "auto"
    """``require``: fail at start-up without a network namespace or bubblewrap; ``auto``: best available."""
    drop_privileges: bool = True
    """When running as root, run children as an unprivileged uid."""
    isolate_calls: bool = True
    """Each call runs in its own forked copy of the defined program (``sandbox.ExecLimits.isolate_calls``),
    so no call of one test can change the value of another, in the reference run (expected values),
    the candidates' runs, evaluation and the Mistake Book's replay (ours; the official implementation
    evaluates all suites' calls of a code in one program, in order: docs/method.md §6.2). Only calls that
    bring code of their own are forked: a call of the program's own function on constants is not.
    False: all calls of a program in one namespace, in order."""
    docker_image: str = "python:3.11-slim"
    """Image of the Docker backend."""
    ray_address: str = ""
    """``backend: ray``: the cluster to join (``auto``, ``host:6379``, ``ray://host:10001``); empty = the
    ``RAY_ADDRESS`` environment variable, else a local Ray runtime started (and stopped) by the run."""
    ray_actors_per_node: int = 1
    """``backend: ray``: sandbox actors per alive node; each owns a warm process pool."""
    ray_workers_per_actor: int = 2
    """``backend: ray``: fork-server workers per actor (``workers`` is the process backend's); size
    actors x workers to each node's cores (the actors reserve no Ray CPUs)."""


@dataclass(frozen=True)
class EvalConfig:
    """Benchmark evaluation (docs/method.md §13)."""

    n_samples: int = 32
    """Samples per problem for avg@n / pass@k."""
    temperature: float = 0.7
    """Evaluation sampling temperature."""
    top_p: float = 0.95
    """Evaluation nucleus sampling."""
    max_new_tokens: int = 1024
    """Evaluation response length."""
    k_list: list[int] = field(default_factory=lambda: [1, 8, 16, 32])
    """k values for pass@k."""
    every: int = 10
    """Validate every this many training steps (and once before training); 0 = never during training."""
    test_sources: list[str] = field(default_factory=lambda: ["lab_heldout"])
    """Held-out problems with references for Test-LLM metrics (pass@5, mut@5, Mul)."""
    tests_per_suite: int = 5
    """Tests taken per suite for pass@5/mut@5."""
    max_mutants: int = 30
    """Mutants per problem (cosmic-ray operators, applied in memory), cached."""
    max_problems: int = 0
    """Cap on problems per benchmark (0 = all)."""
    promote_metric: str = "code/lab_heldout/base/pass@1"
    """Metric of the evaluation that decides the Code LLM's ``champion`` alias (higher is better)."""
    promote_metric_test: str = ""
    """Metric that decides the Test LLM's ``champion`` alias (higher is better); empty: the validity
    ``test/<first eval.test_sources>/pass@<eval.tests_per_suite>``."""
    baseline: bool = True
    """Also evaluate the starting models (``model.code_path``/``test_path``, when local dirs other than the
    evaluated ones: the lab's warm start) with the same settings and seeds, as ``warmstart/...`` and
    ``delta/...`` keys (``flows/evaluate.py``); cached by content hash."""
    evalplus_protocol: bool = True
    """HumanEval+ / MBPP+ are judged by EvalPlus' own rules (``codea1_core.data.evalplus_rules``): the
    sample runs as written (no imports added), EvalPlus' comparison and float rule, per-input time limit
    max(1 s, 4 x the reference's time). ``false``: training's rules (the problem's imports prepended,
    ``sandbox.float_*_tol`` everywhere). Other benchmarks (the lab) always use training's rules. Reported
    as ``code/<bench>/evalplus_protocol``. The sandbox still stops a call at ``sandbox.call_timeout_s``:
    raise it above 4 x the slowest reference input to grant EvalPlus' full limits (the parity bench does)."""
    out_dir: str = "outputs/eval"
    """Where ``evaluate`` writes ``metrics.json``, ``report.html`` and the mutant cache."""
    bigcodebench_path: str = ""
    """Local BigCodeBench release (JSON/JSONL/parquet) for the ``bigcodebench`` benchmark name."""
    ult_path: str = ""
    """Local UnLeakedTestBench ``ULT.jsonl`` for the ``unleakedtestbench`` test source."""
    code_model: str = ""
    """Code-LLM model to evaluate (empty: ``<checkpoint_dir>/final/code`` if present, else ``model.code_path``)."""
    test_model: str = ""
    """Test-LLM model to evaluate (empty: ``<checkpoint_dir>/final/test`` if present, else ``model.test_path``)."""
    solve_candidates: int = 8
    """Test-time collaboration (``solve``): Code-LLM candidates per problem; each gets one test suite."""
    solve_benchmarks: list[str] = field(default_factory=list)
    """Benchmarks also scored with test-time collaboration (``solve/<bench>/pass@1``), e.g. ``[humanevalplus]``."""


@dataclass(frozen=True)
class TrackingConfig:
    """MLflow tracking and registry."""

    backend: Literal["mlflow", "null"] = "mlflow"
    """``mlflow`` or ``null`` (no tracking)."""
    tracking_uri: str = "sqlite:///mlflow/mlflow.db"
    """MLflow store (``$MLFLOW_TRACKING_URI`` wins when set)."""
    artifact_location: str = "mlflow/artifacts"
    """Artifact root for a new experiment."""
    experiment: str = "codea1"
    """Experiment name."""
    log_samples: int = 16
    """Rows of the sample-rollouts table logged per iteration."""
    register: bool = True
    """Register checkpoints as versions of ``codea1-code`` / ``codea1-test``."""


@dataclass(frozen=True)
class OrchestrationConfig:
    """Prefect and resume."""

    max_steps: int = 0
    """Stop after this many training steps (0 = epochs x floor(|D| / B))."""
    resume: Literal["auto", "never"] = "auto"
    """``auto``: continue from the last complete iteration's checkpoint."""
    checkpoint_dir: str = "outputs/train"
    """Where iteration checkpoints, the Mistake Book and metrics go."""
    keep_checkpoints: int = 2
    """Iteration checkpoints kept on disk (the newest)."""
    task_retries: int = 2
    """Prefect retries for I/O tasks."""
    task_timeout_s: float = 3600.0
    """Prefect timeout per task."""


@dataclass(frozen=True)
class DistributedConfig:
    """Data-parallel training over several GPUs or machines on ``torch.distributed`` (docs/distributed.md).

    Resume-neutral: a run checkpointed at one world size resumes at another (2 -> 1, 1 -> 2)."""

    nproc_per_node: int = 1
    """Ranks on this machine; > 1: ``codea1 train`` re-executes itself under ``torchrun`` (one rank per GPU).
    ``data.train_batch_size`` must be divisible by the world size (every rank takes an equal shard)."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """How gradients are reduced: ``ddp`` (DistributedDataParallel: LoRA, models that fit one device) or
    ``fsdp2`` (``torch.distributed.fsdp.fully_shard``: parameters/gradients/AdamW state sharded; full fine-tuning
    of models that do not fit, ``codea1 plan --gpus N``)."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend; ``auto``: ``nccl`` with CUDA, else ``gloo`` (CPU)."""
    timeout_s: float = 600.0
    """Collective timeout: a rank that died or hangs stops the others within this bound (one line, exit 1).
    It must exceed the longest stretch one rank spends alone (rank 0's checkpoint and validation)."""


@dataclass(frozen=True)
class LabConfig:
    """The built-in CPU lab: synthetic problem families and the tiny model."""

    families: list[str] = field(default_factory=list)
    """Families used for training (empty = all training families)."""
    train_per_family: int = 12
    """Parametrized problems per family for training."""
    heldout_per_family: int = 6
    """Held-out problems per family (other parameters) for evaluation."""
    seed: int = 0
    """Seed of the problem generator."""
    hidden_size: int = 128
    """Tiny model: hidden size."""
    num_layers: int = 2
    """Tiny model: decoder layers."""
    num_heads: int = 4
    """Tiny model: attention heads."""
    intermediate_size: int = 256
    """Tiny model: MLP width."""
    vocab_size: int = 2048
    """Tiny model: BPE vocabulary size."""
    max_position_embeddings: int = 1024
    """Tiny model: context length."""
    warmstart_epochs: int = 3
    """SFT epochs of the warm start (both roles, unless ``warmstart_code_epochs`` sets the Code LLM's)."""
    warmstart_code_epochs: int = 0
    """SFT epochs of the Code-LLM warm start; 0 = ``warmstart_epochs``. Apart because copying the prompt's
    constants is learnt late (with fewer epochs, whether it is learnt depends on the seed) while the Test
    LLM's imperfect suites need no more epochs."""
    warmstart_lr: float = 1.0e-3
    """SFT learning rate of the warm start."""
    buggy_fraction: float = 0.5
    """Share of buggy solutions in the Code-LLM warm-start data."""
    warmstart_code_examples_per_problem: int = 4
    """Code-LLM warm-start conversations per warm-start problem (correct/buggy drawn per example)."""
    warmstart_code_problems_per_family: int = 0
    """Distinct parameter sets per training family in the Code-LLM warm start: the training problems plus
    fresh ones (never a ``val``/``test`` parameter set) up to this count; 0 (or <= ``train_per_family``) =
    the training problems alone. Why: the task is to copy the prompt's constants into the code; with 12
    parameter sets seen 24 times each, a tiny model can memorize the 12 answers instead, and whether it
    learns to copy then depends on the seed. ``params.yaml`` uses 48 sets x 1 conversation x
    ``warmstart_code_epochs: 12``, which learns to copy on every seed (``bench/warmstart_seeds.py`` measures
    it; copying is learnt late: with fewer epochs it depends on the seed again). Every family supplies
    ``2 * heldout_per_family + this <= 60`` parameter sets."""
    warmstart_test_examples_per_problem: int = 2
    """Test-LLM warm-start conversations per training problem (test prompts are ~3x longer)."""
    warmstart_batch_size: int = 4
    """SFT batch size of the warm start."""
    golden_tests: Literal["sparse", "boundary"] = "sparse"
    """Golden tests that TRAINING sees (golden-mode rewards, validation, the warm start's golden calls):
    ``boundary`` = each problem's exhaustive boundary tests plus two ordinary inputs (an oracle ceiling);
    ``sparse`` = two or three happy-path tests per problem, like MBPP's three asserts, that at least half
    of each family's buggy variants pass (the paper's premise: human tests are scarce). Evaluation
    (the ``test`` split) always uses the full set and reports ``base``, ``plus`` and ``sparse`` pass@k.
    Default ``sparse``: in ``make lab-compare`` codea1 gains as much with either, and its Test LLM's
    ``pass@5`` is higher on every seed with the sparse warm-start suites (figures in docs/results.md)."""


@dataclass(frozen=True)
class Config:
    """The whole run: ``params.yaml`` as typed, validated values."""

    mode: Literal["codea1", "golden", "selfplay"] = "codea1"
    """``codea1`` (two models, white-box), ``golden`` (golden tests), ``selfplay`` (one model, black-box)."""
    seed: int = 1
    """Global seed (sampling, initialisation)."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GrpoConfig = field(default_factory=GrpoConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    tests: TestsConfig = field(default_factory=TestsConfig)
    mistake_book: MistakeBookConfig = field(default_factory=MistakeBookConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    orchestration: OrchestrationConfig = field(default_factory=OrchestrationConfig)
    lab: LabConfig = field(default_factory=LabConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None, *, source: str = "") -> Config:
        """Build a validated config; unknown keys, wrong types and out-of-range values raise :class:`ConfigError`."""
        cfg = _build(cls, raw or {}, path="", source=source)
        check_ranges(cfg, source)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """``{"reward.alpha": 0.5, ...}`` — for MLflow params."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = value

        walk("", self.to_dict())
        return out

    def replace(self, **overrides: Any) -> Config:
        """A copy with dotted-key overrides applied and validated: ``cfg.replace(**{"reward.alpha": 0.25})``."""
        return apply_overrides(self, [f"{k}={_dump_scalar(v)}" for k, v in overrides.items()])


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _fail(source: str, path: str, msg: str) -> ConfigError:
    where = f"{source}: " if source else ""
    return ConfigError(f"{where}{path}: {msg}")


def _check(tp: Any, value: Any, path: str, source: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _fail(source, path, f"expected a mapping (section), got {_describe(value)}")
        return _build(cast(type, tp), value, path=path, source=source)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value is None and "null" in allowed:  # YAML reads an unquoted `null` as None: same meaning
            return "null"
        if value not in allowed:
            raise _fail(source, path, f"expected one of {list(allowed)}, got {_describe(value)}")
        return value
    if origin in (types.UnionType, typing.Union):
        errors = []
        for alt in typing.get_args(tp):
            if alt is type(None) and value is None:
                return None
            try:
                return _check(alt, value, path, source)
            except ConfigError as exc:
                errors.append(str(exc))
        raise _fail(source, path, f"expected {tp}, got {_describe(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise _fail(source, path, f"expected a list, got {_describe(value)}")
        (item_tp,) = typing.get_args(tp)
        return [_check(item_tp, v, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise _fail(source, path, f"expected bool, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(source, path, f"expected int, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = ""
            if isinstance(value, str):
                try:
                    float(value)
                    hint = " (YAML reads 1e-6 as a string: write 1.0e-6)"
                except ValueError:
                    pass
            raise _fail(source, path, f"expected float, got {_describe(value)}{hint}")
        if not math.isfinite(value):  # .inf/.nan pass a range's comparisons and poison every update
            raise _fail(source, path, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _fail(source, path, f"expected str, got {_describe(value)}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {path}")  # a bug in this module, not user input


def _build(cls: type, raw: dict[str, Any], *, path: str, source: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            dotted = f"{path}.{key}" if path else str(key)
            raise _fail(source, dotted, f"unknown key (known: {', '.join(sorted(known))})")
    kwargs = {}
    for name in known:
        if name in raw:
            dotted = f"{path}.{name}" if path else name
            kwargs[name] = _check(hints[name], raw[name], dotted, source)
    return cls(**kwargs)


# --------------------------------------------------------------------------------------------------
# Value ranges: checked at load so a bad value fails in one line before any work starts
# --------------------------------------------------------------------------------------------------


def _bound(lo: float, hi: float = math.inf, lo_open: bool = False, hi_open: bool = False) -> tuple[str, Any]:
    """A (description, predicate) pair for ``lo <= v <= hi`` (``<`` on an open side)."""
    left = f"> {lo:g}" if lo_open else f">= {lo:g}"
    text = left if hi == math.inf else f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def ok(v: float) -> bool:
        return (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi) and not math.isnan(v)

    return f"must be {text}", ok


_COUNT, _COUNT0 = _bound(1), _bound(0)  # counts >= 1; counts where 0 means "off" / "all"
_POS = _bound(0, lo_open=True)  # timeouts, learning rates, temperatures
_UNIT = _bound(0, 1)  # probabilities, shares, alpha
_OPEN_UNIT = _bound(0, 1, lo_open=True)  # top_p, memory utilisation
_BETA = _bound(0, 1, hi_open=True)
RANGES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "data.reference_call_timeout_s": _POS,
    "data.reference_memory_mb": _COUNT,
    "data.train_batch_size": _COUNT,
    "data.epochs": _COUNT,
    "data.max_problems_per_source": _COUNT0,
    "data.max_prompt_tokens": _COUNT0,
    "model.lora_rank": _COUNT,
    "model.lora_alpha": _POS,
    "model.lora_dropout": _BETA,
    "model.gpu_memory_gb": _COUNT0,
    "model.cpu_threads": _COUNT0,
    "rollout.n_code": _COUNT,
    "rollout.n_tests": _COUNT,
    "rollout.temperature": _POS,
    "rollout.top_p": _OPEN_UNIT,
    "rollout.top_k": _COUNT0,
    "rollout.max_new_tokens_code": _COUNT,
    "rollout.max_new_tokens_test": _COUNT,
    "rollout.max_prompt_tokens_test": _COUNT0,
    "rollout.batch_size": _COUNT,
    "rollout.gpu_memory_utilization": _OPEN_UNIT,
    "rollout.max_model_len": _COUNT,
    "rollout.tensor_parallel_size": _COUNT,
    "rollout.data_parallel_size": _COUNT,
    "grpo.clip_low": _COUNT0,
    "grpo.clip_high": _COUNT0,
    "grpo.dual_clip_c": _bound(1, lo_open=True),
    "grpo.kl_coef": _COUNT0,
    "grpo.kl_clamp": _POS,
    "grpo.adv_eps": _POS,
    "grpo.lr": _POS,
    "grpo.weight_decay": _COUNT0,
    "grpo.adam_beta1": _BETA,
    "grpo.adam_beta2": _BETA,
    "grpo.grad_clip": _POS,
    "grpo.warmup_steps": _COUNT0,
    "grpo.mini_batches": _COUNT,
    "grpo.micro_batch_tokens": _COUNT,
    "grpo.update_n": _COUNT,
    "reward.alpha": _UNIT,
    "reward.k": _COUNT,
    "tests.max_call_chars": _COUNT,
    "tests.max_answer_chars": _COUNT,
    "tests.max_rejected_frac": _UNIT,
    "mistake_book.top_k": _COUNT,
    "mistake_book.max_per_problem": _COUNT0,
    "sandbox.workers": _COUNT,
    "sandbox.call_timeout_s": _POS,
    "sandbox.program_cap_s": _POS,
    "sandbox.memory_mb": _COUNT,
    "sandbox.max_output_bytes": _COUNT,
    "sandbox.float_rel_tol": _COUNT0,
    "sandbox.float_abs_tol": _COUNT0,
    "sandbox.infra_retries": _COUNT0,
    "sandbox.max_infra_failure_frac": _UNIT,
    "sandbox.max_reference_failure_frac": _UNIT,
    "sandbox.ray_actors_per_node": _COUNT,
    "sandbox.ray_workers_per_actor": _COUNT,
    "eval.n_samples": _COUNT,
    "eval.temperature": _COUNT0,
    "eval.top_p": _OPEN_UNIT,
    "eval.max_new_tokens": _COUNT,
    "eval.k_list[]": _COUNT,
    "eval.every": _COUNT0,
    "eval.tests_per_suite": _COUNT,
    "eval.max_mutants": _COUNT0,
    "eval.max_problems": _COUNT0,
    "eval.solve_candidates": _COUNT,
    "tracking.log_samples": _COUNT0,
    "orchestration.max_steps": _COUNT0,
    "orchestration.keep_checkpoints": _COUNT,
    "orchestration.task_retries": _COUNT0,
    "orchestration.task_timeout_s": _COUNT0,
    "lab.train_per_family": _COUNT,
    "lab.heldout_per_family": _COUNT0,
    "lab.hidden_size": _COUNT,
    "lab.num_layers": _COUNT,
    "lab.num_heads": _COUNT,
    "lab.intermediate_size": _COUNT,
    "lab.vocab_size": _COUNT,
    "lab.max_position_embeddings": _COUNT,
    "lab.warmstart_epochs": _COUNT0,
    "lab.warmstart_code_epochs": _COUNT0,
    "lab.warmstart_lr": _POS,
    "lab.buggy_fraction": _UNIT,
    "lab.warmstart_code_examples_per_problem": _COUNT0,
    "lab.warmstart_test_examples_per_problem": _COUNT0,
    "lab.warmstart_batch_size": _COUNT,
    "lab.warmstart_code_problems_per_family": _COUNT0,
    "distributed.nproc_per_node": _COUNT,
    "distributed.timeout_s": _POS,
}
"""Allowed range per dotted key (``key[]``: every list item). 0 means "off"/"all" where a key's docs say so;
``eval.temperature`` 0 is greedy decoding; ``orchestration.task_timeout_s`` 0 is no timeout."""
NON_EMPTY = ("data.train_sources", "eval.k_list")
"""Lists that must have at least one item."""


def check_ranges(cfg: Config, source: str = "") -> None:
    """Raise :class:`ConfigError` naming the first dotted key whose value is out of its range, alone or together
    with another key (:func:`check_together`)."""
    flat = cfg.flat()
    for key in NON_EMPTY:
        if not flat[key]:
            raise _fail(source, key, "must not be empty")
    for key, (text, ok) in RANGES.items():
        name = key.removesuffix("[]")
        items = list(enumerate(flat[name])) if key.endswith("[]") else [(None, flat[name])]
        for i, value in items:
            if not ok(value):
                raise _fail(source, name if i is None else f"{name}[{i}]", f"{text}, got {value!r}")
    check_together(flat, source)


def check_together(flat: dict[str, Any], source: str = "") -> None:
    """Values that only make sense together: pass@k needs k <= n samples; TOPVAR picks ``grpo.update_n`` of the
    ``rollout.n_code`` codes per problem."""
    n = flat["eval.n_samples"]
    for i, k in enumerate(flat["eval.k_list"]):
        if k > n:
            raise _fail(source, f"eval.k_list[{i}]", f"{k} is above eval.n_samples={n} (pass@k needs k <= n)")
    if flat["grpo.update_n"] > flat["rollout.n_code"]:
        raise _fail(
            source,
            "grpo.update_n",
            f"{flat['grpo.update_n']} is above rollout.n_code={flat['rollout.n_code']}",
        )
    hidden, heads = flat["lab.hidden_size"], flat["lab.num_heads"]
    if hidden % heads or (hidden // heads) % 2:  # rotary embeddings rotate pairs of a head's dimensions
        raise _fail(
            source,
            "lab.num_heads",
            f"{heads} does not divide lab.hidden_size={hidden} into heads of an even size: pick a "
            f"divisor of {hidden} that leaves an even quotient (e.g. {_even_head_divisor(hidden, heads)})",
        )
    for key in NON_EMPTY_PATHS:
        if key == "tracking.tracking_uri" and flat["tracking.backend"] != "mlflow":
            continue
        value = flat[key].strip()
        if not value or (key in OUTPUT_DIRS and Path(value) == Path(".")):
            raise _fail(source, key, f"must name a path other than the project folder, got {flat[key]!r}")


def _even_head_divisor(hidden: int, near: int) -> int:
    """The head count nearest ``near`` that splits ``hidden`` into heads of an even size."""
    fits = [h for h in range(1, hidden + 1) if hidden % h == 0 and (hidden // h) % 2 == 0]
    return min(fits, key=lambda h: (abs(h - near), h), default=1)


NON_EMPTY_PATHS = (
    "data.prepared_dir",
    "model.code_path",
    "model.test_path",
    "eval.out_dir",
    "tracking.tracking_uri",
    "tracking.artifact_location",
    "orchestration.checkpoint_dir",
)
"""Path keys without an "empty means a default" meaning: an empty one would read or write the project folder."""
OUTPUT_DIRS = ("data.prepared_dir", "eval.out_dir", "orchestration.checkpoint_dir")
"""Folders a stage writes and prunes: never the project folder itself (``.``) either."""


def metric_names(flat: dict[str, Any]) -> set[str]:
    """The rate metrics (higher is better) the evaluate stage can write for this config, by the names its
    writers give them: ``codea1_core.evaluation.verdicts.aggregate_code`` (``code/<bench>[/<split>]/pass@k``
    for ``k`` in ``eval.k_list`` and ``avg@<eval.n_samples>``; a lab benchmark also as ``<bench>_seen`` /
    ``<bench>_unseen``, ``benchmarks.lab_subsets``), ``suites.aggregate_tests`` (``test/<source>/...`` at
    ``k = eval.tests_per_suite``) and ``collaboration`` (``solve/<bench>/...``). Which of them a run writes
    depends on its data (``plus`` needs plus inputs, ``sparse`` the lab); none outside this set is written."""

    def variants(name: str) -> list[str]:
        return [name, f"{name}_seen", f"{name}_unseen"] if name.startswith("lab") else [name]

    stats = [f"pass@{k}" for k in flat["eval.k_list"]] + [f"avg@{flat['eval.n_samples']}"]
    names: set[str] = set()
    for bench in flat["data.eval_benchmarks"]:
        for name in variants(bench):
            for split in ("", "base/", "plus/", "sparse/"):
                names |= {f"code/{name}/{split}{stat}" for stat in stats}
    k = flat["eval.tests_per_suite"]
    for src in flat["eval.test_sources"]:
        for name in variants(src):
            names |= {f"test/{name}/{m}" for m in (f"pass@{k}", f"pass@{k}_ult", f"mut@{k}", f"mut@{k}_all")}
            names |= {f"test/{name}/mul", f"test/{name}/mul_ult"}
    for bench in flat["eval.solve_benchmarks"]:
        names |= {f"solve/{bench}/{m}" for m in ("pass@1", "base/pass@1", "candidates/pass@1")}
        names.add(f"solve/{bench}/candidates/best_of_n")
    return names


def check_metric_names(flat: dict[str, Any], source: str = "") -> None:
    """``eval.promote_metric`` (and ``eval.promote_metric_test`` when set) must be a metric the evaluate stage
    writes (:func:`metric_names`): a wrong name fails when a stage loads its params, not at register after
    train and evaluate. Not part of :meth:`Config.from_dict`: a config built for one evaluation alone (no
    register) may leave the default metric of benchmarks it does not run."""
    names = metric_names(flat)
    for key in ("eval.promote_metric", "eval.promote_metric_test"):
        value = flat[key]
        if key.endswith("_test") and not value:
            continue
        if value not in names:
            role = "test" if key.endswith("_test") else "code"
            close = sorted(n for n in names if n.startswith(f"{role}/") and n.endswith("pass@1"))[:3]
            raise _fail(
                source,
                key,
                f"{value!r} is not a metric the evaluate stage writes for data.eval_benchmarks/"
                f"eval.test_sources/eval.k_list (e.g. {', '.join(close) or sorted(names)[0]})",
            )


# --------------------------------------------------------------------------------------------------
# Loading and overrides
# --------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _dump_scalar(value: Any) -> str:
    import yaml  # imported where used: the GPU bench builds configs from dicts on images without PyYAML

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"reward.alpha=0.25"`` -> (["reward", "alpha"], 0.25); values are YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (e.g. reward.alpha=0.25)")
    key, _, raw_value = text.partition("=")
    import yaml

    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: cannot parse value {raw_value!r}: {exc}") from None
    return key.split("."), value


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``key=value`` overrides through the same validation as ``params.yaml``."""
    raw = cfg.to_dict()
    for text in overrides:
        parts, value = parse_override(text)
        node = raw
        for i, part in enumerate(parts[:-1]):
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"override {'.'.join(parts)}: unknown section {'.'.join(parts[: i + 1])}")
            node = node[part]
        if isinstance(node.get(parts[-1]), float) and isinstance(value, str) and _NUMBER.fullmatch(value):
            value = float(value)  # `grpo.lr=1e-6`: PyYAML reads an exponent without a dot as a string
        node[parts[-1]] = value
    return Config.from_dict(raw, source="override")


def _duplicate_key(node: Any, path: str = "") -> str | None:
    """The first key a YAML mapping sets twice (dotted, with both lines), walking the composed node tree; YAML's
    "last wins" would otherwise drop the first silently."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key, line = f"{path}{key_node.value}", key_node.start_mark.line + 1
            if key in seen:
                return f"duplicate key {key!r} at line {line} (first at line {seen[key]})"
            seen[key] = line
            found = _duplicate_key(value_node, f"{key}.")
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, f"{path.removesuffix('.')}[{i}].")
            if found:
                return found
    return None


def read_params(path: str | Path) -> str:
    """The text of a params file, with errors that name the file."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_params(text: str, path: str | Path) -> dict[str, Any]:
    """A params file's text as a YAML mapping, parsed once (the duplicate-key check reads the same node tree
    the values are built from); errors name ``path``."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        duplicate = _duplicate_key(node)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    finally:
        loader.dispose()
    if duplicate:
        raise ConfigError(f"{path}: {duplicate}: keep one")
    if data is None or data == {}:
        raise ConfigError(f"{path}: empty (no sections): a params file must set at least one key")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_config(
    path: str | Path = "params.yaml", overrides: list[str] | None = None, *, text: str | None = None
) -> Config:
    """Load ``params.yaml`` (or another file) and apply ``key=value`` overrides.

    ``text``: the file's content when the caller has read it already (:func:`read_params`); errors still name
    ``path``.
    """
    data = parse_params(read_params(path) if text is None else text, Path(path))
    cfg = Config.from_dict(data, source=str(path))
    return apply_overrides(cfg, overrides) if overrides else cfg


def resolve_data_dir(cfg: Config) -> Path | None:
    """The offline data folder: ``data.data_dir``, ``$CODEA1_DATA_DIR``, ``data/benchmarks`` (what
    ``codea1 data fetch`` writes, relative to the project like every path here) or ``../shared/data``;
    None if none is there."""
    import os

    for candidate in (cfg.data.data_dir, os.environ.get("CODEA1_DATA_DIR", "")):
        if candidate:
            return Path(candidate).expanduser()
    fetched = Path("data/benchmarks")
    if fetched.is_dir():
        return fetched
    default = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
    return default if default.is_dir() else None
