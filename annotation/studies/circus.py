"""A study from CIRCUS annotation files: the service behind ``manage.py import_circus`` and the
project room's import page (:func:`import_circus_study`; both show :func:`summary_line`).

Imports CIRCUS annotations (``annotations/users/*.json`` or ``agreement_users/*.json``, read
with :mod:`annotation.agreement.circus_files`) as a CIRVal study under the validity rubric:

* one retrieval dataset per CIRCUS dataset (circo, cirr, fashioniq, lasco), named
  ``<prefix>-<dataset>``. An existing dataset of that name is reused when it has exactly
  one query whose ordinal is each needed ``query_idx`` (e.g. the M-BEIR test file
  imported under that name); otherwise the dataset is created with one placeholder query
  per ``query_idx`` (external id ``str(query_idx)``, ordinal ``query_idx``, one turn with
  no image and no text, ``extra = {"circus_placeholder": true}``);
* the study (closed: its annotations are history; staff may reopen it), one item per
  (dataset, query_idx) with its ``hidden_category``, the annotators (created without a
  usable password, in the ``annotator`` group), one done assignment per labelled
  assignment (``position`` = ``presentation_order``) and one judgement, stored through the
  queue's store (:func:`annotation.assignment.queue.store_judgement`, the path of annotators' submits);
* judgement: ``validated`` as in the file; the four flags kept as they are in
  ``Judgement.flags``; ``category`` = VALIDATED when validated, else the most severe true
  flag, else ``""`` (CIRCUS's "invalid unspecified": validated false and no flag, read
  back by the reports as the label ``[]``); ``note`` = ``annotation.other``; the
  judgement time = ``annotation_updated_at``.

``report`` with ``from_report`` (``--report``/``--from-report``) adds annotators that have no file (annotator_03 and
annotator_08 of the CIRCUS agreement study) from the signatures of the report's
``item_level_rows`` (position = row number). Re-running changes nothing; an annotation
edited since the last run becomes a new judgement revision.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from annotation import roles
from annotation.agreement.circus_files import CircusFormatError, load_agreement_report, parse_assignment_file
from annotation.agreement.maths import FLAGS, UNSPECIFIED_SIGNATURE, VALID_SIGNATURE, signature_flags
from annotation.assignment.queue import store_judgement
from annotation.models import Assignment, Judgement, RubricVersion, Study, StudyItem
from annotation.sizes import add_items, recount
from annotation.verdicts.readmodel import item_completions
from retrieval.models import Dataset, Query, Turn

SOURCE = "circus-import"
CLIENT_TOKEN = "circus-import"


class CircusImportError(ValueError):
    """An import refused before anything is written, in words for the command and the page."""


@dataclass(frozen=True)
class Record:
    """One labelled or unlabelled CIRCUS assignment, whatever file it came from."""

    username: str
    dataset: str
    query_idx: int
    hidden_category: str
    position: int
    validated: bool | None
    flags: tuple[str, ...]
    note: str
    updated_at: str | None
    source: str


def records_from_files(paths: list[str], verify_checksum: bool = True) -> list[Record]:
    out: list[Record] = []
    for path in paths:
        parsed = parse_assignment_file(path, verify_checksum=verify_checksum)
        for a in parsed.annotations:
            out.append(
                Record(
                    parsed.username,
                    a.dataset,
                    a.query_idx,
                    a.hidden_category,
                    a.presentation_order,
                    a.validated,
                    a.flags,
                    a.other,
                    a.updated_at,
                    str(path),
                )
            )
    return out


def records_from_report(path: str, annotators: list[str]) -> list[Record]:
    report = load_agreement_report(path)
    rows = report.get("item_level_rows")
    if not isinstance(rows, list):
        raise CircusImportError(f"{path}: no item_level_rows")
    found: set[str] = set()
    out: list[Record] = []
    for n, row in enumerate(rows, start=1):
        try:
            dataset, idx, hidden, signatures = (
                row["dataset"],
                int(row["query_idx"]),
                row["hidden_category"],
                row["signatures"],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CircusImportError(f"{path}: item_level_rows[{n - 1}] is malformed ({exc})") from None
        for name in annotators:
            signature = signatures.get(name)
            if signature is None:
                continue
            found.add(name)
            if signature == VALID_SIGNATURE:
                validated, flags = True, ()
            else:
                try:
                    on = signature_flags(signature) if signature != UNSPECIFIED_SIGNATURE else frozenset()
                except ValueError as exc:
                    raise CircusImportError(f"{path}: item_level_rows[{n - 1}], {name}: {exc}") from None
                validated, flags = False, tuple(f for f in FLAGS if f in on)
            out.append(Record(name, dataset, idx, hidden, n, validated, flags, "", None, str(path)))
    missing = [a for a in annotators if a not in found]
    if missing:
        raise CircusImportError(f"{path}: no signatures of {', '.join(missing)} in item_level_rows")
    return out


def category_of(validated: bool | None, flags: tuple[str, ...], severity: dict[str, int], valid_key: str) -> str:
    if validated:
        return valid_key
    if not flags:
        return ""  # invalid, unspecified: validated false and no flag
    return max(flags, key=lambda f: severity[f])


def import_circus_study(
    files: list[str],
    study_name: str,
    dataset_prefix: str = "circus",
    report: str | None = None,
    from_report: list[str] | None = None,
    verify_checksum: bool = True,
) -> dict[str, Any]:
    """Import CIRCUS annotation ``files`` (and the annotators ``from_report`` of ``report``) as the
    study ``study_name``, in one transaction; returns the counts :func:`summary_line` words.
    Raises :class:`CircusImportError` (a ValueError) with the reason when nothing can be imported."""
    from_report = [a.strip() for a in from_report or [] if a.strip()]
    if from_report and not report:
        raise CircusImportError("--from-report needs --report")
    if report and not from_report:
        raise CircusImportError("--report needs --from-report (which annotators to take from it)")
    if not files and not from_report:
        raise CircusImportError("give CIRCUS annotation files and/or --report with --from-report")
    try:
        records = records_from_files(files, verify_checksum)
        both = sorted({r.username for r in records} & set(from_report))
        if both:
            raise CircusImportError(f"{', '.join(both)} has a file and is also taken from the report: pick one")
        if from_report:
            records += records_from_report(report, from_report)
    except CircusFormatError as exc:
        raise CircusImportError(str(exc)) from None
    _check(records)
    with transaction.atomic():
        return {"study_name": study_name, **_import(records, study_name, dataset_prefix)}


def summary_line(summary: dict[str, Any]) -> str:
    """What an import did, in one line (the command prints it, the room shows it)."""
    return (
        f"Study {summary['study']} ({summary['study_name']!r}): {summary['items']} items, "
        f"{summary['annotators']} annotators, {summary['judgements']} labelled assignments; created "
        f"{summary['new_queries']} placeholder queries, {summary['new_items']} items, {summary['new_users']} "
        f"users, {summary['new_assignments']} assignments, {summary['new_judgements']} judgements, "
        f"{summary['revised']} revisions."
    )


def _check(records: list[Record]) -> None:
    hidden: dict[tuple[str, int], tuple[str, str]] = {}
    seen: dict[tuple[str, str, int], str] = {}
    for r in records:
        key = (r.dataset, r.query_idx)
        first = hidden.setdefault(key, (r.hidden_category, r.source))
        if first[0] != r.hidden_category:
            raise CircusImportError(
                f"{r.dataset}::{r.query_idx} has hidden category {first[0]!r} in {first[1]} "
                f"but {r.hidden_category!r} in {r.source}"
            )
        who = (r.username, r.dataset, r.query_idx)
        if who in seen:
            raise CircusImportError(f"{r.username} has {r.dataset}::{r.query_idx} twice ({seen[who]}, {r.source})")
        seen[who] = r.source


# ------------------------------------------------------------------ the import


def _queries(prefix: str, needed: dict[str, set[int]]) -> tuple[dict[tuple[str, int], int], int]:
    """(dataset, query_idx) -> query id, creating placeholder datasets and queries."""
    out: dict[tuple[str, int], int] = {}
    created = 0
    for circus_name in sorted(needed):
        name = f"{prefix}-{circus_name}" if prefix else circus_name
        ordinals = needed[circus_name]
        dataset = Dataset.objects.filter(name=name).first()
        placeholder = dataset is None or bool(dataset.extra.get("circus_placeholder"))
        if dataset is None:
            dataset = Dataset.objects.create(
                name=name,
                format="circus",
                extra={"circus_placeholder": True, "circus_dataset": circus_name},
                description=f"CIRCUS {circus_name} queries referenced by imported annotations "
                "(placeholders: no text, no images).",
            )
        found: dict[int, list[int]] = defaultdict(list)
        for qid, ordinal in Query.objects.filter(dataset=dataset, ordinal__in=list(ordinals)).values_list(
            "id", "ordinal"
        ):
            found[ordinal].append(qid)
        twice = sorted(o for o, ids in found.items() if len(ids) > 1)
        if twice:
            raise CircusImportError(
                f"dataset {name!r} has several queries with ordinal {twice[0]}: cannot tell which one a query_idx means"
            )
        missing = sorted(ordinals - set(found))
        if missing and not placeholder:
            raise CircusImportError(
                f"dataset {name!r} exists but has no query with ordinal {missing[0]} "
                f"({len(missing)} query_idx missing); use another --dataset-prefix"
            )
        if missing:
            new = Query.objects.bulk_create(
                [
                    Query(
                        dataset=dataset,
                        external_id=str(o),
                        split="test",
                        ordinal=o,
                        n_turns=1,
                        source_file="circus",
                        extra={"circus_placeholder": True},
                    )
                    for o in missing
                ]
            )
            Turn.objects.bulk_create([Turn(query=q, index=1, texts=[]) for q in new])
            for q in new:
                found[q.ordinal].append(q.pk)
            created += len(new)
        for o in ordinals:
            out[(circus_name, o)] = found[o][0]
    return out, created


def _import(records: list[Record], study_name: str, prefix: str) -> dict[str, int]:
    rubric_row = RubricVersion.builtin("validity")
    needed: dict[str, set[int]] = defaultdict(set)
    for r in records:
        needed[r.dataset].add(r.query_idx)
    study = _existing_study(study_name)
    queries, new_queries = _queries(prefix, needed)
    study = _study(study, study_name, rubric_row, records, needed, prefix)
    items, n_new_items = _items(study, records, queries, prefix)
    users, new_users = _annotators(study, records)
    counts = _judgements(study, study.rubric, records, queries, items, users)
    _counters(study)
    return {
        "study": study.pk,
        "items": len(items),
        "annotators": len(users),
        "new_queries": new_queries,
        "new_items": n_new_items,
        "new_users": new_users,
        **counts,
    }


def _existing_study(study_name: str) -> Study | None:
    study = Study.objects.filter(name=study_name).first()
    if study is not None and study.pool.get("source") != SOURCE:
        raise CircusImportError(f"a study named {study_name!r} exists and was not imported from CIRCUS")
    if study is not None and study.rubric.key != "validity":
        raise CircusImportError(f"study {study_name!r} does not use the validity rubric")
    return study


def _study(
    study: Study | None,
    study_name: str,
    rubric_row: RubricVersion,
    records: list[Record],
    needed: dict[str, set[int]],
    prefix: str,
) -> Study:
    """The study (created on the first import). Quorum 1: the CIRCUS release decided every
    item on one annotator's label (the primary policy), whatever the item's overlap."""
    sources = sorted({r.source for r in records})
    if study is None:
        return Study.objects.create(
            name=study_name,
            rubric=rubric_row,
            overlap=1,
            quorum=1,
            blind=True,
            status=Study.Status.CLOSED,
            pool={"source": SOURCE, "files": sources, "datasets": sorted(needed), "dataset_prefix": prefix},
        )
    pool = dict(study.pool)
    pool["files"] = sorted(set(pool.get("files", [])) | set(sources))
    pool["datasets"] = sorted(set(pool.get("datasets", [])) | set(needed))
    study.pool = pool
    study.save(update_fields=["pool"])
    return study


def _items(study: Study, records: list[Record], queries: dict, prefix: str) -> tuple[dict[int, int], int]:
    items = dict(StudyItem.objects.filter(study=study).values_list("query_id", "id"))
    hidden = {(r.dataset, r.query_idx): r.hidden_category for r in records}
    order = len(items)
    new_items = []
    for key in sorted(hidden):
        qid = queries[key]
        if qid not in items:
            new_items.append(
                StudyItem(
                    study=study,
                    query_id=qid,
                    hidden_category=hidden[key],
                    stratum=f"{prefix}-{key[0]}" if prefix else key[0],
                    order_key=order,
                )
            )
            order += 1
    add_items(study, new_items)
    return dict(StudyItem.objects.filter(study=study).values_list("query_id", "id")), len(new_items)


def _annotators(study: Study, records: list[Record]) -> tuple[dict[str, Any], int]:
    User = get_user_model()
    group, _ = Group.objects.get_or_create(name=roles.ANNOTATOR)
    users = {}
    new_users = 0
    for name in sorted({r.username for r in records}):
        user = User.objects.filter(username=name).first()
        if user is None:
            user = User(username=name)
            user.set_unusable_password()
            user.save()
            new_users += 1
        user.groups.add(group)
        users[name] = user
    study.annotators.add(*users.values())
    return users, new_users


def _judgements(
    study: Study,
    rubric_row: RubricVersion,
    records: list[Record],
    queries: dict,
    items: dict[int, int],
    users: dict[str, Any],
) -> dict[str, int]:
    """Assignments and judgements; an edited label becomes a new revision."""
    rubric = rubric_row.rubric
    severity = {c.key: c.severity for c in rubric.categories}
    valid_key = rubric.valid_category.key  # type: ignore[union-attr]
    existing = {(a.item_id, a.annotator_id): a for a in Assignment.objects.filter(study=study)}
    current = {j.assignment_id: j for j in Judgement.objects.filter(assignment__study=study, is_current=True)}
    counts = {"judgements": 0, "new_assignments": 0, "new_judgements": 0, "revised": 0}
    for r in sorted(records, key=lambda r: (r.username, r.position)):
        if r.validated is None:
            continue  # not labelled yet: the item stays in the study without an assignment
        counts["judgements"] += 1
        at = datetime.fromisoformat(r.updated_at) if r.updated_at else None
        assignment = _assignment(
            study, existing, items[queries[(r.dataset, r.query_idx)]], users[r.username], r, at, counts
        )
        flags = {f: f in r.flags for f in FLAGS}
        category = category_of(r.validated, r.flags, severity, valid_key)
        previous = current.get(assignment.pk)
        if previous is not None and (previous.validated, previous.flags, previous.category, previous.note) == (
            r.validated,
            flags,
            category,
            r.note,
        ):
            continue
        counts["revised" if previous is not None else "new_judgements"] += 1
        current[assignment.pk] = _judge(assignment, previous, r, flags, category, at)
    return counts


def _assignment(
    study: Study, existing: dict, item_id: int, user, r: Record, at: datetime | None, counts: dict[str, int]
) -> Assignment:
    """The annotator's assignment of the item; a new one is reserved, and the store marks it done."""
    assignment = existing.get((item_id, user.pk))
    if assignment is None:
        assignment = Assignment.objects.create(
            study=study,
            item_id=item_id,
            annotator=user,
            status=Assignment.Status.RESERVED,
            served_by=SOURCE,
            position=r.position,
        )
        existing[(item_id, user.pk)] = assignment
        counts["new_assignments"] += 1
    return assignment


def _counters(study: Study) -> None:
    """Every labelled assignment is done; the agreement subset is what everyone judged."""
    n_annotators = study.annotators.count()
    completions = item_completions(study)  # the read model's rule: a late answer completes nothing
    counts = [
        (item_id, completions.get(item_id, 0))
        for item_id in StudyItem.objects.filter(study=study).order_by("id").values_list("id", flat=True)
    ]
    changed = []
    for item_id, n in counts:
        changed.append(StudyItem(id=item_id, taken=n, completed=n, agreement=n_annotators > 1 and n == n_annotators))
    StudyItem.objects.bulk_update(changed, ["taken", "completed", "agreement"], batch_size=1000)
    recount(study, ("n_agreement",))  # the agreement flags were rewritten around the ORM's signals
    study.overlap = max([n for _, n in counts] or [1]) or 1
    study.save(update_fields=["overlap"])


def _judge(
    assignment: Assignment,
    previous: Judgement | None,
    r: Record,
    flags: dict[str, bool],
    category: str,
    at: datetime | None,
) -> Judgement:
    """A new current judgement, stored through the queue's store (the path of annotators'
    submits: revision, current row, token, counters); the CIRCUS edit time is kept."""
    token = CLIENT_TOKEN if previous is None else f"{CLIENT_TOKEN}-{previous.revision + 1}"
    judgement = store_judgement(
        assignment, {"category": category, "flags": flags, "validated": r.validated, "note": r.note}, client_token=token
    )
    if at is not None:
        Judgement.objects.filter(pk=judgement.pk).update(created_at=at)
        if judgement.revision == 1:
            Assignment.objects.filter(pk=assignment.pk).update(completed_at=at)
    return judgement
