"""Import external rank files (CIRCUS layout) as audit runs, or into an existing run.

Retrievers that cannot run here join the pool through their rank files. Their labels
are computed exactly as for computed runs (:func:`audit.runs.aggregation.aggregate_run`,
hence :func:`audit.labels.label_queries`).

Matching: a sample's ``query_idx`` is the 0-based ordinal of the query in its source
file, which is :attr:`retrieval.models.Query.ordinal`. The ordinals must be unique
among the queries of the run's scope, read as a computed audit reads it: a split
(``val``) or a category of one (``dress/val``), needed when several source files count
from 0 (FashionIQ's categories, a dataset's splits). Gallery indices of ``retrievals.multimodal`` are mapped to the dataset's images
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

from retrieval.galleries import scope_text
from retrieval.models import Dataset, Image, Turn

from .labels import count_lines
from .models import AuditLabel, AuditRank, AuditRun
from .rankfiles import RankFile, path_suffixes, read_rank_file
from .runs import aggregation, base, planning


class ImportRanksError(ValueError):
    """The rank files cannot be imported as asked."""


class QueriesDiffer(ImportRanksError):
    """The files' query texts differ from the dataset's: they are most likely another
    dataset's (or split's) rank files, matched here by position only. Refused unless forced."""


def _scope(dataset: Dataset, split: str | None) -> str:
    """The run's scope (``AuditRun.split``), read as a computed audit reads it
    (:func:`audit.runs.planning.resolve_split`: ``val``, ``dress/val`` or a category of the only
    split); none given: the whole dataset (stored as ``""``)."""
    if not (split or "").strip():
        return ""
    try:
        return planning.resolve_split(dataset, split)
    except base.AuditError as exc:
        raise ImportRanksError(str(exc)) from None


def _query_index(dataset: Dataset, scope: str) -> dict[int, int]:
    """``Query.ordinal`` -> query id over the scope's queries; refused when ordinals repeat (several
    source files, e.g. FashionIQ's categories or a dataset's splits, each count from 0)."""
    by_ordinal: dict[int, list[int]] = defaultdict(list)
    for pk, ordinal in planning.queries_in_scope(dataset.pk, scope).values_list("pk", "ordinal"):
        by_ordinal[ordinal].append(pk)
    clashes = [o for o, pks in by_ordinal.items() if len(pks) > 1]
    if clashes:
        raise ImportRanksError(
            f"query ordinals are not unique in dataset {dataset.name!r}{' scope ' + repr(scope) if scope else ''} "
            f"(e.g. {sorted(clashes)[:5]}): {_scope_hint(dataset, scope)}"
        )
    return {o: pks[0] for o, pks in by_ordinal.items()}


def _scope_hint(dataset: Dataset, scope: str) -> str:
    """How to name one source file's queries: the scopes (split, category/split) that exist."""
    pairs = sorted(
        set(planning.queries_in_scope(dataset.pk, scope).order_by().values_list("category", "split").distinct())
    )
    scopes = [scope_text(split, category) for category, split in pairs]
    if len(scopes) < 2:
        return "the scope mixes several source files"
    shown = ", ".join(scopes[:6]) + ("…" if len(scopes) > 6 else "")
    return f"a rank file ranks one source file's queries; choose its scope with --split ({shown})"


class GalleryMapper:
    """Gallery path -> Image id of the dataset, by the longest matching trailing path (the
    ``keep`` of :func:`audit.rankfiles.read_rank_file`: each file keeps the image ids of the
    paths its top lists name, never the paths)."""

    def __init__(self, dataset: Dataset) -> None:
        self.by_path = {p: pk for pk, p in Image.objects.filter(dataset=dataset).values_list("pk", "path") if p}

    def __call__(self, path: str) -> int | None:
        return next((self.by_path[s] for s in path_suffixes(path) if s in self.by_path), None)


def _read_all(paths: Sequence[str | Path], mapper: GalleryMapper) -> list[RankFile]:
    files = [read_rank_file(p, keep=mapper) for p in paths]
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


def _dataset(dataset: Dataset | str) -> Dataset:
    if isinstance(dataset, Dataset):
        return dataset
    found = Dataset.objects.filter(name=dataset).first()
    if found is None:
        raise ImportRanksError(f"no dataset named {dataset!r}")
    return found


def _existing_run(run: AuditRun | int | None, dataset: Dataset, files: list[RankFile]) -> AuditRun | None:
    """The finished run the files join (checked), or ``None`` for a new run."""
    if run is None:
        return None
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
    return existing


def _cut_off(k: int | None, existing: AuditRun | None, files: list[RankFile]) -> int:
    if k is not None:
        return k
    if existing is not None:
        return existing.k
    ks = {f.k for f in files if f.k is not None}
    if len(ks) > 1:
        raise ImportRanksError(f"the files disagree on metadata.k ({sorted(ks)}); pass --k")
    return ks.pop() if ks else 10


class _Collected:
    """Rank rows built from the files' samples and what did not match."""

    def __init__(self) -> None:
        self.rows: list[AuditRank] = []
        self.unknown: set[int] = set()
        self.not_in_run: set[int] = set()
        self.text_mismatch: list[int] = []
        self.mismatch_example: tuple[int, str, str] | None = None  # (query_idx, file's text, dataset's text)
        self.support: dict[int, dict[str, int]] = {}
        self.file_labels: dict[int, str] = {}
        self.unmapped = 0
        self.reference_seen: Counter[str] = Counter()  # per retriever: top lists that hold the query's reference
        self.top_lists: Counter[str] = Counter()  # per retriever: samples with a top list


def _note_reference(f: RankFile, s: Any, reference: int | None, got: _Collected) -> None:
    """Whether the sample's whole top list holds the query's reference image: evidence of how the
    file's retriever handled the reference, which a rank file does not state."""
    if not s.top_mm or reference is None:
        return
    got.top_lists[f.retriever] += 1
    if any(f.gallery_paths.get(i) == reference for i in s.top_mm):
        got.reference_seen[f.retriever] += 1


def _top_ids(f: RankFile, s: Any, got: _Collected) -> list[int]:
    """The sample's multimodal top list as image ids (AUDIT_CANDIDATES_N at most)."""
    top: list[int] = []
    for i in s.top_mm:
        image_id = f.gallery_paths.get(i)
        if image_id is None:
            got.unmapped += 1
        elif image_id not in top:
            top.append(image_id)
        if len(top) == base.candidates_n():
            break
    return top


def _collect(files: list[RankFile], ordinal_to_query: dict[int, int], allowed: set[int] | None) -> _Collected:
    first_turns = list(Turn.objects.filter(query_id__in=ordinal_to_query.values(), index=1))
    texts = {t.query_id: t.text for t in first_turns}
    references = {t.query_id: t.reference_image_id for t in first_turns}
    got = _Collected()
    for f in files:
        for s in f.samples:
            q = ordinal_to_query.get(s.query_idx)
            if q is None:
                got.unknown.add(s.query_idx)
                continue
            if allowed is not None and q not in allowed:
                got.not_in_run.add(s.query_idx)
                continue
            if s.query_text is not None and s.query_text.strip() != (texts.get(q) or "").strip():
                got.text_mismatch.append(s.query_idx)
                got.mismatch_example = got.mismatch_example or (s.query_idx, s.query_text, texts.get(q) or "")
            _note_reference(f, s, references.get(q), got)
            got.rows.append(
                AuditRank(
                    query_id=q,
                    retriever=f.retriever,
                    mm=s.mm,
                    text=s.text,
                    image=s.image,
                    mm_all=s.mm_all,
                    text_all=s.text_all,
                    image_all=s.image_all,
                    top_mm=_top_ids(f, s, got),
                )
            )
            if s.support is not None:
                got.support[q] = s.support
            if s.label:
                got.file_labels[q] = s.label
    return got


def _refuse_other_queries(dataset: Dataset, got: _Collected) -> None:
    """Raise :class:`QueriesDiffer` when any matched sample's query text differs from the
    dataset's query at that position (the files are then not this dataset's)."""
    if not got.text_mismatch:
        return
    idx, theirs, ours = got.mismatch_example or (got.text_mismatch[0], "", "")
    bad = sorted(set(got.text_mismatch))
    matched = len({r.query_id for r in got.rows})
    raise QueriesDiffer(
        f"these rank files do not match dataset {dataset.name!r}: the query texts of {len(bad)} of the {matched} "
        f"matched queries differ from the dataset's (query_idx {bad[:10]}{'…' if len(bad) > 10 else ''}; e.g. "
        f"query_idx {idx}: the file says {theirs!r}, the dataset {ours!r}). They are probably another dataset's or "
        f"split's rank files; check the dataset and split. Nothing was imported; force the import (--force) to "
        f"import them anyway."
    )


def _report(files: list[RankFile], got: _Collected, k: int) -> dict[str, Any]:
    aggregated = files[0].aggregated
    return {
        "files": [f.path for f in files],
        "retrievers": [f.retriever for f in files],
        "aggregated": aggregated,
        "pool": files[0].pool if aggregated else [],
        "rows": len(got.rows),
        "unknown_query_idx": len(got.unknown),
        "unknown_examples": sorted(got.unknown)[:10],
        "not_in_run": len(got.not_in_run),
        "text_mismatches": len(set(got.text_mismatch)),  # queries, not samples (several files name each)
        "text_mismatch_examples": sorted(set(got.text_mismatch))[:10],
        "forced": bool(got.text_mismatch),
        "unmapped_gallery_indices": got.unmapped,
        "reference_in_top_lists": {
            name: {"seen": got.reference_seen[name], "lists": n} for name, n in got.top_lists.items()
        },
        "k": k,
    }


def _store(
    dataset: Dataset,
    existing: AuditRun | None,
    split: str | None,
    names: list[str],
    k: int,
    min_mm_retrievers: int,
    created_by: Any,
    got: _Collected,
    report: dict[str, Any],
) -> AuditRun:
    """Create the imported run (or add the retrievers to ``existing``) and write the rank rows."""
    with transaction.atomic():
        if existing is None:
            target = AuditRun.objects.create(
                dataset=dataset,
                split=split or "",
                retrievers=names,
                external_retrievers=names,
                source=AuditRun.Source.IMPORTED,
                k=k,
                min_mm_retrievers=min_mm_retrievers,
                status=AuditRun.Status.RUNNING,
                stage="importing",
                planned=True,
                started_at=timezone.now(),
                created_by=created_by if getattr(created_by, "pk", None) else None,
                summary={
                    "import": report,
                    "plan": {"queries_in_split": report["queries_in_split"]},
                    "plan_skipped": {"unknown_query_idx": len(got.unknown)} if got.unknown else {},
                },
            )
            target.total = target.done = len({r.query_id for r in got.rows})
            target.save(update_fields=["total", "done"])
        else:
            target = AuditRun.objects.select_for_update().get(pk=existing.pk)
            target.retrievers = [*target.retrievers, *names]
            target.external_retrievers = [*target.external_retrievers, *names]
            target.summary = {**target.summary, "imports": list(target.summary.get("imports", [])) + [report]}
            target.status = AuditRun.Status.RUNNING
            target.stage = "importing"
            target.save()
        for r in got.rows:
            r.run = target
        AuditRank.objects.bulk_create(got.rows, batch_size=1000, ignore_conflicts=True)
    return target


def _label_agreement(target: AuditRun, file_labels: dict[int, str], report: dict[str, Any]) -> None:
    """How many of our labels agree with those an aggregated file recorded (kept in the summary)."""
    ours = dict(AuditLabel.objects.filter(run=target).values_list("query_id", "label"))
    same = sum(1 for q, lab in file_labels.items() if ours.get(q) == lab)
    differ = sorted(q for q, lab in file_labels.items() if q in ours and ours[q] != lab)
    report["label_agreement"] = {"same": same, "different": len(differ), "different_queries": differ[:10]}
    AuditRun.objects.filter(pk=target.pk).update(summary={**target.summary, "import": report})
    target.refresh_from_db()


def import_rank_files(
    dataset: Dataset | str,
    paths: Sequence[str | Path],
    split: str | None = None,
    k: int | None = None,
    min_mm_retrievers: int = 1,
    run: AuditRun | int | None = None,
    created_by: Any = None,
    force: bool = False,
) -> tuple[AuditRun, dict[str, Any]]:
    """Import rank files as a new finished audit run, or add them to ``run``'s pool.

    Returns the run (labelled) and a report: files, retrievers, rows written, samples
    whose ``query_idx`` matched no query, query texts that differ from the stored ones,
    and for an aggregated file how many computed labels agree with the file's. Files whose
    query texts differ from the dataset's are refused (:class:`QueriesDiffer`) unless
    ``force``; a forced import records ``forced`` in its report. A
    sample's rank may be one rank or the list of every positive's rank (stored in
    ``AuditRank.*_all``; the best one in ``mm``/``text``/``image``).
    """
    dataset = _dataset(dataset)
    files = _read_all(paths, GalleryMapper(dataset))
    aggregated = files[0].aggregated
    if aggregated and min_mm_retrievers > 1:
        raise ImportRanksError(
            "an aggregated file holds only the pool's best ranks; min_mm_retrievers > 1 needs the per-retriever files"
        )
    existing = _existing_run(run, dataset, files)
    scope = existing.split if existing is not None and existing.split else _scope(dataset, split)
    k = _cut_off(k, existing, files)
    allowed = None
    if existing is not None:
        allowed = set(AuditLabel.objects.filter(run=existing).values_list("query_id", flat=True))
    index = _query_index(dataset, scope)
    got = _collect(files, index, allowed)
    if not got.rows:
        raise ImportRanksError(f"no sample matched a query of dataset {dataset.name!r} by query_idx (Query.ordinal)")
    if not force:
        _refuse_other_queries(dataset, got)
    report = _report(files, got, k)
    report["queries_in_split"] = len(index)  # the scope the files were matched against (queries not ranked: warned)
    target = _store(dataset, existing, scope, report["retrievers"], k, min_mm_retrievers, created_by, got, report)
    if not aggregation.aggregate_run(target.pk, override_support=got.support if aggregated else None):
        raise ImportRanksError(f"audit {target.pk} could not be aggregated")
    target.refresh_from_db()
    if got.file_labels:
        _label_agreement(target, got.file_labels, report)
    return target, report


def import_summary(run: AuditRun, report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What :func:`import_rank_files` did, as (lines, warnings): ``manage.py import_ranks``
    prints them (warnings on stderr), the project room's import page shows them."""
    lines = [
        f"Audit {run.pk}: {report['rows']} rank rows from {len(report['files'])} file(s), "
        f"retrievers {', '.join(report['retrievers'])}; K={run.k}."
    ]
    warnings = []
    if report["unknown_query_idx"]:
        warnings.append(
            f"warning: {report['unknown_query_idx']} sample(s) match no query "
            f"(query_idx e.g. {report['unknown_examples']})"
        )
    if report["text_mismatches"]:
        warnings.append(
            f"warning: imported with --force although {report['text_mismatches']} query text(s) "
            f"differ from the dataset's (query_idx e.g. {report['text_mismatch_examples']})"
        )
    if "label_agreement" in report:
        a = report["label_agreement"]
        lines.append(f"Labels agree with the file's for {a['same']} queries, differ for {a['different']}.")
    lines += count_lines(run.summary.get("counts", {}))
    return lines, warnings
