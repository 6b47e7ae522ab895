"""annotation.models.parsed_rubric: a study's rubric is parsed once per process per definition,
and a changed definition is parsed anew (never the old rubric under a new text)."""

from __future__ import annotations

import copy

import pytest

from annotation.models import RubricVersion, parsed_rubric

pytestmark = pytest.mark.django_db


def test_rows_with_one_definition_share_one_parse_and_an_edit_is_read():
    pk = RubricVersion.builtin("validity").pk
    row, again = RubricVersion.objects.get(pk=pk), RubricVersion.objects.get(pk=pk)
    assert again is not row and again.rubric is row.rubric
    edited = copy.deepcopy(row.definition)
    edited["title"] = "An edited title"
    assert parsed_rubric(edited).title == "An edited title"
    assert parsed_rubric(row.definition).title == row.rubric.title != "An edited title"
