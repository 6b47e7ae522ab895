"""annotation.studies.sampling: stratified pools, proportional allocation, per-annotator orders."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter

import pytest

from annotation.studies.sampling import (
    agreement_subset,
    largest_remainder,
    report_json,
    shuffle_for_annotator,
    stratified_sample,
    stratum_label,
)

CR, UN = "composition_required", "unresolved"

# The CIRCUS agreement study's published quotas (FORMATS.md 1.2): 50 items,
# circo 6+1 (its whole pool), cirr 8+7, fashioniq 7+7, lasco 7+7.
CIRCUS_QUOTAS = {
    ("circo", CR): 6,
    ("circo", UN): 1,
    ("cirr", CR): 8,
    ("cirr", UN): 7,
    ("fashioniq", CR): 7,
    ("fashioniq", UN): 7,
    ("lasco", CR): 7,
    ("lasco", UN): 7,
}


def pool(sizes: dict) -> list[tuple[str, tuple[str, str]]]:
    return [(f"{ds}::{cat[:4]}{i:04d}", (ds, cat)) for (ds, cat), n in sizes.items() for i in range(n)]


# Per-dataset pool sizes 7 / 86 / 250 / 250 as in the CIRCUS agreement manifest; the
# split by category (except circo's 6+1) is made up for the test.
POOL = pool(
    {
        ("circo", CR): 6,
        ("circo", UN): 1,
        ("cirr", CR): 50,
        ("cirr", UN): 36,
        ("fashioniq", CR): 140,
        ("fashioniq", UN): 110,
        ("lasco", CR): 125,
        ("lasco", UN): 125,
    }
)


def test_circus_quotas_respected():
    items, report, shortfall = stratified_sample(POOL, CIRCUS_QUOTAS, seed=20260423, total=50)
    assert len(items) == 50 and len(set(items)) == 50 and shortfall == 0
    strata = dict(POOL)
    assert Counter(strata[i] for i in items) == Counter(CIRCUS_QUOTAS)
    assert Counter(strata[i][0] for i in items) == {"circo": 7, "cirr": 15, "fashioniq": 14, "lasco": 14}
    assert report[("circo", CR)] == {"population": 6, "requested": 6, "selected": 6, "shortfall": 0}
    assert report[("cirr", UN)] == {"population": 36, "requested": 7, "selected": 7, "shortfall": 0}
    assert items == sorted(items)


def test_reproducible_and_independent_of_input_order():
    a = stratified_sample(POOL, CIRCUS_QUOTAS, seed=1)
    shuffled = list(POOL)
    random.Random(99).shuffle(shuffled)
    b = stratified_sample(shuffled, CIRCUS_QUOTAS, seed=1)
    assert a == b
    assert stratified_sample(list(reversed(POOL)), CIRCUS_QUOTAS, seed=1).items == a.items
    assert stratified_sample(POOL, CIRCUS_QUOTAS, seed=2).items != a.items


def test_strata_are_independent_and_samples_nested():
    base = stratified_sample(POOL, CIRCUS_QUOTAS, seed=5).items
    more = stratified_sample(POOL, {**CIRCUS_QUOTAS, ("lasco", UN): 20}, seed=5).items
    lasco_un = lambda ids: {i for i in ids if i.startswith("lasco::unre")}  # noqa: E731
    # Other strata unchanged; the bigger lasco/unresolved draw contains the smaller one.
    assert set(base) - lasco_un(base) == set(more) - lasco_un(more)
    assert lasco_un(base) < lasco_un(more) and len(lasco_un(more)) == 20


def test_shortfall_reported_when_quota_exceeds_stratum():
    sample = stratified_sample(POOL, {("circo", CR): 10, ("circo", UN): 3, ("cirr", CR): 2}, seed=3)
    assert sample.report[("circo", CR)] == {"population": 6, "requested": 10, "selected": 6, "shortfall": 4}
    assert sample.report[("circo", UN)] == {"population": 1, "requested": 3, "selected": 1, "shortfall": 2}
    assert sample.report[("cirr", CR)]["selected"] == 2
    assert sample.report[("lasco", CR)] == {"population": 125, "requested": 0, "selected": 0, "shortfall": 0}
    assert sample.shortfall == 6 and len(sample.items) == 9
    # The whole circo pool is taken.
    assert {i for i in sample.items if i.startswith("circo")} == {i for i, _ in POOL if i.startswith("circo")}
    # A quota for a stratum with no items at all.
    empty = stratified_sample(POOL, {("cirr", "ghost"): 2}, seed=3)
    assert empty.report[("cirr", "ghost")] == {"population": 0, "requested": 2, "selected": 0, "shortfall": 2}
    assert empty.items == []


def test_largest_remainder_published_example():
    # Hare quota / largest remainder, 10 seats, the classic six-party example
    # (47 000, 16 000, 15 800, 12 000, 6 100, 3 100 votes) -> 5, 2, 1, 1, 1, 0.
    votes = {"yellow": 47_000, "white": 16_000, "red": 15_800, "green": 12_000, "blue": 6_100, "pink": 3_100}
    assert largest_remainder(votes, 10) == {"yellow": 5, "white": 2, "red": 1, "green": 1, "blue": 1, "pink": 0}


def test_largest_remainder_hand_checked_and_edges():
    # 7 * (5, 3, 2) / 10 = 3.5, 2.1, 1.4 -> floors 3, 2, 1; the spare seat goes to .5.
    assert largest_remainder({"a": 5, "b": 3, "c": 2}, 7) == {"a": 4, "b": 2, "c": 1}
    # Equal remainders: larger population first, then stratum order.
    # 2 * (1, 3) / 4 = 0.5, 1.5 -> floors 0, 1; tied remainders: the larger stratum b wins.
    assert largest_remainder({"a": 1, "b": 3}, 2) == {"a": 0, "b": 2}
    # 2 * (1, 1, 2) / 4 = 0.5, 0.5, 1.0 -> floors 0, 0, 1; a and b tie fully: stratum order.
    assert largest_remainder({"b": 1, "a": 1, "c": 2}, 2) == {"b": 0, "a": 1, "c": 1}
    assert largest_remainder({"a": 3, "b": 4}, 50) == {"a": 3, "b": 4}
    assert largest_remainder({"a": 0}, 5) == {"a": 0}
    with pytest.raises(ValueError):
        largest_remainder({"a": 3}, -1)


@pytest.mark.parametrize("total", [1, 7, 50, 333, 593])
def test_proportional_allocation_sums_to_total(total):
    sample = stratified_sample(POOL, None, seed=11, total=total)
    assert len(sample.items) == total and sample.shortfall == 0
    assert sum(r["requested"] for r in sample.report.values()) == total
    for r in sample.report.values():
        assert r["selected"] == r["requested"] <= r["population"]


def test_proportional_allocation_values():
    # 50 of 593: exact shares 0.506, 0.084, 4.216, 3.035, 11.804, 9.275, 10.540, 10.540;
    # floors sum to 47; the 3 spare seats go to .804, .540, .540 (circo's .506 misses out).
    report = stratified_sample(POOL, None, seed=0, total=50).report
    assert {s: r["requested"] for s, r in report.items()} == {
        ("circo", CR): 0,
        ("circo", UN): 0,
        ("cirr", CR): 4,
        ("cirr", UN): 3,
        ("fashioniq", CR): 12,
        ("fashioniq", UN): 9,
        ("lasco", CR): 11,
        ("lasco", UN): 11,
    }


def test_total_larger_than_population_takes_everything():
    small = pool({("a", CR): 2, ("b", CR): 3})
    sample = stratified_sample(small, None, seed=0, total=8)
    assert len(sample.items) == 5 and sample.shortfall == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="quotas"):
        stratified_sample(POOL, None, seed=0)
    with pytest.raises(ValueError, match="total"):
        stratified_sample(POOL, CIRCUS_QUOTAS, seed=0, total=49)
    with pytest.raises(ValueError, match="more than once"):
        stratified_sample([("x", "s1"), ("x", "s2")], {"s1": 1}, seed=0)
    with pytest.raises(ValueError, match="non-negative"):
        stratified_sample(POOL, {("cirr", CR): -1}, seed=0)


def test_report_json_labels():
    report = stratified_sample(POOL, CIRCUS_QUOTAS, seed=0).report
    out = report_json(report)
    assert out["cirr::unresolved"]["selected"] == 7
    json.dumps(out)
    assert stratum_label(("lasco", CR)) == "lasco::composition_required" and stratum_label("x") == "x"


def test_shuffle_for_annotator():
    ids = [f"item{i:03d}" for i in range(50)]
    orders = {a: shuffle_for_annotator(ids, 20260423, a) for a in ("annotator_01", "annotator_02", "annotator_04")}
    for order in orders.values():
        assert sorted(order) == ids and len(order) == 50
    assert len({tuple(o) for o in orders.values()}) == 3  # individual orders
    assert orders["annotator_01"] != ids
    # Reproducible and independent of input order.
    assert shuffle_for_annotator(list(reversed(ids)), 20260423, "annotator_01") == orders["annotator_01"]
    assert shuffle_for_annotator(ids, 20260424, "annotator_01") != orders["annotator_01"]
    with pytest.raises(ValueError, match="more than once"):
        shuffle_for_annotator(["a", "a"], 1, "x")


def test_agreement_subset():
    ids = list(range(200))
    sub = agreement_subset(ids, 50, seed=7)
    assert len(sub) == 50 and len(set(sub)) == 50 and set(sub) <= set(ids) and sub == sorted(sub)
    assert agreement_subset(list(reversed(ids)), 50, seed=7) == sub
    assert agreement_subset(ids, 50, seed=8) != sub
    assert set(agreement_subset(ids, 20, seed=7)) <= set(sub)  # nested
    assert agreement_subset(ids, 0, seed=7) == []
    with pytest.raises(ValueError, match="exceeds"):
        agreement_subset(ids, 201, seed=7)


def order_sha256(item_ids) -> str:
    """SHA-256 (hex) of the ids joined with ``"\\n"`` in presentation order: how CIRCUS computes
    its ``assignment_ids_sha256`` field (the check of a presentation order below)."""
    return hashlib.sha256("\n".join(map(str, item_ids)).encode("utf-8")).hexdigest()


def test_order_sha256_published_values(fixtures_dir):
    # SHA-256("abc") is the FIPS 180-2 test vector.
    assert order_sha256(["abc"]) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert order_sha256(["a", "b"]) == hashlib.sha256(b"a\nb").hexdigest()
    # CIRCUS agreement study: every annotator's stored assignment_ids_sha256, from the
    # ids in presentation order; same 50 items, individual orders.
    sets, orders = set(), set()
    for path in sorted((fixtures_dir / "circus" / "agreement_users").glob("annotator_*.json")):
        data = json.loads(path.read_text())
        ids = [a["assignment_id"] for a in sorted(data["assignments"], key=lambda a: a["presentation_order"])]
        assert order_sha256(ids) == data["assignment_ids_sha256"]
        sets.add(frozenset(ids))
        orders.add(tuple(ids))
        strata = Counter((a["dataset"], a["hidden_category"]) for a in data["assignments"])
        assert strata == Counter(CIRCUS_QUOTAS)
    assert len(sets) == 1 and len(orders) == 7
