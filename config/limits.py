"""The limits hostile JSON meets, wherever it comes from: request bodies
(:mod:`config.parsing`) and imported files (:mod:`retrieval.importers.jsonstream`) read them
here, so an API body and an uploaded file are refused at the same depth, the same integer
range and the same characters. Pure: the standard library only."""
from __future__ import annotations

import re

#: The deepest nesting a JSON document may have (the formats and bodies CIRVal reads need < 10;
#: a draft or a study's quotas deeper than this are refused as a file would be).
MAX_DEPTH = 32
#: The integer range a JSON number may have: a signed 64-bit column's.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: Characters no stored text may hold: NUL (PostgreSQL refuses it in text and JSON) and lone
#: UTF-16 surrogates (they cannot be encoded as UTF-8).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def unstorable_name(text: str) -> str | None:
    """``"a NUL character"`` or ``"a lone surrogate"``: the first character of ``text`` no field may
    hold; ``None`` when there is none."""
    found = UNSTORABLE.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate"
