"""The demo retrievers trained side by side, in two spawned processes (moved from
tests/unit/test_demo_training.py: unit tests start no processes)."""

from __future__ import annotations

import io

from retrieval.demo_training import DEMO_MODELS, train_model
from tests.unit.test_demo_training import TINY


def test_models_trained_side_by_side_are_the_ones_trained_in_turn(tmp_path) -> None:
    """train_demo_retriever trains the two models in two spawned processes on a 2-core machine:
    the same checkpoint bytes as one after the other. On a few steps of a tiny split (the demo's
    800 references took minutes to draw and render in each of the four trainings): the
    processes, the seeding and the one-thread determinism are the same whatever the size."""
    from annotation.management.commands.train_demo_retriever import train_all

    split = {k: v for k, v in TINY.items() if k != "steps"}
    jobs = [("compose", tmp_path / "a" / "compose.pt", 3), ("caption", tmp_path / "a" / "caption.pt", 2)]
    out = io.StringIO()
    side_by_side = train_all(jobs, 3, out, split=split)
    # one progress line (not a TTY: one per tenth of the steps at most), ending with the counts
    lines = out.getvalue().splitlines()
    assert 1 <= len(lines) <= 11 and lines[-1].startswith(
        "training the demo retrievers: compose 3/3, caption 2/2 steps"
    )
    in_turn = [
        train_model(tmp_path / "b" / f"{name}.pt", DEMO_MODELS[name], seed=3, steps=steps, **split)
        for name, _, steps in jobs
    ]
    assert [digest for digest, _ in side_by_side] == in_turn
    assert len(set(in_turn)) == 2
