"""Defaults that the settings and the pure modules below them share (the settings override
them from the environment; a pure function without Django takes them as its default). Pure:
no import at all, so any module of any app may read them."""

from __future__ import annotations

#: The largest image (width x height) read by default (~8000 x 8000, far above any CIR benchmark
#: image; larger ones are refused as decompression bombs). ``IMAGE_MAX_PIXELS`` in the settings.
MAX_PIXELS = 64_000_000

#: The session filters of the multi-turn protocol: a session's ranks stay within epsilon of
#: each other (``AUDIT_SESSION_EPSILON``), and its turns' texts differ by at least tau
#: (``AUDIT_SESSION_TAU``); see :mod:`retrieval.sessions`.
SESSION_EPSILON = 30
SESSION_TAU = 0.8
