"""Accepted alternatives in the validated export: ``pos_cand_list`` = the labelled positives
then the accepted alternatives; the trace names each positive ``labelled`` or
``alternative`` (with its votes, who ticked it and the rule); ``--format circo`` writes the
CIRCO annotation layout with ``gt_img_ids`` (the labelled target first).

The CIRCO layout is the one CIRCO's own ``src/evaluation.py`` reads as ``annotations/val.json``
(miccunifi/CIRCO): it looks a query up by its ``id`` *as a position in the list* and asserts
that a predictions file's keys are exactly ``0 .. n-1``. So each subset's array numbers its
queries ``0 .. n-1`` in ``id`` (the original CIRCO query id is in the trace line at the same
position, ``query_external_id``, beside ``circo_id``), ids of COCO images are integers, and
``semantic_aspects`` is kept (CIRCO records carry it; other formats get ``[]``), so that the
per-aspect semantic mAP@10 is computed, not NaN."""

from __future__ import annotations

from typing import Any

from annotation.alternatives.study import study_alternatives
from annotation.core.export_fields import CIRCO_KEYS
from annotation.models import Study
from annotation.verdicts.readmodel import ItemRow
from retrieval.models import Image

FORMATS: tuple[str, ...] = ("mbeir", "circo")


def _circo_id(value: Any) -> Any:
    """CIRCO's ids are COCO integers; other datasets keep their string ids."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


class ExtraTargets:
    """The accepted alternatives of one batch of exported items."""

    def __init__(self, study: Study, rows: list[tuple[ItemRow, Any]], names: dict[str, str]):
        """``rows``: the batch's exported (item row, decision) pairs."""
        self.names = names
        item_ids = [row.item_id for row, _ in rows]
        self.decided = {i: [a for a in alts if a.accepted] for i, alts in study_alternatives(study, item_ids).items()}
        ids = {a.image for alts in self.decided.values() for a in alts}
        self.external = dict(Image.objects.filter(pk__in=ids).values_list("pk", "external_id"))

    def apply(self, row: ItemRow, line: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The query line with its alternatives appended to ``pos_cand_list``, and the trace's positives."""
        labelled = list(line.get("pos_cand_list") or [])
        positives: list[dict[str, Any]] = [{"image": x, "source": "labelled"} for x in labelled]
        for alt in self.decided.get(row.item_id, []):
            ext = self.external.get(alt.image)
            if ext is None or ext in labelled:
                continue
            prov = alt.provenance()
            prov["ticked_by"] = [self.names.get(a, a) for a in alt.ticked_by]
            positives.append({"image": ext, "source": "alternative", **prov})
        return {**line, "pos_cand_list": [p["image"] for p in positives]}, positives

    @staticmethod
    def circo_entry(line: dict[str, Any], reference: str | None, raw: Any, position: int) -> dict[str, Any]:
        """One CIRCO annotation, ``id`` = its ``position`` in the subset's array (module docstring);
        ``gt_img_ids`` = the labelled target first, then the alternatives."""
        gts = [_circo_id(x) for x in line["pos_cand_list"]]
        raw = raw if isinstance(raw, dict) else {}
        aspects = raw.get("semantic_aspects")
        return {
            "reference_img_id": _circo_id(reference),
            "target_img_id": gts[0] if gts else None,
            "relative_caption": line.get("query_txt") or "",
            "shared_concept": raw.get("shared_concept", ""),
            "gt_img_ids": gts,
            "id": position,
            "semantic_aspects": [a for a in aspects if isinstance(a, str)] if isinstance(aspects, list) else [],
        }


class QueryLayout:
    """How query lines are written: M-BEIR JSONL, one line per query as it comes, or CIRCO's
    layout, one JSON array per subset written at the end (as CIRCO ships its annotations)."""

    def __init__(self, fmt: str = "mbeir"):
        if fmt not in FORMATS:
            raise ValueError(f"unknown export format {fmt!r}; expected one of {FORMATS}")
        self.fmt = fmt
        self.suffix = ".circo.json" if fmt == "circo" else ".jsonl"
        self.entries: dict[Any, list[dict[str, Any]]] = {}

    def keys(self, mbeir_keys: tuple[str, ...]) -> list[str]:
        return list(CIRCO_KEYS if self.fmt == "circo" else mbeir_keys)

    def write(self, out, key: Any, line: dict[str, Any], query: tuple, reference: str | None) -> dict[str, Any]:
        """Write (or keep, for CIRCO) one query line; returns what the trace line adds
        (CIRCO: ``circo_id``, the query's ``id`` in the array). ``query``: (raw record,
        dataset format, external id, split)."""
        if self.fmt != "circo":
            out.write_json(line)
            return {}
        raw = query[0]
        entries = self.entries.setdefault(key, [])
        entries.append(ExtraTargets.circo_entry(line, reference, raw, len(entries)))
        return {"circo_id": len(entries) - 1}

    def finish(self, writers: dict[Any, Any]) -> None:
        """Write each subset's array into its writer's ``queries`` file."""
        for key, entries in self.entries.items():
            writers[key].queries.write_json(entries)
            writers[key].queries.lines = len(entries)
