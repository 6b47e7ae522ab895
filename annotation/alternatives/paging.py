"""Which candidates of a panel an annotator was shown. Pure: no Django.

The panel is shown in pages of :data:`PAGE_SIZE`, best first. A page with a tick opens the
next one, up to the panel's depth (issue 25: "show more candidates until a page brings no
tick"): the pages shown are those up to the one after the last page with a tick. The
annotator's page (``static/cirval/annotate.js``, ``pagesShown``) applies the same rule, so
what was shown follows from the ticks alone and needs no field of its own.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Candidates per page of the annotator's panel (every one of them on screen at 1366x768).
PAGE_SIZE = 10


def pages_shown(panel: Sequence[int], ticked: Iterable[int], page_size: int = PAGE_SIZE) -> int:
    """How many pages of ``panel`` the annotator saw: one past the last page with a tick,
    at most every page (0 for an empty panel)."""
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    if not panel:
        return 0
    chosen = set(ticked)
    last = max((n // page_size for n, image in enumerate(panel) if image in chosen), default=-1)
    return min(-(-len(panel) // page_size), last + 2)


def shown_candidates(panel: Sequence[int], ticked: Iterable[int], page_size: int = PAGE_SIZE) -> list[int]:
    """The candidates of the pages shown (:func:`pages_shown`), in panel order."""
    return list(panel[: pages_shown(panel, ticked, page_size) * page_size])
