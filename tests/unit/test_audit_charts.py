"""The report's inline SVG charts (pure Python)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from audit.charts import grouped_hbar_svg, histogram_svg

NS = "{http://www.w3.org/2000/svg}"


def bars(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)  # well-formed XML
    return [r for r in root.iter(f"{NS}rect") if r.find(f"{NS}title") is not None]


def test_grouped_bars_values_undefined_and_clipping():
    values = {("a<&>", "full"): 0.5, ("a<&>", "shortcut-free"): -3.0, ("b", "full"): None, ("b", "shortcut-free"): 0.0}
    svg = grouped_hbar_svg(["a<&>", "b"], ["full", "shortcut-free"], values, "CompGap", lo=-1.0, hi=1.0)
    assert svg.startswith("<svg") and 'role="img"' in svg
    drawn = bars(svg)
    assert len(drawn) == 3  # the undefined value has no bar
    tips = [b.find(f"{NS}title").text for b in drawn]
    assert "a<&> · full: 0.500" in tips and "a<&> · shortcut-free: -3.000" in tips
    assert "-3.000 (clipped)" in svg and "undefined" in svg
    assert "a&lt;&amp;&gt;" in svg  # names are escaped
    # 0.5 on [-1, 1] is a quarter of the plot width to the right of zero
    half = next(b for b in drawn if b.find(f"{NS}title").text.endswith("0.500"))
    clipped = next(b for b in drawn if "-3.000" in b.find(f"{NS}title").text)
    assert abs(float(half.get("width")) - float(clipped.get("width")) / 2) < 0.2
    # both bars meet at the zero line
    assert abs(float(clipped.get("x")) + float(clipped.get("width")) - float(half.get("x"))) < 0.2


def test_histogram_bars_scale_with_counts():
    svg = histogram_svg({"multimodal": {0: 6, 1: 3, 2: 1}, "either": {0: 2}}, 2, "Support")
    drawn = bars(svg)
    assert len(drawn) == 6  # 3 columns x 2 series (zero-height bars included)
    heights = {b.find(f"{NS}title").text: float(b.get("height")) for b in drawn}
    six = heights["multimodal: 6 queries solved by 0 retrievers"]
    three = heights["multimodal: 3 queries solved by 1 retriever"]
    assert abs(six - 2 * three) < 0.2
    assert heights["either: 0 queries solved by 2 retrievers"] == 0.0


def test_long_row_labels_are_cut_in_the_middle_with_the_whole_name_as_tooltip():
    spec = "openclip:cirval-demo@/work/main/var/models/cirval-demo-compose-s7.pt"
    svg = grouped_hbar_svg(
        [spec, "openclip:tiny"], ["full"], {(spec, "full"): 0.2, ("openclip:tiny", "full"): 0.1}, "Gap"
    )
    root = ET.fromstring(svg)
    labels = [t for t in root.iter(f"{NS}text") if t.get("text-anchor") == "end"]
    shown = [t.find(f"{NS}title").tail for t in labels]
    assert shown[1] == "openclip:tiny"  # short names are left whole
    assert shown[0].startswith("openclip:cir") and shown[0].endswith("compose-s7.pt") and "…" in shown[0]
    assert len(shown[0]) * 7 <= 230 - 8 - 12  # fits between the left margin and the bars
    assert labels[0].find(f"{NS}title").text == spec


def test_session_curve_heading_fits_with_the_whole_spec_as_tooltip():
    from audit.report import _sessions_curve

    spec = "openclip:cirval-demo@/tmp/pytest-of-root/pytest-9/demo-models0/cirval-demo-caption-s7.pt"
    per = {"latest": {"multimodal": {"hits_at_k": [0.1, 0.2]}}}
    root = ET.fromstring(str(_sessions_curve(spec, per, ["latest"], ["multimodal"], 10, 2, 0.5)))
    heading = next(t for t in root.iter(f"{NS}text") if t.get("font-weight") == "600").text
    assert (
        len(heading) <= 123 and heading.startswith("openclip:cirv") and "caption-s7.pt: cumulative Hits@10" in heading
    )
    assert heading.endswith("(target within 10 at some turn ≤ l)")
    assert root.find(f"{NS}title").text.startswith(spec + ": cumulative") and root.get("aria-label").startswith(spec)
    short = ET.fromstring(str(_sessions_curve("openclip:tiny", per, ["latest"], ["multimodal"], 10, 2, 0.5)))
    assert (
        short.find(f"{NS}title").text
        == "openclip:tiny: cumulative Hits@10 after each turn (target within 10 at some turn ≤ l)"
    )
