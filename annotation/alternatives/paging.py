"""Which candidates of a panel an annotator was shown, and which fitting ones they reach.
Pure: no Django.

The page's rules (``static/cirval/annotate.js``, ``pagesShown``):

* the panel is shown in pages of :data:`PAGE_SIZE`, likely fits first
  (:func:`retrieval.fusion.candidate_list`);
* a page with a tick opens the next one by itself, up to the panel's depth (the study's
  ``candidates``, at most :data:`retrieval.fusion.MAX_CANDIDATES`: the stated depth cap);
* the annotator may open the next page at will ("More candidates") up to that cap, with or
  without a tick, and after "None fit" too: "None fit" answers for the pages shown, never
  for the rest of the panel.

What was shown is counted from the ticks (:func:`pages_shown`: up to the page after the last
page with a tick): pages opened at will and left without a tick are not counted, so an
annotator's "no tick" is only ever read for the pages the rule opened.

:func:`reachable` simulates an annotator who follows those rules and ticks every fitting
candidate they are shown, opening no page at will: what ``demo_check`` reports as reachable
recall (issue 39, item 1), beside the pool recall (every fitting candidate of the panel).
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


def reachable(panel: Sequence[int], fitting: Iterable[int], page_size: int = PAGE_SIZE) -> list[int]:
    """The fitting candidates an annotator reaches who ticks every fitting candidate shown and
    opens no page at will: page 1, then each next page while the page before brought a tick
    (:func:`pages_shown` of those ticks). In panel order."""
    fits = set(fitting)
    ticked: list[int] = []
    opened = 1 if panel else 0
    while True:
        page = panel[(opened - 1) * page_size : opened * page_size]
        ticked += [c for c in page if c in fits]
        now = pages_shown(panel, ticked, page_size)
        if now <= opened:
            return ticked
        opened = now
