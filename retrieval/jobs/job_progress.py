"""Progress arithmetic shared by every job page (pure; no Django)."""

from __future__ import annotations


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the rate so far: ``elapsed * (total - done) / done``, never negative.

    ``None`` when nothing is done yet or the total is unknown (no rate to go by).
    """
    if done <= 0 or total <= 0:
        return None
    return max(0.0, elapsed * (total - done) / done)


def format_eta(seconds: float | None) -> str:
    """``h:mm:ss`` of a number of seconds (an ETA); ``?`` when there is none yet."""
    if seconds is None:
        return "?"
    h, rest = divmod(int(round(seconds)), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


class ProgressLine:
    """One progress line on a terminal, for long work in a command (``./cirval up``'s start).

    On a TTY an :meth:`update` with a new text rewrites the line in place (carriage return,
    clear to the end of the line), at most every ``tty_every`` seconds. Elsewhere (a log file, a pipe)
    a line is printed only when the work crosses the next ``milestone`` fraction (every
    10 % by default), so a long run adds a handful of lines, never one per step.
    :meth:`close` ends the line with its last text. ``stream``: a text stream, or Django's
    command ``OutputWrapper`` (written to through its own stream, which does not add an
    ending to every write)."""

    def __init__(self, stream, milestone: float = 0.1, tty_every: float = 0.5, clock=None) -> None:
        import time

        self.stream = getattr(stream, "_out", stream)  # a command's OutputWrapper: its stream
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.milestone = milestone
        self.tty_every = tty_every
        self.clock = clock or time.monotonic
        self._milestones = 0  # milestones printed (not on a TTY)
        self._last_draw: float | None = None
        self._text = ""
        self._printed = ""  # the last line printed (not on a TTY)
        self._drawn = ""  # the text on the line now (on a TTY)

    def update(self, text: str, fraction: float) -> None:
        """Show ``text`` (the work is ``fraction`` done, 0 to 1) if it is time to."""
        self._text = text
        if self.tty:
            now = self.clock()
            if text != self._drawn and (self._last_draw is None or now - self._last_draw >= self.tty_every):
                self._last_draw, self._drawn = now, text
                self.stream.write(f"\r\033[K{text}")
                self.stream.flush()
        elif fraction >= self._milestones * self.milestone - 1e-9:
            self._milestones = int(fraction / self.milestone + 1e-9) + 1
            self._print(text)

    def close(self, text: str | None = None) -> None:
        """End the line with ``text`` (default: the last one shown)."""
        text = self._text if text is None else text
        if not text:  # nothing was ever shown
            return
        if self.tty:
            self.stream.write(f"\r\033[K{text}\n")
            self.stream.flush()
        elif text != self._printed:
            self._print(text)

    def _print(self, text: str) -> None:
        self._printed = text
        self.stream.write(f"{text}\n")
        self.stream.flush()
