"""The turn-by-turn verdict of a session (pure: no Django).

Under a session rubric with a turn verdict (session v2 on) every turn of a session is
answered valid or invalid. THE rule that derives a session's verdict from its turns is
:func:`valid_prefix`, with :func:`session_valid` defined by it:

* the *valid prefix* of a session is the number of its leading valid turns (turn 1, turn 2,
  … up to the first invalid turn); it is 0 when a session-level reject flag holds (the flags
  duplicate, inconsistency, conflict and circle name no turn, so they void every prefix);
* a session is *valid* when its valid prefix is the whole session: every turn valid and no
  reject flag.

CIRCLED truncates its generated sessions the same way (a session is cut after its last good
turn), so a study can export whole valid sessions or valid prefixes.

The same function is applied to one annotator's answers (their own verdict, as agreement
counts it) and to the consensus of every turn (:func:`annotation.core.consensus.decide_turns`),
where a turn is valid when its consensus validated it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def valid_prefix(turns: Sequence[bool], rejected: bool = False) -> int:
    """The number of leading valid turns (0 when ``rejected``: a session-level reject flag)."""
    if rejected:
        return 0
    n = 0
    for valid in turns:
        if valid is not True:
            break
        n += 1
    return n


def session_valid(turns: Sequence[bool], rejected: bool = False) -> bool:
    """A session is valid when its valid prefix is all of it (at least one turn)."""
    return len(turns) > 0 and valid_prefix(turns, rejected) == len(turns)


def turn_answers(per_turn: Sequence[Mapping[str, Any]] | None, key: str) -> tuple[bool, ...] | None:
    """One judgement's turn verdicts, read from its stored per-turn objects under ``key``;
    ``None`` when any turn has none (a judgement under a rubric without turn verdicts)."""
    if not per_turn:
        return None
    answers = tuple(row.get(key) if isinstance(row, Mapping) else None for row in per_turn)
    if any(not isinstance(a, bool) for a in answers):
        return None
    return answers  # type: ignore[return-value]
