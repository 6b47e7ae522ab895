"""The README's retriever section says what the code does: its hf: family table is the one the
families module writes, and its plugin example, installed as a package with its entry point,
is a working retriever kind (issue 37 items 5 and 6)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from retrieval.retrievers import parse_spec
from retrieval.retrievers.hf import families
from tests.plugin_dist import forget_lab_kind, install_lab_plugin

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_hf_family_as_the_code_defines_it():
    assert families.markdown().rstrip("\n") in README.read_text()


def _example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    [example] = [b for b in blocks if "class LabKind(RetrieverKind)" in b]
    return example


@pytest.fixture
def readme_plugin(tmp_path, monkeypatch):
    package = tmp_path / "labretriever"
    package.mkdir()
    (package / "__init__.py").write_text(_example())
    forget_lab_kind()
    monkeypatch.syspath_prepend(str(install_lab_plugin(tmp_path, "labretriever:LabKind")))
    yield
    forget_lab_kind()
    sys.modules.pop("labretriever", None)


class _Model(torch.nn.Module):
    """Stands in for the lab's saved model: any callable of (images, texts) giving [N, 512]."""

    def forward(self, images, texts):
        return torch.stack(
            [torch.full((512,), 1.0 + (i is not None) + 2 * (t is not None)) for i, t in zip(images, texts)]
        )


def test_the_readme_plugin_example_is_a_working_kind(readme_plugin, monkeypatch):
    kind, parsed = parse_spec("lab:/models/lab.pt")
    assert kind.prefix == "lab" and kind.fusion(parsed) == "early"
    with pytest.raises(ValueError, match="expected lab:/path/to/model.pt"):
        parse_spec("lab:/models/lab.bin")
    monkeypatch.setattr(torch, "load", lambda path, **kw: _Model())
    retriever = kind.build(parsed, device="cpu", precision="fp32")
    out = retriever.embed_queries([None, None], ["a red dress", None])
    assert out.shape == (2, 512) and out.dtype == torch.float32
    assert torch.allclose(out.norm(dim=-1), torch.ones(2))
    assert retriever.embed_candidates([None]).shape == (1, 512)
    assert retriever.query_cache_key("sha", "text") != retriever.query_cache_key("sha", "other")
