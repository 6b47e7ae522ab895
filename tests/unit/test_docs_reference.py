"""The documentation states what the code holds (issue 38, item 3).

Read-only checks of docs/ and README.md against the source tree (no process is started; the
strict MkDocs build is tests/integration/test_docs_build.py):

* docs/architecture.md names every Python package of the apps and config, each with the
  first line of its docstring, and every package has a docstring;
* docs/reference/commands.md names every manage.py command of the apps;
* docs/reference/settings.md names every environment variable config/settings.py reads;
* docs/benchmarks/index.md names every script under bench/;
* every repository path the pages write in backticks exists;
* README.md stays a short front door: at most 200 lines, the two commands first, and its
  relative links resolve.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
APPS = ("annotation", "audit", "retrieval", "config")
README_MAX_LINES = 200


def packages() -> list[Path]:
    """Every folder with an __init__.py under the apps and config, sub-packages included."""
    found = []
    for app in APPS:
        for init in (ROOT / app).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.append(init.parent)
    return sorted(found)


def docstring_line(init: Path) -> str:
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
    return doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_every_package_has_a_one_line_docstring():
    missing = [p.relative_to(ROOT).as_posix() for p in packages() if not docstring_line(p / "__init__.py")]
    assert not missing, f"these packages' __init__.py has no docstring (one line saying what it is): {missing}"


def test_the_architecture_page_names_every_package_with_its_docstring():
    text = page("architecture.md")
    absent, stale = [], []
    for pkg in packages():
        name = pkg.relative_to(ROOT).as_posix() + "/"
        line = docstring_line(pkg / "__init__.py")
        if f"`{name}`" not in text:
            absent.append(name)
        elif line and line not in text:
            stale.append(f"{name}: {line!r}")
    assert not absent, f"docs/architecture.md does not name these packages (as `path/`): {absent}"
    assert not stale, f"docs/architecture.md lacks the first docstring line of: {stale}"


def test_the_commands_page_names_every_management_command():
    text = page("reference/commands.md")
    commands = sorted(
        f.stem for app in APPS for f in (ROOT / app).glob("management/commands/*.py") if not f.name.startswith("_")
    )
    assert commands, "no management command found: has the layout changed?"
    missing = [c for c in commands if not re.search(rf"^### {re.escape(c)}$", text, re.M)]
    assert not missing, f"docs/reference/commands.md has no section for: {missing}"


def test_the_settings_page_names_every_environment_variable():
    source = (ROOT / "config" / "settings.py").read_text(encoding="utf-8")
    names = set(re.findall(r"""env_\w+\(\s*["']([A-Z][A-Z0-9_]*)["']""", source))
    assert names, "config/settings.py reads no variable through config/env.py: has the layout changed?"
    text = page("reference/settings.md")
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"docs/reference/settings.md does not list: {missing}"


def test_the_benchmarks_page_names_every_bench_script():
    text = page("benchmarks/index.md")
    missing = sorted(f"bench/{f.name}" for f in (ROOT / "bench").glob("*.py") if f"`bench/{f.name}`" not in text)
    assert not missing, f"docs/benchmarks/index.md does not name: {missing}"


#: A repository path written in backticks: a file or folder under one of these top folders.
REPO_PATH = re.compile(r"`((?:annotation|audit|retrieval|config|tests|bench|deploy|templates|static)/[\w./@-]*)`")


def test_every_repository_path_the_docs_name_exists():
    wrong = []
    for md in sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]:
        for path in REPO_PATH.findall(md.read_text(encoding="utf-8")):
            if not (ROOT / path).exists():
                wrong.append(f"{md.relative_to(ROOT)}: {path}")
    assert not wrong, f"the docs name paths that do not exist (renamed or removed?): {wrong}"


def test_the_readme_is_a_short_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}: move the rest to docs/)"
    )
    head = "\n".join(lines[:8])
    assert re.search(r"^\./cirval up\b", head, re.M) and re.search(r"^\./cirval test\b", head, re.M), (
        "README.md must open with the two commands, ./cirval up and ./cirval test"
    )
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    broken = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not broken, f"README.md links to missing files: {broken}"
