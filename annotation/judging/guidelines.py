"""A study's guidelines: Markdown, sanitised to a small HTML subset, versioned with the rubric."""

from __future__ import annotations

from dataclasses import dataclass

import markdown
import nh3
from django.db import transaction
from django.db.models import Max
from django.utils.safestring import SafeString, mark_safe

from annotation.models import GuidelinesVersion, Study

TAGS = {
    "a",
    "blockquote",
    "br",
    "code",
    "em",
    "figcaption",
    "figure",
    "h1",
    "h2",
    "h3",
    "h4",
    "hr",
    "img",
    "li",
    "ol",
    "p",
    "pre",
    "strong",
    "table",
    "tbody",
    "td",
    "th",
    "thead",
    "tr",
    "ul",
}
ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title", "width", "height"}}


def render_markdown(text: str) -> SafeString:
    """Markdown to HTML, then sanitised (no script, no inline handler or style, http(s) and
    relative links only): guidelines are written by staff but shown to everyone."""
    html = markdown.markdown(text or "", extensions=["tables", "sane_lists"], output_format="html")
    return mark_safe(
        nh3.clean(html, tags=TAGS, attributes=ATTRIBUTES, url_schemes={"http", "https"}, link_rel="noopener noreferrer")
    )


@dataclass(frozen=True)
class Guidelines:
    version: int
    rubric: str
    text: str

    @property
    def html(self) -> SafeString:
        return render_markdown(self.text)


def save_guidelines(study: Study, text: str, user=None) -> GuidelinesVersion | None:
    """Store a new version when the text changed (the study keeps the current text); None when
    it did not: the text of the newest version, or with none yet the text written at the
    study's creation (version 0), is kept as it is."""
    text = (text or "").replace("\r\n", "\n")
    with transaction.atomic():
        last = GuidelinesVersion.objects.filter(study=study).order_by("-version").first()
        if last is not None and last.text == text and last.rubric_id == study.rubric_id:
            return None
        if last is None and text == (study.guidelines or "").replace("\r\n", "\n"):
            return None
        number = (GuidelinesVersion.objects.filter(study=study).aggregate(m=Max("version"))["m"] or 0) + 1
        study.guidelines = text
        study.save(update_fields=["guidelines"])
        return GuidelinesVersion.objects.create(
            study=study, rubric_id=study.rubric_id, version=number, text=text, created_by=user
        )


def current_guidelines(study: Study) -> Guidelines | None:
    """The text annotators see now, with its version (version 0: written at creation)."""
    if not study.guidelines.strip():
        return None
    last = GuidelinesVersion.objects.filter(study=study).order_by("-version").first()
    version = last.version if last is not None and last.text == study.guidelines else 0
    return Guidelines(version, str(study.rubric), study.guidelines)
