"""A fake installed distribution that registers ``tests.plugins.lab_kind`` under the entry-point
group ``cirval.retrievers`` (a ``*.dist-info`` folder on ``sys.path``, which importlib.metadata reads
like any installed package's)."""

from __future__ import annotations

from pathlib import Path


def install_lab_plugin(folder: Path, target: str = "tests.plugins.lab_kind:LabKind") -> Path:
    info = Path(folder) / "cirval_lab-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cirval-lab\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[cirval.retrievers]\nlab = {target}\n")
    return Path(folder)


def forget_lab_kind() -> None:
    from retrieval.retrievers import base

    base._registry.pop("lab", None)  # noqa: SLF001 - the test's own registration
    base._failed.pop("lab", None)  # noqa: SLF001
