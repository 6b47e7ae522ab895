"""Demo accounts: one admin, three annotators, one researcher."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from annotation import roles

DEMO_ACCOUNTS = [
    # (username, password, role)
    ("admin", "admin-demo", roles.ADMIN),
    ("annotator1", "annotator1-demo", roles.ANNOTATOR),
    ("annotator2", "annotator2-demo", roles.ANNOTATOR),
    ("annotator3", "annotator3-demo", roles.ANNOTATOR),
    ("researcher", "researcher-demo", roles.RESEARCHER),
]


def ensure_demo_accounts() -> list[tuple[str, str, str]]:
    """Create or reset the demo accounts; returns (username, password, role) rows."""
    User = get_user_model()
    for username, password, role in DEMO_ACCOUNTS:
        user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@demo.invalid"})
        user.set_password(password)
        user.is_staff = role == roles.ADMIN
        user.is_superuser = role == roles.ADMIN
        user.save()
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    return list(DEMO_ACCOUNTS)
