"""A worker lowers its own CPU priority before it forks its pool (config.worker_tuning.lower_priority)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import os
from config.worker_tuning import lower_priority, scheduling
base = os.nice(0)
lower_priority()
child = os.fork()
if child == 0:  # a pool process inherits its parent's priority
    print("child", scheduling(), os.nice(0) - base, flush=True)
    os._exit(0)
os.waitpid(child, 0)
print("parent", scheduling(), os.nice(0) - base)
"""


def priority_with(value: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "WORKER_NICE"}
    if value is not None:
        env["WORKER_NICE"] = value
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:2]


@pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE"),
    reason="needs Linux's idle scheduling class (os.SCHED_IDLE), which this platform lacks",
)
def test_by_default_the_worker_and_its_pool_run_in_the_idle_class():
    child, parent = priority_with(None)
    assert parent.startswith("parent idle class") and child.startswith("child idle class")


def test_a_number_is_a_nice_value_and_zero_keeps_the_normal_priority():
    if os.nice(0) > 0:
        pytest.skip(
            "this test process already runs niced, so a worker cannot be shown to keep nice 0 "
            "(a nice value is never lowered back)"
        )
    assert priority_with("7") == ["child nice 7 7", "parent nice 7 7"]
    assert priority_with("0") == ["child nice 0 0", "parent nice 0 0"]
