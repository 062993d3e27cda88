"""The warmstart stage: which roles it trains, skipping user models, atomic outputs, a short real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import TINY_LAB

from codea1_core.config import Config
from flows import warmstart
from workspace.resume import is_timing


def _cfg(mode: str = "codea1", model: dict | None = None, lab: dict | None = None) -> Config:
    raw = {"mode": mode, "lab": lab or dict(TINY_LAB), "model": model or {}, "tracking": {"backend": "null"}}
    return Config.from_dict(raw)


def test_role_dirs_follow_mode_and_model_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert warmstart.role_dirs(_cfg()) == {"code": Path("code"), "test": Path("test")}
    assert warmstart.role_dirs(_cfg(mode="golden")) == {"code": Path("code")}
    assert warmstart.role_dirs(_cfg(mode="selfplay")) == {"code": Path("code")}
    user = _cfg(model={"code_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct", "test_path": "/models/tester"})
    assert warmstart.role_dirs(user) == {}
    mixed = _cfg(model={"test_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct"})
    assert warmstart.role_dirs(mixed) == {"code": Path("code")}
    # The stage folder itself is not a role folder.
    assert warmstart.role_dirs(_cfg(model={"code_path": "outputs/warmstart", "test_path": "x"})) == {}


def test_user_models_are_skipped_with_a_metrics_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs/warmstart/code").mkdir(parents=True)  # a stale tiny model from an earlier run
    cfg = _cfg(
        model={
            "code_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "test_path": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        }
    )
    metrics = warmstart.warm_start(cfg)
    assert metrics["skipped"] is True
    written = json.loads((tmp_path / "outputs/warmstart/metrics.json").read_text())
    assert written == metrics
    assert sorted(p.name for p in (tmp_path / "outputs/warmstart").iterdir()) == ["metrics.json"]


def test_failure_leaves_previous_outputs_untouched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "outputs/warmstart"
    (root / "code").mkdir(parents=True)
    (root / "code" / "marker").write_text("old")
    import codea1_core.models.sft

    def boom(*args, **kwargs):
        raise RuntimeError("sft failed")

    monkeypatch.setattr(codea1_core.models.sft, "supervised_finetune", boom)
    with pytest.raises(RuntimeError, match="sft failed"):
        warmstart.warm_start(_cfg(lab=dict(TINY_LAB, families=["is_above"])))
    assert (root / "code" / "marker").read_text() == "old"
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == ["warmstart"]


def test_short_warm_start_models_load_and_generate(tmp_path, monkeypatch):
    """A 2-family, 1-epoch warm start with a tiny model: both role folders are usable HF models."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from codea1_core.data.lab import lab_problems
    from codea1_core.method.prompts import code_messages

    monkeypatch.chdir(tmp_path)
    cfg = _cfg()
    metrics = warmstart.warm_start(cfg)
    root = tmp_path / "outputs/warmstart"
    assert sorted(p.name for p in root.iterdir()) == ["base", "code", "metrics.json", "test"]
    written = {
        **json.loads((root / "metrics.json").read_text()),
        **json.loads(warmstart.timings_path().read_text()),
    }
    assert written == json.loads(json.dumps(metrics))
    assert (
        metrics["skipped"] is False
        and metrics["n_problems"] == 8
        and 10_000 < metrics["param_count"] < 200_000
    )
    assert metrics["code/n_examples"] == metrics["test/n_examples"] == 16
    assert any(k.startswith("code/") and "loss" in k for k in metrics)
    problem = lab_problems(cfg.lab, "test")[0]
    for role in ("code", "test"):
        tok = AutoTokenizer.from_pretrained(root / role)
        model = AutoModelForCausalLM.from_pretrained(root / role)
        ids = tok.apply_chat_template(
            code_messages(problem), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
        assert out.shape[1] > ids["input_ids"].shape[1]
    from workspace.checkpoints import verify_model

    for folder in ("base", "code", "test"):  # each model folder carries the manifest training verifies
        assert (root / folder / "MANIFEST.json").is_file() and verify_model(root / folder) is None
    base = AutoModelForCausalLM.from_pretrained(root / "base")
    code = AutoModelForCausalLM.from_pretrained(root / "code")
    assert any((a != b).any() for a, b in zip(base.parameters(), code.parameters(), strict=True))


def test_the_same_warm_start_built_twice_gives_the_same_bytes(tmp_path, monkeypatch):
    """The stage's DVC output holds no wall-clock field (``time/*``, ``runtime_s`` made its hash change on every
    run of a bit-identical build): two builds give byte-identical files; the timings live outside it."""
    monkeypatch.chdir(tmp_path)
    cfg = _cfg(mode="golden", lab=dict(TINY_LAB, families=["is_above"]))
    root = tmp_path / "outputs/warmstart"

    def tree() -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
        }

    metrics = warmstart.warm_start(cfg)
    first = tree()
    warmstart.warm_start(cfg)
    assert tree() == first and "metrics.json" in first
    assert not any(is_timing(k) for k in json.loads(first["metrics.json"]))
    timings = json.loads(warmstart.timings_path().read_text())
    assert timings["time/total_s"] > 0 and set(timings) == {k for k in metrics if is_timing(k)}


@pytest.mark.e2e
def test_a_full_disk_under_the_warm_start_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, prefect_harness, capsys
):
    """``outputs/`` on a real 256 KiB tmpfs: torch and safetensors raise their own errors on a full disk (a
    traceback); the stage says the path and "No space left on device" in one line and leaves no half-written
    folder."""
    from support import mounted_tmpfs, write_params

    from flows.common import stage_main

    monkeypatch.chdir(tmp_path)
    with mounted_tmpfs(tmp_path / "outputs", "256k", "no real full disk to write to") as outputs:
        params = write_params(
            _cfg(mode="golden", lab=dict(TINY_LAB, families=["is_above"])).replace(
                **{"rollout.max_new_tokens_code": 96, "rollout.max_new_tokens_test": 128}  # the lab's context
            ),
            tmp_path / "p.yaml",
        )
        assert stage_main(warmstart.run, "warmstart", ["--params", params]) == 2
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: outputs/") and "No space left on device" in last, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert not [p.name for p in outputs.iterdir() if "warmstart" in p.name]  # nor its .tmp


@pytest.mark.e2e
def test_flow_runs_under_prefect(tmp_path, monkeypatch, prefect_harness, capsys):
    from support import write_params

    monkeypatch.chdir(tmp_path)
    cfg = _cfg(model={"code_path": "/models/coder", "test_path": "/models/tester"})
    metrics = warmstart.run(write_params(cfg, tmp_path / "params.yaml"))
    assert metrics["skipped"] is True
    assert "warmstart: skipped" in capsys.readouterr().out


def test_stage_main_reports_bad_override(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(
        "lab:\n  warmstart_epochs: 1\nrollout:\n  max_new_tokens_code: 96\n  max_new_tokens_test: 128\n"
    )
    from flows.common import stage_main

    assert stage_main(warmstart.run, "warmstart", ["lab.warmstart_lr=fast"]) == 2
    assert "lab.warmstart_lr" in capsys.readouterr().err
    # Lab values the loader accepts but the lab cannot use fail before any flow run, in one line.
    for override, key in [
        ("lab.families=[nope]", "lab.families"),
        ("lab.buggy_fraction=1.5", "lab.buggy_fraction"),
        ("lab.warmstart_test_examples_per_problem=0", "lab.warmstart_test_examples_per_problem"),
        ("lab.train_per_family=70", "lab.train_per_family"),
    ]:
        assert stage_main(warmstart.run, "warmstart", [override]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and key in err and err.count("\n") == 1
    assert not (tmp_path / "outputs").exists()


def test_selfplay_trains_code_model_on_both_roles(tmp_path, monkeypatch):
    """Self-play's single model also learns the black-box test prompt (D10)."""
    import codea1_core.models.sft

    seen = {}

    def fake_sft(model_dir, examples, out_dir, **kwargs):
        seen[Path(out_dir).name] = examples
        Path(out_dir).mkdir(parents=True)
        return {"train_loss": 1.0}

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(codea1_core.models.sft, "supervised_finetune", fake_sft)
    warmstart.warm_start(_cfg(mode="selfplay"))
    assert list(seen) == ["code"]
    users = [ex["messages"][1]["content"] for ex in seen["code"]]
    assert any("Question:\ndef " in u for u in users) and any(
        "## Role" in u and "Buggy Code" not in u for u in users
    )


def measure_code_model(model_dir: Path, problems: list, n_samples: int, sandbox_cfg) -> dict[str, float]:
    """Greedy + ``n_samples`` T=1.0 solutions per problem, run on the golden tests in the sandbox.

    Returns syntax-validity, mean per-test pass rate and all-tests pass rate per decoding, split into
    training families and held-out families.
    """
    import ast
    from collections import defaultdict

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from codea1_core.data.lab import FAMILIES
    from codea1_core.method.parsing import extract_code
    from codea1_core.method.prompts import code_messages
    from codea1_core.values import values_equal
    from sandbox import make_executor

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows = []
    torch.manual_seed(0)
    for p in problems:
        enc = tok.apply_chat_template(
            code_messages(p), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        n = enc["input_ids"].shape[1]
        with torch.no_grad():
            greedy = model.generate(**enc, max_new_tokens=96, do_sample=False)
            sampled = model.generate(
                **enc,
                max_new_tokens=96,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                num_return_sequences=n_samples,
            )
        rows.append((p, "greedy", extract_code(tok.decode(greedy[0][n:], skip_special_tokens=True))))
        rows += [(p, "t1", extract_code(tok.decode(s[n:], skip_special_tokens=True))) for s in sampled]
    with make_executor(sandbox_cfg) as ex:
        outcomes = ex.run_many([(code, [t.call for t in p.tests]) for p, _, code in rows])
    sums: dict[str, defaultdict] = defaultdict(lambda: defaultdict(float))
    for (p, kind, code), outs in zip(rows, outcomes, strict=True):
        assert not any(o.status == "infra_error" for o in outs)
        try:
            ast.parse(code)
            valid = 1.0
        except SyntaxError:
            valid = 0.0
        passed = [
            o.status == "ok" and values_equal(o.value, t.expected) for o, t in zip(outs, p.tests, strict=True)
        ]
        group = "heldout_families" if FAMILIES[p.entry_point].heldout else "train_families"
        for key in (kind, f"{kind}/{group}"):
            acc = sums[key]
            acc["n"] += 1
            acc["syntax_valid"] += valid
            acc["test_pass"] += sum(passed) / len(passed)
            acc["all_pass"] += float(all(passed))
    return {f"{key}/{m}": v / acc["n"] for key, acc in sums.items() for m, v in acc.items() if m != "n"}


def measure_test_model(model_dir: Path, problems: list, n_samples: int, sandbox_cfg) -> dict[str, float]:
    """White-box suites (greedy + T=1.0) against each problem's first buggy variant, checked in the sandbox.

    Returns asserts per suite, calls that run on the reference, correct predicted answers among those,
    and the share of suites with at least one test the buggy code fails (bug caught).
    """
    import ast
    from collections import defaultdict

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from codea1_core.data.lab import buggy_variants
    from codea1_core.method.parsing import extract_tests
    from codea1_core.method.prompts import test_messages
    from codea1_core.values import values_equal
    from sandbox import make_executor

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows = []
    torch.manual_seed(0)
    for p in problems:
        bug = buggy_variants(p)[0]
        enc = tok.apply_chat_template(
            test_messages(p, bug, 8), add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        n = enc["input_ids"].shape[1]
        with torch.no_grad():
            greedy = model.generate(**enc, max_new_tokens=200, do_sample=False)
            sampled = model.generate(
                **enc,
                max_new_tokens=200,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                num_return_sequences=n_samples,
            )
        texts = [("greedy", greedy[0])] + [("t1", s) for s in sampled]
        for kind, ids in texts:
            suite = extract_tests(tok.decode(ids[n:], skip_special_tokens=True), p.entry_point)
            rows.append((p, bug, kind, suite))
    jobs = [
        (src, [t.call for t in suite.tests])
        for p, bug, _, suite in rows
        for src in (p.reference_solution, bug)
    ]
    with make_executor(sandbox_cfg) as ex:
        outs = ex.run_many(jobs)
    sums: dict[str, defaultdict] = defaultdict(lambda: defaultdict(float))
    for i, (_, _, kind, suite) in enumerate(rows):
        ref, cand = outs[2 * i], outs[2 * i + 1]
        valid = [(t, r, c) for t, r, c in zip(suite.tests, ref, cand, strict=True) if r.status == "ok"]
        right = 0
        for t, r, _ in valid:
            try:
                right += values_equal(ast.literal_eval(t.answer), r.value)
            except (ValueError, SyntaxError):
                pass
        acc = sums[kind]
        acc["n"] += 1
        acc["asserts"] += len(suite.tests)
        acc["runs_on_reference"] += len(valid)
        acc["right_answer"] += right
        acc["bug_caught"] += float(any(not (c.ok and values_equal(c.value, r.value)) for _, r, c in valid))
    out = {}
    for kind, acc in sums.items():
        out |= {
            f"test/{kind}/asserts_per_suite": acc["asserts"] / acc["n"],
            f"test/{kind}/runs_on_reference_frac": acc["runs_on_reference"] / max(1.0, acc["asserts"]),
            f"test/{kind}/right_answer_frac": acc["right_answer"] / max(1.0, acc["runs_on_reference"]),
            f"test/{kind}/bug_caught": acc["bug_caught"] / acc["n"],
        }
    return out


@pytest.mark.slow
def test_default_warm_start_leaves_room_for_improvement(tmp_path, monkeypatch, repo_root):
    """The params.yaml warm start (timed) writes valid code most of the time and passes some, not all, tests."""
    from codea1_core.config import load_config
    from codea1_core.data.lab import FAMILIES, lab_problems

    cfg = load_config(repo_root / "params.yaml")
    monkeypatch.chdir(tmp_path)
    metrics = warmstart.warm_start(cfg)
    print(warmstart.summary_line(metrics))
    heldout = lab_problems(cfg.lab, "test")
    room = measure_code_model(tmp_path / "outputs/warmstart/code", heldout, 4, cfg.sandbox)
    trained_families = [p for p in heldout if not FAMILIES[p.entry_point].heldout]
    room |= measure_test_model(tmp_path / "outputs/warmstart/test", trained_families, 2, cfg.sandbox)
    for key, value in sorted(room.items()):
        print(f"{key:40s} {value:.3f}")
    assert room["greedy/syntax_valid"] > 0.6 and room["t1/syntax_valid"] > 0.5
    assert 0.1 < room["greedy/train_families/test_pass"] < 0.95
    assert room["greedy/train_families/all_pass"] < 0.9
    assert room["test/greedy/asserts_per_suite"] > 4 and room["test/greedy/runs_on_reference_frac"] > 0.8
    assert 0.05 < room["test/t1/bug_caught"] < 0.95


def test_training_problems_prefer_the_prepared_lab_set(tmp_path, monkeypatch):
    from codea1_core.data.lab import lab_problems
    from codea1_core.data.prepared import save_prepared

    monkeypatch.chdir(tmp_path)
    cfg = _cfg()
    generated = lab_problems(cfg.lab, "train")
    assert warmstart.training_problems(cfg) == generated  # no prepared set yet
    save_prepared(generated[:3], tmp_path / "data/prepared/train.parquet")
    prepared = warmstart.training_problems(cfg)
    assert [p.id for p in prepared] == [p.id for p in generated[:3]]
    assert prepared[0].metadata["buggy"] == generated[0].metadata["buggy"]
