"""Every cross-reference in the workbook resolves: a link to a notebook names a file that
exists, with that notebook's number and title; "notebook NN" names a notebook that exists;
"NN §K" (or "notebook NN §K", "§K of notebook NN") names a section that notebook has; a bare
"§K" in a notebook names one of its own sections. Checked over the notebooks, the guides and
labkit's own text (docstrings, SQL comments, data files), after any renumbering."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {p.stem[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}

pytestmark = pytest.mark.default_leg

LINK = re.compile(r"\[(\d\d) · ([^\]]+)\]\((\d\d_[a-z0-9_]+)\.ipynb\)")
FILE = re.compile(r"\b(\d\d_[a-z][a-z0-9_]*)\.ipynb\b")
NB_SECTION = re.compile(r"\b[Nn]otebooks?\s+(\d\d)(?:'s)?\s*§\s*(\d+[a-z]?)|\b(\d\d)\s*§\s*(\d+[a-z]?)"
                        r"|§\s*(\d+[a-z]?)\s+of\s+notebook\s+(\d\d)")
NB_NUMBER = re.compile(r"\b[Nn]otebooks?\s+((?:\d\d(?:\s*(?:,|and|or|to|–)\s*)?)+)")
BARE_SECTION = re.compile(r"§\s*(\d+[a-z]?)\b")


def cells(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]


def sections(path: Path) -> set[str]:
    found = set()
    for text in cells(path):
        for line in text.split("\n"):
            m = re.match(r"#{2,3} (\d+[a-z]?) · ", line)
            if m:
                found.add(m.group(1))
    return found


SECTIONS = {n: sections(p) for n, p in NOTEBOOKS.items()}


def texts():
    """(where, text) for every place a reader meets a cross-reference."""
    for n, p in NOTEBOOKS.items():
        for i, text in enumerate(cells(p)):
            yield f"{p.name} cell {i}", text, n
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "notebooks" / "README.md"]
    files += sorted((ROOT / "labkit").rglob("*.py")) + sorted((ROOT / "labkit").rglob("*.sql"))
    files += sorted((ROOT / "data").glob("*.yaml"))      # the bank, the plans, the capstone card
    for f in files:
        yield str(f.relative_to(ROOT)), f.read_text(), None


def problems_in(where: str, text: str, own: str | None) -> list[str]:
    found = []
    for m in LINK.finditer(text):
        num, title, stem = m.groups()
        path = NOTEBOOKS.get(stem[:2])
        if path is None or path.stem != stem:
            found.append(f"{where}: link to {stem}.ipynb, which does not exist")
        elif num != stem[:2]:
            found.append(f"{where}: link text says {num} for {stem}.ipynb")
    for m in FILE.finditer(text):
        stem = m.group(1)
        if stem[:2] in NOTEBOOKS and NOTEBOOKS[stem[:2]].stem != stem and not stem.startswith("99_"):
            found.append(f"{where}: {stem}.ipynb does not exist (notebook {stem[:2]} is "
                         f"{NOTEBOOKS[stem[:2]].name})")
    for m in NB_SECTION.finditer(text):
        num = m.group(1) or m.group(3) or m.group(6)
        sec = m.group(2) or m.group(4) or m.group(5)
        if num not in NOTEBOOKS:
            found.append(f"{where}: {m.group(0)!r}: there is no notebook {num}")
        elif sec not in SECTIONS[num]:
            found.append(f"{where}: {m.group(0)!r}: notebook {num} has sections "
                         f"{', '.join(sorted(SECTIONS[num])) or 'none'}")
    for m in NB_NUMBER.finditer(text):
        for num in re.findall(r"\d\d", m.group(1)):
            if num not in NOTEBOOKS:
                found.append(f"{where}: {m.group(0).strip()!r}: there is no notebook {num}")
    if own is not None:
        scrubbed = NB_SECTION.sub("", text)
        for m in BARE_SECTION.finditer(scrubbed):
            if m.group(1) not in SECTIONS[own]:
                found.append(f"{where}: '§{m.group(1)}' but this notebook has sections "
                             f"{', '.join(sorted(SECTIONS[own]))}")
    return found


def test_every_cross_reference_resolves():
    found = [p for where, text, own in texts() for p in problems_in(where, text, own)]
    assert not found, "\n".join(found)


def test_the_checker_finds_a_reference_that_does_not_resolve():
    n, path = next(iter(NOTEBOOKS.items()))
    bad = (f"[{n} · X]({path.stem}x.ipynb); notebook 99; {n} §98; see 99_missing.ipynb "
           f"[00 · Y]({path.stem}.ipynb)")
    found = problems_in("planted", bad, None)
    assert len(found) == 4, found                  # the link, its file, notebook 99, §98
    assert problems_in("planted", "as §97 showed", n) and not problems_in("planted", "as §97 showed", None)
    assert not problems_in("planted", f"[{n} · X]({path.stem}.ipynb), notebook {n}", None)
