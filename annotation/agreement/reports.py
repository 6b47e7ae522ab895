"""Agreement reports over a study's judgements (current revisions only).

* :func:`study_triples` gives ``(item, annotator, label)`` triples in the label conventions
  of ``manage.py agreement`` (it backs ``agreement --study ID``): validity rubric:
  ``"VALIDATED"`` or the list of true flags (``[]`` for an invalid judgement with no flag);
  other category rubrics: the category key; session rubrics: one scale's number.
* :func:`study_report` is the researcher's report: :func:`annotation.agreement.maths.agreement_report`
  over the study, a per-category table, per-dataset and per-hidden-category breakdowns,
  the consensus tally, each annotator's confusion against the consensus and the pairwise
  Cohen's kappa and full-signature agreement matrices.
* :func:`report_csv_rows` flattens a report into ``section, group, key, value`` rows.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import combinations
from typing import Any

from django.core.management.base import CommandError

from annotation.verdicts.adjudication import decide_row, is_validity_rubric, iter_item_batches, validity_label
from annotation.agreement.maths import FLAGS, VALIDATED, agreement_report, pair_key, validity_signature
from annotation.verdicts.consensus import ADJUDICATION, POLICIES, REJECTED, UNJUDGED, tally
from annotation.verdicts.consensus import VALIDATED as VALIDATED_STATUS
from annotation.models import Assignment, Judgement, Study
from annotation.judging.rubric import Rubric

NO_CATEGORY = "(none)"


class ReportError(CommandError):
    """An unknown study or an impossible request (a ``CommandError`` for the commands)."""


def get_study(study_id: Any) -> Study:
    """The study with this id (given as an int or a string of digits)."""
    try:
        pk = int(str(study_id).strip())
    except (TypeError, ValueError):
        raise ReportError(f"study id must be an integer, got {study_id!r}") from None
    study = Study.objects.select_related("rubric").filter(pk=pk).first()
    if study is None:
        raise ReportError(f"no study with id {pk}")
    return study


def label_kind(rubric: Rubric) -> str:
    """``validity`` (VALIDATED / flag lists), ``category`` (category keys) or ``scale`` (numbers)."""
    if is_validity_rubric(rubric):
        return "validity"
    if rubric.kind == "category":
        return "category"
    return "scale"


def default_dimension(rubric: Rubric) -> str:
    keys = [s.key for s in rubric.scales]
    if not keys:
        raise ReportError(f"rubric {rubric.key!r} has no scale to report on")
    return "overall" if "overall" in keys else keys[0]


def _check_dimension(rubric: Rubric, dimension: str | None) -> str | None:
    if label_kind(rubric) != "scale":
        if dimension not in (None, "", "label"):
            raise ReportError(f"rubric {rubric.key!r} has categories, not scales: drop the dimension")
        return None
    if not dimension:
        return default_dimension(rubric)
    if dimension not in {s.key for s in rubric.scales}:
        raise ReportError(f"unknown dimension {dimension!r}; rubric {rubric.key!r} has the scales "
                          f"{[s.key for s in rubric.scales]}")
    return dimension


def judgement_label(kind: str, rubric: Rubric, validated: bool | None, flags: dict | None, category: str,
                    scales: dict | None, dimension: str | None) -> Any:
    """The agreement label of one stored judgement (``None``: no label on this dimension)."""
    if kind == "validity":
        valid = rubric.valid_category
        return validity_label(validated, flags, category, valid.key if valid else VALIDATED)
    if kind == "category":
        return category or None
    value = (scales or {}).get(dimension)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reject_flag_triples(study: Study, flag: str) -> list[tuple[int, str, int]]:
    """``(item, annotator, 0/1)``: whether each current session judgement raised ``flag``."""
    rows = (
        Judgement.objects.counted().filter(assignment__study=study)
        .order_by("assignment__item_id", "assignment__annotator__username")
        .values_list("assignment__item_id", "assignment__annotator__username", "reject_flags")
    )
    return [(item, user, int(flag in (flags or []))) for item, user, flags in rows.iterator(chunk_size=5000)]


def study_triples(study_id: Any, dimension: str | None = None) -> list[tuple[int, str, Any]]:
    """``(item id, annotator username, label)`` for every current judgement of a study.

    ``dimension``: for session rubrics, the scale to report on (default ``overall``, else
    the first scale); category rubrics take none. Judgements without a label on the
    dimension are left out. Raises :class:`ReportError` (a ``CommandError``) for an
    unknown study or dimension. Triples come in item id order, then annotator name.
    """
    study = study_id if isinstance(study_id, Study) else get_study(study_id)
    rubric = study.rubric.rubric
    kind = label_kind(rubric)
    dimension = _check_dimension(rubric, dimension)
    rows = (
        Judgement.objects.counted().filter(assignment__study=study)
        .order_by("assignment__item_id", "assignment__annotator__username")
        .values_list("assignment__item_id", "assignment__annotator__username", "validated", "flags", "category",
                     "scales")
    )
    out: list[tuple[int, str, Any]] = []
    for item, user, validated, flags, category, scales in rows.iterator(chunk_size=5000):
        label = judgement_label(kind, rubric, validated, flags, category, scales, dimension)
        if label is not None:
            out.append((item, user, label))
    return out


def annotator_pseudonyms(study: Study) -> dict[str, str]:
    """username -> ``annotator_01``, ``annotator_02``, … in username order, over the study's
    annotators and everyone who holds an assignment in it. Stable while nobody joins."""
    names = set(study.annotators.values_list("username", flat=True))
    names |= set(Assignment.objects.filter(study=study).order_by().values_list("annotator__username", flat=True)
                 .distinct())  # order_by(): the default ordering would make every row distinct
    ordered = sorted(names)
    width = max(2, len(str(len(ordered))))
    return {name: f"annotator_{i:0{width}d}" for i, name in enumerate(ordered, start=1)}


# --------------------------------------------------------------------------- the report


def _signature(kind: str, label: Any) -> str:
    if kind == "validity":
        return validity_signature(label) or ""
    return str(label)


def _summary(report: dict[str, Any], kind: str) -> dict[str, Any]:
    """The headline figures of an agreement report (for breakdown rows)."""
    out = {
        "n_items": report["n_items"],
        "n_judgements": report["n_judgements"],
        "n_annotators": report["n_annotators"],
        "percent_agreement": report["percent_agreement"],
        "krippendorff_alpha": report["krippendorff_alpha"],
        "fleiss_kappa": report["fleiss_kappa"],
        "pairwise_cohen_mean": report["pairwise_cohen"]["mean"],
    }
    if kind == "validity":
        b = report["binary_valid_invalid"]
        out.update(valid_rate=b["valid_rate"], binary_alpha=b["krippendorff_alpha_nominal"],
                   binary_fleiss=b["fleiss_kappa"], binary_cohen_mean=b["pairwise_cohen"]["mean"],
                   signature_alpha=report["signature_alpha_nominal"])
    return out


def _matrix(annotators: list[str], value) -> list[list[Any]]:
    return [[None if a == b else value(a, b) for b in annotators] for a in annotators]


def _one_vs_rest(triples: list[tuple[int, str, Any]], category: str, raters: list[str]) -> dict[str, Any]:
    binary = [(i, a, 1 if lab == category else 0) for i, a, lab in triples]
    r = agreement_report(binary, raters=raters or None, categories=(0, 1), n_boot=0)
    return {"krippendorff_alpha": r["krippendorff_alpha"], "fleiss_kappa": r["fleiss_kappa"],
            "gwet_ac1": r["gwet_ac1"], "pairwise_cohen_mean": r["pairwise_cohen"]["mean"]}


def study_report(
    study: Study,
    *,
    policy: str = "majority",
    primary: str | None = None,
    pseudonymise: bool = False,
    dimension: str | None = None,
    n_boot: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """The researcher's report of a study as a JSON-ready dict (see the module docstring).

    ``pseudonymise`` replaces usernames by ``annotator_NN`` (:func:`annotator_pseudonyms`)
    everywhere, for readers who are not staff. ``policy`` / ``primary``: the consensus
    (category rubrics; adjudications override it). ``n_boot``: bootstrap replicates of the
    overall agreement report (breakdowns never bootstrap).
    """
    if policy not in POLICIES:
        raise ReportError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    rubric = study.rubric.rubric
    kind = label_kind(rubric)
    dimension = _check_dimension(rubric, dimension)
    names = annotator_pseudonyms(study) if pseudonymise else {}

    def show(user: str) -> str:
        return names.get(user, user)

    with_consensus = kind != "scale" and rubric.valid_category is not None
    triples: list[tuple[int, str, Any]] = []
    rows: dict[int, tuple[str, str]] = {}  # item -> (dataset, hidden category)
    decisions = {}
    top_category: dict[str, int] = defaultdict(int)
    n_judgements = 0
    for batch in iter_item_batches(study):
        for row in batch:
            rows[row.item_id] = (row.dataset, row.hidden_category or NO_CATEGORY)
            for v in row.votes:
                label = judgement_label(kind, rubric, v.validated, v.flags, v.category, v.scales, dimension)
                if label is None:
                    continue
                n_judgements += 1
                triples.append((row.item_id, show(v.annotator), label))
                if kind != "scale":
                    top_category[v.category or NO_CATEGORY] += 1
            if with_consensus:
                decisions[row.item_id] = decide_row(row, policy, primary)

    annotators = sorted({a for _, a, _ in triples})
    validity = "validity" if kind == "validity" else None
    level = "ordinal" if kind == "scale" else "nominal"
    # 1-5 scales: ordinal alpha and quadratic-weighted pairwise kappa
    weights = "quadratic" if kind == "scale" else "auto"
    overall = agreement_report(triples, rubric=validity, level=level, raters=annotators or None,
                               kappa_weights=weights, n_boot=n_boot, seed=seed)

    report: dict[str, Any] = {
        "study": {"id": study.pk, "name": study.name, "rubric": {"key": study.rubric.key,
                                                                   "version": study.rubric.version},
                  "kind": kind, "dimension": dimension, "overlap": study.overlap, "items": len(rows),
                  "judgements": n_judgements, "annotators": annotators, "pseudonymised": pseudonymise},
        "agreement": overall,
    }

    # ---- per category
    categories: list[dict[str, Any]] = []
    if kind == "validity":
        b = overall["binary_valid_invalid"]
        valid_key = rubric.valid_category.key  # type: ignore[union-attr]
        categories.append({
            "category": valid_key, "chosen_share": top_category.get(valid_key, 0) / n_judgements if n_judgements else None,
            "prevalence": b["valid_rate"], "krippendorff_alpha": b["krippendorff_alpha_nominal"],
            "fleiss_kappa": b["fleiss_kappa"], "gwet_ac1": b["gwet_ac1"],
            "pairwise_cohen_mean": b["pairwise_cohen"]["mean"],
        })
        for flag in FLAGS:
            f = overall["per_flag_agreement"][flag]
            categories.append({
                "category": flag, "chosen_share": top_category.get(flag, 0) / n_judgements if n_judgements else None,
                "prevalence": f["positive_rate"], "krippendorff_alpha": f["krippendorff_alpha_nominal"],
                "fleiss_kappa": f["fleiss_kappa"], "gwet_ac1": f["gwet_ac1"],
                "pairwise_cohen_mean": f["pairwise_cohen"]["mean"],
            })
    elif kind == "category":
        prevalence = overall["label_prevalence"]
        for c in rubric.by_severity():
            categories.append({"category": c.key,
                               "chosen_share": top_category.get(c.key, 0) / n_judgements if n_judgements else None,
                               "prevalence": prevalence.get(c.key, 0.0),
                               **_one_vs_rest(triples, c.key, annotators)})
    else:
        for s in rubric.scales:
            scale_triples = study_triples(study, s.key)
            if pseudonymise:
                scale_triples = [(i, show(a), v) for i, a, v in scale_triples]
            r = agreement_report(scale_triples, level="ordinal", kappa_weights="quadratic", n_boot=0,
                                 categories=list(range(s.min, s.max + 1)))
            values = [v for _, _, v in scale_triples]
            categories.append({"category": s.key, "kind": "scale (ordinal alpha, quadratic kappa)", "n": len(values),
                               "mean": sum(values) / len(values) if values else None,
                               "krippendorff_alpha": r["krippendorff_alpha"], "fleiss_kappa": r["fleiss_kappa"],
                               "gwet_ac1": r["gwet_ac1"], "pairwise_cohen_mean": r["pairwise_cohen"]["mean"]})
        for flag in rubric.reject_flags:
            flag_triples = [(i, show(a), v) for i, a, v in reject_flag_triples(study, flag.key)]
            r = agreement_report(flag_triples, level="nominal", n_boot=0, categories=[0, 1])
            values = [v for _, _, v in flag_triples]
            categories.append({"category": f"reject:{flag.key}", "kind": "reject flag (nominal)", "n": len(values),
                               "mean": sum(values) / len(values) if values else None,
                               "krippendorff_alpha": r["krippendorff_alpha"], "fleiss_kappa": r["fleiss_kappa"],
                               "gwet_ac1": r["gwet_ac1"], "pairwise_cohen_mean": r["pairwise_cohen"]["mean"]})
    report["categories"] = categories

    # ---- breakdowns
    def breakdown(index: int) -> dict[str, Any]:
        groups: dict[str, list[tuple[int, str, Any]]] = defaultdict(list)
        items_in: dict[str, int] = defaultdict(int)
        for item, meta in rows.items():
            items_in[meta[index]] += 1
        for t in triples:
            groups[rows[t[0]][index]].append(t)
        out = {}
        for group in sorted(items_in):
            sub = groups.get(group, [])
            raters = sorted({a for _, a, _ in sub})
            entry = _summary(agreement_report(sub, rubric=validity, level=level, raters=raters or None, n_boot=0), kind)
            entry["items"] = items_in[group]
            if decisions:
                entry["consensus"] = tally(d for i, d in decisions.items() if rows[i][index] == group)["status"]
            out[group] = entry
        return out

    report["by_dataset"] = breakdown(0)
    report["by_hidden_category"] = breakdown(1)

    # ---- consensus and confusion against it
    if decisions:
        report["consensus"] = {"policy": policy, "primary": show(primary) if primary else None,
                               **tally(decisions.values())}
        columns = [VALIDATED_STATUS, REJECTED, ADJUDICATION]
        valid_label = VALIDATED if kind == "validity" else rubric.valid_category.key  # type: ignore[union-attr]
        confusion: dict[str, Any] = {}
        vote_rows = ["VALIDATED", "INVALID"]
        per: dict[str, list[list[int]]] = {a: [[0] * len(columns) for _ in vote_rows] for a in annotators}
        for item, annotator, label in triples:
            d = decisions[item]
            if d.status == UNJUDGED:
                continue
            r = 0 if label == valid_label else 1
            per[annotator][r][columns.index(d.status)] += 1
        for a in annotators:
            m = per[a]
            decided = m[0][0] + m[0][1] + m[1][0] + m[1][1]
            confusion[a] = {"matrix": m, "n": decided + m[0][2] + m[1][2],
                            "agreement_with_consensus": (m[0][0] + m[1][1]) / decided if decided else None}
        report["confusion"] = {"rows": vote_rows, "columns": columns, "by_annotator": confusion}
    else:
        report["consensus"] = None
        report["confusion"] = None

    # ---- pairwise matrices
    if kind == "validity":
        by_pair = overall["binary_valid_invalid"]["pairwise_cohen_by_pair"]
        kappa_of = "binary valid / invalid"
    else:
        by_pair = overall["pairwise_cohen"]["by_pair"]
        kappa_of = "labels" if kind == "category" else f"{dimension} ({overall['pairwise_cohen']['weights']} weights)"

    def lookup(table: dict[str, Any], a: str, b: str) -> Any:
        return table.get(pair_key(a, b), table.get(pair_key(b, a)))

    agree: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    by_item: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for item, annotator, label in triples:
        by_item[item].append((annotator, _signature(kind, label)))
    for votes in by_item.values():
        for (a, sa), (b, sb) in combinations(sorted(votes), 2):
            cell = agree[(a, b)]
            cell[0] += 1
            cell[1] += sa == sb

    def signature_agreement(a: str, b: str) -> float | None:
        n, same = agree.get((min(a, b), max(a, b)), (0, 0))
        return same / n if n else None

    def shared(a: str, b: str) -> int:
        return agree.get((min(a, b), max(a, b)), (0, 0))[0]

    report["pairwise"] = {
        "annotators": annotators,
        "kappa_of": kappa_of,
        "cohen_kappa": _matrix(annotators, lambda a, b: lookup(by_pair, a, b)),
        "signature_agreement": _matrix(annotators, signature_agreement),
        "shared_items": _matrix(annotators, shared),
    }
    return report


# --------------------------------------------------------------------------- CSV


def report_csv_rows(report: dict[str, Any]) -> Iterator[list[Any]]:
    """``section, group, key, value`` rows of a :func:`study_report` (header first)."""
    yield ["section", "group", "key", "value"]
    s = report["study"]
    for key in ("id", "name", "kind", "dimension", "overlap", "items", "judgements"):
        yield ["study", "", key, s[key]]
    yield ["study", "", "rubric", f"{s['rubric']['key']} v{s['rubric']['version']}"]
    a = report["agreement"]
    for key in ("n_items", "n_annotators", "n_judgements", "n_items_excluded", "percent_agreement",
                "all_ratings_identical_rate", "krippendorff_alpha", "fleiss_kappa", "gwet_ac1"):
        yield ["agreement", "", key, a[key]]
    for key in ("count", "mean", "median", "min", "max"):
        yield ["agreement", "pairwise_cohen", key, a["pairwise_cohen"][key]]
    for label, share in a["label_prevalence"].items():
        yield ["agreement", "label_prevalence", label, share]
    if "binary_valid_invalid" in a:
        b = a["binary_valid_invalid"]
        for key in ("valid_rate", "exact_agreement_rate", "unanimous_valid_invalid_rate",
                    "exact_invalid_signature_rate", "percent_agreement", "krippendorff_alpha_nominal",
                    "fleiss_kappa", "gwet_ac1"):
            yield ["agreement", "binary_valid_invalid", key, b[key]]
        yield ["agreement", "", "signature_alpha_nominal", a["signature_alpha_nominal"]]
    for row in report["categories"]:
        for key, value in row.items():
            if key != "category":
                yield ["category", row["category"], key, value]
    for section in ("by_dataset", "by_hidden_category"):
        for group, entry in report[section].items():
            for key, value in entry.items():
                if key == "consensus":
                    for status, n in value.items():
                        yield [section, group, f"consensus_{status}", n]
                else:
                    yield [section, group, key, value]
    if report["consensus"]:
        c = report["consensus"]
        yield ["consensus", "", "policy", c["policy"]]
        for block in ("status", "provenance", "adjudication_reasons"):
            for key, n in c[block].items():
                yield ["consensus", block, key, n]
    if report["confusion"]:
        conf = report["confusion"]
        for annotator, entry in conf["by_annotator"].items():
            for r, row in zip(conf["rows"], entry["matrix"]):
                for col, n in zip(conf["columns"], row):
                    yield ["confusion", annotator, f"{r}->{col}", n]
            yield ["confusion", annotator, "agreement_with_consensus", entry["agreement_with_consensus"]]
    p = report["pairwise"]
    for name in ("cohen_kappa", "signature_agreement", "shared_items"):
        for i, a_name in enumerate(p["annotators"]):
            for j, b_name in enumerate(p["annotators"]):
                if i != j:
                    yield [f"pairwise_{name}", a_name, b_name, p[name][i][j]]


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A CSV-safe cell: text starting with ``= + - @`` (or a tab / carriage return) gets a
    leading apostrophe so spreadsheets show it as text instead of running a formula.
    Numbers stay numbers (``-0.25`` is data, not a formula); ``None`` is an empty cell."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def safe_rows(rows: Iterable[list[Any]]) -> Iterator[list[Any]]:
    for row in rows:
        yield [csv_cell(v) for v in row]
