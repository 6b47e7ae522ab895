"""A demo leaderboard for the tests (issue 40): six methods on the demo's val split, entered in
every way a method enters, made from the demo audit's own ranks.

* the two audit retrievers, as audit entries;
* retriever 0's stored top lists as a CIRR ``recall`` file, every third query's first ten
  images moved to the end of its list (a weaker method);
* retriever 1's as a CIRCO submission;
* retriever 1's, each list rotated by five places (ranks 1-5 lost, the others five places
  better), as FashionIQ top-K lists;
* retriever 1's ranks (every modality) as a CIRCUS rank file.

The validated subset is every query whose planted kind is clean (the demo's truth file), and
the first image of retriever 1's list other than the target becomes an accepted alternative
(a target of role ``alternative``) of every fifth validated query.
"""

from __future__ import annotations

import json
from pathlib import Path

from audit.leaderboard.entries import enter_audit, enter_predictions, enter_rank_file, split_targets
from audit.models import AuditRank, AuditRun, Leaderboard
from retrieval.models import VALIDATED_SUBSET, Image, Query, QuerySubset, Target, Turn
from retrieval.targets import ALTERNATIVE

#: The planted kinds a validation keeps (the flawed ones: vague, wrong target, too broad, are rejected).
VALID_KINDS = ("composition", "text_only", "image_only")


def _lists(run: AuditRun, retriever: str) -> dict[str, list[str]]:
    """Query external id -> the retriever's stored multimodal top list (the reference removed)."""
    names = dict(Image.objects.filter(dataset=run.dataset).values_list("pk", "external_id"))
    refs = dict(Turn.objects.filter(query__dataset=run.dataset, index=1).values_list("query_id", "reference_image_id"))
    out = {}
    for qid, ext, top in AuditRank.objects.filter(run=run, retriever=retriever, query__n_turns=1).values_list(
        "query_id", "query__external_id", "top_mm"
    ):
        out[ext] = [names[i] for i in top if i != refs.get(qid)][:50]
    return out


def _mark_validated(board: Leaderboard, truth: dict, run: AuditRun) -> None:
    queries = list(Query.objects.filter(dataset=board.dataset, split=board.split, n_turns=1).order_by("ordinal"))
    clean = [q for q in queries if truth["queries"].get(q.external_id, {}).get("kind") in VALID_KINDS]
    subset, _ = QuerySubset.objects.get_or_create(
        dataset=board.dataset, name=VALIDATED_SUBSET, defaults={"source": "test export"}
    )
    subset.queries.set(clean)
    targets = split_targets(board)
    tops = dict(AuditRank.objects.filter(run=run, retriever=run.retrievers[1]).values_list("query_id", "top_mm"))
    refs = dict(Turn.objects.filter(query__in=clean, index=1).values_list("query_id", "reference_image_id"))
    for q in clean[::5]:
        taken = set(targets.labelled.get(q.pk, [])) | {refs.get(q.pk)}
        alt = next((i for i in tops.get(q.pk, []) if i not in taken), None)
        if alt is not None:
            Target.objects.get_or_create(query=q, image_id=alt, defaults={"role": ALTERNATIVE, "relevance": 1.0})


def _rank_file(run: AuditRun, retriever: str, path: Path) -> Path:
    images = list(Image.objects.filter(dataset=run.dataset).order_by("pk").values_list("pk", "path"))
    index = {pk: n for n, (pk, _) in enumerate(images)}
    samples = []
    for ordinal, mm, text, image, top in (
        AuditRank.objects.filter(run=run, retriever=retriever, query__n_turns=1)
        .order_by("query__ordinal")
        .values_list("query__ordinal", "mm_all", "text", "image", "top_mm")
    ):
        samples.append(
            {
                "query_idx": ordinal,
                "ranks": {"multimodal": mm, "text_only": text, "image_only": image},
                "retrievals": {"multimodal": [index[i] for i in top]},
            }
        )
    path.write_text(
        json.dumps(
            {
                "metadata": {"dataset": run.dataset.name, "k": 10},
                "gallery_paths": [p for _, p in images],
                "samples": samples,
            }
        )
    )
    return path


def build_demo_leaderboard(run: AuditRun, out: Path, truth: dict, name: str = "demo-val") -> Leaderboard:
    out.mkdir(parents=True, exist_ok=True)
    board = Leaderboard.objects.create(dataset=run.dataset, split="val", name=name)
    _mark_validated(board, truth, run)
    first, second = run.retrievers[0], run.retrievers[1]
    enter_audit(board, run, first, name="demo retriever A", paper="https://example.org/a")
    enter_audit(board, run, second, name="demo retriever B")
    a, b = _lists(run, first), _lists(run, second)
    swapped = {q: (v[10:] + v[:10] if n % 3 == 0 else v) for n, (q, v) in enumerate(a.items())}
    (out / "recall_submission.json").write_text(json.dumps({"version": "rc2", "metric": "recall", **swapped}, indent=1))
    enter_predictions(
        board, "A, weakened (CIRR file)", [(out / "recall_submission.json", "cirr")], paper="https://example.org/cirr"
    )
    (out / "circo_val_submission.json").write_text(json.dumps(b, indent=1))
    enter_predictions(board, "B (CIRCO file)", [(out / "circo_val_submission.json", "circo")])
    shifted = "\n".join(json.dumps({"query": q, "ranking": v[5:] + v[:5]}) for q, v in b.items())
    (out / "fiq_lists.jsonl").write_text(shifted + "\n")
    enter_predictions(board, "B, rotated (FashionIQ lists)", [(out / "fiq_lists.jsonl", "fashioniq")])
    enter_rank_file(board, _rank_file(run, second, out / "retrieval_data_demo_task1_B.json"), name="B (rank file)")
    return board
