"""Issue 17: a running export gives the CPU up between batches (so the web tier is not
starved) and still streams the same files as one that never pauses."""

from __future__ import annotations

import pytest

from annotation.export import validated
from annotation.export.validated import export_study
from tests.integration.test_report_export import build_twelve

pytestmark = pytest.mark.django_db


def _files(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*.jsonl"))}


def test_export_pauses_between_batches_and_writes_the_same_files(tmp_path, settings, monkeypatch):
    study, _ = build_twelve()
    settings.EXPORT_YIELD_SECONDS = 0.25
    sleeps, yields = [], []
    monkeypatch.setattr(validated.time, "sleep", sleeps.append)
    monkeypatch.setattr(validated.os, "sched_yield", lambda: yields.append(1), raising=False)
    progress = []
    chunked = export_study(
        study, tmp_path / "chunked", chunk_size=5, progress=lambda stage, done, total: progress.append((stage, done))
    )
    assert sleeps == [0.25, 0.25, 0.25] and len(yields) == 3  # 12 items in batches of 5, 5 and 2
    assert [d for s, d in progress if s == "exporting"] == [0, 5, 10, 12]  # still streamed batch by batch

    settings.EXPORT_YIELD_SECONDS = 0
    sleeps.clear()
    whole = export_study(study, tmp_path / "whole")
    assert sleeps == [] and len(yields) == 4  # no sleep, the CPU is still given up once
    assert _files(chunked.path) == _files(whole.path) and _files(whole.path)
