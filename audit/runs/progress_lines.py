"""Progress lines of a run (pure: no Django)."""

from __future__ import annotations


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def encoding_stage(done: int, total: int, images_per_s: float) -> str:
    """``encoding gallery: 1,234/5,000 images · 210 images/s · ETA 18 s`` (rate and ETA left out
    until there is a rate). Fits the run's 100-character stage field."""
    line = f"encoding gallery: {done:,}/{total:,} images"
    if images_per_s > 0:
        line += f" · {images_per_s:,.0f} images/s · ETA {_duration(max(0, total - done) / images_per_s)}"
    return line[:100]
