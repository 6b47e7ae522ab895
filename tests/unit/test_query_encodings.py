"""encode_queries off the late path (early fusion, or CIRCUS's modality rule): three cached
whole-query passes, an unreadable reference dropped from all three, nothing encoded twice."""

from __future__ import annotations

from PIL import Image

from audit.runs.encoding import encode_queries, multimodal_queries
from retrieval.embcache import EmbeddingCache
from tests.plugins.lab_kind import LabRetriever


class Early(LabRetriever):
    modality_rule = "family"


def test_three_passes_cached_and_an_unreadable_reference_dropped(tmp_path):
    for n in range(3):
        Image.new("RGB", (20, 20), (60 * n, 0, 0)).save(tmp_path / f"{n}.png")
    (tmp_path / "3.png").write_bytes(b"not an image")
    r = Early("lab:toy@1", 1)
    cache = EmbeddingCache(tmp_path / "cache", r.spec, r.dim)
    keys, texts = ["0", "1", "3", "2"], ["a", "b", "c", "a"]
    locate = lambda key: tmp_path / f"{key}.png"  # noqa: E731
    first = encode_queries(r, cache, keys, texts, locate)
    assert first.img.ok == [True, True, False, True] and set(first.img.unreadable) == {"3"}
    assert [e.matrix.shape[0] for e in (first.mm, first.txt, first.img)] == [3, 3, 3]
    assert (first.mm.encoded, first.txt.encoded, first.img.encoded) == (3, 3, 3)  # 'a' alone once
    want = r.embed_queries([Image.open(tmp_path / "1.png"), None, Image.open(tmp_path / "1.png")], ["b", "b", None])
    assert abs(first.mm.matrix[1] - want[0]).max() < 1e-6 and abs(first.img.matrix[1] - want[2]).max() < 1e-6
    calls = r.calls
    again = encode_queries(r, cache, keys, texts, locate)
    assert (again.mm.encoded, again.txt.encoded, again.img.encoded) == (0, 0, 0) and r.calls == calls
    ok, mm = multimodal_queries(r, cache, keys, texts, locate)
    assert ok == [True, True, False, True] and (mm - first.mm.matrix).abs().max() == 0
    r.modality_rule = "circus"  # a black image with the text, the image with the empty text: new queries
    circus = encode_queries(r, cache, keys, texts, locate)
    assert (circus.mm.encoded, circus.txt.encoded, circus.img.encoded) == (0, 3, 3)
