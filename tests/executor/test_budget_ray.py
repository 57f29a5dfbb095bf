"""A memory budget given on the command line reaches a Ray cluster's workers (they are not started from this
process, so they do not inherit its environment); without one, each worker keeps its own default."""

from __future__ import annotations

import sys
import types

from pipebubble import budget, executor
from pipebubble.options import Scale


class _Task:
    def __init__(self, fn, options=None):
        self.fn, self.given = fn, options or {}

    def options(self, **given):
        return _Task(self.fn, given)

    def remote(self, *args, **kwargs):
        return (self.given, self.fn(*args, **kwargs))


def fake_ray(monkeypatch) -> None:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: True
    ray.remote = _Task
    ray.get = lambda futures: futures
    monkeypatch.setitem(sys.modules, "ray", ray)


def test_the_budget_travels_to_ray_tasks(monkeypatch):
    fake_ray(monkeypatch)
    out = executor.on_ray([("a", 0), ("b", 1)], lambda path, i: path, Scale("ray", memory_budget=2_000_000_000))
    assert out == [({"runtime_env": {"env_vars": {budget.ENV: "2000000000"}}}, "a"),
                   ({"runtime_env": {"env_vars": {budget.ENV: "2000000000"}}}, "b")]


def test_without_a_budget_ray_tasks_keep_their_own(monkeypatch):
    fake_ray(monkeypatch)
    assert executor.on_ray([("a", 0)], lambda path, i: path, Scale("ray")) == [({}, "a")]
