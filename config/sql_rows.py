"""Model instances from rows of an explicit SQL statement (the hot request paths' raw queries).

Where a profile shows that building and compiling a queryset costs a request more than
running it, the query is written once as SQL over the models' own tables and columns
(:func:`table`, :func:`columns`), and its rows become model instances here with the
converters the ORM itself applies (:func:`instance`, :func:`values`): the backend's, then
each field's ``from_db_value``, as ``SQLCompiler.get_converters`` does. The querysets stay
the definition of the rules; each raw statement has a test against its queryset.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from django.db import connection


def table(model) -> str:
    """The model's table, quoted."""
    return connection.ops.quote_name(model._meta.db_table)


def _fields(model, names: Sequence[str]) -> list:
    """The fields ``names`` of the model, or all its concrete fields in their order."""
    return [model._meta.get_field(n) for n in names] if names else list(model._meta.concrete_fields)


def columns(model, alias: str, names: Sequence[str] = ()) -> str:
    """``alias."column", ...`` of the model's concrete fields in their order (or of ``names``)."""
    q = connection.ops.quote_name
    return ", ".join(f"{alias}.{q(f.column)}" for f in _fields(model, names))


@cache
def _converters(model, names: tuple[str, ...]) -> tuple:
    out = []
    for f in _fields(model, names):
        col = f.get_col(model._meta.db_table)
        out.append((col, tuple(connection.ops.get_db_converters(col) + f.get_db_converters(connection))))
    return tuple(out)


def values(model, row: Sequence[Any], names: Sequence[str] = ()) -> list[Any]:
    """``row``'s values of the model's concrete fields (or of ``names``) as the ORM reads them."""
    out = []
    for value, (col, converters) in zip(row, _converters(model, tuple(names))):
        for convert in converters:
            value = convert(value, col, connection)
        out.append(value)
    return out


def instance(model, row: Sequence[Any]):
    """A model instance from ``row``: its concrete fields' values, in :func:`columns` order."""
    return model.from_db(connection.alias, None, values(model, row))


def instances(row: Sequence[Any], *models) -> list:
    """``row`` cut into one instance per model (its concrete fields, in order) and the rest."""
    out, at = [], 0
    for model in models:
        n = len(model._meta.concrete_fields)
        out.append(instance(model, row[at : at + n]))
        at += n
    return [*out, row[at:]]
