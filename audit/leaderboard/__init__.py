"""Leaderboards before and after cleaning: methods scored with the benchmark's protocol on four sets.

Issue 40. The sets: the full split, its shortcut-free subset, its validated subset and the
validated subset with the accepted alternatives as extra positives, with bootstrap intervals.

Pure parts: :mod:`.stats` (bootstrap, Kendall's tau-b, rank changes), :mod:`.scoring` (the
table, through :func:`retrieval.protocols.figures`), :mod:`.files` (the benchmarks'
prediction files). Django parts: :mod:`.entries` (entering a method), :mod:`.service`
(the sets, the table, its CSV / JSON / LaTeX) and :mod:`.views`.
"""
