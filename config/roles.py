"""The three roles of CIRVal, kept as Django groups, and small helpers to test them.

Admins are staff users (they may also be in the "admin" group); annotators and
researchers are plain users in their group.
"""

from __future__ import annotations

from functools import wraps

from django.core.exceptions import PermissionDenied

ANNOTATOR = "annotator"
RESEARCHER = "researcher"
ADMIN = "admin"
ROLES = (ANNOTATOR, RESEARCHER, ADMIN)


def has_role(user, role: str) -> bool:
    if not getattr(user, "is_authenticated", False):
        return False
    if role == ADMIN:
        return bool(user.is_staff)
    cache = getattr(user, "_cirval_groups", None)
    if cache is None:
        cache = set(user.groups.values_list("name", flat=True))
        user._cirval_groups = cache
    return role in cache


def is_admin(user) -> bool:
    return has_role(user, ADMIN)


def is_researcher(user) -> bool:
    return has_role(user, RESEARCHER) or is_admin(user)


def is_annotator(user) -> bool:
    return has_role(user, ANNOTATOR)


def _require(test, message: str):
    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not test(request.user):
                raise PermissionDenied(message)
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


# Logged-in users without the role get 403 (anonymous users never get this far: the
# login middleware sends them to the login page).
researcher_required = _require(is_researcher, "Only researchers and staff may see this page.")
staff_required = _require(is_admin, "Only staff may do this.")


def roles_context(request) -> dict:
    """Template context: which role-specific navigation a user sees."""
    user = getattr(request, "user", None)
    return {
        "cirval_is_admin": is_admin(user),
        "cirval_is_researcher": is_researcher(user),
        "cirval_is_annotator": is_annotator(user),
    }
