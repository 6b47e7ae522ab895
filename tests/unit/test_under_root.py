"""UnderRoot resolves files under a root as resolve_under does (folders resolved once)."""

from __future__ import annotations

import os

import pytest

from retrieval.imagefiles import PathEscapeError, UnderRoot, resolve_under


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "imgs" / "sub").mkdir(parents=True)
    (root / "imgs" / "a.png").write_bytes(b"a")
    (root / "imgs" / "sub" / "b.png").write_bytes(b"b")
    (root / "top.png").write_bytes(b"t")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(b"s")
    os.symlink(root / "imgs" / "a.png", root / "imgs" / "link_in.png")  # a file link staying inside
    os.symlink(outside / "secret.png", root / "imgs" / "link_out.png")  # a file link leaving the root
    os.symlink(root / "imgs" / "sub", root / "alias")  # a folder link staying inside
    os.symlink(outside, root / "escape")  # a folder link leaving the root
    return root


GOOD = [
    "imgs/a.png",
    "imgs/sub/b.png",
    "top.png",
    "imgs/link_in.png",
    "alias/b.png",
    "imgs/missing.png",
    "./top.png",
    "imgs/sub/../a.png",
    "imgs//a.png",
    "nofolder/x.png",
    "imgs/..",
]
BAD = [
    "imgs/link_out.png",
    "escape/secret.png",
    "../outside/secret.png",
    "imgs/../../outside/secret.png",
    "/etc/passwd",
    "",
    "a\x00b",
]


@pytest.mark.parametrize("rel", GOOD)
def test_same_path_as_resolve_under(tree, rel):
    under = UnderRoot(tree)
    assert under(rel) == resolve_under(tree, rel)
    assert under(rel) == resolve_under(tree, rel)  # the folder memo gives the same answer again


@pytest.mark.parametrize("rel", BAD)
def test_refuses_what_resolve_under_refuses(tree, rel):
    with pytest.raises(PathEscapeError):
        resolve_under(tree, rel)
    under = UnderRoot(tree)
    under("imgs/a.png")  # the folder of some of them is already resolved
    with pytest.raises(PathEscapeError):
        under(rel)


def test_each_folder_resolved_once(tree, monkeypatch):
    import retrieval.imagefiles as imagefiles

    calls = []
    real = imagefiles.resolve_under
    monkeypatch.setattr(imagefiles, "resolve_under", lambda root, rel: calls.append(rel) or real(root, rel))
    under = UnderRoot(tree)
    paths = [under(f"imgs/{name}") for name in ("a.png", "missing.png", "other.png")]
    assert calls == ["imgs"]
    assert paths == [real(tree, f"imgs/{name}") for name in ("a.png", "missing.png", "other.png")]
