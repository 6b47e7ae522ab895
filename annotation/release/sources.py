"""What a release says about the source benchmark of each dataset: its annotation licence and
its citation, by dataset format (from shared/docs/CIR-FORMATS.md §0). A format CIRVal does not
know (the demo, a custom file) gets ``None``: the release leaves a placeholder for the user."""

from __future__ import annotations

from typing import Any

#: format -> (name, annotation licence, citation)
SOURCES: dict[str, tuple[str, str, str]] = {
    "cirr": (
        "CIRR",
        "MIT (images: NLVR2 terms)",
        "Liu, Rodriguez-Opazo, Teney, Gould. Image Retrieval on Real-life Images with Pre-trained "
        "Vision-and-Language Models. ICCV 2021.",
    ),
    "fashioniq": (
        "FashionIQ",
        "Community Data License Agreement (version not stated)",
        "Wu, Gao, Guo, Al-Halah, Rennie, Grauman, Feris. Fashion IQ: A New Dataset Towards Retrieving "
        "Images by Natural Language Feedback. CVPR 2021.",
    ),
    "circo": (
        "CIRCO",
        "CC BY-NC 4.0 (images: COCO terms)",
        "Baldrati, Agnolucci, Bertini, Del Bimbo. Zero-Shot Composed Image Retrieval with Textual "
        "Inversion. ICCV 2023.",
    ),
    "lasco": (
        "LaSCo",
        "MIT (images: COCO)",
        "Levy, Ben-Ari, Darshan, Lischinski. Data Roaming and Quality Assessment for Composed Image "
        "Retrieval. AAAI 2024.",
    ),
    "mbeir": (
        "M-BEIR",
        "MIT (source datasets' terms apply to images and text)",
        "Wei, Chen, Chen, Hu, Zhang, Fu, Ritter, Chen. UniIR: Training and Benchmarking Universal "
        "Multimodal Information Retrievers. ECCV 2024.",
    ),
    "mtfiq": (
        "Multi-turn FashionIQ",
        "none stated (captions from FashionIQ)",
        "Yuan, Lam. Conversational Fashion Image Retrieval via Multiturn Natural Language Feedback. SIGIR 2021.",
    ),
    "circled": ("CIRCLED", "CC BY 4.0", ""),
}


def source_of(fmt: str) -> dict[str, Any] | None:
    """``{"name", "licence", "citation"}`` of a dataset format's source benchmark, or ``None``."""
    if fmt not in SOURCES:
        return None
    name, licence, citation = SOURCES[fmt]
    return {"name": name, "licence": licence, "citation": citation or None}
