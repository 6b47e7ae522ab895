"""The payload's image URLs are what ``reverse`` gives, under any script prefix."""

from __future__ import annotations

from django.urls import clear_script_prefix, reverse, set_script_prefix

from annotation.judging.payloads import image_url


def test_image_url_matches_reverse_for_any_id():
    for pk in (1, 7, 10, 987654320, 123456789012):
        assert image_url(pk) == reverse("retrieval:image", args=[pk])


def test_image_url_follows_the_script_prefix():
    try:
        set_script_prefix("/cirval/")
        assert image_url(42) == reverse("retrieval:image", args=[42])
        assert image_url(42).startswith("/cirval/")
    finally:
        clear_script_prefix()
    assert image_url(42) == reverse("retrieval:image", args=[42])
    assert not image_url(42).startswith("/cirval/")
