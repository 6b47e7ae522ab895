"""annotation.core.serving: the next-item strategy, capacity and lease expiry."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest

from annotation.core.serving import (
    AGREEMENT_SUBSET,
    ALL_SLOTS_RESERVED,
    CLOSEST_TO_OVERLAP,
    FRESH_ITEM,
    QUEUE_EMPTY,
    RESUME_OWN_LEASE,
    SKIPPED_ITEM,
    Candidate,
    Choice,
    capacity_left,
    choose_next,
    nothing_to_serve,
)


def C(item, n=3, done=0, leased=0, *, judged=False, skipped=False, agree=False, order=None):
    return Candidate(
        item_id=item,
        overlap=n,
        completed=done,
        reserved=leased,
        judged_by_me=judged,
        skipped_by_me=skipped,
        in_agreement_subset=agree,
        order_key=item if order is None else order,
    )


def test_capacity_left():
    assert capacity_left(C(1, n=3, done=1, leased=1)) == 1
    assert capacity_left(C(1, n=3, done=2, leased=2)) == 0  # floored
    assert capacity_left(C(1, n=3, done=3)) == 0
    assert capacity_left(C(1, n=1, agree=True, done=2), n_annotators=5) == 3
    assert capacity_left(C(1, n=1, agree=False, done=0), n_annotators=5) == 1


def test_candidate_rejects_bad_counts():
    with pytest.raises(ValueError, match="completed"):
        C(1, done=-1)
    with pytest.raises(ValueError, match="overlap"):
        C(1, n=0)


def test_never_serves_an_item_twice():
    cands = [C(1, done=2, judged=True), C(2, done=0)]
    assert choose_next(cands) == Choice(2, FRESH_ITEM)
    assert choose_next([C(1, done=1, judged=True)]) == Choice(None, QUEUE_EMPTY)


def test_resume_own_lease_first():
    cands = [C(1, done=2), C(2, agree=True), C(3)]
    assert choose_next(cands, annotator_holds=3) == Choice(3, RESUME_OWN_LEASE)
    # A held item missing from the candidates is still resumed (the lease is the caller's fact).
    assert choose_next(cands, annotator_holds=99) == Choice(99, RESUME_OWN_LEASE)
    # ... but never one the candidates show as judged by this annotator.
    judged = [C(1, done=1, judged=True), C(2)]
    assert choose_next(judged, annotator_holds=1) == Choice(2, FRESH_ITEM)
    # A lease on a skipped item means it came back (skipping releases the lease): resume.
    skipped = [C(1, skipped=True), C(2)]
    assert choose_next(skipped, annotator_holds=1) == Choice(1, RESUME_OWN_LEASE)


def test_agreement_subset_first_by_order_key():
    cands = [C(1, done=2), C(2, agree=True, order=9), C(3, agree=True, done=4, order=5)]
    assert choose_next(cands, n_annotators=10) == Choice(3, AGREEMENT_SUBSET)
    # Its capacity is the number of study annotators, not the overlap.
    assert choose_next([C(3, n=3, agree=True, done=4), C(4)], n_annotators=10) == Choice(3, AGREEMENT_SUBSET)
    assert choose_next([C(3, n=3, agree=True, done=9, leased=1), C(4)], n_annotators=10) == Choice(4, FRESH_ITEM)
    # Judged agreement items are not served again.
    assert choose_next([C(3, agree=True, judged=True), C(4, done=1)], n_annotators=10) == Choice(4, CLOSEST_TO_OVERLAP)


def test_closest_to_overlap_preferred():
    cands = [C(1, done=0), C(2, done=1), C(3, done=1, leased=1), C(4, done=3)]
    # Item 3 has 2 of 3 slots taken (1 judgement + 1 lease): it is closest; item 4 is full.
    assert choose_next(cands) == Choice(3, CLOSEST_TO_OVERLAP)
    assert choose_next([C(1), C(2, done=1)]) == Choice(2, CLOSEST_TO_OVERLAP)
    # With different N, the smallest remaining capacity wins over the raw count.
    assert choose_next([C(1, n=5, done=3), C(2, n=3, done=2)]) == Choice(2, CLOSEST_TO_OVERLAP)


def test_ties_broken_by_order_key_deterministically():
    cands = [C("a", done=1, order=7), C("b", done=1, order=2), C("c", done=1, order=4)]
    for _ in range(5):
        random.shuffle(cands)
        assert choose_next(cands) == Choice("b", CLOSEST_TO_OVERLAP)
    fresh = [C("x", order=3), C("y", order=1), C("z", order=2)]
    assert choose_next(fresh) == Choice("y", FRESH_ITEM)
    # Equal order keys fall back to the item id.
    assert choose_next([C("q", order=0), C("p", order=0)]) == Choice("p", FRESH_ITEM)


def test_full_items_never_served():
    cands = [C(1, done=3), C(2, done=2, leased=1), C(3, leased=3), C(4, done=1, leased=5)]
    assert choose_next(cands) == Choice(None, ALL_SLOTS_RESERVED)
    assert choose_next([C(1, done=3), C(2, done=3, judged=True)]) == Choice(None, QUEUE_EMPTY)
    assert choose_next([]) == Choice(None, QUEUE_EMPTY)
    assert not choose_next([]).served and choose_next([C(1)]).served


def test_queue_empty_vs_all_slots_reserved():
    # Blocked only by other annotators' leases: may free up later.
    assert choose_next([C(1, done=2, leased=1)]).rule == ALL_SLOTS_RESERVED
    # Complete: nothing will come back.
    assert choose_next([C(1, done=3)]).rule == QUEUE_EMPTY
    # A skipped item blocked by leases also means "wait".
    assert choose_next([C(1, done=1, leased=2, skipped=True)]).rule == ALL_SLOTS_RESERVED


def test_nothing_to_serve_is_the_rule_the_queue_uses():
    # An item still short of judgements waits (its slots are leased by others).
    assert nothing_to_serve([C(1, done=2)]) == Choice(None, ALL_SLOTS_RESERVED)
    assert nothing_to_serve([C(1, done=3), C(2, done=3)]) == Choice(None, QUEUE_EMPTY)
    assert nothing_to_serve([]) == Choice(None, QUEUE_EMPTY)
    # Items this annotator judged never make them wait.
    assert nothing_to_serve([C(1, done=1, judged=True)]).rule == QUEUE_EMPTY
    # Agreement items wait for every annotator, not only for the overlap.
    assert nothing_to_serve([C(1, done=3, agree=True)], n_annotators=5).rule == ALL_SLOTS_RESERVED
    assert nothing_to_serve([C(1, done=3, agree=True)]).rule == QUEUE_EMPTY
    # A lazy iterator is read only up to the first waiting item.
    seen = []

    def items():
        for c in (C(1, done=1), C(2, done=3)):
            seen.append(c.item_id)
            yield c

    assert nothing_to_serve(items()).rule == ALL_SLOTS_RESERVED
    assert seen == [1]


def test_skipped_items_come_back_last():
    cands = [C(1, done=2, skipped=True), C(2)]
    assert choose_next(cands) == Choice(2, FRESH_ITEM)
    cands = [C(1, done=2, skipped=True), C(2, judged=True), C(3, skipped=True, agree=True, order=50)]
    assert choose_next(cands, n_annotators=4) == Choice(3, SKIPPED_ITEM)
    assert choose_next(cands[:2]) == Choice(1, SKIPPED_ITEM)


def test_duplicate_candidates_rejected():
    with pytest.raises(ValueError, match="twice"):
        choose_next([C(1), C(1)])


# --------------------------------------------------------------------------- simulations


def _candidates(items, overlap, done, leases, annotator, skipped=frozenset(), agreement=frozenset()):
    out = []
    for i, item in enumerate(items):
        others = sum(1 for who, held in leases.items() if held == item and who != annotator)
        out.append(
            Candidate(
                item_id=item,
                overlap=overlap,
                completed=len(done[item]),
                reserved=others,
                judged_by_me=annotator in done[item],
                skipped_by_me=(annotator, item) in skipped,
                in_agreement_subset=item in agreement,
                order_key=i,
            )
        )
    return out


def test_simulation_20_annotators_overlap_3_sequential():
    items = [f"q{i:02d}" for i in range(50)]
    annotators = [f"a{i:02d}" for i in range(20)]
    done: dict[str, list[str]] = defaultdict(list)
    active = list(annotators)
    rules = Counter()
    while active:
        for a in list(active):
            choice = choose_next(_candidates(items, 3, done, {}, a))
            rules[choice.rule] += 1
            if choice.item is None:
                assert choice.rule == QUEUE_EMPTY
                active.remove(a)
                continue
            assert a not in done[choice.item]
            done[choice.item].append(a)
    assert {item: len(who) for item, who in done.items()} == {item: 3 for item in items}
    assert all(len(set(who)) == 3 for who in done.values())
    assert sum(len(who) for who in done.values()) == 150
    assert rules[FRESH_ITEM] == 50 and rules[CLOSEST_TO_OVERLAP] == 100


def test_simulation_concurrent_leases_skips_and_agreement_subset():
    """Leases interleave, some annotators skip; every item still ends with exactly N."""
    rng = random.Random(7)
    items = [f"q{i:02d}" for i in range(50)]
    agreement = frozenset(items[:5])
    annotators = [f"a{i:02d}" for i in range(20)]
    done: dict[str, list[str]] = defaultdict(list)
    leases: dict[str, str] = {}
    skipped: set[tuple[str, str]] = set()
    finished: set[str] = set()
    steps = 0
    while len(finished) < len(annotators):
        steps += 1
        assert steps < 10_000
        a = rng.choice(annotators)
        if a in finished:
            continue
        held = leases.get(a)
        choice = choose_next(
            _candidates(items, 3, done, leases, a, skipped, agreement),
            annotator_holds=held,
            n_annotators=len(annotators),
        )
        if choice.item is None:
            if choice.rule == QUEUE_EMPTY:
                finished.add(a)
            continue
        assert a not in done[choice.item]
        if held is None:
            leases[a] = choice.item  # take the lease; finish on a later turn
            continue
        assert choice == Choice(held, RESUME_OWN_LEASE)
        del leases[a]
        if rng.random() < 0.1 and (a, held) not in skipped:
            skipped.add((a, held))
        else:
            done[held].append(a)
    counts = {item: len(who) for item, who in done.items()}
    assert counts == {item: (20 if item in agreement else 3) for item in items}
    assert all(len(set(who)) == len(who) for who in done.values())
    assert not leases
    assert skipped  # the skip path was exercised
