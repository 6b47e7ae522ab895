"""Alternatives: candidates an annotator ticks as fitting a query as well as its labelled target.

Everything about them in the annotation app lives in this package, in the order an
alternative travels:

* :mod:`.payload` (pure): the ``alternatives`` field of a submitted judgement, checked
  against the candidate panel the annotator was shown;
* :mod:`.paging` (pure): which candidates an annotator was shown (the first two pages are
  open, and a page with a tick opens the two after it);
* :mod:`.agreement` (pure): agreement on the ticks (one binary unit per item and candidate);
* :mod:`.decisions` (pure): the vote rule that accepts a ticked candidate (majority or
  unanimous; an adjudicator's decision overrides);
* :mod:`.study`: a study's accepted alternatives, adjudicators' decisions, the per-candidate
  report, and writing the accepted ones into the dataset (``manage.py apply_alternatives``);
* :mod:`.export`: the accepted alternatives in the validated JSONL and the CIRCO layout.

Outside this package, because imports run ``annotation -> audit -> retrieval``:
:data:`retrieval.targets.ALTERNATIVE` is the target role of an accepted alternative (the
target rule owns it), and :mod:`audit.alternatives` compares an audit before and after the
alternatives were added. The candidate panel itself is :mod:`annotation.judging.candidates`.
"""
