"""The README is a front door and the reference a site: both build, and every link resolves."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 300
BUILD_TIMEOUT_S = 240

_FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def build_site(config: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site_dir`, offline."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner, not a build warning
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
         "--config-file", str(config), "--site-dir", str(site_dir)],
        cwd=config.parent, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
    )  # fmt: skip


def prose(markdown: str) -> str:
    """The text links are read from: fenced code blocks and code spans removed."""
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def relative_links(markdown: str) -> list[str]:
    """Link and image targets that point into the repository (no scheme, not `#anchor` alone)."""
    text = prose(markdown)
    targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
    return [t for t in targets if not _SCHEME.match(t) and not t.startswith(("#", "/"))]


def page_anchors(site: Path, page: Path) -> set[str]:
    """The element ids of the built page for `page` (a file under docs/)."""
    rel = page.relative_to(DOCS).with_suffix("")
    html = site / (rel.parent if rel.name == "index" else rel) / "index.html"
    return set(re.findall(r'\bid="([^"]+)"', html.read_text(encoding="utf-8")))


def broken_links(markdown: str, base: Path, site: Path | None = None) -> list[str]:
    """Relative links of `markdown` (a file in `base`) whose file is missing, or whose anchor is
    missing from the built page when the target is a docs page and `site` is given."""

    def anchor_missing(file: Path, anchor: str) -> bool:
        if not anchor or site is None or file.suffix != ".md" or not file.is_relative_to(DOCS):
            return False
        return anchor not in page_anchors(site, file)

    broken = []
    for target in relative_links(markdown):
        path, _, anchor = target.partition("#")
        file = (base / path).resolve()
        if not file.exists() or anchor_missing(file, anchor):
            broken.append(target)
    return broken


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = build_site(REPO / "mkdocs.yml", out)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}{result.stdout}"
    return out


def test_site_builds_strict_with_every_page(site: Path) -> None:
    pages = sorted(DOCS.rglob("*.md"))
    assert {p.name for p in pages} >= {"index.md", "http-api.md", "python-api.md", "models.md"}
    for page in pages:
        assert page_anchors(site, page), f"{page.name} was not built"
    assert (site / "heatmap.png").is_file() and (site / "tokens.png").is_file()


@pytest.mark.processes  # mkdocs build
def test_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    # the same config over a copy of docs/ with one dead link and one dead anchor
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a", encoding="utf-8") as f:
        f.write("\n[gone](no-such-page.md) and [nowhere](http-api.md#no-such-anchor)\n")
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    output = result.stderr + result.stdout
    assert result.returncode != 0
    assert "no-such-page.md" in output and "no-such-anchor" in output


def test_readme_is_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    text = "\n".join(lines)
    for command in ("make serve", "make test", "source .venv/bin/activate"):
        assert command in text


def test_readme_links_resolve(site: Path) -> None:
    text = README.read_text(encoding="utf-8")
    assert relative_links(text), "README.md links nowhere into docs/"
    assert broken_links(text, README.parent, site) == []


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: p.name)
def test_page_links_resolve(page: Path, site: Path) -> None:
    assert broken_links(page.read_text(encoding="utf-8"), page.parent, site) == []


def test_the_link_check_sees_what_is_broken(site: Path) -> None:
    text = (
        "![a picture](docs/heatmap.png) [ok](docs/models.md#keys) [web](https://example.org)\n"
        "[gone](docs/nope.md) [dead anchor](docs/models.md#nope) `[code](skipped.md)`\n"
        "```\n[fenced](skipped.md)\n```\n[ref]: missing/file.txt\n"
    )
    assert broken_links(text, REPO, site) == [
        "docs/nope.md",
        "docs/models.md#nope",
        "missing/file.txt",
    ]


def test_tests_named_in_the_docs_exist() -> None:
    named = [
        (page.name, file, name)
        for page in sorted(DOCS.rglob("*.md"))
        for file, name in _TEST_ID.findall(page.read_text(encoding="utf-8"))
    ]
    assert named, "no page names a test"
    missing = [
        f"{page}: {file}::{name}"
        for page, file, name in named
        if not (REPO / file).is_file()
        or not re.search(rf"^\s*(async\s+)?def {name}\(", (REPO / file).read_text(), re.M)
    ]
    assert missing == []
