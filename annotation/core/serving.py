"""Which item an annotator gets next: pure strategy functions over plain data.

No Django, no Celery. The database layer queries one annotator's candidate items (in
SQL, locking rows with ``select_for_update(skip_locked=True)``), describes each as a
:class:`Candidate` and calls :func:`choose_next`; the returned :class:`Choice` names the
item and the rule that served it.

Rules, in order:

1. ``resume_own_lease``: the annotator holds an unexpired lease (``annotator_holds``):
   resume it, unless the candidates show that item as already judged by them. (Skipping
   must release the lease; a lease on a skipped item therefore means it came back by
   rule 4 and is resumed.)
2. ``agreement_subset``: items of the agreement subset (everyone judges them), by
   ``order_key`` (the caller may pass a per-annotator shuffled position here, as in the
   CIRCUS agreement study: same items, individual orders).
3. ``closest_to_overlap`` / ``fresh_item``: other items, closest to completing their
   overlap first: smallest remaining capacity ``N - completed - reserved``, then highest
   ``completed + reserved``, then highest ``priority`` (the suspicion score in a study served
   by suspicion, else 0), then ``order_key``, then ``item_id`` (deterministic). The
   rule is ``fresh_item`` when the chosen item has no judgement and no lease yet.
4. ``skipped_item``: items this annotator skipped come back last, once nothing else is
   left (agreement items first, then the same preference as rule 3).

An item is never served to an annotator who already judged it, and never when its
capacity is used up (``completed + reserved >= N``; for agreement items
``N = n_annotators`` when given). With nothing to serve, the choice is ``None`` with the
rule ``all_slots_reserved`` when some item this annotator could still judge is only
blocked by other annotators' leases (it may free up when they expire), else
``queue_empty``. The engine (:mod:`annotation.assignment.queue`) says ``refit_pending``
instead of ``queue_empty`` while a reliability-weighted adaptive study waits for a refit of its
annotator model, which may open a further slot on items whose split it no longer settles,
and ``panels_pending`` while the only items left wait for their candidate panels.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

RESUME_OWN_LEASE = "resume_own_lease"
AGREEMENT_SUBSET = "agreement_subset"
CLOSEST_TO_OVERLAP = "closest_to_overlap"
FRESH_ITEM = "fresh_item"
SKIPPED_ITEM = "skipped_item"
GOLD_ITEM = "gold_item"
TRAINING_ITEM = "training_item"
QUEUE_EMPTY = "queue_empty"
#: How a study serves its fresh items (``Study.serve_order``).
SERVE_RANDOM = "random"
SERVE_SUSPICION = "suspicion"
ALL_SLOTS_RESERVED = "all_slots_reserved"
REFIT_PENDING = "refit_pending"
#: Nothing to serve now but single-turn items whose candidate panel a worker is still
#: computing: an item is served only once its panel is stored (issue 39, item 2).
PANELS_PENDING = "panels_pending"


@dataclass(frozen=True)
class Candidate:
    """One item's state as seen by the annotator asking for work.

    ``overlap``: judgements wanted (N); ``completed``: judgements stored by anyone;
    ``reserved``: active (unexpired) leases held by *other* annotators;
    ``judged_by_me`` / ``skipped_by_me``: this annotator's history with the item;
    ``in_agreement_subset``: everyone in the study must judge it; ``order_key``: a
    stable sort key (position in the pool, or in this annotator's shuffled order);
    ``priority``: served first when higher, after the overlap rule (the suspicion score).
    """

    item_id: Hashable
    overlap: int
    completed: int = 0
    reserved: int = 0
    judged_by_me: bool = False
    skipped_by_me: bool = False
    in_agreement_subset: bool = False
    order_key: Any = 0
    priority: float = 0.0

    def __post_init__(self) -> None:
        for name in ("overlap", "completed", "reserved"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Candidate {self.item_id!r}: {name} must be a non-negative integer, got {value!r}")
        if self.overlap < 1:
            raise ValueError(f"Candidate {self.item_id!r}: overlap must be >= 1, got {self.overlap}")


@dataclass(frozen=True)
class Choice:
    """The decision: ``item`` (``None`` when nothing is served) and the ``rule`` behind it."""

    item: Hashable | None
    rule: str

    @property
    def served(self) -> bool:
        return self.item is not None


def queue_fields(serve_order: str) -> tuple[str, ...]:
    """THE order items are read in for serving, as SQL ordering fields: agreement items, then
    the items closest to their overlap, then (``SERVE_SUSPICION``) the highest suspicion
    score, then the study's seeded order: the database side of :func:`_preference` (the
    indexes ``studyitem_queue`` and ``studyitem_suspicion_queue`` follow it)."""
    if serve_order == SERVE_SUSPICION:
        return ("-agreement", "-taken", "-suspicion", "order_key")
    return ("-agreement", "-taken", "order_key")


def target_overlap(c: Candidate, n_annotators: int | None = None) -> int:
    """N for this item: ``n_annotators`` for agreement-subset items when given, else ``overlap``."""
    if c.in_agreement_subset and n_annotators is not None:
        return n_annotators
    return c.overlap


def capacity_left(c: Candidate, n_annotators: int | None = None) -> int:
    """Judgement slots still free: ``N - completed - reserved``, floored at 0."""
    return max(0, target_overlap(c, n_annotators) - c.completed - c.reserved)


def _preference(c: Candidate, n_annotators: int | None) -> tuple[Any, ...]:
    progress = c.completed + c.reserved
    return (capacity_left(c, n_annotators), -progress, -c.priority, c.order_key, c.item_id)


def _by_id(candidates: Sequence[Candidate]) -> dict[Hashable, Candidate]:
    by_id: dict[Hashable, Candidate] = {}
    for c in candidates:
        if c.item_id in by_id:
            raise ValueError(f"item {c.item_id!r} appears twice among the candidates")
        by_id[c.item_id] = c
    return by_id


def _choose_servable(servable: Sequence[Candidate], n_annotators: int | None) -> Choice | None:
    """Rules 2-4 on the items with a free slot: agreement subset, then fresh items, then skipped ones."""
    fresh = [c for c in servable if not c.skipped_by_me]
    agreement = [c for c in fresh if c.in_agreement_subset]
    if agreement:
        best = min(agreement, key=lambda c: (c.order_key, c.item_id))
        return Choice(best.item_id, AGREEMENT_SUBSET)
    if fresh:
        best = min(fresh, key=lambda c: _preference(c, n_annotators))
        rule = FRESH_ITEM if best.completed + best.reserved == 0 else CLOSEST_TO_OVERLAP
        return Choice(best.item_id, rule)
    skipped = [c for c in servable if c.skipped_by_me]
    if skipped:
        best = min(skipped, key=lambda c: (not c.in_agreement_subset, *_preference(c, n_annotators)))
        return Choice(best.item_id, SKIPPED_ITEM)
    return None


def choose_next(
    candidates: Sequence[Candidate], *, annotator_holds: Hashable | None = None, n_annotators: int | None = None
) -> Choice:
    """The next item for one annotator (see the module docstring for the rules)."""
    if n_annotators is not None and n_annotators < 1:
        raise ValueError(f"n_annotators must be >= 1, got {n_annotators}")
    by_id = _by_id(candidates)

    if annotator_holds is not None:
        held = by_id.get(annotator_holds)
        if held is None or not held.judged_by_me:
            return Choice(annotator_holds, RESUME_OWN_LEASE)

    open_items = [c for c in by_id.values() if not c.judged_by_me]
    servable = [c for c in open_items if capacity_left(c, n_annotators) > 0]
    chosen = _choose_servable(servable, n_annotators)
    if chosen is not None:
        return chosen
    return nothing_to_serve(open_items, n_annotators)


def nothing_to_serve(open_items: Iterable[Candidate], n_annotators: int | None = None) -> Choice:
    """Why nothing can be served, given the items this annotator has not judged:
    ``ALL_SLOTS_RESERVED`` while one of them still waits for judgements (others hold its
    slots; it may come back when a lease runs out), else ``QUEUE_EMPTY``. Stops at the
    first waiting item, so ``open_items`` may be a lazy iterator."""
    waiting = any(c.completed < target_overlap(c, n_annotators) for c in open_items if not c.judged_by_me)
    return Choice(None, ALL_SLOTS_RESERVED if waiting else QUEUE_EMPTY)


def gold_due(served: int, gold_served: int, rate: float, training: int = 0) -> str | None:
    """Whether an annotator's next item is a gold item, and under which rule.

    ``served``: items served to the annotator so far (gold included); ``gold_served``: gold
    items among them. ``TRAINING_ITEM`` while fewer than ``training`` gold items were
    served (the training phase, before any real item); then ``GOLD_ITEM`` whenever the gold
    share would fall behind ``rate``: gold is due when ``gold_served < floor(rate *
    (served + 1))``, so at 5 % the 20th, 40th, ... item is gold. ``None`` otherwise.
    """
    if not 0 <= rate <= 1:
        raise ValueError(f"gold rate must be within [0, 1], got {rate}")
    if served < 0 or gold_served < 0 or gold_served > served or training < 0:
        raise ValueError(f"bad counts: served={served}, gold_served={gold_served}, training={training}")
    if gold_served < training:
        return TRAINING_ITEM
    if gold_served < int(rate * (served + 1) + 1e-9):
        return GOLD_ITEM
    return None


def choose_gold(candidates: Sequence[Candidate], rule: str) -> Choice | None:
    """The gold item to serve under ``rule`` (from :func:`gold_due`): the first by
    ``order_key`` (then ``item_id``) that this annotator has not judged; gold items have no
    overlap limit. ``None`` when no gold item is left for them."""
    left = [c for c in candidates if not c.judged_by_me and not c.skipped_by_me]
    if not left:
        return None
    best = min(left, key=lambda c: (c.order_key, c.item_id))
    return Choice(best.item_id, rule)
