"""Working copies: the notebooks a reader runs and saves, in a folder git ignores.

``make lab`` and ``make study`` open JupyterLab on copies of notebooks/ and student/ in
work/ (work/notebooks/..., work/student/...): running and saving a notebook there never
changes a committed file, so ``git pull`` and the workbook's own checks keep working.

    labkit workcopy                        copy what is missing; name each copy whose notebook
                                           changed since it was copied, with the command below
    labkit workcopy --fresh NOTEBOOK ...   replace those copies with fresh ones; each replaced
    labkit workcopy --fresh --all          copy is kept beside it (NAME.replaced-TIME.ipynb)

A copy that exists is someone's work: it is never written over.  work/.copied.json records
which version of its notebook each copy was made from (a SHA-256), which is how a copy left
behind by a newer notebook (after ``git pull``) is found.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from ..core.errors import LabkitError
from .nbtools import NOTEBOOKS

ROOT = NOTEBOOKS.parent
FOLDER = "work"
SOURCES = ("notebooks", "student")
RECORD = ".copied.json"


def sources(root: Path = ROOT) -> list[Path]:
    """The notebooks that get working copies, relative to ``root``."""
    found = [p.relative_to(root) for part in SOURCES for p in sorted((root / part).glob("*.ipynb"))]
    if not found:
        raise LabkitError(f"There are no notebooks in {root / 'notebooks'}.",
                          "run labkit from a checkout of the workbook (the folder with notebooks/ and student/).")
    return found


def work_folder(root: Path = ROOT, *, create: bool = False) -> Path:
    """work/ with its notebooks/ and student/, each a real folder (made when ``create``)."""
    work = root / FOLDER
    for folder in (work, *(work / part for part in SOURCES)):
        shown = folder.relative_to(root)
        if folder.is_symlink():
            raise LabkitError(f"{shown} is a link to {os.readlink(folder)}: the working copies are kept "
                              "in a folder of the workbook's own, and a copy saved through the link "
                              "would be written somewhere else.",
                              f"remove the link (`rm {shown}`; what it points to stays), then run "
                              "`labkit workcopy` again.")
        if folder.exists() and not folder.is_dir():
            raise LabkitError(f"{shown} is a file, not a folder: the working copies go there.",
                              f"move it away (`mv {shown} {shown}.old`), then run `labkit workcopy` again.")
        if create:
            folder.mkdir(exist_ok=True)
    return work


def source_of(name: str, root: Path = ROOT) -> Path:
    """The notebook ``name`` means, relative to ``root``: notebooks/NAME.ipynb or
    student/NAME.ipynb, or the path of its copy (work/notebooks/NAME.ipynb), from the
    workbook's folder or the current one, with or without .ipynb."""
    path = Path(name if name.endswith(".ipynb") else name + ".ipynb")
    for base in (Path.cwd(), root):
        full = (base / path).resolve()
        for top in (root / FOLDER, root):
            try:
                rel = full.relative_to(top.resolve())
            except ValueError:
                continue
            if len(rel.parts) == 2 and rel.parts[0] in SOURCES and (root / rel).is_file():
                return rel
    raise LabkitError(f"There is no notebook {name!r} in notebooks/ or student/.",
                      "name it as notebooks/NAME.ipynb or student/NAME.ipynb (the copy's own path, "
                      "work/notebooks/NAME.ipynb, works too), or pass --all for every copy.")


def _copy_of(work: Path, rel: Path) -> Path:
    """Where ``rel``'s working copy lives; refused when something other than a file is there."""
    copy = work / rel
    if copy.is_symlink() or (copy.exists() and not copy.is_file()):
        shown = Path(FOLDER) / rel
        raise LabkitError(f"{shown} is a link or a folder, not a working copy: saving it could write "
                          "somewhere else.",
                          f"move it away (`mv {shown} {shown}.old`), then run `labkit workcopy` again.")
    return copy


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_record(work: Path) -> dict[str, str]:
    try:
        record = json.loads((work / RECORD).read_text())
    except (OSError, ValueError):
        return {}                       # no record: a copy unlike its notebook counts as older
    return record if isinstance(record, dict) else {}


def _write_record(work: Path, record: dict[str, str]) -> None:
    tmp = work / f"{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, work / RECORD)


def _write_new(copy: Path, data: bytes) -> None:
    with open(copy, "xb") as f:         # never over a file that is there
        f.write(data)


def _backup_name(copy: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        again = "" if n == 1 else f"-{n}"                   # a second replacement within the second
        backup = copy.with_name(f"{copy.stem}.replaced-{stamp}{again}.ipynb")
        if not os.path.lexists(backup):
            return backup
    raise LabkitError(f"Too many copies of {copy.name} were replaced this second.", "run the command again.")


def copy_missing(root: Path = ROOT, out=print) -> tuple[list[Path], list[Path]]:
    """Copy every notebook that has no working copy yet; return (copied, stale): the
    notebooks copied and those whose copy was made from an older version of them."""
    work = work_folder(root, create=True)
    record = _read_record(work)
    copied, stale = [], []
    for rel in sources(root):
        copy, data = _copy_of(work, rel), (root / rel).read_bytes()
        if not copy.exists():
            _write_new(copy, data)
            copied.append(rel)
        elif copy.read_bytes() != data:
            if record.get(rel.as_posix()) != _digest(data):
                stale.append(rel)
            continue                    # the reader's work: never written over
        record[rel.as_posix()] = _digest(data)
    _write_record(work, record)
    counts = [f"{n} from {part}/" for part in SOURCES if (n := sum(r.parts[0] == part for r in copied))]
    if copied:
        out(f"{FOLDER}/: working copies made, " + " and ".join(counts)
            + " (run and save them there; notebooks/ and student/ stay as committed)")
    for rel in stale:
        out(f"{FOLDER}/{rel.as_posix()} was copied before {rel.as_posix()} changed; it is kept as it is. "
            f"For a fresh copy (yours is kept beside it): labkit workcopy --fresh {rel.as_posix()}")
    if len(stale) > 1:
        out("Every one of them: labkit workcopy --fresh --all")
    return copied, stale


def replace(names: list[Path], root: Path = ROOT, out=print) -> list[Path]:
    """Give each notebook in ``names`` (relative to ``root``) a fresh working copy, saying
    what is replaced first; a replaced copy is kept beside it.  Returns the backups made."""
    work = work_folder(root, create=True)
    record = _read_record(work)
    backups = []
    for rel in names:
        copy, data = _copy_of(work, rel), (root / rel).read_bytes()
        shown = f"{FOLDER}/{rel.as_posix()}"
        if copy.exists() and copy.read_bytes() == data:
            out(f"{shown} is already a fresh copy of {rel.as_posix()}")
        elif copy.exists():
            backup = _backup_name(copy)
            out(f"replacing {shown} with a fresh copy of {rel.as_posix()}; "
                f"the one replaced is kept as {FOLDER}/{backup.relative_to(work).as_posix()}")
            os.link(copy, backup)       # fails rather than write over anything
            os.unlink(copy)
            backups.append(backup)
            _write_new(copy, data)
        else:
            out(f"copying {rel.as_posix()} to {shown}")
            _write_new(copy, data)
        record[rel.as_posix()] = _digest(data)
        _write_record(work, record)
    return backups


def workcopy_command(*, notebooks: list[str], fresh: bool, every: bool, root: Path = ROOT) -> int:
    """``labkit workcopy [--fresh NOTEBOOK ...|--fresh --all]``"""
    if not fresh and (notebooks or every):
        raise LabkitError("Naming notebooks (or --all) asks for fresh copies of them.",
                          "add --fresh: `labkit workcopy --fresh NOTEBOOK ...` or `labkit workcopy --fresh --all`.")
    if not fresh:
        copy_missing(root)
        return 0
    if bool(notebooks) == every:
        raise LabkitError("--fresh takes the notebooks whose copies it replaces, or --all, not both." if every
                          else "--fresh needs the notebooks whose copies it replaces.",
                          "name them (`labkit workcopy --fresh notebooks/NAME.ipynb ...`) or pass --all.")
    work_folder(root)
    names = sources(root) if every else [source_of(name, root) for name in notebooks]
    replace(list(dict.fromkeys(names)), root)
    return 0
