"""retrieval.captions: CIRVal's caption join and CLIP4Cir's, on the real FashionIQ samples."""

from __future__ import annotations

import json

import pytest

from retrieval.captions import CAPTION_JOINS, join_captions
from tests.conftest import FIXTURES, SHARED
from tests.reference_impl import clip4cir_fiq_text

FILES = [
    root / "fashioniq" / f"cap.{c}.val.sample.json"
    for root in (FIXTURES / "datasets", SHARED / "reference" / "datasets")
    for c in ("dress", "shirt", "toptee")
]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parents[1].name}-{p.name}")
def test_clip4cir_join_equals_clip4cirs_validation_text(path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is not here")
    records = json.loads(path.read_text())
    differ = 0
    for r in records:
        assert join_captions(r["captions"], "clip4cir") == clip4cir_fiq_text(r["captions"])
        differ += join_captions(r["captions"]) != join_captions(r["captions"], "clip4cir")
    assert differ > 0  # the choice changes the encoded text of real records


def test_cirval_join_by_hand() -> None:
    assert join_captions([" is red ", "", "has long sleeves."]) == "is red and has long sleeves."
    assert join_captions(["is RED.", " has sleeves?"], "clip4cir") == "Is red and has sleeves"
    assert join_captions(["is red", ""], "clip4cir") == "Is red and "  # CLIP4Cir keeps an empty caption
    assert join_captions([]) == "" and join_captions(["only"], "clip4cir") == "Only"
    assert set(CAPTION_JOINS) == {"cirval", "clip4cir"}
    with pytest.raises(ValueError, match="unknown caption join 'x'"):
        join_captions(["a"], "x")
