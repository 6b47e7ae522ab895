"""An audit with ``caption_join="clip4cir"`` encodes CLIP4Cir's texts (retrieval.captions), through
the real eager audit path with a tiny retriever."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from audit.runs import dispatch, encoding, planning
from audit.runs.encoding import clear_memos
from retrieval.captions import join_captions
from retrieval.demo import build_demo
from retrieval.loader import load_parsed
from retrieval.models import Dataset, Turn, turn_captions

pytestmark = pytest.mark.django_db


def test_the_audit_encodes_the_chosen_join(tmp_path, settings, monkeypatch) -> None:
    settings.EMBEDDING_CACHE_DIR = tmp_path / "embeddings"
    root = tmp_path / "demo"
    load_parsed(build_demo(root, n_gallery=24, n_single=4, n_sessions=0), "demo", images_root=root)
    clear_memos()
    seen: list[str] = []
    real = encoding.encode_texts

    def spy(retriever, cache, texts, *args, **kwargs):
        seen.extend(texts)
        return real(retriever, cache, texts, *args, **kwargs)

    monkeypatch.setattr(encoding, "encode_texts", spy)
    dataset = Dataset.objects.get(name="demo")
    run = dispatch.run_inline(planning.create_run(dataset, ["openclip:cirval-tiny-vit"], caption_join="clip4cir"))
    assert run.status == "done", run.error
    assert run.caption_join == "clip4cir"
    captions = [turn_captions(t.texts) for t in Turn.objects.filter(query__dataset=dataset, index=1)]
    expected = {join_captions(c, "clip4cir") for c in captions}
    assert expected and expected <= set(seen)
    assert expected != {join_captions(c) for c in captions}  # the demo's captions change under CLIP4Cir's join
    clear_memos()
    with pytest.raises(CommandError, match="invalid choice: 'x'"):
        call_command("run_audit", "--dataset", "demo", "--retriever", "openclip:cirval-tiny-vit", "--caption-join", "x")
