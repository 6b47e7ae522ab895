"""The rows every annotation request reads, each by one explicit SQL statement.

"Next item" reads the study with what the engine needs to decide without further queries:
whether the caller annotates in it, whether any lease of the study has expired, its number
of gold items and the caller's own counts (:func:`study_row`), then the few items it chooses
from, locked, with their query, dataset and first turn, the caller's earlier assignment and
the items still open to them (:func:`candidate_rows`). A submit reads the caller's
assignment, locked, with its study, rubric, item, query and annotator, whether the caller
still annotates in the study, the current revision, the row stored with the client token
and whether a draft exists (:func:`submit_row`). Built as ORM querysets, with their
``Exists``/``Subquery`` annotations, building and compiling them cost 4-5 ms of CPU per
request for each of the first two and about a quarter of the web tier's CPU under load for
the candidates, many times what running them costs (docs/benchmarks/load.md, "Web tier CPU
per request"). This module writes them as SQL once (:mod:`config.sql_rows` makes the
instances, with the ORM's converters).

The rules they read are those of the ORM, which stay their definition:
  * membership: :func:`annotation.permissions.membership` (a row of the study's annotators,
    the annotator role, an active account);
  * the study row: :func:`annotation.permissions.member_study` with
    :func:`annotation.assignment.queue.lease_state` (``mine_done`` and ``mine_reserved`` are
    the read model's :func:`annotation.verdicts.readmodel.assignment_counts`);
  * the candidates: :func:`annotation.assignment.queue.candidate_query` (the served pool, the
    free slots of :func:`annotation.verdicts.state.free_slot_q`, the queue order, and
    :func:`annotation.verdicts.state.open_left`), with the rule values the queue passes in;
  * the submit row: :func:`annotation.permissions.writable_rows` with
    :func:`annotation.assignment.queue.submit_rows`.
``tests/unit/test_hot_rows.py`` compares each with the ORM's on generated studies
(members and not, inactive accounts, revoked roles, expired, live and released leases, gold,
revisions, tokens, drafts, finished and held items, panels waiting, serve orders, adaptive
slots, a stopped estimate), on SQLite and PostgreSQL alike, so a change to a rule that the
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
from config.limits import fits_int64
from config.sql_rows import columns, instances, table
from config.sql_rows import values as sql_values
from retrieval.models import Dataset, Query, Turn

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


def _membership(study_column: str) -> str:
    """``EXISTS``: a row of the study's annotators for the user and the annotator role
    (:func:`annotation.permissions.membership`; the account's being active is checked on the
    user object, as there). Parameters: user, user, group name."""
    user_groups = get_user_model().groups.through
    group = user_groups._meta.get_field("group").related_model
    return (
        f"EXISTS(SELECT 1 FROM {table(Study.annotators.through)} m WHERE m.study_id = {study_column}"
        f" AND m.user_id = %s AND EXISTS(SELECT 1 FROM {table(user_groups)} ug"
        f" INNER JOIN {table(group)} g ON ug.group_id = g.id WHERE ug.user_id = %s AND g.name = %s))"
    )


@cache
def _statement() -> str:
    """The statement (made once per process; tables and columns from the models' meta).
    Parameters, in order: user (membership), user and group name (role), RESERVED and now
    (expired leases), then RELEASED x2, DONE, RESERVED, now, study, user (the caller's
    counts), then the study."""
    return (
        f"SELECT {columns(Study, 's')}, {columns(RubricVersion, 'r')}, "
        f"{_membership('s.id')}, "
        # has_expired (queue.lease_state): a reserved assignment whose lease ran out
        f"EXISTS(SELECT 1 FROM {table(Assignment)} x WHERE x.study_id = s.id AND x.status = %s"
        f" AND x.lease_expires <= %s), "
        # n_gold: on the partial index studyitem_gold
        f"(SELECT COUNT(*) FROM {table(StudyItem)} gi WHERE gi.study_id = s.id AND gi.gold), "
        # the caller's counts (queue._mine_aggregates; done/reserved: readmodel.assignment_counts)
        "mine.position, mine.served, mine.gold, mine.done, mine.reserved "
        f"FROM {table(Study)} s INNER JOIN {table(RubricVersion)} r ON s.rubric_id = r.id "
        "CROSS JOIN (SELECT MAX(a.position) AS position,"
        " COUNT(CASE WHEN a.status <> %s THEN 1 END) AS served,"
        " COUNT(CASE WHEN a.status <> %s AND i.gold THEN 1 END) AS gold,"
        " COUNT(CASE WHEN a.status = %s THEN 1 END) AS done,"
        " COUNT(CASE WHEN a.status = %s AND a.lease_expires > %s THEN 1 END) AS reserved"
        f" FROM {table(Assignment)} a INNER JOIN {table(StudyItem)} i ON a.item_id = i.id"
        " WHERE a.study_id = %s AND a.annotator_id = %s) mine "
        "WHERE s.id = %s"
    )


def _storable(key: int) -> bool:
    """Whether ``key`` fits a 64-bit key column: a URL's id of 5,000 digits is no study, and
    SQLite's driver refuses it as a parameter (OverflowError) where the ORM's query is never run."""
    return fits_int64(int(key))


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
    study, rubric, rest = instances(row, Study, RubricVersion)
    study.rubric = rubric
    extra = dict(zip(EXTRA, rest))
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
    current = f"SELECT {{}} FROM {table(Judgement)} j WHERE j.assignment_id = a.id AND j.is_current"
    # queue.submit_rows: the row stored with the token (no token: none, as client_token=None finds none)
    token = (
        f"(SELECT t.id FROM {table(Judgement)} t WHERE t.assignment_id = a.id AND t.client_token = %s)"
        if with_token
        else "NULL"
    )
    sql = (
        f"SELECT {columns(Assignment, 'a')}, {columns(Study, 's')}, {columns(RubricVersion, 'r')}, "
        f"{columns(StudyItem, 'i')}, {columns(Query, 'q')}, {columns(user, 'u')}, "
        f"{_membership('a.study_id')}, "
        f"({current.format('j.id')}), ({current.format('j.revision')}), ({current.format('j.late')}), {token}, "
        f"EXISTS(SELECT 1 FROM {table(Draft)} d WHERE d.assignment_id = a.id) "
        f"FROM {table(Assignment)} a INNER JOIN {table(Study)} s ON a.study_id = s.id"
        f" INNER JOIN {table(RubricVersion)} r ON s.rubric_id = r.id"
        f" INNER JOIN {table(StudyItem)} i ON a.item_id = i.id INNER JOIN {table(Query)} q ON i.query_id = q.id"
        f" INNER JOIN {table(user)} u ON a.annotator_id = u.id "
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
    a, study, rubric, item, query, annotator, rest = instances(row, *SUBMIT_MODELS)
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


# --------------------------------------------------------------------------- next item's candidates

#: The first turn's columns read with an item for serving (``turn1_<column>``): a single-turn
#: item's payload then needs no query of its own for its turn
#: (:func:`annotation.judging.payloads.item_payload`).
TURN1_COLUMNS = ("id", "texts", "reference_image_id", "turn_target_id", "provenance")
#: Rows "next item" locks per request: enough to step around a few racing annotators.
CANDIDATES = 8


def _order_by(fields: tuple[str, ...]) -> str:
    """``ORDER BY`` of StudyItem ordering fields (``-`` for descending), on the alias ``i``."""
    q = connection.ops.quote_name
    out = []
    for name in fields:
        column = q(StudyItem._meta.get_field(name.lstrip("-")).column)
        out.append(f"i.{column} DESC" if name.startswith("-") else f"i.{column} ASC")
    return ", ".join(out)


def _open_left_sql() -> str:
    """The items still open to the user (:func:`annotation.verdicts.state.open_to`: not gold,
    a slot free under the quorum rule or held by them now, not done by them), counted up to
    a limit (:func:`annotation.verdicts.state.open_left`). Parameters: study, agreement slots,
    slots, study, user, RESERVED, now, study, user, DONE, limit."""
    a = table(Assignment)
    return (
        f"(SELECT COUNT(*) FROM (SELECT o.id FROM {table(StudyItem)} o WHERE o.study_id = %s AND NOT o.gold"
        " AND ((o.agreement AND o.taken < %s) OR (NOT o.agreement AND o.taken < o.extra_slots + %s)"
        f" OR o.id IN (SELECT h.item_id FROM {a} h WHERE h.study_id = %s AND h.annotator_id = %s"
        " AND h.status = %s AND h.lease_expires > %s))"
        f" AND o.id NOT IN (SELECT x.item_id FROM {a} x WHERE x.study_id = %s AND x.annotator_id = %s"
        " AND x.status = %s) LIMIT %s) open_left)"
    )


@cache
def _candidate_statement(order: tuple[str, ...], panels: bool, stopped: bool) -> str:
    """The statement of :func:`candidate_rows` (made once per process and variant). Parameters:
    user (earlier), :func:`_open_left_sql`'s, study, study, user, RELEASED, slots, limit."""
    q = connection.ops.quote_name
    turn = columns(Turn, "t", TURN1_COLUMNS)
    sql = (
        f"SELECT {columns(StudyItem, 'i')}, {columns(Query, 'q')}, {columns(Dataset, 'd')}, {turn}, "
        f"(SELECT e.id FROM {table(Assignment)} e WHERE e.item_id = i.id AND e.annotator_id = %s LIMIT 1), "
        f"{_open_left_sql()} "
        f"FROM {table(StudyItem)} i INNER JOIN {table(Query)} q ON i.query_id = q.id"
        f" INNER JOIN {table(Dataset)} d ON q.dataset_id = d.id"
        f" LEFT OUTER JOIN {table(Turn)} t ON t.query_id = q.id AND t.{q(Turn._meta.get_field('index').column)} = 1 "
        "WHERE i.study_id = %s AND NOT i.gold"
        + (" AND NOT (q.n_turns = 1 AND i.candidates_source = '')" if panels else "")
        + (" AND i.taken > 0" if stopped else "")
        + f" AND i.id NOT IN (SELECT m.item_id FROM {table(Assignment)} m WHERE m.study_id = %s"
        " AND m.annotator_id = %s AND NOT (m.status = %s))"
        " AND (i.agreement OR (NOT i.agreement AND i.taken < i.extra_slots + %s))"
        f" ORDER BY {_order_by(order)} LIMIT %s"
    )
    if connection.features.has_select_for_update_skip_locked and connection.features.has_select_for_update_of:
        sql += " FOR UPDATE OF i SKIP LOCKED"
    return sql


def candidate_rows(study_id: int, user_id: int, now, rules: dict) -> list[StudyItem]:
    """Up to :data:`CANDIDATES` items "next item" chooses from, locked (rows racing requests
    hold are skipped), each with its query and dataset, ``earlier_id``, ``turn1_*`` and
    ``open_left``: the rows of :func:`annotation.assignment.queue.candidate_query`, whose
    queryset stays their definition (``tests/unit/test_hot_rows.py`` compares them). ``rules``:
    the study's ``order`` (queue fields), ``panels`` (items wait for their panel), ``stopped``
    (an estimate's stop rule was met), ``slots`` and ``agreement_slots`` (the quorum rule's,
    the second for the study's annotators) and ``left_limit`` (how far open_left counts)."""
    at = connection.ops.adapt_datetimefield_value(now)
    status = Assignment.Status
    params = [
        user_id,
        *(study_id, rules["agreement_slots"], rules["slots"], study_id, user_id, status.RESERVED, at),
        *(study_id, user_id, status.DONE, rules["left_limit"]),
        *(study_id, study_id, user_id, status.RELEASED, rules["slots"], CANDIDATES),
    ]
    with connection.cursor() as cursor:
        cursor.execute(_candidate_statement(tuple(rules["order"]), rules["panels"], rules["stopped"]), params)
        rows = cursor.fetchall()
    out = []
    for row in rows:
        item, query, dataset, rest = instances(row, StudyItem, Query, Dataset)
        query.dataset, item.query = dataset, query
        turn = rest[: len(TURN1_COLUMNS)]
        for name, value in zip(TURN1_COLUMNS, sql_values(Turn, turn, TURN1_COLUMNS)):
            setattr(item, f"turn1_{name}", value)
        item.earlier_id, item.open_left = rest[len(TURN1_COLUMNS) :]
        out.append(item)
    return out
