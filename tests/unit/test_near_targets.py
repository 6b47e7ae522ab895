"""audit.runs.encoding.near_targets: every query's image-to-image query built at once."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from audit.runs.encoding import _near_queries, near_targets


def _one_by_one(gallery, positives, references):
    rows = []
    for pos, ref in zip(positives, references):
        q = F.normalize(gallery[torch.as_tensor(list(pos))].float().mean(0), dim=-1)
        rows.append(q if ref is None else q + gallery[int(ref)].float())
    return F.normalize(torch.stack(rows), dim=-1)


def test_the_queries_are_those_of_the_rule_row_by_row():
    g = F.normalize(torch.randn(40, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    positives = [[3], [5, 9, 11], [0, 0], [39], [7, 8]]
    references = [None, 2, 4, None, 39]
    assert torch.allclose(_near_queries(g, positives, references), _one_by_one(g, positives, references), atol=1e-6)
    # one positive, no reference: the positive's own (unit) embedding, bit for bit
    assert torch.equal(_near_queries(g, [[6]], [None])[0], F.normalize(F.normalize(g[6], dim=-1), dim=-1))


def test_queries_without_positives_get_no_list_and_the_nearest_comes_first():
    g = F.normalize(torch.randn(30, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    out = near_targets(g, [[], [4], [10, 12]], top_k=5, references=[None, None, 3])
    assert out[0] == [] and len(out[1]) == 5 and out[1][0] == 4 and len(out[2]) == 5
    assert near_targets(g, [[1]], top_k=0) == [[]]


def test_rank_three_in_one_pass_gives_what_four_rankings_give():
    """rank_three ranks the three modalities and the near-targets queries in one call; each row
    is ranked as a call of its own would rank it."""
    from audit.runs.encoding import rank_three
    from retrieval.encoders import compose_embeddings
    from retrieval.ranking import rank_queries

    gen = torch.Generator().manual_seed(2)
    g = F.normalize(torch.randn(50, 8, generator=gen), dim=-1)
    img, txt = (
        F.normalize(torch.randn(6, 8, generator=gen), dim=-1),
        F.normalize(torch.randn(6, 8, generator=gen), dim=-1),
    )
    positives = [[1], [2, 3], [], [4], [5, 6], [7]]
    exclude = [0, None, 8, 9, 10, None]
    groups = [[1, 11, 12], [2, 13], [], [4, 14], [5], [7, 15]]
    extra = [[20], [], [21], [], [], [22, 23]]
    references = [0, None, 8, 9, 10, None]

    class Composer:
        compose = staticmethod(compose_embeddings)

    got = rank_three(
        Composer(), img, txt, g, positives, exclude, panel_k=7, extra=extra, groups=groups, references=references
    )
    for name, q in (("mm", compose_embeddings(img, txt)), ("text", txt), ("image", img)):
        one = rank_queries(
            q,
            g,
            positives,
            exclude,
            top_k=7,
            return_per_positive=True,
            groups=groups,
            extra=extra,
            references=references,
        )
        assert getattr(got, name) == one.best_rank
        assert got.all[name] == one.per_positive_ranks and got.extra[name] == one.extra_ranks
        assert got.group[name] == one.group_rank and got.ahead[name] == one.reference_ahead
        tops = {"mm": got.top_mm, "text": got.top_text, "image": got.top_image}[name]
        assert tops == [[i for i in row if i >= 0] for row in one.topk.tolist()]
    assert got.top_near == near_targets(g, positives, 7, references)
    bare = rank_three(Composer(), img, txt, g, positives, None, panel_k=0)
    assert bare.top_near == [[] for _ in positives] and bare.group["mm"] == [None] * 6


def test_top_lists_drop_the_padding_of_a_gallery_smaller_than_k():
    from audit.runs.encoding import _top_rows

    assert _top_rows(torch.tensor([[3, 1, -1], [0, 2, 1]])) == [[3, 1], [0, 2, 1]]
    assert _top_rows(torch.tensor([[3, 1], [0, 2]])) == [[3, 1], [0, 2]]
    assert _top_rows(torch.empty((0, 4), dtype=torch.long)) == []
