"""The two rows every annotation request reads, each by one explicit SQL statement.

"Next item" reads the study with what the engine needs to decide without further queries:
whether the caller annotates in it, whether any lease of the study has expired, its number
of gold items and the caller's own counts (:func:`study_row`). A submit reads the caller's
assignment, locked, with its study, rubric, item, query and annotator, whether the caller
still annotates in the study, the current revision, the row stored with the client token
and whether a draft exists (:func:`submit_row`). Built as ORM querysets, with their
``Exists``/``Subquery`` annotations, building and compiling them cost 4-5 ms of CPU per
request, ten times what running them costs (docs/benchmarks/load.md, "Web tier CPU per
request"). This module writes them as SQL once.

The rules they read are those of the ORM, which stay their definition:
  * membership: :func:`annotation.permissions.membership` (a row of the study's annotators,
    the annotator role, an active account);
  * the study row: :func:`annotation.permissions.member_study` with
    :func:`annotation.assignment.queue.lease_state` (``mine_done`` and ``mine_reserved`` are
    the read model's :func:`annotation.verdicts.readmodel.assignment_counts`);
  * the submit row: :func:`annotation.permissions.writable_rows` with
    :func:`annotation.assignment.queue.submit_rows`.
``tests/unit/test_hot_rows.py`` compares both rows with the ORM's on generated studies
(members and not, inactive accounts, revoked roles, expired, live and released leases, gold,
revisions, tokens, drafts), on SQLite and PostgreSQL alike, so a change to a rule that the
SQL misses fails there.
"""

from __future__ import annotations

from functools import cache

from django.contrib.auth import get_user_model
from django.db import connection
from django.http import Http404
from django.utils import timezone

from annotation import roles
from annotation.models import Assignment, Draft, Judgement, RubricVersion, Study, StudyItem
from annotation.permissions import writable
from config.limits import INT_MAX, INT_MIN
from retrieval.models import Query

#: The annotations of the row, in the order the statement selects them.
EXTRA = (
    "is_annotator",
    "has_expired",
    "n_gold",
    "mine_position",
    "mine_served",
    "mine_gold",
    "mine_done",
    "mine_reserved",
)


def _columns(model, alias: str) -> str:
    q = connection.ops.quote_name
    return ", ".join(f"{alias}.{q(f.column)}" for f in model._meta.concrete_fields)


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _membership(study_column: str) -> str:
    """``EXISTS``: a row of the study's annotators for the user and the annotator role
    (:func:`annotation.permissions.membership`; the account's being active is checked on the
    user object, as there). Parameters: user, user, group name."""
    user_groups = get_user_model().groups.through
    group = user_groups._meta.get_field("group").related_model
    return (
        f"EXISTS(SELECT 1 FROM {_table(Study.annotators.through)} m WHERE m.study_id = {study_column}"
        f" AND m.user_id = %s AND EXISTS(SELECT 1 FROM {_table(user_groups)} ug"
        f" INNER JOIN {_table(group)} g ON ug.group_id = g.id WHERE ug.user_id = %s AND g.name = %s))"
    )


@cache
def _statement() -> str:
    """The statement (made once per process; tables and columns from the models' meta).
    Parameters, in order: user (membership), user and group name (role), RESERVED and now
    (expired leases), then RELEASED x2, DONE, RESERVED, now, study, user (the caller's
    counts), then the study."""
    return (
        f"SELECT {_columns(Study, 's')}, {_columns(RubricVersion, 'r')}, "
        f"{_membership('s.id')}, "
        # has_expired (queue.lease_state): a reserved assignment whose lease ran out
        f"EXISTS(SELECT 1 FROM {_table(Assignment)} x WHERE x.study_id = s.id AND x.status = %s"
        f" AND x.lease_expires <= %s), "
        # n_gold: on the partial index studyitem_gold
        f"(SELECT COUNT(*) FROM {_table(StudyItem)} gi WHERE gi.study_id = s.id AND gi.gold), "
        # the caller's counts (queue._mine_aggregates; done/reserved: readmodel.assignment_counts)
        "mine.position, mine.served, mine.gold, mine.done, mine.reserved "
        f"FROM {_table(Study)} s INNER JOIN {_table(RubricVersion)} r ON s.rubric_id = r.id "
        "CROSS JOIN (SELECT MAX(a.position) AS position,"
        " COUNT(CASE WHEN a.status <> %s THEN 1 END) AS served,"
        " COUNT(CASE WHEN a.status <> %s AND i.gold THEN 1 END) AS gold,"
        " COUNT(CASE WHEN a.status = %s THEN 1 END) AS done,"
        " COUNT(CASE WHEN a.status = %s AND a.lease_expires > %s THEN 1 END) AS reserved"
        f" FROM {_table(Assignment)} a INNER JOIN {_table(StudyItem)} i ON a.item_id = i.id"
        " WHERE a.study_id = %s AND a.annotator_id = %s) mine "
        "WHERE s.id = %s"
    )


@cache
def _converters(model) -> tuple:
    """Per concrete field, the converters the ORM applies to a value read from the database
    (the backend's, then the field's ``from_db_value``), as ``SQLCompiler.get_converters``."""
    out = []
    for f in model._meta.concrete_fields:
        col = f.get_col(model._meta.db_table)
        out.append((col, tuple(connection.ops.get_db_converters(col) + f.get_db_converters(connection))))
    return tuple(out)


def _instance(model, values):
    converted = []
    for value, (col, converters) in zip(values, _converters(model)):
        for convert in converters:
            value = convert(value, col, connection)
        converted.append(value)
    return model.from_db(connection.alias, None, converted)


def _instances(row, *models) -> list:
    """``row`` cut into one instance per model (its concrete fields, in order) and the rest."""
    out, at = [], 0
    for model in models:
        n = len(model._meta.concrete_fields)
        out.append(_instance(model, row[at : at + n]))
        at += n
    return [*out, row[at:]]


def _storable(key: int) -> bool:
    """Whether ``key`` fits a 64-bit key column: a URL's id of 5,000 digits is no study, and
    SQLite's driver refuses it as a parameter (OverflowError) where the ORM's query is never run."""
    return INT_MIN <= int(key) <= INT_MAX


def study_row(user, study_id: int, now=None) -> Study | None:
    """The study ``study_id`` with its rubric and the annotations of :data:`EXTRA` for
    ``user`` at ``now`` (``is_annotator`` and ``has_expired`` as bools, counts as ints or
    None where the ORM gives None), and ``mine_user``; None if there is no such study."""
    if not _storable(study_id):  # no row has it; the database would refuse the parameter
        return None
    now = now or timezone.now()
    at = connection.ops.adapt_datetimefield_value(now)
    reserved, released, done = Assignment.Status.RESERVED, Assignment.Status.RELEASED, Assignment.Status.DONE
    params = [
        user.pk,
        user.pk,
        roles.ANNOTATOR,
        reserved,
        at,
        released,
        released,
        done,
        reserved,
        at,
        study_id,
        user.pk,
        study_id,
    ]
    with connection.cursor() as cursor:
        cursor.execute(_statement(), params)
        row = cursor.fetchone()
    if row is None:
        return None
    n_study, n_rubric = len(Study._meta.concrete_fields), len(RubricVersion._meta.concrete_fields)
    study = _instance(Study, row[:n_study])
    study.rubric = _instance(RubricVersion, row[n_study : n_study + n_rubric])
    extra = dict(zip(EXTRA, row[n_study + n_rubric :]))
    extra["is_annotator"] = bool(extra["is_annotator"]) and user.is_active
    extra["has_expired"] = bool(extra["has_expired"])
    # no assignment yet: the ORM's per-annotator subqueries give no row (None), as here MAX does
    if extra["mine_position"] is None:
        extra.update(mine_served=None, mine_gold=None, mine_done=None, mine_reserved=None)
    for name, value in extra.items():
        setattr(study, name, value)
    study.mine_user = user.pk
    return study


def study_for_next(user, study_id: int, now=None) -> Study:
    """:func:`study_row`, with :func:`annotation.permissions.member_study`'s access rule: 404
    unless the user annotates in the study or is staff, so ids leak nothing."""
    study = study_row(user, study_id, now)
    if study is None or not (study.is_annotator or roles.is_admin(user)):
        raise Http404("no such study")
    return study


#: The annotations of the submit row, in the order its statement selects them.
SUBMIT_EXTRA = ("is_member", "current_id", "current_revision", "current_late", "token_id", "has_draft")
SUBMIT_MODELS = (Assignment, Study, RubricVersion, StudyItem, Query, get_user_model())


@cache
def _submit_statement(with_token: bool, lock: bool) -> str:
    """Parameters: user, user, group name (membership), the token (``with_token``), the
    assignment and the user. ``lock``: ``FOR UPDATE OF`` the assignment (where supported)."""
    user = get_user_model()
    current = f"SELECT {{}} FROM {_table(Judgement)} j WHERE j.assignment_id = a.id AND j.is_current"
    # queue.submit_rows: the row stored with the token (no token: none, as client_token=None finds none)
    token = (
        f"(SELECT t.id FROM {_table(Judgement)} t WHERE t.assignment_id = a.id AND t.client_token = %s)"
        if with_token
        else "NULL"
    )
    sql = (
        f"SELECT {_columns(Assignment, 'a')}, {_columns(Study, 's')}, {_columns(RubricVersion, 'r')}, "
        f"{_columns(StudyItem, 'i')}, {_columns(Query, 'q')}, {_columns(user, 'u')}, "
        f"{_membership('a.study_id')}, "
        f"({current.format('j.id')}), ({current.format('j.revision')}), ({current.format('j.late')}), {token}, "
        f"EXISTS(SELECT 1 FROM {_table(Draft)} d WHERE d.assignment_id = a.id) "
        f"FROM {_table(Assignment)} a INNER JOIN {_table(Study)} s ON a.study_id = s.id"
        f" INNER JOIN {_table(RubricVersion)} r ON s.rubric_id = r.id"
        f" INNER JOIN {_table(StudyItem)} i ON a.item_id = i.id INNER JOIN {_table(Query)} q ON i.query_id = q.id"
        f" INNER JOIN {_table(user)} u ON a.annotator_id = u.id "
        "WHERE a.id = %s AND a.annotator_id = %s"
    )
    if lock and connection.features.has_select_for_update_of:
        sql += " FOR UPDATE OF a"
    elif lock and connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    return sql


def assignment_row(user, assignment_id: int, client_token: str = "", lock: bool = True) -> Assignment | None:
    """The user's assignment ``assignment_id`` as a submit reads it (locked unless ``lock`` is
    false), with its study and rubric, item and query, annotator, and the annotations of
    :data:`SUBMIT_EXTRA` (``is_member``, ``current_late`` and ``has_draft`` as bools); None
    if it is not theirs or does not exist."""
    if not _storable(assignment_id):
        return None
    params = [user.pk, user.pk, roles.ANNOTATOR, *([client_token] if client_token else []), assignment_id, user.pk]
    with connection.cursor() as cursor:
        cursor.execute(_submit_statement(bool(client_token), lock), params)
        row = cursor.fetchone()
    if row is None:
        return None
    a, study, rubric, item, query, annotator, rest = _instances(row, *SUBMIT_MODELS)
    study.rubric, item.query = rubric, query
    a.study, a.item, a.annotator = study, item, annotator
    extra = dict(zip(SUBMIT_EXTRA, rest))
    extra["is_member"] = bool(extra["is_member"]) and user.is_active
    extra["has_draft"] = bool(extra["has_draft"])
    if extra["current_late"] is not None:
        extra["current_late"] = bool(extra["current_late"])
    for name, value in extra.items():
        setattr(a, name, value)
    return a


def submit_row(user, assignment_id: int, client_token: str = "") -> Assignment:
    """:func:`assignment_row`, locked, with :func:`annotation.permissions.writable_assignment`'s
    access rule (:func:`annotation.permissions.writable`): 404 for someone else's, 403 with the
    reason once access has ended."""
    return writable(assignment_row(user, assignment_id, client_token))
