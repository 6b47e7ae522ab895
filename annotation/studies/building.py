"""Building a study: its item pool (filtered, stratified, seeded), overlap, annotators."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import transaction

from annotation.core.consensus import SessionRule
from annotation.core.rounds import InteractiveSettings
from annotation.core.study_settings import QuorumSettings, ServingSettings, SettingsError
from annotation.judging.candidates import send_fill
from annotation.models import RubricVersion, Study, StudyItem
from annotation.roles import ANNOTATOR
from annotation.sizes import add_items
from annotation.studies.sampling import agreement_subset, report_json, shuffle_for_annotator, stratified_sample
from audit.labels import LABELS
from retrieval.dbstats import refresh_statistics
from retrieval.models import Dataset, Query, QuerySubset

logger = logging.getLogger(__name__)


class StudyError(ValueError):
    pass


@dataclass
class StudySpec:
    name: str
    datasets: list[str]
    rubric: str = "validity"
    overlap: int = 3
    hidden_categories: list[str] = field(
        default_factory=list
    )  # audit labels (audit.labels.LABELS), e.g. audit.labels.SHORTCUT_FREE_LABELS
    quotas: dict[str, int] | None = None  # "dataset::category" -> n
    total: int | None = None
    seed: int = 0
    agreement_size: int = 0
    blind: bool = True
    guidelines: str = ""
    lease_minutes: int = 10
    annotators: list[str] = field(default_factory=list)
    single_turn_only: bool | None = None  # default: from the rubric (validity: single, session: multi)
    quorum: int | None = None  # current judgements before an item is decided; default: the overlap
    session_rule: dict | None = None  # session rubrics: {"reject": "majority"|"any", "threshold": 3.0}
    candidates: int = 20  # candidate images per single-turn item (0 to 50)
    adaptive_max: int | None = None  # adaptive overlap: more annotators, up to this many, where they disagree
    consensus: str = "majority"  # the study's consensus policy: majority or reliability (Dawid-Skene weighted)
    interactive: dict | None = None  # an interactive study: annotation.core.rounds.InteractiveSettings fields
    serve_order: str = "random"  # "random" (the seeded shuffle) or "suspicion" (highest first; annotation.core.serving)
    estimate: dict | None = (
        None  # an estimate study: {"target_half_width": 0.03, "strata": 4} (annotation.studies.estimating)
    )


def latest_audit(dataset: Dataset):
    """The newest finished audit of a dataset, or None."""
    from audit.models import AuditRun

    return AuditRun.objects.filter(dataset=dataset, status=AuditRun.Status.DONE).order_by("-finished_at", "-pk").first()


def hidden_categories(dataset: Dataset) -> dict[int, str]:
    """query id -> audit label: from the newest finished audit, else from subsets named
    after the labels (written by imports of external audits)."""
    from audit.models import AuditLabel

    run = latest_audit(dataset)
    if run is not None:
        return dict(AuditLabel.objects.filter(run=run).values_list("query_id", "label"))
    labels: dict[int, str] = {}
    for name in LABELS:
        subset = QuerySubset.objects.filter(dataset=dataset, name=name).first()
        if subset is not None:
            for qid in subset.queries.values_list("id", flat=True):
                labels[qid] = name
    return labels


def _parse_quotas(quotas: Mapping[str, int] | None) -> dict[tuple[str, str], int] | None:
    if quotas is None:
        return None
    parsed = {}
    for key, n in quotas.items():
        dataset, sep, category = key.partition("::")
        if not sep:
            raise StudyError(f"quota key {key!r} must look like 'dataset::hidden_category'")
        parsed[(dataset, category)] = int(n)
    return parsed


def _verdict_settings(spec: StudySpec, rubric: RubricVersion) -> dict:
    """Check the session rule (the quorum: :func:`_check_numbers`); the session rule to store (session rubrics)."""
    if rubric.rubric.kind != "session":
        if spec.session_rule:
            raise StudyError("a session rule applies to session rubrics only")
        return {}
    try:
        rule = SessionRule.from_dict(spec.session_rule)
    except (TypeError, ValueError) as exc:
        raise StudyError(f"session rule: {exc}") from None
    scales = {s.key: s for s in rubric.rubric.scales}
    if rule.scale not in scales:
        raise StudyError(f"session rule: the rubric has no scale {rule.scale!r} (scales: {', '.join(scales)})")
    return rule.to_dict()


def _interactive_settings(spec: StudySpec) -> dict:
    """The interactive settings to store (empty: not interactive). The retriever defaults to
    the one that ranks the first dataset's queries on demand (its newest audited spec)."""
    if spec.interactive is None:
        return {}
    from audit.runs.ondemand import candidate_retriever
    from retrieval.retrievers import parse_spec

    data = dict(spec.interactive)
    if not data.get("retriever"):
        dataset = Dataset.objects.filter(name=spec.datasets[0]).first() if spec.datasets else None
        if dataset is None:
            raise StudyError(f"no dataset named {spec.datasets[0] if spec.datasets else ''!r}")
        data["retriever"] = candidate_retriever(dataset.pk)
    try:
        parse_spec(data["retriever"])
        return InteractiveSettings.from_dict(data).to_dict()
    except (TypeError, ValueError) as exc:
        raise StudyError(f"interactive settings: {exc}") from None


def _rubric(key: str) -> RubricVersion:
    """A shipped rubric by key (its newest version; ``key@N``: version N, e.g. ``session@1``),
    or a stored version by id."""
    try:
        if key.isdigit():
            return RubricVersion.objects.get(pk=int(key))
        name, _, version = key.partition("@")
        return RubricVersion.builtin(name, int(version) if version else None)
    except (KeyError, ValueError, RubricVersion.DoesNotExist):
        raise StudyError(f"unknown rubric {key!r}") from None


def _draw_pool(spec: StudySpec, single: bool) -> tuple[list[tuple[int, tuple[str, str]]], dict[int, str]]:
    """(query id, (dataset, hidden category)) of every eligible query, and the hidden categories."""
    pool: list[tuple[int, tuple[str, str]]] = []
    hidden: dict[int, str] = {}
    for name in spec.datasets:
        dataset = Dataset.objects.filter(name=name).first()
        if dataset is None:
            raise StudyError(f"no dataset named {name!r}")
        labels = hidden_categories(dataset)
        if spec.hidden_categories and not labels:
            raise StudyError(
                f"dataset {name!r} has no audit labels yet: run an audit first, or drop the category filter"
            )
        queries = Query.objects.filter(dataset=dataset)
        queries = queries.filter(n_turns=1) if single else queries.filter(n_turns__gt=1)
        for qid in queries.values_list("id", flat=True):
            category = labels.get(qid, "")
            if spec.hidden_categories and category not in spec.hidden_categories:
                continue
            hidden[qid] = category
            pool.append((qid, (name, category)))
    if not pool:
        raise StudyError("the item pool is empty: check the datasets and the category filter")
    return pool, hidden


def _sample(pool: list[tuple[int, tuple[str, str]]], spec: StudySpec) -> tuple[list[int], dict, int]:
    """(chosen query ids, per-stratum report, shortfall): the whole pool, or a stratified sample."""
    quotas = _parse_quotas(spec.quotas)
    if quotas is not None or spec.total is not None:
        return stratified_sample(pool, quotas, seed=spec.seed, total=spec.total)
    report: dict = {}
    for _, stratum in pool:
        entry = report.setdefault(stratum, {"population": 0, "requested": 0, "selected": 0})
        entry["population"] += 1
        entry["requested"] += 1
        entry["selected"] += 1
    return [qid for qid, _ in pool], report, 0


def create_study(spec: StudySpec, created_by=None) -> tuple[Study, dict]:
    """Create a study and its items; returns (study, sampling report)."""
    _check_numbers(spec)
    if Study.objects.filter(name=spec.name).exists():
        raise StudyError(f"a study named {spec.name!r} exists already")
    rubric = _rubric(spec.rubric)
    interactive = _interactive_settings(spec)
    single = spec.single_turn_only
    if single is None:
        single = rubric.rubric.kind != "session" or bool(interactive)

    session_rule = _verdict_settings(spec, rubric)
    estimate = _estimate_settings(spec, rubric, single, interactive)
    pool, hidden = _draw_pool(spec, single)
    chosen, report, shortfall = _sample(pool, spec)
    agreement = set(agreement_subset(chosen, spec.agreement_size, spec.seed)) if spec.agreement_size else set()
    strata = dict(pool)

    users = annotator_users(spec.annotators)

    report_json_ = report_json(report)
    # The queue order is a seeded shuffle, so no dataset or id range is judged first.
    chosen = shuffle_for_annotator(chosen, spec.seed, "study-queue")
    with transaction.atomic():
        study = Study.objects.create(
            name=spec.name,
            rubric=rubric,
            overlap=spec.overlap,
            blind=spec.blind,
            guidelines=spec.guidelines,
            lease_minutes=spec.lease_minutes,
            seed=spec.seed,
            created_by=created_by,
            candidates=spec.candidates,
            quorum=spec.quorum,
            session_rule=session_rule,
            adaptive_max=spec.adaptive_max,
            consensus=spec.consensus,
            interactive=interactive,
            serve_order=spec.serve_order,
            estimate=estimate,
            pool={
                "datasets": spec.datasets,
                "hidden_categories": spec.hidden_categories,
                "quotas": spec.quotas,
                "total": spec.total,
                "seed": spec.seed,
                "agreement_size": spec.agreement_size,
                "single_turn": single,
                "sampling": report_json_,
                "shortfall": shortfall,
                "audit_runs": {
                    name: getattr(latest_audit(Dataset.objects.get(name=name)), "pk", None) for name in spec.datasets
                },
            },
        )
        add_items(
            study,
            [
                StudyItem(
                    study=study,
                    query_id=qid,
                    hidden_category=hidden[qid],
                    stratum=strata[qid][0],
                    agreement=qid in agreement,
                    order_key=n,
                )
                for n, qid in enumerate(chosen)
            ],
            batch_size=5000,
        )
        study.annotators.set(users)
        transaction.on_commit(lambda: _queue_candidates(study.pk, single and spec.candidates > 0 and not interactive))
    refresh_statistics(StudyItem)  # the queue's query is planned from these, from the first request
    if estimate:
        from annotation.studies.estimating import plan_estimate

        plan_estimate(study)
    return study, {"items": len(chosen), "agreement": len(agreement), "strata": report_json_, "shortfall": shortfall}


def _estimate_settings(spec: StudySpec, rubric: RubricVersion, single: bool, interactive: dict) -> dict:
    """The estimate settings to store (empty: not an estimate study). An estimate study samples
    the whole pool itself: no quotas, total or agreement subset, single-turn validity items,
    served in its plan's order."""
    if spec.estimate is None:
        return {}
    from annotation.studies.estimating import EstimateError, check_settings

    if spec.quotas or spec.total is not None or spec.agreement_size:
        raise StudyError(
            "an estimate study draws its own sample from the whole pool: no quotas, total or agreement subset"
        )
    if not single or interactive or rubric.rubric.kind != "category" or rubric.rubric.valid_category is None:
        raise StudyError("an estimate study judges single-turn queries under a rubric with a valid category")
    if spec.serve_order != Study.ServeOrder.RANDOM:
        raise StudyError("an estimate study is served in its sampling plan's order: the serve order must be random")
    try:
        return check_settings(spec.estimate)
    except EstimateError as exc:
        raise StudyError(str(exc)) from None


def annotator_users(usernames: Iterable[str]) -> list:
    """The users behind ``usernames``; StudyError names any unknown one or any without the
    annotator role (a study's annotators must hold it)."""
    usernames = list(usernames)
    users = list(get_user_model().objects.filter(username__in=usernames).prefetch_related("groups"))
    unknown = set(usernames) - {u.username for u in users}
    if unknown:
        raise StudyError(f"unknown annotators: {', '.join(sorted(unknown))}")
    without = sorted(u.username for u in users if ANNOTATOR not in {g.name for g in u.groups.all()})
    if without:
        raise StudyError(
            f"these users do not have the annotator role: {', '.join(without)}. "
            "Give them the role first (staff: the users page or the Django admin's groups), then add them."
        )
    return users


def _check_numbers(spec: StudySpec) -> None:
    """The spec's quorum and serving settings keep their groups' rules (annotation.core.study_settings)."""
    try:
        for group in (QuorumSettings, ServingSettings):
            group.of(spec).validate()
    except SettingsError as exc:
        raise StudyError(str(exc)) from None


def _queue_candidates(study_id: int, wanted: bool) -> None:
    """Ask a worker to fix the study's candidate panels (pages fill them lazily otherwise)."""
    if not wanted:
        return
    try:
        send_fill(study_id)
    except Exception:  # no broker: the item pages fill the panels themselves
        logger.warning("could not queue the candidate panels of study %s", study_id, exc_info=True)


def add_annotators(study: Study, usernames: Iterable[str]) -> list:
    """Add these users to the study's annotators (StudyError: unknown, or without the role)."""
    users = annotator_users(usernames)
    study.annotators.add(*users)
    return users


def preflight(spec: StudySpec) -> list[str]:
    """What the admin should know before a study is built: queries whose images are missing,
    and a pool drawn from audit labels (e.g. the shortcut-free ones) asked of a dataset that no
    finished audit has labelled."""
    from retrieval.models import Target, Turn

    warnings: list[str] = []
    for name in spec.datasets:
        dataset = Dataset.objects.filter(name=name).first()
        if dataset is None:
            continue
        queries = Query.objects.filter(dataset=dataset)
        broken = set(
            Turn.objects.filter(query__in=queries, reference_image__missing=True).values_list("query_id", flat=True)
        )
        broken |= set(Target.objects.filter(query__in=queries, image__missing=True).values_list("query_id", flat=True))
        if broken:
            n_images = dataset.images.filter(missing=True).count()
            warnings.append(
                f"{name}: {len(broken)} of {queries.count()} queries have missing images "
                f"({n_images} image files were not found at import). Annotators would see placeholders."
            )
        asked = [label for label in LABELS if label in spec.hidden_categories]
        if asked and latest_audit(dataset) is None:
            warnings.append(
                f"{name}: no finished audit. A pool drawn from audit labels ({', '.join(asked)}) needs one; "
                "labels imported with the dataset, if any, are used as they are."
            )
    return warnings
