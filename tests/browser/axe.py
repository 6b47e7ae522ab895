"""axe-core in the browser tests: the npm package (package.json, package-lock.json at the
repository root; ``./cirval test`` installs it with ``npm ci``), injected into a page and run
on the whole document."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

AXE_JS = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
SERIOUS = ("serious", "critical")


@lru_cache(maxsize=1)
def axe_source() -> str:
    if not AXE_JS.exists():
        raise RuntimeError(
            f"{AXE_JS} is missing: the browser tests need axe-core; run `npm ci` in the repository "
            "root (./cirval test does it)"
        )
    return AXE_JS.read_text(encoding="utf-8")


def axe_violations(page, impacts: tuple[str, ...] = SERIOUS) -> list[str]:
    """axe-core's violations of the page as it is now, of the given impacts, one line each:
    rule, impact, and the first few elements it names."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        # evaluated through the browser's debugging protocol: the site's CSP (script-src 'self')
        # refuses an inline script tag, and stays as it is for the page under test
        page.evaluate(axe_source() + "\n;void 0")
    found = page.evaluate(
        """async (impacts) => {
        const r = await axe.run(document, { resultTypes: ['violations'] });
        return r.violations.filter((v) => impacts.includes(v.impact)).map((v) =>
            v.id + ' (' + v.impact + '): ' + v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(' | ') +
            (v.nodes.length > 3 ? ' … ' + v.nodes.length + ' elements' : ''));
    }""",
        list(impacts),
    )
    return found
