"""Agreement reports over a study's judgements (current revisions only).

* :func:`compute_agreement` is THE agreement of a study's judgements: the page, report.json,
  report.csv and ``manage.py agreement --study`` (:func:`study_agreement`) all go through it,
  with an :class:`AgreementSpec` taken from the rubric (every category or scale value; scales
  ordinal with quadratic kappa weights) and the constant-pair convention (``undefined`` or
  ``one``), so they give identical numbers.
* :func:`study_triples` gives ``(item, annotator, label)`` triples in the label conventions
  of ``manage.py agreement``: validity rubric:
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
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from typing import Any

from django.core.management.base import CommandError
from django.db.models import Max

from annotation.agreement.maths import (
    CONSTANT_PAIRS,
    FLAGS,
    VALIDATED,
    agreement_report,
    default_kappa_weights,
    pair_key,
    validity_signature,
)
from annotation.core.consensus import ADJUDICATION, PENDING, POLICIES, REJECTED, Decision, tally
from annotation.core.consensus import VALIDATED as VALIDATED_STATUS
from annotation.core.rubric import Rubric
from annotation.core.turns import session_valid, turn_answers
from annotation.models import Assignment, Study, StudyItem
from annotation.verdicts.readmodel import (
    Verdicts,
    counted_judgements,
    is_validity_rubric,
    item_states,
    late_per_annotator,
    study_pass,
    validity_label,
)

NO_CATEGORY = "(none)"

#: Session rubrics with a turn verdict (v2 on): the dimensions of their turn-by-turn agreement,
#: ``verdict`` (each annotator's own session verdict, :func:`annotation.core.turns.session_valid`)
#: and ``turn:N`` (the verdict on turn N, 1-based), labels 1 (valid) / 0 (invalid).
VERDICT_DIMENSION = "verdict"
TURN_PREFIX = "turn:"


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


def turn_position(dimension: str | None) -> int | None:
    """N of a ``turn:N`` dimension (N >= 1), else ``None``."""
    if not dimension or not dimension.startswith(TURN_PREFIX):
        return None
    number = dimension[len(TURN_PREFIX) :]
    return int(number) if number.isdigit() and int(number) >= 1 else None


def is_turn_dimension(dimension: str | None) -> bool:
    return dimension == VERDICT_DIMENSION or turn_position(dimension) is not None


def turn_label(key: str, per_turn: Any, reject_flags: Any, dimension: str) -> int | None:
    """The 1 / 0 label of one judgement on a turn dimension (``None``: no answer there, e.g. a
    judgement made under a rubric without turn verdicts or a session shorter than turn N)."""
    answers = turn_answers(per_turn, key)
    if answers is None:
        return None
    if dimension == VERDICT_DIMENSION:
        return int(session_valid(answers, bool(reject_flags)))
    n = turn_position(dimension)
    return int(answers[n - 1]) if n is not None and n <= len(answers) else None


def check_dimension(rubric: Rubric, dimension: str | None) -> str | None:
    if is_turn_dimension(dimension):
        if rubric.turn_verdict is None:
            raise ReportError(
                f"rubric {rubric.key!r} v{rubric.version} gives no turn verdict: no dimension {dimension!r}"
            )
        return dimension
    if label_kind(rubric) != "scale":
        if dimension not in (None, "", "label"):
            raise ReportError(f"rubric {rubric.key!r} has categories, not scales: drop the dimension")
        return None
    if not dimension:
        return default_dimension(rubric)
    if dimension not in {s.key for s in rubric.scales}:
        turns = f", {VERDICT_DIMENSION!r} and {TURN_PREFIX}N (turn N)" if rubric.turn_verdict is not None else ""
        raise ReportError(
            f"unknown dimension {dimension!r}; rubric {rubric.key!r} has the scales "
            f"{[s.key for s in rubric.scales]}{turns}"
        )
    return dimension


def judgement_label(
    kind: str,
    rubric: Rubric,
    validated: bool | None,
    flags: dict | None,
    category: str,
    scales: dict | None,
    dimension: str | None,
) -> Any:
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
        counted_judgements(study)
        .order_by("assignment__item_id", "assignment__annotator__username")
        .values_list("assignment__item_id", "assignment__annotator__username", "reject_flags")
    )
    return [(item, user, int(flag in (flags or []))) for item, user, flags in rows.iterator(chunk_size=5000)]


def study_triples(study_id: Any, dimension: str | None = None) -> list[tuple[int, str, Any]]:
    """``(item id, annotator username, label)`` for every current judgement of a study.

    ``dimension``: for session rubrics, the scale to report on (default ``overall``, else
    the first scale), or with a turn verdict ``verdict`` / ``turn:N`` (1 valid, 0 invalid);
    category rubrics take none. Judgements without a label on the
    dimension are left out. Raises :class:`ReportError` (a ``CommandError``) for an
    unknown study or dimension. Triples come in item id order, then annotator name.
    """
    study = study_id if isinstance(study_id, Study) else get_study(study_id)
    rubric = study.rubric.rubric
    kind = label_kind(rubric)
    dimension = check_dimension(rubric, dimension)
    rows = (
        counted_judgements(study)
        .order_by("assignment__item_id", "assignment__annotator__username")
        .values_list(
            "assignment__item_id",
            "assignment__annotator__username",
            "validated",
            "flags",
            "category",
            "scales",
            "per_turn",
            "reject_flags",
        )
    )
    out: list[tuple[int, str, Any]] = []
    turns = is_turn_dimension(dimension)
    for item, user, validated, flags, category, scales, per_turn, rejects in rows.iterator(chunk_size=5000):
        label = (
            turn_label(rubric.turn_verdict.key, per_turn, rejects, dimension)
            if turns  # type: ignore[union-attr, arg-type]
            else judgement_label(kind, rubric, validated, flags, category, scales, dimension)
        )
        if label is not None:
            out.append((item, user, label))
    return out


def annotator_pseudonyms(study: Study) -> dict[str, str]:
    """username -> ``annotator_01``, ``annotator_02``, … in username order, over the study's
    annotators and everyone who holds an assignment in it. Stable while nobody joins."""
    names = set(study.annotators.values_list("username", flat=True))
    names |= set(
        Assignment.objects.filter(study=study).order_by().values_list("annotator__username", flat=True).distinct()
    )  # order_by(): the default ordering would make every row distinct
    ordered = sorted(names)
    width = max(2, len(str(len(ordered))))
    return {name: f"annotator_{i:0{width}d}" for i, name in enumerate(ordered, start=1)}


# --------------------------------------------------------------------------- the agreement engine

DEFAULT_BOOTSTRAP = 1000
_BOOTSTRAP_ITEM_BUDGET = 200_000  # replicates x items resampled by a default report


def default_bootstrap(study: Study) -> int:
    """Replicates of a study report's bootstrap when none is asked for: 1000, fewer (never
    under 100) for very large studies so the page stays responsive. The page, report.json,
    report.csv and ``agreement --study`` use the same default, hence the same intervals."""
    n_items = study.n_items
    return (
        DEFAULT_BOOTSTRAP
        if n_items * DEFAULT_BOOTSTRAP <= _BOOTSTRAP_ITEM_BUDGET
        else max(100, _BOOTSTRAP_ITEM_BUDGET // n_items)
    )


@dataclass(frozen=True)
class AgreementSpec:
    """How one kind of label is scored: the categories come from the rubric (every scale value,
    every category; validity: signatures, Gwet's Q = all 17), never only the observed ones."""

    rubric: str | None  # "validity" or None
    level: str
    categories: tuple[Any, ...] | None
    weights: str | None  # Cohen's kappa weights: None (unweighted), "linear" or "quadratic"

    def describe(self) -> str:
        weights = f"{self.weights} weights" if self.weights else "unweighted"
        scale = (
            f", categories {', '.join(map(str, self.categories))}"
            if self.categories is not None
            else ", categories: the validity signatures (Gwet's Q = 17)"
            if self.rubric
            else ""
        )
        return f"{self.level} level, Cohen's kappa {weights}{scale}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "kappa_weights": self.weights or "none",
            "categories": list(self.categories) if self.categories is not None else None,
            "statement": self.describe(),
        }


FLAG_SPEC = AgreementSpec(None, "nominal", (0, 1), None)
TURN_SPEC = FLAG_SPEC  # turn verdicts and derived session verdicts: 1 valid / 0 invalid, nominal


def agreement_spec(rubric: Rubric, dimension: str | None = None) -> AgreementSpec:
    """The spec of a rubric's labels (``dimension``: the scale of a session rubric).
    Scales are ordinal with quadratic weights over their whole range."""
    kind = label_kind(rubric)
    if is_turn_dimension(dimension):
        check_dimension(rubric, dimension)
        return TURN_SPEC
    if kind == "validity":
        return AgreementSpec("validity", "nominal", None, None)
    if kind == "category":
        return AgreementSpec(None, "nominal", tuple(c.key for c in rubric.categories), None)
    dimension = check_dimension(rubric, dimension)
    scale = next(s for s in rubric.scales if s.key == dimension)
    return AgreementSpec(None, "ordinal", tuple(range(scale.min, scale.max + 1)), default_kappa_weights("ordinal"))


def compute_agreement(
    triples: list[tuple[Any, Any, Any]],
    spec: AgreementSpec,
    *,
    raters: list[str] | None = None,
    n_boot: int = 0,
    seed: int = 0,
    constant_pairs: str = "undefined",
) -> dict[str, Any]:
    """THE agreement of a set of study judgements: every report, page, download and
    ``manage.py agreement --study`` goes through here, so they give identical numbers."""
    report = agreement_report(
        triples,
        rubric=spec.rubric,
        level=spec.level,
        raters=raters or None,  # type: ignore[arg-type]
        categories=spec.categories,
        kappa_weights=spec.weights,  # type: ignore[arg-type]
        n_boot=n_boot,
        seed=seed,
        constant_pairs=constant_pairs,
    )  # type: ignore[arg-type]
    report["spec"] = spec.to_dict()
    return report


def study_agreement(
    study: Study | Any,
    *,
    dimension: str | None = None,
    n_boot: int = 0,
    seed: int = 0,
    constant_pairs: str = "undefined",
    pseudonymise: bool = False,
) -> dict[str, Any]:
    """The agreement block of :func:`study_report` on its own (``manage.py agreement --study``)."""
    study = study if isinstance(study, Study) else get_study(study)
    spec = agreement_spec(study.rubric.rubric, dimension)
    triples = study_triples(study, dimension)
    if pseudonymise:
        names = annotator_pseudonyms(study)
        triples = [(i, names.get(a, a), v) for i, a, v in triples]
    return compute_agreement(
        triples,
        spec,
        raters=sorted({a for _, a, _ in triples}),
        n_boot=n_boot,
        seed=seed,
        constant_pairs=constant_pairs,
    )


def study_turn_agreement(
    study: Study | Any, *, n_boot: int = 0, seed: int = 0, constant_pairs: str = "undefined", pseudonymise: bool = False
) -> dict[str, Any]:
    """Agreement turn by turn (``manage.py agreement --study ID --turns``): :func:`study_agreement`
    on the derived session verdict and on every turn position up to the study's longest session."""
    study = study if isinstance(study, Study) else get_study(study)
    if study.rubric.rubric.turn_verdict is None:
        raise ReportError(
            f"study {study.pk} uses rubric {study.rubric.key!r} v{study.rubric.version}, which gives no turn verdict"
        )
    longest = StudyItem.objects.filter(study=study).aggregate(n=Max("query__n_turns"))["n"] or 0
    options = {"n_boot": n_boot, "seed": seed, "constant_pairs": constant_pairs, "pseudonymise": pseudonymise}
    return {
        "study": study.pk,
        "spec": TURN_SPEC.to_dict(),
        "session": study_agreement(study, dimension=VERDICT_DIMENSION, **options),
        "positions": [
            {"turn": n, **study_agreement(study, dimension=f"{TURN_PREFIX}{n}", **options)}
            for n in range(1, longest + 1)
        ],
    }


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
        "gwet_ac1": report["gwet_ac1"],
        "pairwise_cohen_mean": report["pairwise_cohen"]["mean"],
        "kappa_pairs": _pairs_covered(report["pairwise_cohen"]),
        "kappa_weights": report["pairwise_cohen"]["weights"],
    }
    if kind == "validity":
        b = report["binary_valid_invalid"]
        out.update(
            valid_rate=b["valid_rate"],
            binary_alpha=b["krippendorff_alpha_nominal"],
            binary_fleiss=b["fleiss_kappa"],
            binary_cohen_mean=b["pairwise_cohen"]["mean"],
            signature_alpha=report["signature_alpha_nominal"],
        )
    return out


def _matrix(annotators: list[str], value) -> list[list[Any]]:
    return [[None if a == b else value(a, b) for b in annotators] for a in annotators]


@dataclass
class _Gathered:
    """One pass over a study's items: agreement triples, item groups, decisions, choices."""

    triples: list[tuple[int, str, Any]] = field(default_factory=list)
    rows: dict[int, tuple[str, str]] = field(default_factory=dict)  # item -> (dataset, hidden category)
    decisions: dict[int, Decision] = field(default_factory=dict)
    top_category: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    n_judgements: int = 0
    turn_triples: dict[str, list[tuple[int, str, int]]] = field(default_factory=lambda: defaultdict(list))
    n_turns: int = 0  # the longest session's turns (turn verdict rubrics)

    states: dict[str, int] | None = None  # the read model's item states (studies with decisions)

    @cached_property
    def annotators(self) -> list[str]:
        """The annotators of the triples (read once the triples are gathered)."""
        return sorted({a for _, a, _ in self.triples})

    @cached_property
    def tally(self) -> dict[str, Any]:
        """The consensus tally of every decision (read once the decisions are made)."""
        return tally(self.decisions.values())

    def share(self, key: str) -> float | None:
        return self.top_category.get(key, 0) / self.n_judgements if self.n_judgements else None


@dataclass(frozen=True)
class _Context:
    study: Study
    rubric: Rubric
    kind: str
    dimension: str | None
    spec: AgreementSpec
    verdicts: Verdicts
    names: dict[str, str]
    constant_pairs: str

    def show(self, user: str) -> str:
        return self.names.get(user, user)

    def agreement(
        self, triples: list[tuple[Any, Any, Any]], spec: AgreementSpec | None = None, *, n_boot: int = 0, seed: int = 0
    ) -> dict[str, Any]:
        raters = sorted({a for _, a, _ in triples})
        return compute_agreement(
            triples, spec or self.spec, raters=raters, n_boot=n_boot, seed=seed, constant_pairs=self.constant_pairs
        )


def _gather(ctx: _Context) -> _Gathered:
    """The report's one pass: the read model's (:func:`~annotation.verdicts.readmodel.study_pass`:
    rows and decisions under the report's rule), turned into triples and groups. What each item
    gives is kept with the study's rows (per report options), so after a judgement only the
    items whose rows changed are read again."""
    state = study_pass(ctx.study, ctx.verdicts)
    kept = state.derived_for(
        (
            "report",
            ctx.kind,
            ctx.dimension,
            ctx.study.rubric_id,
            tuple(sorted(ctx.names.items())),
            ctx.verdicts.turn_key,
        )
    )
    g = _Gathered(decisions=state.decisions, states=state.states)
    for row in state.rows:
        g.rows[row.item_id] = (row.dataset, row.hidden_category or NO_CATEGORY)
        found = kept.get(row.item_id) if kept is not None else None
        if found is None:
            found = _item_triples(ctx, row)
            if kept is not None:
                kept[row.item_id] = found
        triples, categories, turns, n_turns = found
        g.triples.extend(triples)
        g.n_judgements += len(triples)
        for category in categories:
            g.top_category[category] += 1
        for dim, dim_triples in turns:
            g.turn_triples[dim].extend(dim_triples)
        g.n_turns = max(g.n_turns, n_turns)
    return g


def _item_triples(ctx: _Context, row) -> tuple[list, list[str], list[tuple[str, list]], int]:
    """One item's part of the report: its triples, the categories its judgements chose, its
    turn-dimension triples and its number of turns."""
    triples, categories = [], []
    for v in row.votes:
        label = judgement_label(ctx.kind, ctx.rubric, v.validated, v.flags, v.category, v.scales, ctx.dimension)
        if label is None:
            continue
        triples.append((row.item_id, ctx.show(v.annotator), label))
        if ctx.kind != "scale":
            categories.append(v.category or NO_CATEGORY)
    if ctx.verdicts.turn_key is None:
        return triples, categories, [], 0
    g = _Gathered()
    _gather_turns(ctx, g, row)
    return triples, categories, list(g.turn_triples.items()), g.n_turns


def _gather_turns(ctx: _Context, g: _Gathered, row) -> None:
    """The turn-dimension triples of one session (:func:`turn_label`, as :func:`study_triples`)."""
    key = ctx.verdicts.turn_key
    for v in row.votes:
        answers = turn_answers(v.per_turn, key)  # type: ignore[arg-type]
        if answers is None:
            continue
        g.n_turns = max(g.n_turns, len(answers))
        for dim in (VERDICT_DIMENSION, *(f"{TURN_PREFIX}{n}" for n in range(1, len(answers) + 1))):
            label = turn_label(key, v.per_turn, v.reject_flags, dim)  # type: ignore[arg-type]
            g.turn_triples[dim].append((row.item_id, ctx.show(v.annotator), label))  # type: ignore[arg-type]


def _turn_row(
    ctx: _Context, dimension: str, triples: list[tuple[int, str, int]], decisions: list[Decision]
) -> dict[str, Any]:
    """One row of the turn-by-turn table: agreement on ``dimension`` through the one engine
    (no bootstrap, as every breakdown) and the consensus of that turn (or session)."""
    r = ctx.agreement(triples, TURN_SPEC)
    return {
        "dimension": dimension,
        "n_items": r["n_items"],
        "n_judgements": r["n_judgements"],
        "valid_rate": r["label_prevalence"].get(1, r["label_prevalence"].get("1", 0.0)) if triples else None,
        "percent_agreement": r["percent_agreement"],
        "krippendorff_alpha": r["krippendorff_alpha"],
        "fleiss_kappa": r["fleiss_kappa"],
        "gwet_ac1": r["gwet_ac1"],
        "pairwise_cohen_mean": r["pairwise_cohen"]["mean"],
        "kappa_pairs": _pairs_covered(r["pairwise_cohen"]),
        "consensus": tally(decisions)["status"],
    }


def _turns(ctx: _Context, g: _Gathered) -> dict[str, Any] | None:
    """Agreement per turn position and per session (turn verdict rubrics), and the valid
    prefixes the consensus keeps; ``None`` for other rubrics."""
    if ctx.verdicts.turn_key is None:
        return None
    decided = [d for d in g.decisions.values() if d.decided and d.prefix is not None]
    prefixes: dict[str, int] = defaultdict(int)
    for d in decided:
        prefixes[str(d.prefix)] += 1
    positions = []
    for n in range(1, g.n_turns + 1):
        turn_decisions = [d.turns[n - 1] for d in g.decisions.values() if len(d.turns) >= n]
        positions.append(
            {"turn": n, **_turn_row(ctx, f"{TURN_PREFIX}{n}", g.turn_triples[f"{TURN_PREFIX}{n}"], turn_decisions)}
        )
    return {
        "verdict_key": ctx.verdicts.turn_key,
        "spec": TURN_SPEC.to_dict(),
        "rule": "a session is valid when every turn is valid and no reject flag holds; its valid prefix is its "
        "leading valid turns (annotation.core.turns.valid_prefix)",
        "session": _turn_row(ctx, VERDICT_DIMENSION, g.turn_triples[VERDICT_DIMENSION], list(g.decisions.values())),
        "positions": positions,
        "prefix_lengths": dict(sorted(prefixes.items(), key=lambda kv: int(kv[0]))),
        "whole_sessions": sum(1 for d in decided if d.validated),
        "prefix_sessions": sum(1 for d in decided if d.prefix and not d.validated),
    }


def _category_row(category: str, share: float | None, prevalence: float, block: dict[str, Any]) -> dict[str, Any]:
    return {
        "category": category,
        "chosen_share": share,
        "prevalence": prevalence,
        "krippendorff_alpha": block["krippendorff_alpha_nominal"],
        "fleiss_kappa": block["fleiss_kappa"],
        "gwet_ac1": block["gwet_ac1"],
        "pairwise_cohen_mean": block["pairwise_cohen"]["mean"],
        "kappa_pairs": _pairs_covered(block["pairwise_cohen"]),
    }


def _pairs_covered(pc: dict[str, Any]) -> str:
    """``"<defined> of <all>"``: the annotator pairs a mean Cohen's kappa covers."""
    return f"{pc['count']} of {pc['n_pairs']}"


def _validity_categories(ctx: _Context, g: _Gathered, overall: dict[str, Any]) -> list[dict[str, Any]]:
    b = overall["binary_valid_invalid"]
    valid_key = ctx.rubric.valid_category.key  # type: ignore[union-attr]
    rows = [_category_row(valid_key, g.share(valid_key), b["valid_rate"], b)]
    for flag in FLAGS:
        f = overall["per_flag_agreement"][flag]
        rows.append(_category_row(flag, g.share(flag), f["positive_rate"], f))
    return rows


def _one_vs_rest(ctx: _Context, triples: list[tuple[int, str, Any]], category: str) -> dict[str, Any]:
    binary = [(i, a, 1 if lab == category else 0) for i, a, lab in triples]
    r = ctx.agreement(binary, FLAG_SPEC)
    return {
        "krippendorff_alpha": r["krippendorff_alpha"],
        "fleiss_kappa": r["fleiss_kappa"],
        "gwet_ac1": r["gwet_ac1"],
        "pairwise_cohen_mean": r["pairwise_cohen"]["mean"],
        "kappa_pairs": _pairs_covered(r["pairwise_cohen"]),
    }


def _category_categories(ctx: _Context, g: _Gathered, overall: dict[str, Any]) -> list[dict[str, Any]]:
    prevalence = overall["label_prevalence"]
    return [
        {
            "category": c.key,
            "chosen_share": g.share(c.key),
            "prevalence": prevalence.get(c.key, 0.0),
            **_one_vs_rest(ctx, g.triples, c.key),
        }
        for c in ctx.rubric.by_severity()
    ]


def _scale_row(
    ctx: _Context, name: str, kind: str, triples: list[tuple[Any, Any, Any]], spec: AgreementSpec
) -> dict[str, Any]:
    r = ctx.agreement(triples, spec)
    values = [v for _, _, v in triples]
    return {
        "category": name,
        "kind": kind,
        "kappa_weights": r["pairwise_cohen"]["weights"],
        "n": len(values),
        "mean": sum(values) / len(values) if values else None,
        "krippendorff_alpha": r["krippendorff_alpha"],
        "fleiss_kappa": r["fleiss_kappa"],
        "gwet_ac1": r["gwet_ac1"],
        "pairwise_cohen_mean": r["pairwise_cohen"]["mean"],
        "kappa_pairs": _pairs_covered(r["pairwise_cohen"]),
    }


def _scale_categories(ctx: _Context) -> list[dict[str, Any]]:
    rows = []
    for s in ctx.rubric.scales:
        spec = agreement_spec(ctx.rubric, s.key)
        triples = [(i, ctx.show(a), v) for i, a, v in study_triples(ctx.study, s.key)]
        rows.append(_scale_row(ctx, s.key, f"scale ({spec.describe()})", triples, spec))
    for flag in ctx.rubric.reject_flags:
        triples = [(i, ctx.show(a), v) for i, a, v in reject_flag_triples(ctx.study, flag.key)]
        rows.append(_scale_row(ctx, f"reject:{flag.key}", f"reject flag ({FLAG_SPEC.describe()})", triples, FLAG_SPEC))
    return rows


def _categories(ctx: _Context, g: _Gathered, overall: dict[str, Any]) -> list[dict[str, Any]]:
    if ctx.kind == "validity":
        return _validity_categories(ctx, g, overall)
    if ctx.kind == "category":
        return _category_categories(ctx, g, overall)
    return _scale_categories(ctx)


def _breakdown(ctx: _Context, g: _Gathered, index: int, overall: dict[str, Any] | None = None) -> dict[str, Any]:
    """Agreement per dataset (index 0) or hidden category (1), same spec and weights as the
    headline. A single group holds every triple: its figures are the headline's (``overall``)."""
    groups: dict[str, list[tuple[int, str, Any]]] = defaultdict(list)
    items_in: dict[str, int] = defaultdict(int)
    for meta in g.rows.values():
        items_in[meta[index]] += 1
    for t in g.triples:
        groups[g.rows[t[0]][index]].append(t)
    out = {}
    for group in sorted(items_in):
        whole = overall is not None and len(items_in) == 1
        entry = _summary(overall if whole else ctx.agreement(groups.get(group, [])), ctx.kind)
        entry["items"] = items_in[group]
        if g.decisions:
            entry["consensus"] = (
                dict(g.tally["status"])
                if len(items_in) == 1
                else tally(d for i, d in g.decisions.items() if g.rows[i][index] == group)["status"]
            )
        out[group] = entry
    return out


def _confusion(ctx: _Context, g: _Gathered) -> dict[str, Any] | None:
    """Each annotator's votes (VALIDATED / INVALID) against the consensus (category rubrics)."""
    if not g.decisions or ctx.kind == "scale":
        return None
    columns = [VALIDATED_STATUS, REJECTED, ADJUDICATION, PENDING]
    valid_label = VALIDATED if ctx.kind == "validity" else ctx.rubric.valid_category.key  # type: ignore[union-attr]
    vote_rows = ["VALIDATED", "INVALID"]
    per: dict[str, list[list[int]]] = {a: [[0] * len(columns) for _ in vote_rows] for a in g.annotators}
    for item, annotator, label in g.triples:
        d = g.decisions[item]
        if d.status in columns:
            per[annotator][0 if label == valid_label else 1][columns.index(d.status)] += 1
    confusion: dict[str, Any] = {}
    for a, m in per.items():
        decided = m[0][0] + m[0][1] + m[1][0] + m[1][1]
        confusion[a] = {
            "matrix": m,
            "n": sum(map(sum, m)),
            "agreement_with_consensus": (m[0][0] + m[1][1]) / decided if decided else None,
        }
    return {"rows": vote_rows, "columns": columns, "by_annotator": confusion}


def _consensus(ctx: _Context, g: _Gathered) -> dict[str, Any] | None:
    if not g.decisions:
        return None
    v = ctx.verdicts
    return {
        "policy": "session" if v.session is not None else v.policy,
        "primary": ctx.show(v.primary) if v.primary else None,
        "quorum": v.quorum,
        "session_rule": v.session.to_dict() if v.session is not None else None,
        **g.tally,
        "states": dict(g.states) if g.states is not None else item_states(g.decisions.values()),
    }


def _pairwise(ctx: _Context, g: _Gathered, overall: dict[str, Any]) -> dict[str, Any]:
    if ctx.kind == "validity":
        by_pair = overall["binary_valid_invalid"]["pairwise_cohen_by_pair"]
        kappa_of = "binary valid / invalid, unweighted"
    else:
        by_pair = overall["pairwise_cohen"]["by_pair"]
        weights = overall["pairwise_cohen"]["weights"]
        kappa_of = f"labels, {'unweighted' if weights == 'none' else weights + ' weights'}"
        if ctx.kind == "scale":
            kappa_of = f"{ctx.dimension}, {weights} weights"

    def lookup(a: str, b: str) -> Any:
        return by_pair.get(pair_key(a, b), by_pair.get(pair_key(b, a)))

    agree: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    by_item: dict[int, list[tuple[str, str]]] = defaultdict(list)
    signed: dict[Any, str] = {}  # a label's signature, worked out once per distinct label
    for item, annotator, label in g.triples:
        key = tuple(label) if isinstance(label, list) else label
        signature = signed.get(key)
        if signature is None:
            signature = signed[key] = _signature(ctx.kind, label)
        by_item[item].append((annotator, signature))
    for votes in by_item.values():
        for (a, sa), (b, sb) in combinations(sorted(votes), 2):
            cell = agree[(a, b)]
            cell[0] += 1
            cell[1] += sa == sb

    def cell(a: str, b: str) -> tuple[int, int]:
        n, same = agree.get((min(a, b), max(a, b)), (0, 0))
        return n, same

    annotators = g.annotators
    return {
        "annotators": annotators,
        "kappa_of": kappa_of,
        "cohen_kappa": _matrix(annotators, lookup),
        "signature_agreement": _matrix(
            annotators, lambda a, b: cell(a, b)[1] / cell(a, b)[0] if cell(a, b)[0] else None
        ),
        "shared_items": _matrix(annotators, lambda a, b: cell(a, b)[0]),
    }


def _context(
    study: Study, policy: str, primary: str | None, pseudonymise: bool, dimension: str | None, constant_pairs: str
) -> _Context:
    if policy not in POLICIES:
        raise ReportError(f"unknown consensus policy {policy!r}; expected one of {POLICIES}")
    if constant_pairs not in CONSTANT_PAIRS:
        raise ReportError(f"constant_pairs must be one of {CONSTANT_PAIRS}, got {constant_pairs!r}")
    rubric = study.rubric.rubric
    if is_turn_dimension(dimension):
        raise ReportError(
            f"the report shows every turn in its turn-by-turn section; {dimension!r} is for manage.py agreement --study"
        )
    dimension = check_dimension(rubric, dimension)
    return _Context(
        study,
        rubric,
        label_kind(rubric),
        dimension,
        agreement_spec(rubric, dimension),
        Verdicts.of(study, policy, primary),
        annotator_pseudonyms(study) if pseudonymise else {},
        constant_pairs,
    )


def study_report(
    study: Study,
    *,
    policy: str = "majority",
    primary: str | None = None,
    pseudonymise: bool = False,
    dimension: str | None = None,
    n_boot: int = 0,
    seed: int = 0,
    constant_pairs: str = "undefined",
) -> dict[str, Any]:
    """The researcher's report of a study as a JSON-ready dict (see the module docstring).

    ``pseudonymise`` replaces usernames by ``annotator_NN`` (:func:`annotator_pseudonyms`)
    everywhere, for readers who are not staff. ``policy`` / ``primary``: the consensus
    (category rubrics; adjudications override it; the study's quorum applies). ``n_boot``:
    bootstrap replicates of the overall agreement (breakdowns never bootstrap).
    ``constant_pairs``: Cohen's kappa of two raters constant on one label, ``undefined``
    (default) or ``one`` (the CIRCUS convention). The overall block is exactly
    :func:`study_agreement` (:func:`compute_agreement` over the same triples).
    """
    ctx = _context(study, policy, primary, pseudonymise, dimension, constant_pairs)
    g = _gather(ctx)
    overall = ctx.agreement(g.triples, n_boot=n_boot, seed=seed)
    return {
        "study": {
            "id": study.pk,
            "name": study.name,
            "rubric": {"key": study.rubric.key, "version": study.rubric.version},
            "kind": ctx.kind,
            "dimension": ctx.dimension,
            "overlap": study.overlap,
            "quorum": ctx.verdicts.quorum,
            "items": len(g.rows),
            "judgements": g.n_judgements,
            "late": sum(late_per_annotator(study).values()),
            "annotators": g.annotators,
            "pseudonymised": pseudonymise,
        },
        "agreement": overall,
        "categories": _categories(ctx, g, overall),
        "by_dataset": _breakdown(ctx, g, 0, overall),
        "by_hidden_category": _breakdown(ctx, g, 1, overall),
        "consensus": _consensus(ctx, g),
        "confusion": _confusion(ctx, g),
        "pairwise": _pairwise(ctx, g, overall),
        "turns": _turns(ctx, g),
    }


# --------------------------------------------------------------------------- CSV


def _csv_agreement(a: dict[str, Any]) -> Iterator[list[Any]]:
    for key in (
        "n_items",
        "n_annotators",
        "n_judgements",
        "n_items_excluded",
        "n_categories",
        "percent_agreement",
        "all_ratings_identical_rate",
        "krippendorff_alpha",
        "fleiss_kappa",
        "gwet_ac1",
    ):
        yield ["agreement", "", key, a[key]]
    for key in ("count", "n_undefined", "n_pairs", "mean", "median", "min", "max", "weights", "constant_pairs"):
        yield ["agreement", "pairwise_cohen", key, a["pairwise_cohen"][key]]
    for pair, value in a["pairwise_cohen"]["by_pair"].items():
        yield ["agreement", "pairwise_cohen_by_pair", pair, value]
    for label, share in a["label_prevalence"].items():
        yield ["agreement", "label_prevalence", label, share]
    yield ["agreement", "spec", "statement", a["spec"]["statement"]]
    for name, iv in a["confidence_intervals"]["intervals"].items():
        for bound in ("low", "high", "n_valid"):
            yield ["agreement", "confidence_intervals", f"{name}.{bound}", iv[bound] if iv else None]
    yield ["agreement", "confidence_intervals", "n_boot", a["confidence_intervals"]["n_boot"]]
    if "intervals_state" in a:  # the page's report: current, updating (none shown yet) or off
        yield ["agreement", "confidence_intervals", "state", a["intervals_state"]["state"]]
    if "binary_valid_invalid" in a:
        b = a["binary_valid_invalid"]
        for key in (
            "valid_rate",
            "exact_agreement_rate",
            "unanimous_valid_invalid_rate",
            "exact_invalid_signature_rate",
            "percent_agreement",
            "krippendorff_alpha_nominal",
            "fleiss_kappa",
            "gwet_ac1",
        ):
            yield ["agreement", "binary_valid_invalid", key, b[key]]
        yield ["agreement", "binary_valid_invalid", "pairwise_cohen_mean", b["pairwise_cohen"]["mean"]]
        yield ["agreement", "", "signature_alpha_nominal", a["signature_alpha_nominal"]]


def _csv_breakdowns(report: dict[str, Any]) -> Iterator[list[Any]]:
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


def _csv_consensus(report: dict[str, Any]) -> Iterator[list[Any]]:
    if report["consensus"]:
        c = report["consensus"]
        yield ["consensus", "", "policy", c["policy"]]
        yield ["consensus", "", "quorum", c["quorum"]]
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


def _csv_turns(report: dict[str, Any]) -> Iterator[list[Any]]:
    """``turns, session | turn N, key, value`` rows (turn verdict rubrics)."""
    t = report.get("turns")
    if not t:
        return
    for row, group in [(t["session"], "session"), *((p, f"turn {p['turn']}") for p in t["positions"])]:
        for key, value in row.items():
            if key == "consensus":
                for status, n in value.items():
                    yield ["turns", group, f"consensus_{status}", n]
            elif key not in ("turn", "dimension"):
                yield ["turns", group, key, value]
    for length, n in t["prefix_lengths"].items():
        yield ["turns", "prefix_lengths", length, n]
    yield ["turns", "", "whole_sessions", t["whole_sessions"]]
    yield ["turns", "", "prefix_sessions", t["prefix_sessions"]]


def _weights_words(weights: str) -> str:
    return "unweighted" if weights in (None, "none") else f"{weights} weights"


def kappa_bases(report: dict[str, Any]) -> dict[str, str]:
    """What each Cohen's kappa of a report is computed over (the CSV's ``basis`` column):
    ``labels`` (the headline kappa: validity signatures, categories or the scale), ``binary``
    (validity: valid / invalid) and ``pairwise`` (the pairwise matrix, :func:`_pairwise`)."""
    kind, a = report["study"]["kind"], report["agreement"]
    weights = _weights_words(a["pairwise_cohen"]["weights"])
    labels = {"validity": "validity signatures", "category": "categories"}.get(kind, report["study"]["dimension"])
    return {
        "labels": f"{labels}, {weights}",
        "binary": "binary valid / invalid, unweighted",
        "pairwise": report["pairwise"]["kappa_of"],
    }


def _basis(row: list[Any], bases: dict[str, str], kind: str) -> str:
    """The basis of a row's Cohen's kappa ('' for a row that is no kappa)."""
    section, group, key = (str(x) for x in row[:3])
    if section == "pairwise_cohen_kappa":
        return bases["pairwise"]
    if section == "turns" and "cohen" in key:
        return (
            "turn verdict valid / invalid, unweighted"
            if group.startswith("turn")
            else "session verdict valid / invalid, unweighted"
        )
    if "cohen" not in group and "cohen" not in key:
        return ""
    if "binary" in group or "binary" in key:
        return bases["binary"]
    if section == "category":
        return (
            f"{group} chosen or not, unweighted"
            if kind != "scale" or group.startswith("reject:")
            else f"{group}, {_weights_words(default_kappa_weights('ordinal'))}"
        )
    return bases["labels"]


def _csv_undefined(report: dict[str, Any]) -> Iterator[list[Any]]:
    """Why each null coefficient of the headline is undefined (Fleiss' kappa and the others)."""
    for key, why in report["agreement"]["undefined"].items():
        yield ["agreement", "undefined", key, why]


def report_csv_rows(report: dict[str, Any]) -> Iterator[list[Any]]:
    """``section, group, key, value, basis`` rows of a :func:`study_report` (header first).
    ``basis`` names what a Cohen's kappa is computed over (:func:`kappa_bases`), so two kappas
    of one pair (e.g. over validity signatures and over valid / invalid) are told apart; the
    ``agreement, undefined`` rows say why a coefficient is null."""
    bases, kind = kappa_bases(report), report["study"]["kind"]
    yield ["section", "group", "key", "value", "basis"]
    for row in _csv_body(report):
        yield [*row, _basis(row, bases, kind)]


def _csv_body(report: dict[str, Any]) -> Iterator[list[Any]]:
    s = report["study"]
    for key in ("id", "name", "kind", "dimension", "overlap", "quorum", "items", "judgements", "late"):
        yield ["study", "", key, s[key]]
    yield ["study", "", "rubric", f"{s['rubric']['key']} v{s['rubric']['version']}"]
    yield from _csv_agreement(report["agreement"])
    yield from _csv_undefined(report)
    yield from _csv_breakdowns(report)
    yield from _csv_consensus(report)
    yield from _csv_turns(report)
    p = report["pairwise"]
    yield ["pairwise", "", "kappa_of", p["kappa_of"]]
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
