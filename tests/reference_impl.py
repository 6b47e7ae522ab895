"""Slow, obviously-correct reference implementations that the tests (and benchmarks) compare
the production code with. Not imported by the application.

* :func:`pessimistic_rank` / :func:`naive_rank`: a full sort per query, for
  :func:`retrieval.ranking.rank_queries`.
* :func:`pairwise_cohen_kappa_sklearn`: one ``sklearn`` call per pair, for
  :func:`annotation.agreement.maths.pairwise_cohen_kappa`.
* :func:`circo_official_scores`: the logic of CIRCO's ``src/evaluation.py`` (miccunifi/CIRCO
  @267b5c9, ``main`` and ``compute_metrics``), re-written here from reading it: the checks it
  makes on a predictions file and the figures it prints, for the validated CIRCO export.
* :func:`uniir_cirr_lists`: where UniIR's CIRR converter puts a CIRR record's targets
  (TIGER-AI-Lab/UniIR @98dc570, ``src/data/preprocessing/cirr_data_preprocessor.py``,
  ``cirr_to_mbeir_entry``), for the M-BEIR export.
* :func:`clip4cir_fiq_text`: the text CLIP4Cir's FashionIQ validation encodes for a caption
  pair (ABaldrati/CLIP4Cir @dfed9f7, ``src/validate.py``), for :mod:`retrieval.captions`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from annotation.agreement.maths import ConstantPairs, KappaWeights, PairKappa, Ratings
from retrieval.ranking import NEG_INF, RankResult, _score_dtype, _validate


def pessimistic_rank(scores: np.ndarray, target: int, exclude: int | None = None) -> int:
    """Brute-force rank of gallery item ``target`` in one score row, by a full argsort.

    Sorted by score (descending) with the target placed after every item it ties with,
    the excluded item removed: the same rule as :func:`rank_queries`.
    """
    idx = np.arange(scores.shape[0])
    keep = idx != exclude if exclude is not None else np.ones(scores.shape[0], dtype=bool)
    s, idx = scores[keep], idx[keep]
    order = np.lexsort((idx == target, -s))  # score desc, the target last among equals
    return int(np.flatnonzero(idx[order] == target)[0]) + 1


def naive_rank(
    queries: torch.Tensor,
    gallery: torch.Tensor,
    positives: Sequence[Sequence[int]],
    exclude: Sequence[int | None] | None = None,
    top_k: int = 10,
    return_per_positive: bool = False,
) -> RankResult:
    """Reference implementation: full score matrix and a full sort per query and positive.

    Same conventions as :func:`rank_queries` (pessimistic ties; the excluded item is
    kept in the top-K list, whose ties break by the lower gallery index).
    For tests and benchmarks only (memory ``Q x G``, time ``Q P G log G``).
    """
    n_q, n_g = _validate(queries, gallery, positives, exclude, top_k)
    dtype = _score_dtype(queries, gallery)
    scores = (queries.to(dtype) @ gallery.to(device=queries.device, dtype=dtype).T).cpu().numpy()
    best_rank: list[int | None] = []
    per_positive: list[list[int | None]] = []
    topk = torch.full((n_q, top_k), -1, dtype=torch.long)
    topk_scores = torch.full((n_q, top_k), NEG_INF, dtype=dtype)
    for q in range(n_q):
        ex = None if exclude is None or exclude[q] is None else int(exclude[q])
        row = [None if int(p) == ex else pessimistic_rank(scores[q], int(p), ex) for p in positives[q]]
        per_positive.append(row)
        best_rank.append(min((r for r in row if r is not None), default=None))
        plain = np.lexsort((np.arange(n_g), -scores[q]))[:top_k]
        topk[q, : plain.size] = torch.from_numpy(plain.astype(np.int64))
        topk_scores[q, : plain.size] = torch.from_numpy(scores[q][plain])
    return RankResult(best_rank, topk, topk_scores, per_positive if return_per_positive else None)


def pairwise_cohen_kappa_sklearn(
    ratings: Ratings, weights: KappaWeights = None, constant_pairs: ConstantPairs = "undefined"
) -> list[PairKappa]:
    """Reference for :func:`pairwise_cohen_kappa`: one ``sklearn`` call per pair (slow).

    Same conventions: full category list as ``labels``; NaN from sklearn (p_e = 1, both
    raters constant on one label) becomes ``None`` (or 1.0 with ``constant_pairs="one"``);
    pairs with no shared item are omitted.
    """
    import warnings

    from sklearn.metrics import cohen_kappa_score

    dense = ratings.dense()
    labels = list(range(ratings.n_categories))
    out: list[PairKappa] = []
    for a in range(ratings.n_raters):
        for b in range(a + 1, ratings.n_raters):
            shared = (dense[a] >= 0) & (dense[b] >= 0)
            if not shared.any():
                continue
            ya, yb = dense[a][shared], dense[b][shared]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = float(cohen_kappa_score(ya, yb, labels=labels, weights=weights))
            constant = bool((ya == ya[0]).all() and (yb == ya[0]).all())
            if math.isnan(value):
                if not constant:
                    raise ArithmeticError("sklearn returned NaN for a pair that is not constant")
            kappa = (1.0 if constant_pairs == "one" else None) if math.isnan(value) else value
            out.append(PairKappa(ratings.raters[a], ratings.raters[b], kappa, int(shared.sum()), constant))
    return out


CIRCO_ASPECTS = (
    "cardinality",
    "addition",
    "negation",
    "direct_addressing",
    "compare_change",
    "comparative_statement",
    "statement_with_conjunction",
    "spatial_relations_background",
    "viewpoint",
)


def circo_official_scores(
    annotations: list[dict], predictions: dict[str, list[int]], ranks: Sequence[int] = (5, 10, 25, 50)
) -> dict[str, dict]:
    """What CIRCO's evaluation script reports for ``predictions`` (query id -> ranked COCO ids)
    against ``annotations`` (the list it reads as ``annotations/val.json``).

    Like the script: the predictions' keys must be exactly ``0 .. len(predictions) - 1``
    (AssertionError otherwise); a query id is a *position* in ``annotations``; duplicate
    predictions are a ValueError; AP@k over every ``gt_img_ids`` (precision at each hit,
    summed over the first k, over min(#gt, k)); Recall@k counts ``target_img_id`` only;
    semantic mAP@10 per aspect of ``semantic_aspects`` (NaN for an aspect no query has)."""
    keys = sorted(int(k) for k in predictions)
    assert keys == list(range(len(predictions))), "The keys of the predictions dictionary must be all the query ids"
    aps: dict[int, list[float]] = {k: [] for k in ranks}
    recalls: dict[int, list[float]] = {k: [] for k in ranks}
    by_aspect: dict[str, list[float]] = {}
    for key, ranked in predictions.items():
        entry = annotations[int(key)]
        if len(set(ranked)) != len(ranked):
            raise ValueError(f"query {key}: duplicate predictions")
        gts = set(int(g) for g in entry["gt_img_ids"])
        hit = np.array([int(p) in gts for p in ranked], dtype=float)
        precision_at_hits = np.cumsum(hit) * hit / np.arange(1, len(hit) + 1)
        for k in ranks:
            aps[k].append(float(precision_at_hits[:k].sum() / min(len(entry["gt_img_ids"]), k)))
            recalls[k].append(float(sum(1 for p in ranked[:k] if int(p) == int(entry["target_img_id"]))))
        for aspect in entry.get("semantic_aspects", []):
            by_aspect.setdefault(aspect, []).append(
                float(precision_at_hits[:10].sum() / min(len(entry["gt_img_ids"]), 10))
            )
    return {
        "map": {k: float(np.mean(aps[k])) for k in ranks},
        "recall": {k: float(np.mean(recalls[k])) for k in ranks},
        "semantic_map10": {a: float(np.mean(by_aspect[a])) if by_aspect.get(a) else math.nan for a in CIRCO_ASPECTS},
    }


def uniir_cirr_lists(record: dict) -> tuple[list[str], list[str]]:
    """``(positives, negatives)`` image names of one CIRR record as UniIR's converter places
    them (every image of the candidate pool): each ``target_soft`` entry scored exactly 1.0 is a
    positive, every other one (0.5, 0.2, -1) a negative, in ``target_soft`` order; the hard
    target is not looked at by itself. With no positive the converter skips the record (``pos`` empty)."""
    pos = [name for name, score in record.get("target_soft", {}).items() if score == 1.0]
    neg = [name for name, score in record.get("target_soft", {}).items() if score != 1.0]
    return pos, neg


def clip4cir_fiq_text(pair: Sequence[str]) -> str:
    """CLIP4Cir's validation text of one FashionIQ triplet: the two captions trimmed of
    '.', '?', ',' and spaces at both ends, the first capitalised (str.capitalize), joined by
    ' and ' (written out for exactly two captions, as the script indexes them)."""
    first, second = pair[0], pair[1]
    return first.strip(".?, ").capitalize() + " and " + second.strip(".?, ")


# ----------------------------------------------------------------- benchmark evaluation code
# Re-implementations of the community's evaluation logic (written here from reading it, not
# copied): they rank by a full argsort of the score matrix and then score the ranked names the
# way each repository does, for :mod:`retrieval.protocols`.


def ranked_names(scores: np.ndarray, names: Sequence) -> np.ndarray:
    """Every query's gallery names, best score first (a full argsort per row, as CLIP4Cir's
    ``torch.argsort`` of the distances)."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.asarray(names, dtype=object)[order]


def clip4cir_cirr(
    scores: np.ndarray, names: Sequence, references: Sequence, targets: Sequence, members: Sequence[Sequence]
) -> dict[str, float]:
    """CLIP4Cir's CIRR validation: the reference is dropped from each ranked list, R@K counts
    ``target_hard``, Recall_subset@K ranks within the ``img_set`` members; percent."""
    ranked = ranked_names(scores, names)
    rows = [row[row != ref] for row, ref in zip(ranked, references)]
    labels = np.array([row == t for row, t in zip(rows, targets)])
    out = {f"R@{k}": float(labels[:, :k].sum() / len(rows) * 100) for k in (1, 5, 10, 50)}
    group = [row[np.isin(row, list(m))] == t for row, m, t in zip(rows, members, targets)]
    for k in (1, 2, 3):
        out[f"Recall_subset@{k}"] = float(sum(g[:k].sum() for g in group) / len(rows) * 100)
    return out


def clip4cir_fiq(scores: np.ndarray, names: Sequence, targets: Sequence) -> dict[str, float]:
    """CLIP4Cir's FashionIQ validation of one category (its gallery only; the reference
    stays in the list); percent."""
    ranked = ranked_names(scores, names)
    labels = np.array([row == t for row, t in zip(ranked, targets)])
    return {f"R@{k}": float(labels[:, :k].sum() / len(ranked) * 100) for k in (10, 50)}


def circo_evaluation(predictions: dict, annotations: Sequence[dict]) -> dict[str, float]:
    """:func:`circo_official_scores` as percent figures named like :mod:`retrieval.protocols`'
    (``mAP@K``, ``R@K``); ``annotations`` in query id order (ids are positions, as the script reads them)."""
    scores = circo_official_scores(list(annotations), predictions)
    out = {f"mAP@{k}": 100 * v for k, v in scores["map"].items()}
    out.update({f"R@{k}": 100 * v for k, v in scores["recall"].items()})
    return out


def searle_circo_predictions(scores: np.ndarray, names: Sequence, query_ids: Sequence) -> dict[str, list]:
    """SEARLE's CIRCO predictions: the top 50 of the whole gallery, reference kept."""
    ranked = ranked_names(scores, names)
    return {str(q): [int(x) for x in row[:50]] for q, row in zip(query_ids, ranked)}


def cirr_server(recall: dict, subset: dict, annotations: Sequence[dict]) -> dict[str, float]:
    """The CIRR test server's scoring of its two prediction files (Recall@K: ``target_hard``
    within the first K of the 50 names; Recall_subset@K: within the first K of the 3), as
    its page describes it; percent."""
    out = {}
    for k in (1, 5, 10, 50):
        out[f"R@{k}"] = (
            100 * sum(a["target_hard"] in recall[str(a["pairid"])][:k] for a in annotations) / len(annotations)
        )
    for k in (1, 2, 3):
        out[f"Recall_subset@{k}"] = (
            100 * sum(a["target_hard"] in subset[str(a["pairid"])][:k] for a in annotations) / len(annotations)
        )
    return out
