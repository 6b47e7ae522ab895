"""retrieval.protocols against re-implementations of CLIP4Cir's (CIRR, FashionIQ) and CIRCO's /
SEARLE's evaluation logic (tests/reference_impl.py) on the same embeddings, to 1e-9.

The ranks come from :func:`retrieval.ranking.rank_queries` exactly as an audit computes them
(the reference removed, or kept with ``--keep-reference``), with ``reference_ahead``; the
protocols then put the reference back (FashionIQ, CIRCO) or keep it out (CIRR)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from retrieval.protocols import KEPT, PROTOCOLS, REMOVED, QueryRanks, adjusted_rank, figures, protocol_report
from retrieval.ranking import rank_queries
from tests.reference_impl import circo_evaluation, clip4cir_cirr, clip4cir_fiq, searle_circo_predictions

G, D = 300, 12


def embeddings(seed: int, n: int) -> torch.Tensor:
    x = torch.randn(n, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / x.norm(dim=1, keepdim=True)


def audit_ranks(queries, gallery, positives, refs, removed: bool, groups=None):
    res = rank_queries(
        queries,
        gallery,
        positives,
        refs if removed else None,
        top_k=0,
        return_per_positive=True,
        groups=groups,
        references=refs,
    )
    return res


def percent(values: dict) -> dict:
    return {k: v * 100 for k, v in values.items() if isinstance(v, float)}


@pytest.mark.parametrize("removed", [True, False])
def test_cirr_equals_clip4cir(removed):
    rng = np.random.default_rng(3)
    gallery, queries = embeddings(1, G), embeddings(2, 60)
    # queries close to their target, so that every cut-off sees hits and misses
    refs = [int(x) for x in rng.integers(0, G, 60)]
    targets = [int((r + 1 + rng.integers(0, G - 1)) % G) for r in refs]
    queries = queries * 0.6 + gallery[targets] * 0.4
    members = [
        [r, t, *[int(x) for x in rng.choice(G, 4, replace=False) if x not in (r, t)]] for r, t in zip(refs, targets)
    ]
    res = audit_ranks(queries, gallery, [[t] for t in targets], refs, removed, groups=members)
    ranks = [QueryRanks(p, a, subset=s) for p, a, s in zip(res.per_positive_ranks, res.reference_ahead, res.group_rank)]
    ours = percent(figures(PROTOCOLS["cirr"], ranks, audited_removed=removed))
    names = [f"img{i}" for i in range(G)]
    theirs = clip4cir_cirr(
        (queries @ gallery.T).numpy(),
        names,
        [names[r] for r in refs],
        [names[t] for t in targets],
        [[names[m] for m in ms] for ms in members],
    )
    assert set(theirs) <= set(ours)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-9), key
    assert 0 < theirs["R@5"] < 100 and 0 < theirs["Recall_subset@1"] < 100
    assert ours["Avg"] == pytest.approx((theirs["R@5"] + theirs["Recall_subset@1"]) / 2, abs=1e-9)


@pytest.mark.parametrize("removed", [True, False])
def test_fashioniq_per_category_equals_clip4cir(removed):
    rng = np.random.default_rng(5)
    ranks, expected = [], {}
    for n, cat in enumerate(("dress", "shirt", "toptee")):
        size = 120 + 40 * n
        gallery, queries = embeddings(10 + n, size), embeddings(20 + n, 50)
        refs = [int(x) for x in rng.integers(0, size, 50)]
        targets = [int(x) for x in rng.integers(0, size, 50)]
        queries = queries * 0.7 + gallery[targets] * 0.3
        res = audit_ranks(queries, gallery, [[t] for t in targets], refs, removed)
        ranks += [QueryRanks(p, a, category=cat) for p, a in zip(res.per_positive_ranks, res.reference_ahead)]
        names = [f"{cat}{i}" for i in range(size)]
        expected[cat] = clip4cir_fiq((queries @ gallery.T).numpy(), names, [names[t] for t in targets])
    ours = figures(PROTOCOLS["fashioniq"], ranks, audited_removed=removed)
    for cat, values in expected.items():
        for key, value in values.items():
            assert ours["categories"][cat][key] * 100 == pytest.approx(value, abs=1e-9), (cat, key)
    for k in (10, 50):
        assert ours[f"R@{k}"] * 100 == pytest.approx(np.mean([v[f"R@{k}"] for v in expected.values()]), abs=1e-9)


@pytest.mark.parametrize("removed", [True, False])
def test_circo_equals_evaluation_py(removed):
    rng = np.random.default_rng(7)
    gallery, queries = embeddings(30, G), embeddings(31, 40)
    names = list(range(5000, 5000 + G))
    refs = [int(x) for x in rng.integers(0, G, 40)]
    gts = [
        [int(x) for x in rng.choice([i for i in range(G) if i != r], int(rng.integers(1, 8)), replace=False)]
        for r in refs
    ]
    queries = queries * 0.6 + torch.stack([gallery[g].mean(0) for g in gts]) * 0.4
    # a reference close to the query: keeping it in the gallery changes the figures
    gallery = gallery.clone()
    for q, r in enumerate(refs[:10]):
        gallery[r] = queries[q] / queries[q].norm()
    res = audit_ranks(queries, gallery, gts, refs, removed)
    ranks = [QueryRanks(p, a, primary=0) for p, a in zip(res.per_positive_ranks, res.reference_ahead)]
    ours = percent(figures(PROTOCOLS["circo"], ranks, audited_removed=removed))
    annotations = [
        {"id": q, "gt_img_ids": [names[i] for i in g], "target_img_id": names[g[0]]} for q, g in enumerate(gts)
    ]
    theirs = circo_evaluation(searle_circo_predictions((queries @ gallery.T).numpy(), names, range(40)), annotations)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, abs=1e-9), key
    assert theirs["R@50"] > 0 and theirs["mAP@10"] > 0


def test_circo_recall_counts_the_target_only():
    # the target at rank 7, another ground truth at rank 1: CIRCO's Recall@5 is a miss
    ranks = [QueryRanks([7, 1], [False, False], primary=0)]
    out = figures(PROTOCOLS["circo"], ranks, audited_removed=True)
    assert out["R@5"] == 0.0 and out["R@10"] == 1.0
    assert out["mAP@5"] == pytest.approx(1 / 2)  # one hit at 1, min(|gt|=2, 5) = 2


def test_reference_handling_is_stated_and_applied():
    assert PROTOCOLS["cirr"].reference == REMOVED
    assert PROTOCOLS["fashioniq"].reference == PROTOCOLS["circo"].reference == KEPT
    assert adjusted_rank(4, True, audited_removed=True, reference=KEPT) == 5
    assert adjusted_rank(4, True, audited_removed=False, reference=REMOVED) == 3
    assert adjusted_rank(4, True, audited_removed=True, reference=REMOVED) == 4
    assert adjusted_rank(None, True, audited_removed=True, reference=KEPT) is None


def test_ranks_without_reference_flags_are_reported_as_audited():
    report = protocol_report(PROTOCOLS["circo"], {("r", "multimodal"): [QueryRanks([3])]}, audited_removed=True)
    assert report.reference.startswith("as audited")
    assert report.warnings and "kept" in report.warnings[0]
    assert report.rows[("r", "multimodal")]["R@5"] == 1.0


def test_one_number_per_query_gives_the_best_rank_figures_and_leaves_the_rest_undefined():
    # a rank file's one number per query (the best positive's rank), ranks 1, 4, 9 and 60
    cirr = [QueryRanks([r], every_positive=False, subset_known=False) for r in (1, 4, 9, 60)]
    report = protocol_report(PROTOCOLS["cirr"], {("x", "multimodal"): cirr}, audited_removed=True, imported=True)
    row = report.rows[("x", "multimodal")]
    assert (row["R@1"], row["R@5"], row["R@10"], row["R@50"]) == (0.25, 0.5, 0.75, 0.75)
    assert row["Recall_subset@1"] is None and row["Avg"] is None  # no subset rank was stored: not 0
    assert report.reference.startswith("as in the rank file")
    assert any("Recall_subset" in w for w in report.warnings) and any("cannot check" in w for w in report.warnings)
    circo = [QueryRanks([3], primary=1, every_positive=False, subset_known=False)]
    row = figures(PROTOCOLS["circo"], circo, audited_removed=True)
    assert row["mAP@10"] is None and row["R@10"] is None  # need every ground truth's rank
    warned = protocol_report(PROTOCOLS["circo"], {("x", "multimodal"): circo}, True, imported=True).warnings
    assert any("mAP@K and Recall@K of the primary target need every positive" in w for w in warned)
    fiq = [
        QueryRanks([r], category=c, every_positive=False, subset_known=False) for r, c in ((5, "dress"), (70, "shirt"))
    ]
    row = figures(PROTOCOLS["fashioniq"], fiq, audited_removed=True)
    assert row["categories"]["dress"]["R@10"] == 1.0 and row["categories"]["shirt"]["R@50"] == 0.0
