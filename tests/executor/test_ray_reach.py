"""A Ray cluster that cannot be reached is a one-line error naming its address, said at once (Ray itself retries
for minutes); a job of one file is mapped in this process, and ``notes`` says so once. No cluster, and no Ray,
is needed: a stand-in records whether ``ray.init`` was called."""

from __future__ import annotations

import os
import socket
import sys
import time
import types

import pytest

from pipebubble import executor
from pipebubble.errors import PipebubbleError
from pipebubble.options import Scale


def where(path: str, position: int, workers: int = 1) -> tuple[str, int]:
    return path, os.getpid()


@pytest.fixture
def ray_init(monkeypatch) -> list[dict]:
    """``ray.init``'s calls, through a stand-in for Ray; what ``notes`` held before is dropped."""
    calls: list[dict] = []
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False,
                                                                  init=lambda **kwargs: calls.append(kwargs)))
    executor.notes()
    return calls


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_address_nothing_listens_at_is_refused_at_once_naming_it(ray_init, scheme):
    address = f"{scheme}127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(PipebubbleError, match=f"^--ray-address {address}: no Ray cluster answers there"):
        executor.each([("a", 0), ("b", 1)], where, Scale("ray", ray_address=address))
    assert time.monotonic() - started < executor.RAY_CONNECT_S and not ray_init


@pytest.mark.parametrize("address", ["nowhere", "host:port", ":6379"])
def test_an_address_that_is_no_host_and_port_is_refused(ray_init, address):
    with pytest.raises(PipebubbleError, match="expected auto, HOST:PORT or ray://HOST:PORT"):
        executor.each([("a", 0), ("b", 1)], where, Scale("ray", ray_address=address))
    assert not ray_init


def test_auto_without_a_running_cluster_is_said_in_our_words(monkeypatch):
    def no_cluster(**_):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                              "setting `--address` flag or `RAY_ADDRESS` environment variable.")

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False, init=no_cluster))
    with pytest.raises(PipebubbleError, match="^--ray-address auto: no Ray cluster is running on this machine"):
        executor.each([("a", 0), ("b", 1)], where, Scale("ray", ray_address="auto"))


def test_an_address_that_answers_goes_on_to_ray(ray_init, monkeypatch):
    ray = sys.modules["ray"]  # tasks run as they are submitted
    monkeypatch.setattr(ray, "remote", lambda fn: types.SimpleNamespace(remote=fn), raising=False)
    monkeypatch.setattr(ray, "get", lambda futures: futures, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        out = executor.each([("a", 0), ("b", 1)], where, Scale("ray", ray_address=address))
    assert [path for path, _ in out] == ["a", "b"] and [call["address"] for call in ray_init] == [address]
    assert executor.notes() == []


def test_one_file_on_ray_is_mapped_here_and_noted_once(ray_init):
    scale = Scale("ray", ray_address="127.0.0.1:1")
    assert executor.each([("a", 0)], where, scale) == [("a", os.getpid())]
    executor.each([("a", 0)], where, scale)
    assert executor.notes() == ["--executor ray was not used: one file is mapped in this process (Ray maps two "
                                "or more)"]
    assert executor.notes() == [] and not ray_init


def test_the_local_executor_notes_nothing(ray_init):
    executor.each([("a", 0)], where, Scale("local"))
    executor.ran_here(Scale("local"), "anything")
    assert executor.notes() == []
