"""Guarantees callers rely on instead of checking: every executor closes (also as ``with``), every CLI
subcommand has its flow entry point (the CLI's old "not implemented yet" fallback is gone)."""

from __future__ import annotations

import importlib

import pytest

from sandbox import DockerExecutor, Executor, ProcessExecutor

PROTOCOL = ("run", "run_many", "close", "__enter__", "__exit__")


def test_every_executor_class_has_the_protocol() -> None:
    from sandbox.ray_executor import RayExecutor  # importable without Ray: Ray is imported when one is built

    assert all(name in dir(Executor) for name in PROTOCOL)
    for cls in (ProcessExecutor, DockerExecutor, RayExecutor):
        missing = [name for name in PROTOCOL if not callable(getattr(cls, name, None))]
        assert missing == [], f"{cls.__name__} lacks {missing}"


class _Client:
    """A docker client stand-in that counts ``close`` calls (no container is created here)."""

    def __init__(self) -> None:
        self.closed = 0
        self.containers = self

    def close(self) -> None:
        self.closed += 1


def test_regression_docker_executor_works_as_a_with_block() -> None:
    """Bug: ``DockerExecutor`` had no ``close``/``__enter__``: ``sandbox.backend=docker`` crashed the train flow
    (``with make_executor(...)``) and prepare (``executor.close()``), while solve/attack/evaluate asked
    ``hasattr(executor, "close")``. A client the caller passed in stays the caller's to close."""
    client = _Client()
    with DockerExecutor(workers=1, client=client) as ex:
        assert ex.run_many([]) == []
    assert client.closed == 0


def test_docker_executor_closes_the_client_it_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox import docker_executor

    client = _Client()
    monkeypatch.setattr(docker_executor, "_connect", lambda: client)
    with DockerExecutor(workers=1):
        pass
    assert client.closed == 1


def _commands() -> dict[str, str]:
    """CLI subcommand -> the function of its flow module it calls (``run``: DVC stages, ``main``: the rest)."""
    from flows.cli import app

    names = {(c.name or c.callback.__name__) for c in app.registered_commands}
    stages = {"prepare", "warmstart", "train", "evaluate", "register"}
    return {name: "run" if name in stages else "main" for name in names - {"ui"}}


def test_cli_knows_every_subcommand() -> None:
    assert set(_commands()) == {
        "prepare",
        "warmstart",
        "train",
        "evaluate",
        "register",
        "solve",
        "attack",
        "plan",
        "serve",
        "deploy",
        "data",
    }


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_cli_subcommand_has_its_entry_point(name: str) -> None:
    module = importlib.import_module(f"flows.{name}")
    assert callable(getattr(module, _commands()[name]))
