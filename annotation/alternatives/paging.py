"""Which candidates of a panel an annotator was shown, and which fitting ones they reach.
Pure: no Django.

The page's rules (``static/cirval/annotate.js``, ``pagesShown``; the item page states them):

* the panel is shown in pages of :data:`PAGE_SIZE`, likely fits first
  (:func:`retrieval.fusion.candidate_list`);
* the first :data:`PAGES_AHEAD` pages are open from the start, and a page with a tick opens
  the :data:`PAGES_AHEAD` pages after it by itself (2: the panel stops opening pages only
  after two pages in a row without a tick); all up to the panel's depth (the study's
  ``candidates``, at most :data:`retrieval.fusion.MAX_CANDIDATES`: the stated depth cap);
* the annotator may open the next page at will ("More candidates") up to that cap, with or
  without a tick, and after "None fit" too: "None fit" answers for the pages shown, never
  for the rest of the panel.

What was shown is counted from the ticks (:func:`pages_shown`: up to :data:`PAGES_AHEAD`
pages past the last page with a tick): pages opened at will and left without a tick are not
counted, so an annotator's "no tick" is only ever read for the pages the rule opened.

:func:`reachable` simulates an annotator who follows those rules and ticks every fitting
candidate they are shown, opening no page at will: what ``demo_check`` reports as reachable
recall (issue 39, item 1), beside the pool recall (every fitting candidate of the panel).
On the demo's seeds 11 and 13, over all audited queries, annotators reach 0.82 and 0.82 of
the fitting images with two pages ahead, where the panels hold 0.83 and 0.85; with one page
ahead (a tick opened the next page only) they reached 0.72 and 0.74 of the same panels.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: Candidates per page of the annotator's panel (every one of them on screen at 1366x768).
PAGE_SIZE = 10

#: Pages open past the last page with a tick (and from the start): the panel stops opening
#: pages by itself after this many pages in a row without a tick.
PAGES_AHEAD = 2


def pages_shown(
    panel: Sequence[int], ticked: Iterable[int], page_size: int = PAGE_SIZE, ahead: int = PAGES_AHEAD
) -> int:
    """How many pages of ``panel`` the annotator saw: ``ahead`` past the last page with a tick
    (``ahead`` with no tick), at most every page (0 for an empty panel)."""
    if page_size < 1 or ahead < 1:
        raise ValueError("page_size and ahead must be >= 1")
    if not panel:
        return 0
    chosen = set(ticked)
    last = max((n // page_size for n, image in enumerate(panel) if image in chosen), default=-1)
    return min(-(-len(panel) // page_size), last + 1 + ahead)


def shown_candidates(panel: Sequence[int], ticked: Iterable[int], page_size: int = PAGE_SIZE) -> list[int]:
    """The candidates of the pages shown (:func:`pages_shown`), in panel order."""
    return list(panel[: pages_shown(panel, ticked, page_size) * page_size])


def reachable(panel: Sequence[int], fitting: Iterable[int], page_size: int = PAGE_SIZE) -> list[int]:
    """The fitting candidates an annotator reaches who ticks every fitting candidate shown and
    opens no page at will: page by page while the rule keeps a next page open
    (:func:`pages_shown` of the ticks so far), i.e. until :data:`PAGES_AHEAD` pages in a row
    bring no tick. In panel order."""
    fits = set(fitting)
    ticked: list[int] = []
    seen = 0
    while seen < pages_shown(panel, ticked, page_size):
        ticked += [c for c in panel[seen * page_size : (seen + 1) * page_size] if c in fits]
        seen += 1
    return ticked
