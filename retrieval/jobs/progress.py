"""Progress arithmetic shared by every job page (pure; no Django)."""
from __future__ import annotations


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the rate so far: ``elapsed * (total - done) / done``, never negative.

    ``None`` when nothing is done yet or the total is unknown (no rate to go by).
    """
    if done <= 0 or total <= 0:
        return None
    return max(0.0, elapsed * (total - done) / done)
