"""Every reference to docs/design.md in the repository names a section that exists.

The reference form (the only one): the path, a comma, and the section's title in double quotes,

    docs/design.md, "The numerics contract of add_rms_norm"

where the title is the text of a `## ` heading of docs/design.md, character for character. The title may
wrap onto the next line of a docstring or a `#` comment: a line break, its indentation and a leading `#`
count as one space. In Markdown files a link to the document is a reference too (`[...](docs/design.md)`,
or `[...](docs/design.md#anchor)` with the anchor GitHub derives from a title); so is a bare
`docs/design.md` naming the whole document, in Markdown only: in code every reference names a section.

Scanned: spec/, torch_impl/, jax_impl/, kernels/, parity/, tests/, benchmarks/ (.py and .md files),
README.md and docs/tutorial.md. The test fails on

- a reference to a section that docs/design.md does not have;
- a bare `docs/design.md` in code (a reference must say which section);
- any other design file: a "DESIGN.md" (or "design.md") that is not `docs/design.md`. The repository carries
  its own design document; code cites nothing a user who clones it cannot read.

Also checked: docs/design.md's sections are unique, its contents links land on them, and every repository path
it names in backticks exists. This file itself is not scanned: it quotes the forms it checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"
SCANNED_DIRS = ("spec", "torch_impl", "jax_impl", "kernels", "parity", "tests", "benchmarks")
SCANNED_FILES = ("README.md", "docs/tutorial.md")
SUFFIXES = (".py", ".md")
PATH = "docs/design.md"

HEADING = re.compile(r"^##[ \t]+(?P<title>.+?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")
# `docs/design.md, "Title"`: the title may run over one line break (docstring or comment continuation).
REFERENCE = re.compile(r'docs/design\.md,[ \t]*"(?P<title>[^"\n]+(?:\n[^"\n]*)?)"')
# A Markdown link whose target is a design document: [text](path#anchor).
LINK = re.compile(r"\]\((?P<target>[^()\s#]*design\.md)(?:#(?P<anchor>[^()\s]*))?\)", re.IGNORECASE)
# Any path-like token that ends in design.md, whatever its case and directory.
ANY_DESIGN = re.compile(r"[\w./~-]*design\.md", re.IGNORECASE)
CONTINUATION = re.compile(r"[ \t]*\n[ \t]*(?:#[ \t]*)?")


@dataclass(frozen=True)
class Problem:
    where: str  # "path:line"
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def sections(design_text: str) -> list[str]:
    """The `## ` headings of a design document, in order; headings inside fenced code blocks are not headings."""
    titles, fenced = [], False
    for line in design_text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            titles.append(match.group("title"))
    return titles


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def normalize_title(raw: str) -> str:
    """A quoted title as written, with a wrapped line (its indentation and a leading '#') read as one space."""
    return CONTINUATION.sub(" ", raw).strip()


def check_text(
    text: str, where: str, titles: list[str], *, markdown: bool, source: Path | None = None
) -> list[Problem]:
    """Every problem with the design references in one file's text.

    `where` prefixes each problem; `source` is the file's path (to resolve relative Markdown links; None means
    links are taken relative to the repository root).
    """
    problems: list[Problem] = []
    known, anchors = set(titles), {anchor(t): t for t in titles}
    accepted: set[int] = set()  # where the well-formed references and links start

    def line_of(offset: int) -> str:
        return f"{where}:{text.count(chr(10), 0, offset) + 1}"

    for match in REFERENCE.finditer(text):
        accepted.add(match.start())
        title = normalize_title(match.group("title"))
        if title not in known:
            problems.append(Problem(line_of(match.start()), f'no section "{title}" in {PATH}'))
    if markdown:
        base = (source.parent if source is not None else REPO).resolve()
        for match in LINK.finditer(text):
            target = match.group("target")
            accepted.add(match.start("target"))  # reported here, if at all, not again as a stray path
            if (base / target).resolve() != DESIGN.resolve():
                problems.append(Problem(line_of(match.start()), f"link to {target!r}, which is not {PATH}"))
                continue
            found = match.group("anchor")
            if found and found not in anchors:
                problems.append(Problem(line_of(match.start()), f"no section with anchor #{found} in {PATH}"))
    for match in ANY_DESIGN.finditer(text):
        token = match.group()
        if match.start() in accepted:
            continue
        if token != PATH:
            problems.append(Problem(line_of(match.start()), f'{token!r} is not {PATH}: cite {PATH}, "Section title"'))
        elif not markdown:
            problems.append(Problem(line_of(match.start()), f'{PATH} without a section: write {PATH}, "Section title"'))
    return problems


def scanned_files() -> list[Path]:
    files = [REPO / name for name in SCANNED_FILES]
    for directory in SCANNED_DIRS:
        files += sorted(p for p in (REPO / directory).rglob("*") if p.suffix in SUFFIXES and p.is_file())
    return [p for p in files if p.resolve() != Path(__file__).resolve() and "__pycache__" not in p.parts]


def design_titles() -> list[str]:
    return sections(DESIGN.read_text(encoding="utf-8"))


# ---- the repository ------------------------------------------------------------------------------------------
def test_design_document_has_unique_sections():
    titles = design_titles()
    assert titles, f"{PATH} has no '## ' sections"
    duplicates = sorted({t for t in titles if titles.count(t) > 1})
    assert not duplicates, f"{PATH} repeats section titles {duplicates}: references would be ambiguous"
    anchors = [anchor(t) for t in titles]
    assert len(set(anchors)) == len(anchors), f"two sections of {PATH} share an anchor: {anchors}"


def test_every_design_reference_resolves():
    titles = design_titles()
    problems: list[Problem] = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(REPO))
        problems += check_text(text, where, titles, markdown=path.suffix == ".md", source=path)
    assert not problems, "design references that do not resolve:\n  " + "\n  ".join(map(str, problems))


def test_design_document_links_to_its_own_sections():
    """docs/design.md's contents links (`](#anchor)`) point at its own headings."""
    text = DESIGN.read_text(encoding="utf-8")
    anchors = {anchor(t) for t in sections(text)}
    missing = sorted(set(re.findall(r"\]\(#([^()\s]+)\)", text)) - anchors)
    assert not missing, f"{PATH} links to anchors it does not have: {missing}"


def test_design_document_names_existing_paths():
    """Every repository path docs/design.md gives in backticks (`spec/params.py`, `tests/twins/`,
    `spec/parallel.py::check_tp_degree`) exists, so the document cannot silently outlive a move."""
    text = DESIGN.read_text(encoding="utf-8")
    paths = re.findall(r"`([\w.-]+/[\w./-]*)(?:::[\w.]+)?`", text)
    assert paths, f"{PATH} names no paths: the pattern above no longer matches how it writes them"
    missing = sorted({p for p in paths if not (REPO / p).exists()})
    assert not missing, f"{PATH} names paths that do not exist: {missing}"


def test_the_code_cites_the_design_somewhere():
    """Guard against a scan that finds nothing (a moved directory, a changed form): references do exist."""
    titles = design_titles()
    cited = set()
    for path in scanned_files():
        for match in REFERENCE.finditer(path.read_text(encoding="utf-8")):
            cited.add(normalize_title(match.group("title")))
    assert cited & set(titles), f'no file cites a section of {PATH} in the form {PATH}, "Section title"'


# ---- the checker itself, on synthetic text --------------------------------------------------------------------
SYNTHETIC_DESIGN = """# design

## The math

## The numerics contract of add_rms_norm

```text
## Not a heading (inside a fence)
```
"""


def _check(text: str, *, markdown: bool = False) -> list[str]:
    return [p.what for p in check_text(text, "x.py", sections(SYNTHETIC_DESIGN), markdown=markdown)]


def test_checker_reads_headings_outside_fences_only():
    assert sections(SYNTHETIC_DESIGN) == ["The math", "The numerics contract of add_rms_norm"]
    assert anchor("The numerics contract of add_rms_norm") == "the-numerics-contract-of-add_rms_norm"
    assert anchor("4. Attention: GQA, RoPE, q/k norm") == "4-attention-gqa-rope-qk-norm"


def test_checker_accepts_references_to_existing_sections():
    assert _check('"""Kernels (docs/design.md, "The math")."""') == []
    wrapped_docstring = '"""Contract: (docs/design.md, "The numerics contract\n    of add_rms_norm"). More."""'
    assert _check(wrapped_docstring) == []
    wrapped_comment = '# as docs/design.md, "The numerics\n    # contract of add_rms_norm" says\nx = 1'
    assert _check(wrapped_comment) == []


def test_checker_reports_a_missing_section():
    text = 'x = 1\n# see docs/design.md, "The error policy"\n'
    problems = check_text(text, "x.py", sections(SYNTHETIC_DESIGN), markdown=False)
    assert [str(p) for p in problems] == ['x.py:2: no section "The error policy" in docs/design.md']


def test_checker_reports_bare_and_foreign_design_files():
    assert _check('"""One layer (DESIGN.md)."""') == [
        "'DESIGN.md' is not docs/design.md: cite docs/design.md, \"Section title\""
    ]
    assert len(_check("# per /work/elsewhere/DESIGN.md's policy")) == 1
    assert len(_check("# docs/DESIGN.md")) == 1  # the file is docs/design.md: case matters on most file systems
    assert _check('"""The flow (docs/design.md)."""') == [
        'docs/design.md without a section: write docs/design.md, "Section title"'
    ]
    assert _check("The design is in docs/design.md.", markdown=True) == []  # the whole document, in Markdown


def test_checker_resolves_markdown_links():
    titles = sections(SYNTHETIC_DESIGN)
    readme = "See [the design](docs/design.md) and [its math](docs/design.md#the-math)."
    assert check_text(readme, "README.md", titles, markdown=True, source=REPO / "README.md") == []
    tutorial = "See [the contract](design.md#the-numerics-contract-of-add_rms_norm)."
    assert check_text(tutorial, "docs/tutorial.md", titles, markdown=True, source=REPO / "docs" / "tutorial.md") == []
    broken = "See [x](docs/design.md#the-maths) and [y](DESIGN.md)."
    found = [p.what for p in check_text(broken, "README.md", titles, markdown=True, source=REPO / "README.md")]
    assert found == [
        "no section with anchor #the-maths in docs/design.md",
        "link to 'DESIGN.md', which is not docs/design.md",
    ]


if __name__ == "__main__":  # python tests/docs/test_design.py: list every problem
    all_titles = design_titles()
    for file in scanned_files():
        for problem in check_text(
            file.read_text(encoding="utf-8"),
            str(file.relative_to(REPO)),
            all_titles,
            markdown=file.suffix == ".md",
            source=file,
        ):
            print(problem)
