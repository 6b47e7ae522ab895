"""Settings come from the environment with working defaults."""

from __future__ import annotations

import pytest

from config.env import env_bool, env_int, env_list


def test_env_readers(monkeypatch):
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_INT", "12")
    monkeypatch.setenv("X_LIST", " a, b ,,c")
    assert env_bool("X_BOOL") is True and env_int("X_INT", 0) == 12 and env_list("X_LIST", []) == ["a", "b", "c"]
    monkeypatch.setenv("X_BOOL", "maybe")
    with pytest.raises(ValueError, match="X_BOOL"):
        env_bool("X_BOOL")


def test_worker_torch_threads_leave_the_reserved_cores_to_the_web_tier():
    from config.worker_tuning import torch_threads

    assert torch_threads(16, 1, 1) == 15
    assert torch_threads(16, 2, 2) == 7
    assert torch_threads(2, 1, 2) == 1  # never zero
    assert torch_threads(1, 1, 1) == 1
    assert torch_threads(8, 0, 4) == 2
