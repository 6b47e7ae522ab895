"""A study's settings in typed groups, each with its own rules (annotation.core.study_settings)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from annotation.core.consensus import AdaptiveQuorumRule, study_quorum_rule
from annotation.core.study_settings import (
    COLUMN_GROUPS,
    MAX_LEASE_MINUTES,
    MAX_OVERLAP,
    EstimateSettings,
    GoldSettings,
    QuorumSettings,
    ServingSettings,
    SettingsError,
)
from retrieval.fusion import MAX_CANDIDATES


def test_defaults_keep_their_rules():
    for group in (*COLUMN_GROUPS, EstimateSettings):
        assert group().problems() == {}
        assert group().validate() == group()


def test_each_setting_is_in_one_group():
    names = [name for group in COLUMN_GROUPS for name in group.field_names()]
    assert len(names) == len(set(names))
    assert QuorumSettings.field_names() == ("overlap", "quorum", "adaptive_max", "consensus", "adaptive_confidence")


def test_the_readmodel_reads_the_quorum_group():
    from annotation.verdicts.readmodel import QUORUM_FIELDS

    assert QUORUM_FIELDS == QuorumSettings.field_names()


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"overlap": 0}, "overlap", "overlap must be between 1 and 50"),
        ({"overlap": MAX_OVERLAP + 1}, "overlap", "overlap must be between 1"),
        ({"overlap": True}, "overlap", "overlap must be"),
        ({"overlap": 3, "quorum": 4}, "quorum", "quorum must lie between 1 and the overlap (3), got 4"),
        ({"quorum": 0}, "quorum", "quorum must lie between 1"),
        ({"overlap": 3, "adaptive_max": 3}, "adaptive_max", "More than the overlap (3), or empty"),
        ({"overlap": 2, "adaptive_max": MAX_OVERLAP + 1}, "adaptive_max", "More than the overlap"),
        ({"consensus": "loudest"}, "consensus", "consensus must be majority or reliability"),
        ({"adaptive_confidence": 0.4}, "adaptive_confidence", "between 0.5 and 1.0"),
        ({"adaptive_confidence": float("nan")}, "adaptive_confidence", "between 0.5 and 1.0"),
    ],
)
def test_quorum_rules(values, field, message):
    problems = QuorumSettings(**values).problems()
    assert list(problems) == [field] and message in problems[field]
    with pytest.raises(SettingsError, match="must|More than") as refused:
        QuorumSettings(**values).validate()
    assert refused.value.problems == problems


def test_quorum_combinations_that_keep_the_rules():
    assert QuorumSettings(overlap=3, quorum=3).problems() == {}
    assert QuorumSettings(overlap=2, quorum=1, adaptive_max=3, consensus="reliability").problems() == {}
    assert QuorumSettings(overlap=MAX_OVERLAP).problems() == {}


def test_a_bad_overlap_is_named_once():
    """A quorum or maximum is not blamed for an overlap that is itself wrong."""
    assert list(QuorumSettings(overlap=0, quorum=2, adaptive_max=3).problems()) == ["overlap"]


def test_the_quorum_group_builds_the_quorum_rule():
    quorum = QuorumSettings(overlap=2, adaptive_max=3, consensus="reliability", adaptive_confidence=0.9)
    assert isinstance(quorum.rule, AdaptiveQuorumRule)
    assert quorum.rule == study_quorum_rule(2, None, 3, "reliability", 0.9)
    assert QuorumSettings(overlap=3, quorum=2).rule.base == 2


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"gold_rate": -0.1}, "gold_rate"),
        ({"gold_rate": 1.5}, "gold_rate"),
        ({"training_items": -1}, "training_items"),
        ({"training_items": 1.5}, "training_items"),
        ({"too_fast_seconds": -1}, "too_fast_seconds"),
        ({"straight_run": 1}, "straight_run"),
    ],
)
def test_gold_rules(values, field):
    problems = GoldSettings(**values).problems()
    assert list(problems) == [field] and field in problems[field]


def test_gold_bounds_are_inclusive():
    assert GoldSettings(gold_rate=0, training_items=0, too_fast_seconds=0, straight_run=2).problems() == {}
    assert GoldSettings(gold_rate=1).problems() == {}


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"serve_order": "loudest"}, "serve_order"),
        ({"lease_minutes": 0}, "lease_minutes"),
        ({"lease_minutes": MAX_LEASE_MINUTES + 1}, "lease_minutes"),
        ({"candidates": -1}, "candidates"),
        ({"candidates": MAX_CANDIDATES + 1}, "candidates"),
        ({"blind": "yes"}, "blind"),
    ],
)
def test_serving_rules(values, field):
    problems = ServingSettings(**values).problems()
    assert list(problems) == [field]


def test_serving_bounds_are_inclusive():
    assert ServingSettings(serve_order="suspicion", lease_minutes=MAX_LEASE_MINUTES, candidates=0).problems() == {}
    assert ServingSettings(lease_minutes=1, candidates=MAX_CANDIDATES, blind=False).problems() == {}


def test_estimate_settings_parse_and_check():
    assert EstimateSettings.parse({"target_half_width": "0.05", "strata": "3", "stopped": True}) == EstimateSettings(
        0.05, 3, False
    )
    assert EstimateSettings.parse(None).validate().to_dict() == {
        "target_half_width": 0.03,
        "strata": 4,
        "reallocate": False,
    }
    with pytest.raises(SettingsError, match="half-width must lie in"):
        EstimateSettings.parse({"target_half_width": 0.6}).validate()
    with pytest.raises(SettingsError, match="strata must lie between 1 and 8"):
        EstimateSettings.parse({"strata": 9}).validate()
    with pytest.raises(SettingsError, match="must be a number"):
        EstimateSettings.parse({"strata": "many"})


def test_groups_are_built_from_columns_or_values():
    """``of``: from attributes (a Study's columns, a StudySpec, which has no gold fields or
    adaptive_confidence: their defaults); ``from_values``: from a mapping."""
    spec = SimpleNamespace(overlap=2, quorum=None, adaptive_max=3, consensus="majority")
    assert QuorumSettings.of(spec) == QuorumSettings(overlap=2, adaptive_max=3)
    assert ServingSettings.from_values({"candidates": 5, "unrelated": 1}) == ServingSettings(candidates=5)


def test_an_error_lists_every_problem():
    with pytest.raises(SettingsError) as refused:
        GoldSettings(gold_rate=2, straight_run=0).validate()
    assert set(refused.value.problems) == {"gold_rate", "straight_run"}
    assert "gold_rate" in str(refused.value) and "straight_run" in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_groups_are_frozen():
    with pytest.raises(AttributeError):
        QuorumSettings().overlap = 4  # type: ignore[misc]


def test_study_builds_its_groups_from_its_columns():
    from annotation.models import Study

    study = Study(overlap=2, quorum=1, adaptive_max=3, gold_rate=0.1, lease_minutes=5, interactive={}, estimate={})
    assert study.quorum_settings == QuorumSettings(overlap=2, quorum=1, adaptive_max=3)
    assert study.quorum_rule == study.quorum_settings.rule
    assert study.gold_settings.gold_rate == 0.1 and study.serving_settings.lease_minutes == 5
    assert study.interactive_settings is None and study.estimate_settings is None
    study.interactive = {"retriever": "openclip:x", "top_n": 5}
    assert study.interactive_settings.top_n == 5


def test_study_clean_names_each_broken_setting():
    from django.core.exceptions import ValidationError

    from annotation.models import Study

    Study(overlap=3).clean()
    study = Study(overlap=3, quorum=5, gold_rate=2, interactive={"retriever": "openclip:x", "top_n": 99})
    study.estimate = {"strata": 9}
    with pytest.raises(ValidationError) as refused:
        study.clean()
    errors = refused.value.message_dict
    assert set(errors) == {"quorum", "gold_rate", "interactive", "estimate"}
    assert "quorum must lie between 1 and the overlap (3)" in errors["quorum"][0]
    assert "top_n" in errors["interactive"][0]


def test_the_settings_form_shows_each_problem_on_its_field():
    from annotation.models import Study
    from annotation.room.forms import StudySettingsForm

    data = {**GoldSettings().to_dict(), "overlap": 2, "quorum": "", "adaptive_max": 2, "consensus": "majority"}
    data.update(adaptive_confidence=0.9, serve_order="random", lease_minutes=10, straight_run=1, guidelines="")
    form = StudySettingsForm(data, instance=Study(overlap=3))
    assert not form.is_valid()
    assert set(form.errors) == {"adaptive_max", "straight_run"}
    assert "More than the overlap (2)" in form.errors["adaptive_max"][0]


@pytest.mark.django_db
def test_the_study_form_checks_the_groups_and_fills_the_spec():
    from annotation.forms import StudyForm
    from retrieval.models import Dataset

    Dataset.objects.create(name="settings-form", format="demo")
    base = {"name": "s", "datasets": ["settings-form"], "rubric": "validity", "seed": 0, "agreement_size": 0}
    base.update(lease_minutes=10, blind="on", candidates="", consensus="", serve_order="")
    refused = StudyForm({**base, "overlap": 3, "quorum": 4, "adaptive_max": 3})
    assert not refused.is_valid()
    assert set(refused.errors) == {"quorum", "adaptive_max"}
    assert "quorum must lie between 1 and the overlap (3), got 4" in refused.errors["quorum"][0]
    form = StudyForm({**base, "overlap": 2, "quorum": 2, "adaptive_max": 3})
    assert form.is_valid(), form.errors
    spec = form.spec()
    assert QuorumSettings.of(spec) == QuorumSettings(overlap=2, quorum=2, adaptive_max=3)
    assert ServingSettings.of(spec) == ServingSettings()  # empty choices: the defaults
