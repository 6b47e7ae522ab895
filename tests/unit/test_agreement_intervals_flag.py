"""The agreement intervals' scheduling (annotation.agreement.intervals): at most one task pending
per study and options, a burst of submits sends one, a page brings a delayed one forward, a lost
flag frees itself, a broker outage frees it at once. No database, no process: a stand-in study
and a recording send_task."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from annotation.agreement import intervals

OPTIONS = {"dimension": None, "n_boot": 1000, "seed": 0, "constant_pairs": "undefined"}


@pytest.fixture
def sent(settings, tmp_path, monkeypatch):
    from retrieval.jobs import sending

    settings.VAR_DIR = tmp_path
    out: list[tuple] = []
    monkeypatch.setattr(
        sending, "send_task", lambda name, *args, countdown=None: out.append((name, args, countdown)) or True
    )
    return out


STUDY = SimpleNamespace(pk=7, created_at=datetime(2026, 1, 2, tzinfo=UTC))


def test_a_burst_sends_one_task_and_a_page_brings_it_forward(sent) -> None:
    assert intervals.request_intervals(STUDY, OPTIONS, countdown=30)
    for _ in range(5):  # the rest of the burst: the delayed task is pending
        assert not intervals.request_intervals(STUDY, OPTIONS, countdown=30)
    assert len(sent) == 1 and sent[0][0] == intervals.INTERVALS_TASK and sent[0][2] == 30
    assert intervals.request_intervals(STUDY, OPTIONS)  # a page: now, not in 30 s
    assert not intervals.request_intervals(STUDY, OPTIONS)  # ... once
    assert len(sent) == 2 and sent[1][2] is None
    _, flag = intervals._paths(STUDY, OPTIONS)
    intervals._release(flag, sent[0][1][2])  # the delayed task ends: the flag is not its own any more
    assert flag.exists()
    intervals._release(flag, sent[1][1][2])
    assert not flag.exists()
    assert not intervals.request_intervals(STUDY, {**OPTIONS, "n_boot": 0})  # bootstrap=0: nothing to compute
    assert len(sent) == 2


def test_a_lost_flag_frees_itself_and_a_broker_outage_frees_it(sent, monkeypatch) -> None:
    from retrieval.jobs import sending

    assert intervals.request_intervals(STUDY, OPTIONS, countdown=30)
    _, flag = intervals._paths(STUDY, OPTIONS)
    old = time.time() - intervals.PENDING_STALE_SECONDS - 1
    os.utime(flag, (old, old))  # its worker died long ago
    assert intervals.request_intervals(STUDY, OPTIONS, countdown=30) and len(sent) == 2
    flag.unlink()
    monkeypatch.setattr(sending, "send_task", lambda *a, **k: False)  # the broker is down
    assert not intervals.request_intervals(STUDY, OPTIONS) and not flag.exists()


def test_blocks_are_kept_per_study_and_options(sent) -> None:
    block = {
        "fingerprint": "v1",
        "confidence_intervals": {"n_boot": 1000},
        "undefined": {},
        "computed_at": 1.0,
        "seconds": 0.1,
    }
    intervals._write(STUDY, OPTIONS, block)
    assert intervals.stored(STUDY, OPTIONS) == block
    assert intervals.stored(STUDY, {**OPTIONS, "seed": 1}) is None
    again = SimpleNamespace(pk=7, created_at=datetime(2026, 1, 3, tzinfo=UTC))  # same id, a new study
    assert intervals.stored(again, OPTIONS) is None
