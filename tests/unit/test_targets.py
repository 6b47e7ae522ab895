"""retrieval.targets: which targets count, per dataset format, on the real annotation samples."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from audit.labels import label_queries
from retrieval import importers
from retrieval.ranking import rank_queries
from retrieval.targets import RULES, TargetFacts, graded_targets, positive_targets, rule_text

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "datasets"


def parsed(fmt: str, *names: str):
    return importers.parse(fmt, [DATA / fmt / n for n in names])


def positives_of(fmt: str, ds) -> dict[str, list[str]]:
    return {q.external_id: [t.image for t in positive_targets(fmt, q.targets)] for q in ds.queries}


def test_cirr_counts_the_hard_target_only():
    ds = parsed("cirr", "cap.rc2.val.sample.json", "split.rc2.val.sample.json")
    raw = {str(r["pairid"]): r for r in json.loads((DATA / "cirr" / "cap.rc2.val.sample.json").read_text())}
    pos = positives_of("cirr", ds)
    assert len(pos) == 48
    for qid, images in pos.items():
        assert images == [raw[qid]["target_hard"]], qid
    # hard targets scored below 1 (0.2) or negative (-1.0) in target_soft still count
    assert pos["14671"] == [raw["14671"]["target_hard"]] and pos["29045"] == [raw["29045"]["target_hard"]]
    # the soft targets feed only the graded gains, with their scores
    q = next(q for q in ds.queries if q.external_id == "12130")
    graded = graded_targets("cirr", q.targets)
    assert graded[0] == (q.targets[0], 1.0) and q.targets[0].role == "hard"
    soft = {k: v for k, v in raw["12130"]["target_soft"].items() if v > 0 and k != raw["12130"]["target_hard"]}
    assert {t.image: g for t, g in graded[1:]} == soft


def test_fashioniq_lasco_mtfiq_count_the_target():
    fiq = parsed("fashioniq", "cap.dress.val.sample.json", "split.dress.val.sample.json")
    raw = json.loads((DATA / "fashioniq" / "cap.dress.val.sample.json").read_text())
    assert [p for p in positives_of("fashioniq", fiq).values()] == [[r["target"]] for r in raw]
    lasco = parsed("lasco", "lasco_val.json", "lasco_val_corpus.sample.json")
    raw = json.loads((DATA / "lasco" / "lasco_val.json").read_text())
    assert sorted(positives_of("lasco", lasco).values()) == sorted([[str(r["target-image"][0])] for r in raw])
    mt = parsed("mtfiq", "dress.val.sample.json", "split.dress.val.sample.json")
    raw = json.loads((DATA / "mtfiq" / "dress.val.sample.json").read_text())
    finals = sorted([r["target"][1]] for r in raw)
    # one final target per session; the turns' intermediate targets never count
    assert sorted(positives_of("mtfiq", mt).values()) == finals


def test_circo_counts_every_ground_truth():
    ds = parsed("circo", "val.json")
    raw = {str(r["id"]): r for r in json.loads((DATA / "circo" / "val.json").read_text())}
    pos = positives_of("circo", ds)
    assert len(pos) == 220
    many = 0
    for qid, images in pos.items():
        assert sorted(int(i) for i in images) == sorted(raw[qid]["gt_img_ids"]), qid
        many += len(images) > 1
    assert many > 100  # most CIRCO queries have several ground truths


def test_mbeir_counts_the_qrels_positives():
    ds = parsed(
        "mbeir", "mbeir_cirr_task7_test.jsonl", "mbeir_cirr_task7_cand_pool.jsonl", "mbeir_cirr_task7_test_qrels.txt"
    )
    qrels = {}
    for line in (DATA / "mbeir" / "mbeir_cirr_task7_test_qrels.txt").read_text().splitlines():
        qid, _, did, rel = line.split()[:4]
        if float(rel) > 0:
            qrels.setdefault(qid, set()).add(did)
    for q in ds.queries:
        pos = set(positives_of("mbeir", ds)[q.external_id])
        negs = {t.image for t in q.targets if t.role == "neg"}
        assert not pos & negs
        assert qrels.get(q.external_id, set()) <= pos  # every positive qrels line counts
        assert pos == {t.image for t in q.targets if t.role == "pos"}


def test_circled_counts_the_final_ground_truths():
    ds = parsed("circled", "cirr_val.json", "circo_val.json", "fashioniq_dress_val.json")
    raw = {}
    for name in ("cirr_val.json", "circo_val.json", "fashioniq_dress_val.json"):
        for r in json.loads((DATA / "circled" / name).read_text()):
            raw[r["session_id"]] = r
    for q in ds.queries:
        pos = positives_of("circled", ds)[q.external_id]
        assert len(pos) == len(raw[q.external_id]["ground_truth_ids"]) >= 1


def test_other_formats_and_negatives():
    facts = [
        TargetFacts(1, 1.0, True, "gt"),
        TargetFacts(2, 0.0, False, "gt"),
        TargetFacts(3, 1.0, False, "neg"),
        TargetFacts(4, 0.5, False, "gt"),
    ]
    assert [t.image for t in positive_targets("demo", facts)] == [1, 4]
    assert [t.image for t in positive_targets("fashioniq", facts)] == [1]
    assert [t.image for t in positive_targets("circo", facts)] == [1, 4]
    assert positive_targets("mbeir", facts) == []
    assert set(RULES) == set(importers.FORMATS)  # one rule per importable format
    assert rule_text("cirr").startswith("the hard target") and "relevance > 0" in rule_text("demo")


def _unit(key: str, dim: int = 32) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
    v = rng.standard_normal(dim)
    return v / np.linalg.norm(v)


def simulated_labels(ds, rule: dict[str, list[str]]) -> dict[str, str]:
    """Labels (K = 3) of a simulated retriever on the CIRR sample, with ``rule``'s positives."""
    gallery_ids = sorted({i for q in ds.queries for i in [q.turns[0].reference, *(t.image for t in q.targets)]})
    index = {g: n for n, g in enumerate(gallery_ids)}
    gallery = torch.tensor(np.stack([_unit(g) for g in gallery_ids]), dtype=torch.float32)
    image = torch.tensor(np.stack([_unit(q.turns[0].reference) for q in ds.queries]), dtype=torch.float32)
    soft = [[t.image for t in q.targets if t.relevance > 0] or [q.targets[0].image] for q in ds.queries]
    text = torch.tensor(
        np.stack(
            [
                np.mean([_unit(i) for i in images], axis=0) + 0.5 * _unit("text" + q.external_id)
                for q, images in zip(ds.queries, soft)
            ]
        ),
        dtype=torch.float32,
    )
    queries = {"mm": torch.nn.functional.normalize(image + text, dim=1), "text": text, "image": image}
    exclude = [index[q.turns[0].reference] for q in ds.queries]
    pos = [[index[i] for i in rule[q.external_id]] for q in ds.queries]
    best = {m: rank_queries(e, gallery, pos, exclude).best_rank for m, e in queries.items()}
    rows = [(q.external_id, "sim", best["mm"][n], best["text"][n], best["image"][n]) for n, q in enumerate(ds.queries)]
    return label_queries(rows, k=3).labels


def test_cirr_labels_that_change_with_the_rule():
    """The 48 CIRR val queries under the old rule (relevance > 0) and the new one (hard only).

    Seven queries get a different positive set (five lose soft targets scored 0.2-1.0, one
    loses the reference that CIRR scores 1.0 by mistake, one (29045, hard scored -1.0)
    gains its hard target). Their labels are then compared on a simulated retriever (no
    images here): seeded random image embeddings; the caption embedding points at the
    mean of the soft-scored images, the multimodal query adds the reference. Only queries
    whose positive set changed can change label.
    """
    ds = parsed("cirr", "cap.rc2.val.sample.json", "split.rc2.val.sample.json")
    old = {q.external_id: [t.image for t in q.targets if t.relevance > 0 and t.role != "neg"] for q in ds.queries}
    new = positives_of("cirr", ds)
    changed = {q for q in new if set(old[q]) != set(new[q])}
    assert len(changed) == 7
    assert set(changed) == {"12130", "12136", "12143", "12155", "27067", "14671", "29045"}

    labels = {name: simulated_labels(ds, rule) for name, rule in (("old", old), ("new", new))}
    flipped = sorted(q for q in labels["new"] if labels["old"][q] != labels["new"][q])
    print(f"CIRR val sample: {len(changed)} of 48 queries change positives; {len(flipped)} change label: {flipped}")
    assert set(flipped) <= changed
    assert flipped  # the rule matters for labels, not only for counts


def test_accepted_alternatives_count_for_every_format_after_its_own_positives():
    from retrieval.targets import ALTERNATIVE, TargetFacts, positive_targets

    hard = TargetFacts("h", 1.0, True, "hard")
    soft = TargetFacts("s", 0.5, False, "soft")
    alt = TargetFacts("a", 1.0, False, ALTERNATIVE)
    neg = TargetFacts("n", 0.0, False, "neg")
    assert [t.image for t in positive_targets("cirr", [alt, soft, hard, neg])] == ["h", "a"]
    assert [t.image for t in positive_targets("fashioniq", [alt, hard])] == ["h", "a"]
    assert [t.image for t in positive_targets("circo", [TargetFacts("g"), alt])] == ["g", "a"]
    assert [t.image for t in positive_targets("demo", [alt, TargetFacts("g")])] == ["g", "a"]


def test_negatives_and_mbeir_lists_come_from_the_target_rule():
    """One place decides negatives too: CIRR soft targets scored 1.0 are never negatives (UniIR
    puts them in pos_cand_list; graded nDCG gives them gain 1.0), those below 1.0 are."""
    from retrieval.targets import mbeir_candidates, negative_targets

    hard = TargetFacts("h", 1.0, True, "hard")
    soft1 = TargetFacts("s1", 1.0, False, "soft")
    half = TargetFacts("s5", 0.5, False, "soft")
    minus = TargetFacts("m", -1.0, False, "soft")
    targets = [hard, soft1, half, minus]
    assert [t.image for t in negative_targets("cirr", targets)] == ["s5", "m"]
    pos, neg = mbeir_candidates("cirr", targets)
    assert ([t.image for t in pos], [t.image for t in neg]) == (["h", "s1"], ["s5", "m"])
    assert ("s1", 1.0) in [(t.image, g) for t, g in graded_targets("cirr", targets)]
    # as UniIR's converter: a hard target scored below 1.0 is a negative, and a query left with no
    # positive (CIRR val's 29045: target_hard scored -1.0) has an empty pos_cand_list (it is left out)
    low_hard = TargetFacts("h", 0.5, True, "hard")
    pos, neg = mbeir_candidates("cirr", [low_hard, soft1])
    assert ([t.image for t in pos], [t.image for t in neg]) == (["s1"], ["h"])
    pos, neg = mbeir_candidates("cirr", [TargetFacts("h", -1.0, True, "hard")])
    assert (pos, [t.image for t in neg]) == ([], ["h"])
    # a hard target target_soft does not list (relevance 1.0 from the importer) stays a positive
    assert [t.image for t in mbeir_candidates("cirr", [hard, half])[0]] == ["h"]
    mb = [TargetFacts("p", 1.0, False, "pos"), TargetFacts("n", 0.0, False, "neg")]
    assert [[t.image for t in part] for part in mbeir_candidates("mbeir", mb)] == [["p"], ["n"]]
    assert [[t.image for t in part] for part in mbeir_candidates("circo", [TargetFacts("g")])] == [["g"], []]
