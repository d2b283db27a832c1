"""The code blocks of the README and docs/, as a reader finds them: what
``tests/service/test_snippets.py`` (docs/, each block on the session's server) and
``tests/test_readme.py`` (the README, in order, in one shell, against ``make serve``) run.

A block that cannot run here says so where it stands, on the line before it:
``<!-- snippet: skip: <why> -->`` (installs, docker, Kubernetes, a server that holds the
terminal). ``<!-- snippet: own-server -->`` marks a block that starts a server (it gets a free
port instead of 8001 and a scratch directory instead of ``/tmp``), and
``<!-- snippet: http-error -->`` one that shows an error answer (it must get one). Every other
``sh``, ``bash``, ``console`` or ``python`` block is run; ``json``, ``toml`` and ``text`` blocks
are what the reader sees, not commands."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
RUN = {"sh", "bash", "console", "python"}
SHOWN = {"json", "toml", "text", "yaml", "http", ""}
MARK = re.compile(r"<!--\s*snippet:\s*(skip|own-server|http-error)\s*(?::\s*(.*?))?\s*-->")
#: the README's demo server, as its blocks name it
DEMO = re.compile(r"(localhost|127\.0\.0\.1):8000")
#: the port of a block's own server (``own-server``), as its text names it
OWN_PORT = "8001"
#: curl that fails on an HTTP error, as a reader would notice one (unless the block asks for
#: --fail itself: a readiness loop)
PREAMBLE = """curl() {
  case " $* " in
    *" -f"* | *" -sf"* | *" --fail"*) command curl --max-time 180 "$@" ;;
    *) command curl --fail-with-body --max-time 180 "$@" ;;
  esac
}
"""
#: curl's exit status for an HTTP error under --fail-with-body (an ``http-error`` block's)
HTTP_ERROR = 22


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str
    mark: str | None  # None, "skip", "own-server" or "http-error" (it shows a 4xx)
    why: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        """A block to run (not one to look at, nor one marked ``skip``)."""
        return self.lang in RUN and self.mark != "skip"

    def commands(self) -> str:
        """A console block's commands (its ``$ `` lines); any other block as it is."""
        if self.lang != "console":
            return self.text
        return "\n".join(ln[2:] for ln in self.text.splitlines() if ln.startswith("$ ")) + "\n"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, with the marker on the line before each."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.search(before)
        found.append(
            Block(
                page,
                i + 1,
                fence.group(1),
                "\n".join(lines[i + 1 : end]) + "\n",
                mark.group(1) if mark else None,
                (mark.group(2) or "") if mark else "",
            )
        )
        i = end + 1
    return found
