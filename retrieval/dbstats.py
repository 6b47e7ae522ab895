"""Fresh planner statistics after a bulk write.

PostgreSQL plans from per-table statistics that autovacuum refreshes some time after a
table changes (and never where autovacuum is off). Until then a table that just gained
thousands of rows looks nearly empty, and the planner picks plans that read and sort every
row: the "next item" query of a 5,000-item study took 20-30 ms instead of 0.3 ms. Code that
bulk-creates rows a request will soon read calls :func:`refresh_statistics` afterwards;
``ANALYZE`` samples at most 30,000 rows per table, so this costs tens of milliseconds.
Other databases need nothing.
"""

from __future__ import annotations

from django.db import connection


def refresh_statistics(*models) -> None:
    """``ANALYZE`` the tables of ``models`` on PostgreSQL; nothing elsewhere."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
