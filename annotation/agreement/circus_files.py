"""Pure readers of CIRCUS annotation files (no Django).

* :func:`parse_assignment_file` reads a per-annotator assignment file
  (``annotations/agreement_users/annotator_NN.json`` or ``annotations/users/…``) into
  plain :class:`CircusAnnotation` records, and rejects malformed files with a
  :class:`CircusFormatError` that names the file, the entry and the field.
* :func:`load_agreement_report` reads ``agreement_report.json`` keeping the duplicated
  (mislabelled) pair keys in file order (the tests put the right labels back by position,
  tests/circus_triples.py, which also turns the records and the report's signatures into
  ``(item, annotator, label)`` triples to compare CIRVal's agreement with CIRCUS's).

Schema: the CIRCUS reference notes (FORMATS.md, sections 1.1 and 1.3).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotation.core.rubric import CIRCUS_FLAG_ORDER as FLAGS
from annotation.core.rubric import VALIDATED_LABEL as VALIDATED
from retrieval.importers import jsonstream
from retrieval.records import ParseError
from retrieval.validation import Record


class CircusFormatError(ParseError):
    """A malformed CIRCUS file. Names the file, the entry (if any) and the field."""

    def __init__(self, file: str, message: str, *, entry: int | None = None, field: str | None = None):
        super().__init__(file, entry, field, message, record_label=f"assignments[{entry}]")
        self.entry = entry

    @classmethod
    def of(cls, exc: ParseError) -> CircusFormatError:
        """The error of a :class:`retrieval.validation.Record` as a CircusFormatError."""
        return cls(exc.file, exc.message, entry=exc.record, field=exc.field)


@dataclass(frozen=True)
class CircusAnnotation:
    """One assignment of one annotator, with its (possibly empty) annotation."""

    username: str
    assignment_id: str
    dataset: str
    query_idx: int
    hidden_category: str
    presentation_order: int
    validated: bool | None  # None: not labelled yet
    flags: tuple[str, ...]  # the true flags, in canonical order
    other: str
    updated_at: str | None
    source_user: str | None = None
    selection_mode: str | None = None

    @property
    def item_key(self) -> str:
        """``"<dataset>::<query_idx>"`` (equal to ``assignment_id``)."""
        return f"{self.dataset}::{self.query_idx}"

    @property
    def label(self) -> str | list[str] | None:
        """Validity label: ``"VALIDATED"``, the list of flags, or ``None`` when unlabelled."""
        if self.validated is None:
            return None
        if self.validated:
            return VALIDATED
        return list(self.flags)


@dataclass(frozen=True)
class AssignmentFile:
    """The header of a per-annotator file and its annotations in presentation order."""

    study_name: str
    seed: int | None
    username: str
    source_user: str | None
    generated_at: str | None
    assignment_ids_sha256: str | None
    annotations: tuple[CircusAnnotation, ...]


def _parse_entry(raw: Any, file: str, entry: int, username: str) -> CircusAnnotation:
    rec = Record(file, entry, raw, "assignment", label=f"assignments[{entry}]")
    assignment_id = rec.req_str("assignment_id")
    dataset = rec.req_str("dataset")
    query_idx = rec.req_int("query_idx")
    if not dataset:
        rec.fail("dataset", "empty dataset")
    if query_idx < 0:
        rec.fail("query_idx", f"negative query_idx {query_idx}")
    if assignment_id != f"{dataset}::{query_idx}":
        rec.fail("assignment_id", f"{assignment_id!r} is not '<dataset>::<query_idx>' = '{dataset}::{query_idx}'")
    hidden = rec.req_str("hidden_category")
    order = rec.req_int("presentation_order")
    if order < 1:
        rec.fail("presentation_order", f"presentation_order must be >= 1, got {order}")
    assigned = rec.data.get("assigned_user")
    if assigned is not None and assigned != username:
        rec.fail("assigned_user", f"assigned to {assigned!r}, but the file belongs to {username!r}")
    annotation = rec.nested("annotation", rec.req_obj("annotation"), "annotation")
    validated = annotation.nullable_bool("validated")
    flags = tuple(f for f in FLAGS if annotation.req_bool(f))
    source_user = rec.data.get("source_user")
    selection_mode = rec.data.get("selection_mode")
    return CircusAnnotation(
        username=username,
        assignment_id=assignment_id,
        dataset=dataset,
        query_idx=query_idx,
        hidden_category=hidden,
        presentation_order=order,
        validated=validated,
        flags=flags,
        other=annotation.opt_str("other") or "",
        updated_at=rec.opt_str("annotation_updated_at"),
        source_user=source_user if isinstance(source_user, str) else None,
        selection_mode=selection_mode if isinstance(selection_mode, str) else None,
    )


def parse_assignment_data(data: Any, *, file: str = "<data>", verify_checksum: bool = True) -> AssignmentFile:
    """Validate an already-decoded assignment file (see :func:`parse_assignment_file`).

    Fields are read through :class:`retrieval.validation.Record` (an entry is named
    ``assignments[N]``); any error is a :class:`CircusFormatError`."""
    if not isinstance(data, dict):
        raise CircusFormatError(file, "the file must hold one JSON object")
    try:
        return _parse_assignment_data(Record(file, None, data, "assignment file"), verify_checksum)
    except CircusFormatError:
        raise
    except ParseError as exc:
        raise CircusFormatError.of(exc) from None


def _parse_assignment_data(rec: Record, verify_checksum: bool) -> AssignmentFile:
    file = rec.file
    username = rec.req_str("username")
    study = rec.req_str("study_name")
    seed = rec.opt_int("seed")
    annotations = [_parse_entry(raw, file, i, username) for i, raw in enumerate(rec.req_list("assignments"))]
    _check_unique(annotations, file)
    count = rec.opt_int("assignment_count")
    if count is not None and count != len(annotations):
        rec.fail("assignment_count", f"assignment_count {count!r} but {len(annotations)} assignments")
    ordered = tuple(sorted(annotations, key=lambda a: a.presentation_order))
    checksum = rec.opt_str("assignment_ids_sha256")
    if verify_checksum and checksum is not None:
        digest = hashlib.sha256("\n".join(a.assignment_id for a in ordered).encode("utf-8")).hexdigest()
        if digest != checksum.lower():
            rec.fail(
                "assignment_ids_sha256",
                f"SHA-256 of the assignment ids in presentation order is {digest}, the file says {checksum}",
            )
    source_user = rec.data.get("source_user")
    generated_at = rec.data.get("generated_at")
    return AssignmentFile(
        study_name=study,
        seed=seed,
        username=username,
        source_user=source_user if isinstance(source_user, str) else None,
        generated_at=generated_at if isinstance(generated_at, str) else None,
        assignment_ids_sha256=checksum,
        annotations=ordered,
    )


def _check_unique(annotations: list[CircusAnnotation], file: str) -> None:
    """Assignment ids and presentation orders appear once each."""
    seen_ids: dict[str, int] = {}
    seen_orders: dict[int, int] = {}
    for i, ann in enumerate(annotations):
        if ann.assignment_id in seen_ids:
            raise CircusFormatError(
                file,
                f"duplicate assignment {ann.assignment_id!r} (also assignments[{seen_ids[ann.assignment_id]}])",
                entry=i,
                field="assignment_id",
            )
        if ann.presentation_order in seen_orders:
            raise CircusFormatError(
                file, f"duplicate presentation_order {ann.presentation_order}", entry=i, field="presentation_order"
            )
        seen_ids[ann.assignment_id] = i
        seen_orders[ann.presentation_order] = i


def parse_assignment_file(path: str | Path, *, verify_checksum: bool = True) -> AssignmentFile:
    """Read and validate one CIRCUS per-annotator assignment file.

    Checks: JSON object with ``username``, ``study_name`` and ``assignments``; every
    entry has ``assignment_id == "<dataset>::<query_idx>"``, an int ``query_idx`` and
    ``presentation_order``, ``hidden_category``, and an ``annotation`` object with a
    bool-or-null ``validated`` and one bool per flag; ids and presentation orders are
    unique; ``assignment_count`` (if present) matches; ``assignment_ids_sha256`` (if
    present and ``verify_checksum``) equals the SHA-256 of the ids joined with ``"\\n"``
    in presentation order. Annotations come back sorted by presentation order.
    """
    file = str(path)
    try:
        jsonstream.check_bounds(file)  # depth, 64-bit integers, NUL, lone surrogates: flat memory
        text = Path(path).read_text(encoding="utf-8")
    except ParseError as exc:
        raise CircusFormatError(file, exc.message.replace("cannot read file:", "cannot read:")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CircusFormatError(file, f"cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CircusFormatError(file, f"invalid JSON: {exc}") from None
    return parse_assignment_data(data, file=file, verify_checksum=verify_checksum)


def _keep_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any] | list[tuple[str, Any]]:
    keys = [k for k, _ in pairs]
    return dict(pairs) if len(set(keys)) == len(keys) else list(pairs)


def load_agreement_report(path: str | Path) -> dict[str, Any]:
    """Read ``agreement_report.json``; every ``pairwise_cohen_by_pair`` becomes a list of
    ``(published_key, value)`` in file order, duplicates kept (the keys are mislabelled:
    relabel them by position). Any other duplicated key is an error."""
    file = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=_keep_duplicates)
    except (OSError, json.JSONDecodeError) as exc:
        raise CircusFormatError(file, f"cannot read the report: {exc}") from None

    def fix(node: Any, where: str) -> Any:
        if isinstance(node, list):
            return [fix(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "pairwise_cohen_by_pair":
                pairs = list(value.items()) if isinstance(value, dict) else value
                out[key] = [(str(k), float(v)) for k, v in pairs]
            elif isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
                raise CircusFormatError(file, "duplicate keys", field=f"{where}.{key}".lstrip("."))
            else:
                out[key] = fix(value, f"{where}.{key}")
        return out

    if isinstance(data, list):
        raise CircusFormatError(file, "duplicate top-level keys")
    return fix(data, "")
