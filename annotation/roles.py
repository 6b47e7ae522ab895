"""The roles live in ``config.roles`` (every app checks them); re-exported here."""

from config.roles import (  # noqa: F401
    ADMIN,
    ANNOTATOR,
    RESEARCHER,
    ROLES,
    has_role,
    is_admin,
    is_annotator,
    is_researcher,
    roles_context,
)

__all__ = [
    "ADMIN",
    "ANNOTATOR",
    "RESEARCHER",
    "ROLES",
    "has_role",
    "is_admin",
    "is_annotator",
    "is_researcher",
    "roles_context",
]
