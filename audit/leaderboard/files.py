"""The benchmarks' prediction files, read as ranked lists (pure: no Django).

* ``cirr``: the CIRR test server's files (Cuberick-Orion/CIRR ``Test-split_server.md``, the
  inverse of :mod:`audit.predictions`): ``{"version": "rc2", "metric": "recall", "<pairid>":
  [top-50 image names], ...}``, or ``"metric": "recall_subset"`` with the top 3 of the query's
  ``img_set`` members;
* ``circo``: a CIRCO submission (miccunifi/CIRCO ``submission_examples``): ``{"<query id>":
  [50 unique COCO image ids], ...}``;
* ``fashioniq``: FashionIQ top-K lists, one JSON object a line: ``{"query": "<CIRVal query
  id, dress/val/00012>", "candidate": "<reference asin>", "ranking": [top-K asins]}``; without
  ``query``, line ``n`` of a category's file is that category's ``n``-th query (the caption
  file's order), and ``category`` names it.

:func:`read_predictions` checks the file's own shape; :func:`check_predictions` checks it
against the split it is entered for (unknown ids, ids of another split, every query
present, lists at least as long as the protocol's largest cut-off). Both raise
:class:`PredictionFileError`, naming the file, the line and the id: nothing is stored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from retrieval.records import ParseError

FORMATS: dict[str, str] = {
    "cirr": "CIRR test-server file (recall or recall_subset JSON)",
    "circo": "CIRCO submission JSON",
    "fashioniq": "FashionIQ top-K lists (JSON lines)",
}
CIRR_METRICS = ("recall", "recall_subset")
_KEY = re.compile(r'"((?:[^"\\]|\\.)*)"\s*:')


class PredictionFileError(ParseError):
    """A prediction file that cannot be entered: its line and the query id are named."""

    def __init__(self, file: str, line: int | None, query: Any, message: str):
        label = f"line {line}" + (f", query {query!r}" if query is not None else "") if line else None
        super().__init__(file, (line - 1) if line else None, None, message, record_label=label)
        self.line, self.query = line, query


@dataclass
class Predictions:
    """A file's ranked lists: query key -> image keys (strings), best first, and each key's line."""

    path: str
    fmt: str
    lists: dict[str, list[str]] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    metric: str = "recall"  # cirr: recall or recall_subset
    candidates: dict[str, str] = field(default_factory=dict)  # fashioniq: the reference each line names
    category: str = ""

    def line(self, key: str) -> int | None:
        return self.lines.get(key)


def _key_lines(text: str) -> dict[str, int]:
    """The line of each key of a JSON object's text (the first time it is written)."""
    out: dict[str, int] = {}
    for m in _KEY.finditer(text):
        out.setdefault(json.loads(f'"{m.group(1)}"'), text.count("\n", 0, m.start()) + 1)
    return out


def _load(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PredictionFileError(path, exc.lineno, None, f"not valid JSON: {exc.msg}") from None


def _ranked(value: Any, path: str, line: int | None, key: str, ints: bool) -> list[str]:
    kind = "integers" if ints else "strings or integers"
    if not isinstance(value, list):
        raise PredictionFileError(path, line, key, f"expected a list of image ids, got {type(value).__name__}")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, (int, str)) or (ints and not isinstance(item, int)):
            raise PredictionFileError(path, line, key, f"image ids must be {kind}, got {item!r}")
        out.append(str(item))
    if len(set(out)) != len(out):
        twice = next(x for x in out if out.count(x) > 1)
        raise PredictionFileError(path, line, key, f"image {twice!r} is listed twice")
    return out


def _object_file(text: str, path: str, fmt: str, ints: bool) -> Predictions:
    doc = _load(text, path)
    if not isinstance(doc, dict):
        raise PredictionFileError(path, 1, None, f"a {FORMATS[fmt]} is a JSON object, got {type(doc).__name__}")
    lines = _key_lines(text)
    out = Predictions(path, fmt, lines=lines)
    if fmt == "cirr":
        if doc.get("metric") not in CIRR_METRICS:
            raise PredictionFileError(
                path,
                lines.get("metric", 1),
                None,
                f"'metric' must be one of {', '.join(CIRR_METRICS)}, got {doc.get('metric')!r}",
            )
        out.metric = doc["metric"]
    for key, value in doc.items():
        if fmt == "cirr" and key in ("version", "metric"):
            continue
        out.lists[key] = _ranked(value, path, lines.get(key), key, ints)
    return out


def _fiq_line(n: int, raw: str, path: str, out: Predictions) -> None:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PredictionFileError(path, n, None, f"not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or "ranking" not in doc:
        raise PredictionFileError(path, n, None, "each line is an object with 'ranking' (and 'query' or 'candidate')")
    key = doc.get("query")
    if key is None:
        if not isinstance(doc.get("candidate"), str):
            raise PredictionFileError(path, n, None, "a line without 'query' needs its 'candidate'")
        key = f"#{len(out.lists)}"  # the category's n-th query, resolved by check_predictions
    key = str(key)
    if key in out.lists:
        raise PredictionFileError(path, n, key, f"query {key!r} appears twice (first on line {out.lines[key]})")
    out.lists[key] = _ranked(doc["ranking"], path, n, key, False)
    out.lines[key] = n
    if isinstance(doc.get("candidate"), str):
        out.candidates[key] = doc["candidate"]
    if isinstance(doc.get("category"), str):
        out.category = out.category or doc["category"]


def read_predictions(text: str, fmt: str, path: str = "<input>", own_ids: bool = True) -> Predictions:
    """The ranked lists of a prediction file in format ``fmt`` (:data:`FORMATS`). ``own_ids``:
    the file ranks the benchmark's own images, so CIRCO's must be COCO integers (a dataset
    without a format of its own, the demo, names its images by string ids in any format)."""
    if fmt not in FORMATS:
        raise PredictionFileError(path, None, None, f"unknown prediction format {fmt!r} (one of {', '.join(FORMATS)})")
    if fmt in ("cirr", "circo"):
        return _object_file(text, path, fmt, ints=fmt == "circo" and own_ids)
    out = Predictions(path, fmt)
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            _fiq_line(n, raw, path, out)
    return out


@dataclass
class SplitFacts:
    """What a prediction file is checked against: the split's query keys (in order), the
    other splits' keys, the gallery's image keys, each query's reference key, and the
    shortest list the protocol accepts (its largest cut-off, or the gallery size)."""

    split: str
    queries: list[str]
    other_splits: Mapping[str, str]  # query key -> its split
    images: set[str]
    references: Mapping[str, str]
    cutoff: int


def _resolve_positions(pred: Predictions, facts: SplitFacts) -> None:
    """FashionIQ lines without 'query': line n is the n-th query of the category."""
    prefix = f"{pred.category}/" if pred.category else ""
    ordered = [q for q in facts.queries if q.startswith(prefix)]
    for key in [k for k in pred.lists if k.startswith("#")]:
        n = int(key[1:])
        if n >= len(ordered):
            raise PredictionFileError(
                pred.path,
                pred.lines[key],
                None,
                f"line {n + 1} of the category has no query ({len(ordered)} in split {facts.split!r})",
            )
        pred.lists[ordered[n]] = pred.lists.pop(key)
        pred.lines[ordered[n]] = pred.lines.pop(key)
        pred.candidates[ordered[n]] = pred.candidates.pop(key)


def _check_query(pred: Predictions, key: str, facts: SplitFacts, known: set[str], cutoff: int) -> None:
    line = pred.line(key)
    if key not in known:
        if key in facts.other_splits:
            raise PredictionFileError(
                pred.path,
                line,
                key,
                f"query {key!r} belongs to split {facts.other_splits[key]!r}, "
                f"not {facts.split!r}: this file is for another split",
            )
        raise PredictionFileError(
            pred.path, line, key, f"unknown query id {key!r} (not a query of split {facts.split!r})"
        )
    ranked = pred.lists[key]
    unknown = next((i for i in ranked if i not in facts.images), None)
    if unknown is not None:
        raise PredictionFileError(pred.path, line, key, f"unknown image id {unknown!r} (not in the gallery)")
    if len(ranked) < cutoff:
        raise PredictionFileError(pred.path, line, key, f"lists {len(ranked)} images, fewer than the cut-off {cutoff}")
    candidate = pred.candidates.get(key)
    if candidate is not None and facts.references.get(key) not in (None, candidate):
        raise PredictionFileError(
            pred.path, line, key, f"candidate {candidate!r} is not the query's reference {facts.references[key]!r}"
        )


def check_predictions(pred: Predictions, facts: SplitFacts) -> Predictions:
    """Refuse a file for another split, with unknown ids, a missing query or a list shorter
    than the cut-off (``recall_subset``: 3), naming its line and id."""
    if pred.fmt == "fashioniq":
        _resolve_positions(pred, facts)
    known = set(facts.queries)
    cutoff = min(3, facts.cutoff) if pred.metric == "recall_subset" else facts.cutoff
    for key in pred.lists:
        _check_query(pred, key, facts, known, cutoff)
    return pred


def check_complete(files: list[Predictions], facts: SplitFacts) -> None:
    """Every query of the split has a list in one of an entry's files (FashionIQ: one file
    per category), and no query has two."""
    seen: dict[str, str] = {}
    for pred in (f for f in files if f.metric == "recall"):
        for key in pred.lists:
            if key in seen:
                raise PredictionFileError(
                    pred.path, pred.line(key), key, f"query {key!r} is also ranked in {seen[key]}"
                )
            seen.setdefault(key, pred.path)
    missing = [q for q in facts.queries if q not in seen]
    if not any(f.metric == "recall" for f in files):
        raise PredictionFileError(
            files[0].path if files else "<input>",
            None,
            None,
            "a CIRR recall_subset file needs the recall file beside it",
        )
    if missing:
        raise PredictionFileError(
            files[0].path if files else "<input>",
            None,
            None,
            f"{len(missing)} queries of split {facts.split!r} have no list, e.g. "
            f"{', '.join(missing[:5])}; the prediction files must rank every query",
        )


def positions(ranked: list[str], wanted: list[str]) -> list[int | None]:
    """The 1-based place of each wanted image in a ranked list (``None``: not listed)."""
    place = {image: n for n, image in enumerate(ranked, 1)}
    return [place.get(w) for w in wanted]
