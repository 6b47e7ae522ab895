"""The validated export of a study: M-BEIR query JSONL per dataset and hidden category, a
trace JSONL beside each, and a manifest with counts and SHA-256 of every file.

Streamed: items are read in id order with ``.iterator(chunk_size)``, one batch of items
(with their votes, queries, turns and targets) at a time, and every line is written as soon
as it is made, so memory does not grow with the study. The files go to a temporary folder
next to the destination that is renamed at the end: a reader never sees half an export.

Layout of an export folder::

    manifest.json
    <dataset>/validated_solved/<dataset>_validated_solved.jsonl         hidden category composition_required
    <dataset>/validated_solved/<dataset>_validated_solved.trace.jsonl
    <dataset>/validated_unsolved/...                                     hidden category unresolved
    <dataset>/validated/...                                              no hidden category (no audit)
    <dataset>/validated_<label>/...                                      any other audit label

A subset's files exist only when it has at least one line. Query lines follow the M-BEIR
query layout, keys in this order: ``qid, query_txt, query_img_path, query_modality,
query_src_content, pos_cand_list, neg_cand_list, task_id``. An M-BEIR query keeps its own
values (from the verbatim source record); other formats get ``qid = "<dataset>:<query id>"``,
the turn's text, the reference image path (relative to the dataset's image root),
``query_modality = "image,text"``, ``query_src_content`` = JSON of the dataset, query id
and reference id, ``pos_cand_list`` / ``neg_cand_list`` as :func:`retrieval.targets.mbeir_candidates`
places them (UniIR's converter: for CIRR, every target scored 1.0 is a positive, the primary
first, and those scored 0.5, 0.2 or -1 are negatives, the hard target too), ``task_id = 7``.
A validated query whose known targets are all negatives (CIRR val's pairid 29045, whose
``target_soft`` scores its ``target_hard`` -1.0) gets no M-BEIR line, as UniIR's converters leave it out
(:data:`retrieval.targets.MBEIR_NO_POSITIVE`); the manifest's ``left_out`` counts and names
those queries, and ``export_validated`` says how many were left out and why.
Each trace line carries the consensus, every vote (category, sub-reason, flags, note, flag
for adjudication, time, revision) and the adjudication behind the query line at the same
position. Annotators appear as ``annotator_NN`` (:func:`annotation.agreement.reports.annotator_pseudonyms`),
adjudicators as ``adjudicator_NN`` (username order).

Only decided items are exported: an item needs the study's quorum of current judgements (or an
adjudication, :func:`annotation.verdicts.readmodel.decide_row`); the manifest counts validated,
rejected, adjudicated, pending (below the quorum), unjudged and awaiting-adjudication items, the
states of :mod:`annotation.verdicts.state`.

Session studies (session rubric) are decided by their session rule and written in the CIRCLED
public layout instead (CIR-FORMATS §7.1): ``<dataset>/<subset>.json``, a JSON list of
``{session_id, subset, ground_truth_ids, num_turns, turns}`` (a CIRCLED query keeps its verbatim
record, so the file re-imports with :mod:`retrieval.importers.circled`), and
``<dataset>/<subset>.trace.jsonl`` beside it (scales, reject flags, notes, adjudication).
Sessions judged turn by turn (session rubric v2) are written whole (``sessions="whole"``, the
default: the validated sessions) or as valid prefixes (``sessions="prefix"``: every decided
session with a valid prefix of at least one turn, cut after it as CIRCLED truncates its
sessions; the ground truths stay the session's). Their trace line carries per-turn provenance:
which turns were kept, each turn's consensus and every annotator's answer on it.

After the rename, each dataset of the study gets its :class:`retrieval.models.QuerySubset`
named ``validated`` rewritten with the validated queries, so an audit report can score them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.text import slugify

from annotation.agreement.maths import validity_signature
from annotation.agreement.reports import annotator_pseudonyms
from annotation.alternatives.export import FORMATS as QUERY_FORMATS
from annotation.alternatives.export import ExtraTargets, QueryLayout
from annotation.core.consensus import (
    ADJUDICATED,
    ADJUDICATION,
    PENDING,
    POLICIES,
    REJECTED,
    UNJUDGED,
    VALIDATED,
    Decision,
    tally,
)
from annotation.core.export_fields import CIRCLED_KEYS, MBEIR_KEYS
from annotation.core.turns import turn_answers
from annotation.models import Adjudication, ExportJob, Study
from annotation.verdicts.readmodel import (
    DEFAULT_CHUNK,
    ItemRow,
    Verdicts,
    decide_row,
    is_session_rubric,
    iter_item_batches,
    validity_label,
)
from annotation.verdicts.refit import refit_study
from audit.labels import COMPOSITION_REQUIRED, UNRESOLVED
from audit.runs.aggregation import latest_turn_checks
from retrieval.jobs.leases import run_job
from retrieval.models import VALIDATED_SUBSET, Dataset, Query, QuerySubset, Target, Turn, turn_text
from retrieval.targets import MBEIR_NO_POSITIVE, TargetFacts, mbeir_candidates

FORMAT = "cirval.validated_export"
FORMAT_VERSION = 1
TASK_ID = 7  # M-BEIR: (image, text) -> image
SUBSETS = {COMPOSITION_REQUIRED: "validated_solved", UNRESOLVED: "validated_unsolved", "": VALIDATED_SUBSET}
SUBSET_QUERY_NAME = VALIDATED_SUBSET

Progress = Callable[[str, int, int], None]


SESSION_SCOPES = ("whole", "prefix")  # turn-by-turn sessions: whole valid sessions or valid prefixes


class ExportError(ValueError):
    """An export that cannot run (wrong rubric, unknown primary annotator, busy destination)."""


def subset_name(hidden_category: str) -> str:
    """validated_solved / validated_unsolved / validated / validated_<label>."""
    if hidden_category in SUBSETS:
        return SUBSETS[hidden_category]
    return "validated_" + (slugify(hidden_category).replace("-", "_") or "other")


class _HashingFile:
    """A binary file written line by line, hashing and counting as it goes."""

    def __init__(self, path: Path):
        self.path = path
        self.handle: IO[bytes] = open(path, "wb")
        self.sha = hashlib.sha256()
        self.lines = 0
        self.bytes = 0

    def write_json(self, obj: Any) -> None:
        data = (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")
        self.handle.write(data)
        self.sha.update(data)
        self.lines += 1
        self.bytes += len(data)

    def close(self) -> None:
        self.handle.close()


@dataclass
class _Subset:
    dataset: str
    subset: str
    hidden_category: str
    queries: _HashingFile
    trace: _HashingFile


@dataclass
class ExportResult:
    path: Path
    manifest: dict[str, Any]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def check_exportable(
    study: Study, policy: str, primary: str | None, fmt: str = "mbeir", sessions: str = "whole"
) -> None:
    """Raise :class:`ExportError` unless the study can be exported under this policy.
    Category rubrics with a validated category export M-BEIR JSONL or CIRCO's layout
    (``fmt``); session rubrics export CIRCLED sessions under the study's session rule
    (``policy`` must stay majority, ``fmt`` mbeir, the default); ``sessions="prefix"``
    (valid prefixes) needs a session rubric with a turn verdict. The export page and
    ``manage.py export_validated`` both ask this before :func:`export_study`."""
    if fmt not in QUERY_FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; expected one of {QUERY_FORMATS}")
    rubric = study.rubric.rubric
    if sessions not in SESSION_SCOPES:
        raise ExportError(f"unknown session scope {sessions!r}; expected one of {SESSION_SCOPES}")
    if sessions == "prefix" and (not is_session_rubric(rubric) or rubric.turn_verdict is None):
        raise ExportError(
            f"valid prefixes need a session rubric with a turn verdict; study {study.name!r} uses "
            f"{rubric.key!r} v{rubric.version}"
        )
    if is_session_rubric(rubric):
        if policy != "majority" or primary or fmt != "mbeir":
            raise ExportError(
                "session studies are decided by their session rule and exported as CIRCLED sessions; "
                "the policy, the primary annotator and the format apply to category rubrics only"
            )
        return
    if rubric.kind != "category" or rubric.valid_category is None:
        raise ExportError(
            f"study {study.name!r} uses the {rubric.kind} rubric {rubric.key!r}: only category "
            "rubrics with a validated category and session rubrics can be exported"
        )
    if policy not in POLICIES:
        raise ExportError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    if primary and policy != "primary":
        raise ExportError("a primary annotator is only used by the primary policy")
    if primary and not study.assignments.filter(annotator__username=primary).exists():
        raise ExportError(f"{primary!r} has no assignment in study {study.name!r}")


def _split_targets(fmt: str, facts: list[TargetFacts]) -> tuple[list[str], list[str]]:
    """(pos_cand_list, neg_cand_list) external ids, as :func:`retrieval.targets.mbeir_candidates` places them."""
    pos, neg = mbeir_candidates(fmt, facts)
    return [t.image for t in pos], [t.image for t in neg]


class _QueryData:
    """Query, first turn and targets of one batch of validated queries (a few queries)."""

    def __init__(self, query_ids: list[int]):
        self.queries = {
            q: (raw, fmt, ext, split)
            for q, raw, fmt, ext, split in Query.objects.filter(id__in=query_ids).values_list(
                "id", "raw", "dataset__format", "external_id", "split"
            )
        }
        self.turns: dict[int, tuple[str, str | None, str | None]] = {}
        for q, texts, path, ref in Turn.objects.filter(query_id__in=query_ids, index=1).values_list(
            "query_id", "texts", "reference_image__path", "reference_image__external_id"
        ):
            self.turns[q] = (turn_text(texts), path or None, ref)
        facts: dict[int, list[TargetFacts]] = defaultdict(list)
        rows = Target.objects.filter(query_id__in=query_ids)
        for q, ext, role, relevance, primary in rows.order_by("query_id", "-is_primary", "id").values_list(
            "query_id", "image__external_id", "role", "relevance", "is_primary"
        ):
            facts[q].append(TargetFacts(ext, relevance, primary, role))
        self.targets: dict[int, tuple[list[str], list[str]]] = {
            q: _split_targets(self.queries[q][1] if q in self.queries else "", f) for q, f in facts.items()
        }

    def circled_record(self, row: ItemRow) -> dict[str, Any]:
        query = Query.objects.select_related("dataset").get(pk=row.query_id)
        return circled_record(row, query, self.targets.get(row.query_id, ([], []))[0])

    def mbeir_line(self, row: ItemRow) -> dict[str, Any]:
        raw, fmt, ext, _split = self.queries[row.query_id]
        if fmt == "mbeir" and isinstance(raw, dict) and raw.get("qid"):
            line = {key: raw.get(key) for key in MBEIR_KEYS}
            line["query_modality"] = raw.get("query_modality") or "image,text"
            line["pos_cand_list"] = list(raw.get("pos_cand_list") or [])
            line["neg_cand_list"] = list(raw.get("neg_cand_list") or [])
            line["task_id"] = raw.get("task_id", TASK_ID)
            return line
        text, path, ref = self.turns.get(row.query_id, ("", None, None))
        pos, neg = self.targets.get(row.query_id, ([], []))
        return {
            "qid": f"{row.dataset}:{ext}",
            "query_txt": text,
            "query_img_path": path,
            "query_modality": "image,text",
            "query_src_content": json.dumps({"dataset": row.dataset, "id": ext, "reference": ref}),
            "pos_cand_list": list(pos),
            "neg_cand_list": list(neg),
            "task_id": TASK_ID,
        }


def _token(text: str) -> str:
    return "".join(ch for ch in slugify(text) if ch.isalnum()) or "x"


def circled_subset(fmt: str, dataset: str, category: str, split: str) -> str:
    """The CIRCLED subset of a session that is not a CIRCLED record, named as CIRCLED names its
    sources so that :mod:`retrieval.importers.circled` re-imports the file without ``--subset``:
    FashionIQ and Multi-turn FashionIQ ``fashioniq_<category>_<split>``, CIRR ``cirr_<split>``,
    CIRCO ``circo_<split>``, any other data ``<dataset>_<split>`` (letters and digits only)."""
    if fmt in ("fashioniq", "mtfiq") and category:
        return f"fashioniq_{_token(category)}_{_token(split)}"
    if fmt in ("cirr", "circo"):
        return f"{fmt}_{_token(split)}"
    return f"{_token(dataset)}_{_token(split)}"


def circled_record(row: ItemRow, query: Query, positives: list[str]) -> dict[str, Any]:
    """One session in the CIRCLED public layout (CIR-FORMATS §7.1). A CIRCLED query keeps its
    verbatim record; any other session is rebuilt from its turns: turn k's reference and
    modification text, the ground truths = the query's positive targets."""
    raw = query.raw if isinstance(query.raw, dict) else {}
    if query.dataset.format == "circled" and all(k in raw for k in CIRCLED_KEYS):
        return {k: raw[k] for k in CIRCLED_KEYS}
    turns = [
        {
            "turn": t.index,
            "reference_image_id": t.reference_image.external_id if t.reference_image else "",
            "relative_caption": turn_text(t.texts),
        }
        for t in query.turns.select_related("reference_image").order_by("index")
    ]
    subset = circled_subset(query.dataset.format, row.dataset, query.category, query.split)
    return {
        "session_id": query.external_id,
        "subset": subset,
        "ground_truth_ids": list(positives),
        "num_turns": len(turns),
        "turns": turns,
    }


def _vote_dict(vote, names: dict[str, str]) -> dict[str, Any]:
    label = validity_label(vote.validated, vote.flags, vote.category)
    try:
        signature = validity_signature(label) if label is not None else None
    except ValueError:  # a category rubric whose keys are not the CIRCUS flags
        signature = None
    return {
        "annotator": names.get(vote.annotator, vote.annotator),
        "validated": vote.validated,
        "label": label,
        "signature": signature,
        "category": vote.category,
        "sub_reason": vote.sub_reason,
        "flags": vote.flags,
        "note": vote.note,
        "flagged": vote.flagged,
        "time_spent_ms": vote.time_spent_ms,
        "revision": vote.revision,
        "judged_at": _iso(vote.judged_at),
    }


def _session_vote_dict(vote, names: dict[str, str]) -> dict[str, Any]:
    return {
        "annotator": names.get(vote.annotator, vote.annotator),
        "scales": vote.scales,
        "per_turn": vote.per_turn,
        "reject_flags": vote.reject_flags,
        "note": vote.note,
        "flagged": vote.flagged,
        "time_spent_ms": vote.time_spent_ms,
        "revision": vote.revision,
        "judged_at": _iso(vote.judged_at),
    }


def _turn_trace(row: ItemRow, decision: Decision, kept: int, run: _Run) -> dict[str, Any]:
    """Per-turn provenance of a turn-by-turn session: the turns kept, and for every turn its
    consensus (status, provenance, votes) and each annotator's answer."""
    key, names = run.verdicts.turn_key, run.names
    answers = {
        names.get(v.annotator, v.annotator): turn_answers(v.per_turn, key)  # type: ignore[arg-type]
        for v in row.votes
    }
    return {
        "scope": run.sessions,
        "num_turns": len(decision.turns),
        "turns_kept": kept,
        "truncated": kept < len(decision.turns),
        "valid_prefix": decision.prefix,
        "turns": [
            {
                "turn": i + 1,
                "kept": i < kept,
                "status": d.status,
                "provenance": d.provenance,
                "valid_votes": d.valid_votes,
                "invalid_votes": d.invalid_votes,
                "answers": {a: (t[i] if t is not None and i < len(t) else None) for a, t in answers.items()},
            }
            for i, d in enumerate(decision.turns)
        ],
    }


def _trace_line(
    qid: str, row: ItemRow, decision: Decision, subset: str, run: _Run, kept: int | None = None
) -> dict[str, Any]:
    adj, names, session = row.adjudication, run.names, run.verdicts.session is not None
    vote_dict = _session_vote_dict if session else _vote_dict
    differs = {"majority": run.differs[row.item_id]} if row.item_id in run.differs else {}  # reliability policy
    turns = {"turn_verdicts": _turn_trace(row, decision, kept, run)} if kept is not None else {}
    return {
        **differs,
        "qid": qid,
        "item": row.item_id,
        "query": row.query_id,
        "dataset": row.dataset,
        "query_external_id": row.external_id,
        "query_ordinal": row.ordinal,
        "hidden_category": row.hidden_category,
        "subset": subset,
        "validated": True,
        "consensus": {
            "policy": "session" if session else run.verdicts.policy,
            "status": decision.status,
            "provenance": decision.provenance,
            "quorum": decision.quorum,
            "valid_votes": decision.valid_votes,
            "invalid_votes": decision.invalid_votes,
            "n_votes": decision.n_votes,
            "flagged_votes": decision.flagged_votes,
            "decided_by": names.get(decision.decided_by, decision.decided_by) if decision.decided_by else None,
        },
        "votes": [vote_dict(v, names) for v in row.votes],
        "adjudication": None
        if adj is None
        else {
            "decision": adj.decision,
            "note": adj.note,
            "adjudicator": run.adjudicators.get(adj.decided_by or "", None),
            "decided_at": _iso(adj.decided_at),
        },
        **turns,
    }


def export_destination(study: Study, out_dir: Path | None) -> tuple[Path, bool]:
    """(final folder, auto-named). An explicit folder must be absent or empty."""
    if out_dir is not None:
        out_dir = Path(out_dir).resolve()
        if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
            raise ExportError(f"{out_dir} exists and is not an empty folder")
        return out_dir, False
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    base = slugify(study.name) or f"study-{study.pk}"
    return Path(settings.EXPORT_DIR).resolve() / f"{base}-{stamp}", True


def move_into_place(tmp: Path, final: Path, auto: bool) -> Path:
    if final.is_dir() and not any(final.iterdir()):
        final.rmdir()
    for n in range(1, 1000):
        target = final if n == 1 else final.with_name(f"{final.name}-{n}")
        try:
            os.rename(tmp, target)  # atomic; fails when the target is a non-empty folder
            return target
        except OSError:
            if not auto or not target.exists():
                raise
    raise ExportError(f"cannot find a free folder name next to {final}")


def _refresh_validated_subsets(study: Study, dataset_ids: list[int], id_file: Path) -> None:
    """Rewrite each dataset's 'validated' QuerySubset from the ids written during the export."""
    through = QuerySubset.queries.through
    with transaction.atomic():
        subsets = {}
        for ds in Dataset.objects.filter(id__in=dataset_ids):
            subset, _ = QuerySubset.objects.get_or_create(dataset=ds, name=SUBSET_QUERY_NAME)
            subset.source = f"study {study.pk} export"
            subset.save(update_fields=["source"])
            through.objects.filter(querysubset=subset).delete()
            subsets[ds.pk] = subset.pk
        batch: list = []
        with open(id_file, encoding="ascii") as fh:
            for line in fh:
                dataset_id, query_id = map(int, line.split())
                batch.append(through(querysubset_id=subsets[dataset_id], query_id=query_id))
                if len(batch) >= 5000:
                    through.objects.bulk_create(batch, ignore_conflicts=True)
                    batch = []
        if batch:
            through.objects.bulk_create(batch, ignore_conflicts=True)


_RULES = {
    "majority": "validated when strictly more than half of the item's annotators chose VALIDATED",
    "unanimous": "validated when every annotator of the item chose VALIDATED",
    "reliability": "validated when every annotator of the item chose VALIDATED, or, on a split vote, when the "
    "annotators' Dawid-Skene reliability model gives the item a posterior above one half",
    "primary": "validated when the deciding annotator (the primary one where they judged the item, else the first "
    "in username order) chose VALIDATED",
}


def consensus_rule(verdicts: Verdicts) -> str:
    """The consensus rule of an export in words (the manifest's ``consensus.rule``)."""
    rule = verdicts.describe_session() if verdicts.session is not None else _RULES[verdicts.policy]
    quorum = (
        f"the quorum of its votes under {verdicts.rule.describe()}"
        if verdicts.rule is not None and verdicts.rule.adaptive
        else f"{verdicts.quorum} current judgement(s) (the quorum)"
    )
    return (
        f"{rule}; an item is decided only once it has {quorum}, "
        "before that it is pending and never exported; flagged items, ties and disagreements wait for an "
        "adjudicator, whose decision always wins"
    )


def verdict_counts(tallied: dict[str, Any], exported_lines: int) -> dict[str, Any]:
    """The manifest's ``counts`` from a :func:`~annotation.core.consensus.tally`."""
    status, provenance = tallied["status"], tallied["provenance"]
    return {
        "items": tallied["items"],
        "validated": status[VALIDATED],
        "rejected": status[REJECTED],
        "adjudicated": provenance[ADJUDICATED],
        "pending": status[PENDING],  # below the quorum (annotation.verdicts.state); unjudged items apart
        "unjudged": status[UNJUDGED],
        "awaiting_adjudication": status[ADJUDICATION],
        "by_provenance": {k: n for k, n in sorted(provenance.items()) if n},
        "exported_lines": exported_lines,
    }


class _Writers:
    """The open query / trace files of an export, one pair per (dataset, subset)."""

    def __init__(self, tmp: Path, circled: bool, suffix: str = ".jsonl"):
        self.tmp = tmp
        self.circled = circled
        self.suffix = suffix  # of the query files (the query layout's: M-BEIR JSONL or CIRCO)
        self.subsets: dict[tuple[str, str], _Subset] = {}

    def get(self, dataset: str, subset: str, hidden_category: str) -> _Subset:
        w = self.subsets.get((dataset, subset))
        if w is None:
            if self.circled:
                folder, stem, ext = self.tmp / dataset, subset, ".json"
            else:
                folder, stem, ext = self.tmp / dataset / subset, f"{dataset}_{subset}", self.suffix
            folder.mkdir(parents=True, exist_ok=True)
            queries = _JsonListFile(folder / f"{stem}{ext}") if self.circled else _HashingFile(folder / f"{stem}{ext}")
            w = self.subsets[(dataset, subset)] = _Subset(
                dataset, subset, hidden_category, queries, _HashingFile(folder / f"{stem}.trace.jsonl")
            )
        return w

    def close(self) -> None:
        for w in self.subsets.values():
            w.queries.close()
            w.trace.close()

    def abort(self) -> None:
        for w in self.subsets.values():
            w.queries.handle.close()
            w.trace.handle.close()

    @property
    def lines(self) -> int:
        return sum(w.queries.lines for w in self.subsets.values())

    def files(self) -> list[dict[str, Any]]:
        out = []
        for (dataset, subset), w in sorted(self.subsets.items()):
            for kind, f in (("queries", w.queries), ("trace", w.trace)):
                out.append(
                    {
                        "path": f.path.relative_to(self.tmp).as_posix(),
                        "kind": kind,
                        "dataset": dataset,
                        "subset": subset,
                        "hidden_category": w.hidden_category,
                        "lines": f.lines,
                        "bytes": f.bytes,
                        "sha256": f.sha.hexdigest(),
                    }
                )
        return out


class _JsonListFile(_HashingFile):
    """A JSON list (the CIRCLED public layout) written one element at a time."""

    def __init__(self, path: Path):
        super().__init__(path)
        self._raw(b"[")

    def _raw(self, data: bytes) -> None:
        self.handle.write(data)
        self.sha.update(data)
        self.bytes += len(data)

    def write_json(self, obj: Any) -> None:
        self._raw(
            (",\n  " if self.lines else "\n  ").encode("ascii") + json.dumps(obj, ensure_ascii=False).encode("utf-8")
        )
        self.lines += 1

    def close(self) -> None:
        self._raw(b"\n]\n" if self.lines else b"]\n")
        super().close()


@dataclass
class _Run:
    """The state of one export while it runs."""

    study: Study
    verdicts: Verdicts
    tmp: Path
    id_file: Path
    names: dict[str, str]
    adjudicators: dict[str, str]
    writers: _Writers
    decisions: list[Decision]
    per_dataset: dict[str, dict[str, Any]]
    dataset_ids: dict[str, int]
    layout: QueryLayout
    differs: dict[int, dict[str, Any]] = field(default_factory=dict)  # reliability vs majority (_compare_majority)
    sessions: str = "whole"
    left_out: list[str] = field(default_factory=list)  # M-BEIR qids with no positive (MBEIR_NO_POSITIVE)

    def kept_turns(self, decision: Decision) -> int | None:
        """Turns of a turn-by-turn session to write (``None``: not such a study, or nothing to
        write): a validated session whole; in prefix scope, a decided session's valid prefix."""
        if self.verdicts.turn_key is None:
            return None
        if decision.validated:
            return decision.prefix or len(decision.turns)
        if self.sessions == "prefix" and decision.decided and decision.prefix:
            return decision.prefix
        return None

    def keeps(self, decision: Decision) -> bool:
        return decision.validated or self.kept_turns(decision) is not None


def _adjudicator_names(study: Study) -> dict[str, str]:
    names = sorted(
        {
            u
            for u in Adjudication.objects.filter(study=study)
            .order_by()
            .values_list("decided_by__username", flat=True)
            .distinct()
            if u
        }
    )
    return {u: f"adjudicator_{i:02d}" for i, u in enumerate(names, start=1)}


def _prepare(study: Study, out_dir: Path | str | None, tmp_name: str | None) -> tuple[Path, bool, Path]:
    """(final folder, auto-named, fresh temporary folder next to it)."""
    final, auto = export_destination(study, Path(out_dir) if out_dir is not None else None)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / (tmp_name or f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    if tmp.exists():
        shutil.rmtree(tmp)  # a previous attempt of the same job died half way
    tmp.mkdir()
    return final, auto, tmp


def _count_row(run: _Run, row: ItemRow, decision: Decision) -> None:
    run.decisions.append(decision)
    run.dataset_ids.setdefault(row.dataset, row.dataset_id)
    run.per_dataset.setdefault(row.dataset, {"items": 0, "validated": 0, "subsets": {}})["items"] += 1


def _write_batch(run: _Run, batch: list[ItemRow], ids: IO[str]) -> None:
    decided = [(row, decide_row(row, run.verdicts)) for row in batch]
    for row, d in decided:
        _count_row(run, row, d)
        _compare_majority(run, row, d)
    keep = [(row, d) for row, d in decided if run.keeps(d)]
    if not keep:
        return
    data = _QueryData([row.query_id for row, _ in keep])
    extras = None if run.verdicts.session is not None else ExtraTargets(run.study, keep, run.names)
    checks = latest_turn_checks([row.query_id for row, _ in keep]) if extras is None else {}
    for row, d in keep:
        subset = _write_query(run, data, extras, row, d, checks)
        ids.write(f"{row.dataset_id} {row.query_id}\n")
        entry = run.per_dataset[row.dataset]
        entry["validated"] += 1
        if not d.validated:
            entry["valid_prefixes"] = entry.get("valid_prefixes", 0) + 1
        if subset is not None:
            entry["subsets"][subset] = entry["subsets"].get(subset, 0) + 1


def _compare_majority(run: _Run, row: ItemRow, decision: Decision) -> None:
    """Under the reliability policy: keep the majority verdict of every item where it differs
    (the trace line and the manifest show both)."""
    if run.verdicts.policy != "reliability" or run.verdicts.session is not None:
        return
    majority = decide_row(row, replace(run.verdicts, policy="majority"))
    if majority.status != decision.status:
        run.differs[row.item_id] = {
            "item": row.item_id,
            "dataset": row.dataset,
            "query_external_id": row.external_id,
            "reliability": decision.status,
            "majority": majority.status,
            "majority_provenance": majority.provenance,
            "split": majority.split_text,
        }


def _write_query(
    run: _Run,
    data: _QueryData,
    extras: ExtraTargets | None,
    row: ItemRow,
    d: Decision,
    checks: dict[int, list[dict[str, Any]]] | None = None,
) -> str | None:
    """Write one validated item's query line (or session record) and trace line; its subset
    (``None``: an M-BEIR line with no positive, left out as UniIR leaves it out: ``run.left_out``).
    A session's trace line carries its turns' automatic checks (``turn_checks``:
    :func:`audit.runs.aggregation.latest_turn_checks`)."""
    if extras is None:  # a session: the CIRCLED record (cut after its valid prefix when so asked)
        line = data.circled_record(row)
        kept = run.kept_turns(d)
        if kept is not None and kept < len(line["turns"]):
            line = {**line, "num_turns": kept, "turns": line["turns"][:kept]}
        subset = str(line["subset"])
        w = run.writers.get(row.dataset, subset, row.hidden_category)
        w.queries.write_json(line)
        w.trace.write_json(
            {
                **_trace_line(str(line["session_id"]), row, d, subset, run, kept),
                "turn_checks": (checks or {}).get(row.query_id, []),
            }
        )
        return subset
    line, positives = extras.apply(row, data.mbeir_line(row))  # + accepted alternatives
    if run.layout.fmt == "mbeir" and not line["pos_cand_list"] and line["neg_cand_list"]:
        # every known target is a negative (UniIR leaves such a query out); a query whose
        # targets are not known at all (a hidden test split, a CIRCUS study's placeholder) is kept
        run.left_out.append(str(line["qid"]))
        return None
    subset = subset_name(row.hidden_category)
    w = run.writers.get(row.dataset, subset, row.hidden_category)
    added = run.layout.write(
        w.queries,
        (row.dataset, subset),
        line,
        data.queries[row.query_id],
        data.turns.get(row.query_id, ("", None, None))[2],
    )
    w.trace.write_json({**_trace_line(str(line["qid"]), row, d, subset, run), "positives": positives, **added})
    return subset


def _reliability_manifest(run: _Run) -> dict[str, Any] | None:
    """The reliability policy's model (annotators pseudonymised) and the items where its
    verdict differs from the majority's; None under another policy."""
    model = run.verdicts.reliability
    if run.verdicts.policy != "reliability" or model is None:
        return None
    name = run.names.get
    return {
        "model": "Dawid-Skene (annotation.verdicts.reliability)",
        "prior_valid": model.prior,
        "annotators": {
            name(u, u): {"sensitivity": model.sensitivity[u], "specificity": model.specificity[u]}
            for u in sorted(model.sensitivity)
        },
        "differs_from_majority": len(run.differs),
        "differing_items": [run.differs[k] for k in sorted(run.differs)],
    }


def _manifest(run: _Run, created_at: datetime) -> dict[str, Any]:
    study, rubric, verdicts = run.study, run.study.rubric, run.verdicts
    circled = verdicts.session is not None
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": created_at.isoformat(),
        "study": {
            "id": study.pk,
            "name": study.name,
            "overlap": study.overlap,
            "quorum": verdicts.quorum,
            "adaptive_max": study.adaptive_max,
            "adaptive_confidence": study.adaptive_confidence if study.quorum_rule.weighted else None,
            "blind": study.blind,
        },
        "rubric": {"key": rubric.key, "version": rubric.version, "title": rubric.title},
        "consensus": {
            "policy": "session" if circled else verdicts.policy,
            "primary": run.names.get(verdicts.primary, verdicts.primary) if verdicts.primary else None,
            "quorum": verdicts.quorum,
            "session_rule": verdicts.session.to_dict() if circled else None,  # type: ignore[union-attr]
            "turn_verdict": verdicts.turn_key,
            "sessions": run.sessions if verdicts.turn_key is not None else None,
            "adjudications_applied": Adjudication.objects.filter(study=study, is_current=True).count(),
            "rule": consensus_rule(verdicts),
            "quorum_rule": verdicts.rule.describe() if verdicts.rule is not None else None,
            "reliability": _reliability_manifest(run),
        },
        "counts": {
            **verdict_counts(tally(run.decisions), run.writers.lines),
            **(
                {"valid_prefixes": sum(e.get("valid_prefixes", 0) for e in run.per_dataset.values())}
                if verdicts.turn_key is not None
                else {}
            ),
        },
        "datasets": {k: run.per_dataset[k] for k in sorted(run.per_dataset)},
        "files": run.writers.files(),
        "query_layout": list(CIRCLED_KEYS) if circled else run.layout.keys(MBEIR_KEYS),
        "query_format": "circled" if circled else run.layout.fmt,
        "pseudonyms": "annotators are annotator_NN and adjudicators adjudicator_NN, numbered in username order",
        **(
            {"left_out": {"queries": len(run.left_out), "reason": MBEIR_NO_POSITIVE, "qids": run.left_out}}
            if run.left_out
            else {}
        ),
    }


def export_study(
    study: Study,
    out_dir: Path | str | None = None,
    *,
    policy: str = "majority",
    primary: str | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    progress: Progress | None = None,
    tmp_name: str | None = None,
    fmt: str = "mbeir",
    created_at: datetime | None = None,
    sessions: str = "whole",
) -> ExportResult:
    """Export a study's validated items (module docstring). ``out_dir``: the export folder
    itself (absent or empty); default ``EXPORT_DIR/<study>-<timestamp>``. ``progress(stage,
    done, total)`` is called after every batch. ``created_at``: the manifest's timestamp
    (default now; a release passes the time of the study's last decision, so the same study
    gives the same bytes). ``sessions``: turn-by-turn session studies, ``whole`` (validated
    sessions) or ``prefix`` (valid prefixes too). Returns the final folder and the manifest."""
    check_exportable(study, policy, primary or None, fmt, sessions)
    refit_study(study)  # weighted adaptive overlap: the slots follow the exact fit the verdicts read
    verdicts = Verdicts.of(study, policy, primary or None)
    layout = QueryLayout(fmt)
    report = progress or (lambda stage, done, total: None)
    final, auto, tmp = _prepare(study, out_dir, tmp_name)
    id_file = final.parent / f"{tmp.name}.ids"
    run = _Run(
        study,
        verdicts,
        tmp,
        id_file,
        annotator_pseudonyms(study),
        _adjudicator_names(study),
        _Writers(tmp, verdicts.session is not None, layout.suffix),
        [],
        {},
        {},
        layout,
        sessions=sessions,
    )
    total = study.n_items
    created_at = created_at or timezone.now()
    done = 0
    report("exporting", 0, total)
    try:
        with open(id_file, "w", encoding="ascii") as ids:
            for batch in iter_item_batches(study, chunk_size=chunk_size):
                _write_batch(run, batch, ids)
                done += len(batch)
                report("exporting", done, total)
                yield_cpu()
                if settings.DEBUG and not connection.force_debug_cursor:
                    connection.queries_log.clear()  # DEBUG keeps every SQL string: memory would grow
        run.layout.finish(run.writers.subsets)
        run.writers.close()
        manifest = _manifest(run, created_at)
        with open(tmp / "manifest.json", "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2, ensure_ascii=False)
            fh.write("\n")
        report("finishing", done, total)
        path = move_into_place(tmp, final, auto)
        _refresh_validated_subsets(study, sorted(run.dataset_ids.values()), id_file)
        return ExportResult(path, manifest)
    except BaseException:
        run.writers.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        id_file.unlink(missing_ok=True)


def yield_cpu(seconds: float | None = None) -> None:
    """Between two batches: give the CPU up (``sched_yield``) and sleep ``EXPORT_YIELD_SECONDS``
    so that the web tier's requests run between an export's batches (the export keeps
    streaming; a batch of 2000 items takes far longer than the pause)."""
    seconds = float(settings.EXPORT_YIELD_SECONDS) if seconds is None else seconds
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    if seconds > 0:
        time.sleep(seconds)


def run_export_job(job: ExportJob) -> ExportJob:
    """Run one ExportJob under :func:`retrieval.jobs.leases.run_job`: claimed once (a
    redelivered message or a resend never runs it twice at once), beating, and finished
    with the folder and the manifest, or failed with a readable message."""

    def work(report) -> dict[str, Any]:
        study = Study.objects.select_related("rubric").get(pk=job.study_id)
        result = export_study(
            study,
            policy=job.policy,
            primary=job.primary or None,
            progress=report,
            tmp_name=f".export-job{job.pk}.tmp",
            fmt=job.query_format or "mbeir",
            chunk_size=settings.EXPORT_CHUNK_SIZE,
            sessions=job.sessions or "whole",
        )
        return {
            "path": str(result.path),
            "manifest": result.manifest,
            "files": ["manifest.json"] + [f["path"] for f in result.manifest["files"]],
        }

    run_job(ExportJob, job.pk, work)
    job.refresh_from_db()
    return job
