"""The map (ARCHITECTURE.md) and the reference pages (docs/) say what the tree and the app hold:
every folder is on the map, every path the map names exists, and docs/api.md lists exactly the
routes of the schema."""

from __future__ import annotations

import re

from tests.utils.servers import ROOT

MAP = (ROOT / "ARCHITECTURE.md").read_text()
PACKAGE = ROOT / "backend" / "tunedeck"
TOP = (
    "backend",
    "frontend",
    "configs",
    "migrations",
    "trainer",
    "tests",
    "bench",
    "scripts",
    "packaging",
    "docs",
)


def named_paths(text: str) -> set[str]:
    """Paths in backticks that look like the tree's own (a folder ends in /, a file has a suffix)."""
    return {
        p
        for p in re.findall(r"`([A-Za-z_][\w./-]*(?:/|\.py|\.md|\.toml))`", text)
        if "/" in p or p.endswith((".py", ".md", ".toml"))
    }


def test_every_folder_of_the_package_and_the_top_level_is_on_the_map():
    folders = [
        d
        for d in PACKAGE.rglob("*")
        if d.is_dir() and "__pycache__" not in d.parts and any(f.suffix == ".py" for f in d.iterdir())
    ]
    missing = [str(d.relative_to(ROOT)) + "/" for d in folders if f"`{d.relative_to(ROOT)}/`" not in MAP]
    missing += [f"{name}/" for name in TOP if f"`{name}/`" not in MAP]
    assert missing == []
    listed = {p for p in (ROOT / name for name in TOP) if p.is_dir()}
    assert listed == {ROOT / name for name in TOP}, "a top-level folder on the map is not in the tree"


def test_every_path_the_map_names_exists():
    roots = [ROOT, PACKAGE]  # the recipes name paths inside the package without its prefix
    missing = [p for p in sorted(named_paths(MAP)) if "/" in p and not any((r / p).exists() for r in roots)]
    # A bare file name stands in its folder's row: it must be a file of the package.
    names = {f.name for f in PACKAGE.rglob("*.py")} | {f.name for f in ROOT.glob("*.*")}
    missing += [p for p in sorted(named_paths(MAP)) if "/" not in p and p not in names]
    assert missing == []


def test_the_api_page_lists_exactly_the_routes_of_the_schema(app_factory):
    app = app_factory()
    schema = app.api.get("/openapi.json").json()
    want = {(m.upper(), path) for path, ops in schema["paths"].items() for m in ops}
    page = (ROOT / "docs" / "api.md").read_text()
    have = set(re.findall(r"^\| ([A-Z]+) \| `([^`]+)` \|", page, re.M))
    assert have == want, {"not on the page": sorted(want - have), "not in the app": sorted(have - want)}


def test_the_readme_stays_what_a_new_user_reads_first():
    """Reference material lives in docs/: the README as a whole, and each of its sections, stay short."""
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= 220, f"README.md has {len(readme)} lines: move reference material into docs/"
    heads = [i for i, line in enumerate(readme) if line.startswith("## ")] + [len(readme)]
    for start, end in zip(heads, heads[1:]):
        assert end - start <= 45, (
            f"README section {readme[start]!r} has {end - start} lines: move it into docs/"
        )


def test_the_readme_links_the_map_and_the_reference_pages():
    readme = (ROOT / "README.md").read_text()
    pages = ["ARCHITECTURE.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]
    assert len(pages) > 3
    for page in pages:  # every reference page is reachable from the README
        assert f"({page})" in readme, page
