"""Writing many result rows at once: COPY on PostgreSQL, ``bulk_create`` elsewhere.

Rows are write-once (a chunk's rank rows are the same whoever computes them), so a row
that already exists is kept: on PostgreSQL the rows are COPYed into a temporary table
and moved over with ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``; on SQLite
one prepared ``INSERT OR IGNORE`` (``bulk_create(ignore_conflicts=True)`` on other
databases). Call inside ``transaction.atomic()``.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any

from django.db import connection, models

#: bulk_create batch size (SQLite's bound-parameter limit allows a few thousand values).
BATCH = 1000


def _json_encoder() -> Any:
    """``json.dumps`` for the acyclic values of JSON fields: the C encoder that ``json.dumps``
    builds on every call, built once (the same text; 0.3 instead of 2 us for a short list),
    without the circular-reference check."""
    if c_make_encoder is None:  # no C accelerator: the plain function
        return json.dumps
    base = json.JSONEncoder()
    encode = c_make_encoder(
        None, base.default, encode_basestring_ascii, None, base.key_separator, base.item_separator, False, False, True
    )
    return lambda value: "".join(encode(value, 0))


_json_text = _json_encoder()


class JSONText(str):
    """A JSON field's value already written as JSON text (the text ``json.dumps`` gives):
    stored as it is. A top list of gallery ids, for example, joins ids written out once per
    gallery instead of formatting every int of every row again (most of a rank row's bytes)."""


def json_int_list(texts: Sequence[str], positions: Sequence[int]) -> JSONText:
    """The JSON text of ``[ids[p] for p in positions]``, where ``texts[p]`` is ``str(ids[p])``."""
    return JSONText("[" + ", ".join(map(texts.__getitem__, positions)) + "]")


def _stored_json(value: Any) -> Any:
    if value is None:
        return None
    return str(value) if type(value) is JSONText else _json_text(value)


_PLAIN = (models.IntegerField, models.CharField, models.TextField, models.FloatField, models.BooleanField)


def _converter(field: models.Field, from_dict: bool = False) -> Any:
    """``obj -> value to store`` for one field, chosen once per field (not per row); with
    ``from_dict`` the row is a dict of the model's attribute names (``run_id``, ``mm``, ...)."""
    get = operator.itemgetter(field.attname) if from_dict else operator.attrgetter(field.attname)
    if isinstance(field, models.JSONField):
        return lambda obj: _stored_json(get(obj))
    if isinstance(field, models.ForeignKey) or (isinstance(field, _PLAIN) and not isinstance(field, models.AutoField)):
        return get
    if from_dict:
        raise TypeError(f"{field.name}: write model instances, not dicts, when a field fills itself in on save")
    # what a save would store (auto fields such as auto_now filled in)
    return lambda obj: field.get_db_prep_save(field.pre_save(obj, True), connection)


def _values(fields: Sequence[models.Field], objs: Sequence[Any]) -> list[list[Any]]:
    """The stored values of each row: model instances, or dicts holding every field's value
    under its attribute name (no model instance built: ~10 us a row less)."""
    from_dict = bool(objs) and isinstance(objs[0], dict)
    convert = [_converter(f, from_dict) for f in fields]
    return [[c(obj) for c in convert] for obj in objs]


def copy_rows(model: type[models.Model], objs: Sequence[models.Model]) -> int:
    """COPY ``objs`` into ``model``'s table (PostgreSQL, psycopg 3), skipping existing rows."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    table = connection.ops.quote_name(model._meta.db_table)
    tmp = connection.ops.quote_name(f"_copy_{model._meta.db_table}")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {tmp}")
        cursor.execute(f"CREATE TEMP TABLE {tmp} ON COMMIT DROP AS SELECT {cols} FROM {table} WITH NO DATA")
        with cursor.cursor.copy(f"COPY {tmp} ({cols}) FROM STDIN") as copy:
            for row in _values(fields, objs):
                copy.write_row(row)
        cursor.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {tmp} ON CONFLICT DO NOTHING")
        written = cursor.rowcount
        cursor.execute(f"DROP TABLE {tmp}")
    return written


def sqlite_rows(model: type[models.Model], objs: Sequence[models.Model]) -> int:
    """One prepared ``INSERT OR IGNORE`` run over every row (SQLite): no per-row SQL compiling."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    marks = ", ".join("?" * len(fields))
    sql = f"INSERT OR IGNORE INTO {connection.ops.quote_name(model._meta.db_table)} ({cols}) VALUES ({marks})"
    with connection.cursor() as cursor:
        cursor.cursor.executemany(sql, _values(fields, objs))
        return cursor.cursor.rowcount


def insert_rows(model: type[models.Model], objs: Sequence[models.Model] | Sequence[dict[str, Any]]) -> None:
    """Write ``objs`` in bulk, keeping rows that already exist (see the module docstring).

    ``objs``: model instances, or dicts of every field's value by attribute name (see :func:`_values`)."""
    if not objs:
        return
    if isinstance(objs[0], dict) and connection.vendor not in ("postgresql", "sqlite"):
        objs = [model(**{k: json.loads(v) if type(v) is JSONText else v for k, v in row.items()}) for row in objs]
    if connection.vendor == "postgresql":
        copy_rows(model, objs)
    elif connection.vendor == "sqlite":
        sqlite_rows(model, objs)
    else:
        model.objects.bulk_create(objs, batch_size=BATCH, ignore_conflicts=True)
