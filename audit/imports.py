"""Import external rank files (CIRCUS layout) as audit runs, or into an existing run.

Retrievers that cannot run here join the pool through their rank files. Their labels
are computed exactly as for computed runs (:func:`audit.runs.aggregation.aggregate_run`,
hence :func:`audit.labels.label_queries`).

Matching: a sample's ``query_idx`` is the 0-based ordinal of the query in its source
file, which is :attr:`retrieval.models.Query.ordinal`. The ordinals must be unique
among the dataset's queries considered (choose ``split`` when several splits share
them). Gallery indices of ``retrievals.multimodal`` are mapped to the dataset's images
by path: the longest trailing part of the file's gallery path that equals an
``Image.path`` wins (so absolute, anonymised roots do not matter); unmatched indices are
dropped from the stored top lists.

An aggregated file carries only the pool's best ranks: it enters as one pseudo
retriever ``aggregated:<name>``, which yields the same labels as the pool when
``min_mm_retrievers`` is 1 (composition_required then means best multimodal rank <= K);
larger values are refused. Its per-query support counts are those recorded in the file.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from retrieval.models import Dataset, Image, Query, Turn

from .runs import aggregation, base
from .models import AuditLabel, AuditRank, AuditRun
from .rankfiles import RankFile, path_suffixes, read_rank_file


class ImportRanksError(ValueError):
    """The rank files cannot be imported as asked."""


def _query_index(dataset: Dataset, split: str | None) -> dict[int, int]:
    qs = Query.objects.filter(dataset=dataset)
    if split:
        qs = qs.filter(split=split)
    by_ordinal: dict[int, list[int]] = defaultdict(list)
    for pk, ordinal in qs.values_list("pk", "ordinal"):
        by_ordinal[ordinal].append(pk)
    clashes = [o for o, pks in by_ordinal.items() if len(pks) > 1]
    if clashes:
        hint = "choose a split with --split" if not split else "the split mixes several source files"
        raise ImportRanksError(
            f"query ordinals are not unique in dataset {dataset.name!r}{' split ' + repr(split) if split else ''} "
            f"(e.g. {sorted(clashes)[:5]}); {hint}"
        )
    return {o: pks[0] for o, pks in by_ordinal.items()}


class _GalleryMapper:
    """Gallery path -> Image id of the dataset, by the longest matching trailing path."""

    def __init__(self, dataset: Dataset) -> None:
        self.by_path = {p: pk for pk, p in Image.objects.filter(dataset=dataset).values_list("pk", "path") if p}
        self.memo: dict[str, int | None] = {}

    def __call__(self, path: str) -> int | None:
        if path not in self.memo:
            self.memo[path] = next((self.by_path[s] for s in path_suffixes(path) if s in self.by_path), None)
        return self.memo[path]


def _read_all(paths: Sequence[str | Path]) -> list[RankFile]:
    files = [read_rank_file(p) for p in paths]
    if not files:
        raise ImportRanksError("name at least one rank file")
    aggregated = [f for f in files if f.aggregated]
    if aggregated and len(files) > 1:
        raise ImportRanksError(
            "an aggregated file already combines its pool; import it alone, or import the per-retriever files"
        )
    names = Counter(f.retriever for f in files)
    dupes = [n for n, c in names.items() if c > 1]
    if dupes:
        raise ImportRanksError(f"retriever {dupes[0]!r} appears in more than one file")
    return files


def import_rank_files(
    dataset: Dataset | str,
    paths: Sequence[str | Path],
    split: str | None = None,
    k: int | None = None,
    min_mm_retrievers: int = 1,
    run: AuditRun | int | None = None,
    created_by: Any = None,
) -> tuple[AuditRun, dict[str, Any]]:
    """Import rank files as a new finished audit run, or add them to ``run``'s pool.

    Returns the run (labelled) and a report: files, retrievers, rows written, samples
    whose ``query_idx`` matched no query, query texts that differ from the stored ones,
    and for an aggregated file how many computed labels agree with the file's.
    """
    if isinstance(dataset, str):
        found = Dataset.objects.filter(name=dataset).first()
        if found is None:
            raise ImportRanksError(f"no dataset named {dataset!r}")
        dataset = found
    files = _read_all(paths)
    aggregated = files[0].aggregated
    if aggregated and min_mm_retrievers > 1:
        raise ImportRanksError(
            "an aggregated file holds only the pool's best ranks; min_mm_retrievers > 1 needs the per-retriever files"
        )
    existing: AuditRun | None = None
    if run is not None:
        existing = run if isinstance(run, AuditRun) else AuditRun.objects.filter(pk=run).first()
        if existing is None:
            raise ImportRanksError(f"no audit {run}")
        if existing.dataset_id != dataset.pk:
            raise ImportRanksError(f"audit {existing.pk} is of dataset {existing.dataset.name!r}, not {dataset.name!r}")
        if existing.status != AuditRun.Status.DONE:
            raise ImportRanksError(f"audit {existing.pk} is {existing.status}; external ranks join finished runs")
        clash = [f.retriever for f in files if f.retriever in existing.retrievers]
        if clash:
            raise ImportRanksError(f"audit {existing.pk} already has retriever {clash[0]!r}")
        split = existing.split or split
    ks = {f.k for f in files if f.k is not None}
    if k is None:
        if existing is not None:
            k = existing.k
        elif len(ks) > 1:
            raise ImportRanksError(f"the files disagree on metadata.k ({sorted(ks)}); pass --k")
        else:
            k = ks.pop() if ks else 10
    ordinal_to_query = _query_index(dataset, split or None)
    allowed: set[int] | None = None
    if existing is not None:
        allowed = set(AuditLabel.objects.filter(run=existing).values_list("query_id", flat=True))

    texts = {
        t.query_id: t.text for t in Turn.objects.filter(query_id__in=ordinal_to_query.values(), index=1)
    }
    mapper = _GalleryMapper(dataset)
    rows: list[AuditRank] = []
    unknown: set[int] = set()
    not_in_run: set[int] = set()
    text_mismatch: list[int] = []
    support: dict[int, dict[str, int]] = {}
    file_labels: dict[int, str] = {}
    unmapped = 0
    for f in files:
        for s in f.samples:
            q = ordinal_to_query.get(s.query_idx)
            if q is None:
                unknown.add(s.query_idx)
                continue
            if allowed is not None and q not in allowed:
                not_in_run.add(s.query_idx)
                continue
            if s.query_text is not None and s.query_text.strip() != (texts.get(q) or "").strip():
                text_mismatch.append(s.query_idx)
            top: list[int] = []
            for i in s.top_mm:
                image_id = mapper(f.gallery_paths[i])
                if image_id is None:
                    unmapped += 1
                elif image_id not in top:
                    top.append(image_id)
                if len(top) == base.panel_k():
                    break
            rows.append(AuditRank(query_id=q, retriever=f.retriever, mm=s.mm, text=s.text, image=s.image, top_mm=top))
            if s.support is not None:
                support[q] = s.support
            if s.label:
                file_labels[q] = s.label
    if not rows:
        raise ImportRanksError(
            f"no sample matched a query of dataset {dataset.name!r} by query_idx (Query.ordinal)"
        )
    names = [f.retriever for f in files]
    report: dict[str, Any] = {
        "files": [f.path for f in files],
        "retrievers": names,
        "aggregated": aggregated,
        "pool": files[0].pool if aggregated else [],
        "rows": len(rows),
        "unknown_query_idx": len(unknown),
        "unknown_examples": sorted(unknown)[:10],
        "not_in_run": len(not_in_run),
        "text_mismatches": len(text_mismatch),
        "text_mismatch_examples": sorted(text_mismatch)[:10],
        "unmapped_gallery_indices": unmapped,
        "k": k,
    }

    with transaction.atomic():
        if existing is None:
            target = AuditRun.objects.create(
                dataset=dataset, split=split or "", retrievers=names, external_retrievers=names,
                source=AuditRun.Source.IMPORTED, k=k, min_mm_retrievers=min_mm_retrievers,
                status=AuditRun.Status.RUNNING, stage="importing", planned=True, started_at=timezone.now(),
                created_by=created_by if getattr(created_by, "pk", None) else None,
                summary={"import": report, "plan_skipped": {"unknown_query_idx": len(unknown)} if unknown else {}},
            )
            total = len({r.query_id for r in rows})
            target.total = target.done = total
            target.save(update_fields=["total", "done"])
        else:
            target = AuditRun.objects.select_for_update().get(pk=existing.pk)
            target.retrievers = [*target.retrievers, *names]
            target.external_retrievers = [*target.external_retrievers, *names]
            imports = list(target.summary.get("imports", [])) + [report]
            target.summary = {**target.summary, "imports": imports}
            target.status = AuditRun.Status.RUNNING
            target.stage = "importing"
            target.save()
        for r in rows:
            r.run = target
        AuditRank.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    if not aggregation.aggregate_run(target.pk, override_support=support if aggregated else None):
        raise ImportRanksError(f"audit {target.pk} could not be aggregated")
    target.refresh_from_db()
    if file_labels:
        ours = dict(AuditLabel.objects.filter(run=target).values_list("query_id", "label"))
        same = sum(1 for q, lab in file_labels.items() if ours.get(q) == lab)
        differ = sorted(q for q, lab in file_labels.items() if q in ours and ours[q] != lab)
        report["label_agreement"] = {"same": same, "different": len(differ), "different_queries": differ[:10]}
        summary = dict(target.summary)
        summary["import"] = report
        AuditRun.objects.filter(pk=target.pk).update(summary=summary)
        target.refresh_from_db()
    return target, report
