"""How a release names a retriever's checkpoint: by its file name (and, in release.json, its
sha256), never by the server folder it was read from.

A computed audit stores each retriever as its spec, ``openclip:MODEL@/srv/…/var/models/x.pt``
for a checkpoint. Every text a release writes itself (release.json, README.md, croissant.json,
the audit reports) passes through :meth:`ServerPaths.clean`, which writes each such path as
its file name, so that two releases of the same data made from two folders (another
``CIRVAL_VAR_DIR``, another checkout) are the same bytes but for ``released_at``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from retrieval.specs import looks_like_path

_SEPARATORS = re.compile(r"[\\/]")


def checkpoint_path(spec: str) -> str | None:
    """The checkpoint path a spec names as written (``None`` for a tag, random weights or a name
    that is not a spec); read from the text alone, so a checkpoint since moved is still found."""
    head, sep, weights = spec.partition("@")
    weights = weights.strip()
    if not sep or not head.strip() or not weights or not looks_like_path(weights):
        return None
    return weights


def file_name(path: str) -> str:
    """The last part of ``path`` (either separator)."""
    return _SEPARATORS.split(path.rstrip("/\\"))[-1]


class ServerPaths:
    """The checkpoint paths of a set of specs, each with the file name a release writes for it."""

    def __init__(self, specs: Iterable[str]):
        names: dict[str, str] = {}
        for spec in specs:
            path = checkpoint_path(spec) if isinstance(spec, str) else None
            if path is None:
                continue
            for form in {path, os.path.expanduser(path), os.path.abspath(os.path.expanduser(path))}:
                if form != file_name(path):
                    names[form] = file_name(path)
        self.names = dict(sorted(names.items(), key=lambda kv: -len(kv[0])))  # longest first: no partial rewrite

    def text(self, value: str) -> str:
        for path, name in self.names.items():
            if path in value:
                value = value.replace(path, name)
        return value

    def clean(self, value: Any) -> Any:
        """``value`` (a JSON-like value or a text) with every checkpoint path written as its file name."""
        if not self.names:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.clean(k): self.clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.clean(v) for v in value]
        return value


def public_spec(spec: str) -> str:
    """``spec`` as a release names it: a checkpoint by its file name (``openclip:M@x.pt``)."""
    return ServerPaths([spec]).text(spec)
