"""Interactive studies: the settings and the stopping rule (pure; no Django).

In an interactive study the annotator plays the user of a retriever. They see a target
(its image, or its description as FISD's simulated user does) and the retriever's current
top candidates, and type feedback. Round ``t`` is one CIRCLED turn: a reference image (the
query's reference in round 1, afterwards the candidate the annotator picked, by default the
first) and the feedback text. The worker encodes each turn as the audit does (multimodal:
``normalise(normalise(image) + normalise(text))``), aggregates turns ``1..t`` with the
study's history strategy (:func:`retrieval.sessions.aggregate_history`: latest, average or
weighted, the session audit's one rule) and ranks the gallery with it, the round's
reference left out. The session ends when the target is within the top ``top_n`` (found) or
after ``max_rounds`` rounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from retrieval.sessions import DEFAULT_ALPHA, STRATEGIES

DEFAULT_TOP_N = 10
DEFAULT_MAX_ROUNDS = 5
DEFAULT_STRATEGY = "average"
TARGET_VIEWS = ("image", "description")
MAX_TOP_N = 50
MAX_ROUNDS_LIMIT = 20
MAX_TEXT = 500  # characters of one round's feedback

FOUND = "found"
OUT_OF_ROUNDS = "rounds"


@dataclass(frozen=True)
class InteractiveSettings:
    """An interactive study's settings (stored in ``Study.interactive``)."""

    retriever: str
    top_n: int = DEFAULT_TOP_N
    max_rounds: int = DEFAULT_MAX_ROUNDS
    strategy: str = DEFAULT_STRATEGY
    alpha: float = DEFAULT_ALPHA
    target_view: str = "image"

    def __post_init__(self) -> None:
        if not isinstance(self.retriever, str) or not self.retriever.strip():
            raise ValueError("an interactive study needs a retriever spec")
        if isinstance(self.top_n, bool) or not isinstance(self.top_n, int) or not 1 <= self.top_n <= MAX_TOP_N:
            raise ValueError(f"top_n must be an integer between 1 and {MAX_TOP_N}")
        if (
            isinstance(self.max_rounds, bool)
            or not isinstance(self.max_rounds, int)
            or not 1 <= self.max_rounds <= MAX_ROUNDS_LIMIT
        ):
            raise ValueError(f"max_rounds must be an integer between 1 and {MAX_ROUNDS_LIMIT}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")
        if self.target_view not in TARGET_VIEWS:
            raise ValueError(f"target_view must be one of {', '.join(TARGET_VIEWS)}")
        if not isinstance(self.alpha, (int, float)) or isinstance(self.alpha, bool) or not 0 <= self.alpha <= 1:
            raise ValueError("alpha must be a number between 0 and 1")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InteractiveSettings:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown interactive settings: {', '.join(sorted(unknown))}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hides_target(config: dict[str, Any] | None) -> bool:
    """Whether a study (its stored interactive settings; empty: not interactive) shows its
    annotators the target only as a description: they must then never be served the
    target's image (:func:`annotation.access.may_fetch_image`, the item payload, the prefetch)."""
    return bool(config) and config.get("target_view") == "description"


def outcome(rank: int | None, rounds_done: int, settings: InteractiveSettings) -> str:
    """``found`` when the target is within the top N, ``rounds`` when the last round has
    passed without it, else ``""`` (the session goes on)."""
    if rank is not None and rank <= settings.top_n:
        return FOUND
    if rounds_done >= settings.max_rounds:
        return OUT_OF_ROUNDS
    return ""


def clean_text(text: Any) -> str:
    """A round's feedback: stripped, one line, at most MAX_TEXT characters (ValueError if empty)."""
    if not isinstance(text, str):
        raise ValueError("the feedback must be text")
    cleaned = " ".join(text.split())
    if not cleaned:
        raise ValueError("type some feedback first")
    if len(cleaned) > MAX_TEXT:
        raise ValueError(f"the feedback is longer than {MAX_TEXT} characters")
    return cleaned
