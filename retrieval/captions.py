"""How a turn's several captions become the one text a retriever encodes (pure).

FashionIQ (and Multi-turn FashionIQ) give two captions per triplet, written by two
annotators. The protocols join them differently, which changes the text embeddings (not the
metrics' definitions):

* ``cirval`` (the default everywhere in CIRVal): each caption stripped of surrounding white
  space, empty ones left out, the rest joined with ``" and "`` in file order, case and
  punctuation kept ("is red and has long sleeves.").
* ``clip4cir``: CLIP4Cir's validation text (ABaldrati/CLIP4Cir, ``src/validate.py``,
  ``generate_fiq_val_predictions``): each caption stripped of the characters ``.?,`` and
  spaces at both ends, the first one capitalised as Python's ``str.capitalize`` does (its first
  letter upper case, every other letter lower case), joined with ``" and "``; empty captions
  are kept, as there ("Is red and ").

Single-caption turns (CIRR, CIRCO, LaSCo, CIRCLED, M-BEIR) are the caption itself under
``cirval`` and are capitalised and stripped under ``clip4cir``; the option is meant for
FashionIQ. ``manage.py run_audit --caption-join clip4cir`` audits with CLIP4Cir's texts.
"""

from __future__ import annotations

from collections.abc import Sequence

CAPTION_JOINS: dict[str, str] = {
    "cirval": "captions stripped of white space, empty ones dropped, joined with ' and '",
    "clip4cir": "CLIP4Cir's: '.?, ' stripped from each, the first capitalised, joined with ' and '",
}
DEFAULT_JOIN = "cirval"


def join_captions(captions: Sequence[str], style: str = DEFAULT_JOIN) -> str:
    """The one text of ``captions`` under ``style`` (a key of :data:`CAPTION_JOINS`)."""
    if style == "cirval":
        return " and ".join(c.strip() for c in captions if c and c.strip())
    if style == "clip4cir":
        parts = [(c or "").strip(".?, ") for c in captions]
        if parts:
            parts[0] = parts[0].capitalize()
        return " and ".join(parts)
    raise ValueError(f"unknown caption join {style!r}; expected one of {', '.join(CAPTION_JOINS)}")


#: How a composed query whose text is blank (CIRR test1's pairid 27098: ``' '``) is ranked.
#: CIRVal's retrievers are the CLIP family (open_clip dual encoders: the query is the normalised
#: sum of the normalised image and text embeddings), whose tokenizer reads a blank text as its
#: start and end tokens only; the benchmarks' own test scripts (CLIP4Cir's CIRR test
#: predictions) encode such a caption as it is. A ranking that must cover every query (a
#: server's prediction file) ranks it so; the audit, which labels queries, leaves it out.
BLANK_TEXT_RULE = (
    "ranked with the empty text: the reference image composed with the text encoder's "
    "embedding of an empty text (start and end tokens only), as the CIRR test scripts rank it"
)


def ranking_text(text: str, blank_ok: bool = False) -> str | None:
    """The text a composed (image + text) query of text ``text`` encodes: the text; a blank
    one as the empty text when ``blank_ok`` (:data:`BLANK_TEXT_RULE`), else ``None`` (the
    query is not ranked). Every on-demand ranking asks this."""
    if text.strip():
        return text
    return "" if blank_ok else None
