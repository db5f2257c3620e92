"""Printed text within the width budget: tables whose long cells wrap inside their own column,
and transcripts built on them, every word whole and in order."""

from labkit.core.steps import Step
from labkit.core.text import TEXT_WIDTH, fill, table
from labkit.core.transcript import Row, Transcript


def words_by_column(text: str) -> list[list[str]]:
    """The words of a rendered table, column by column, read top to bottom; the columns are where
    the rule of dashes under the header says."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "} and "-" in line)
    spans, start = [], None
    for i, ch in enumerate(lines[rule] + " "):
        if ch == "-" and start is None:
            start = i
        elif ch == " " and start is not None:
            spans.append((start, i))
            start = None
    out = [[] for _ in spans]
    for line in lines[rule + 1:]:
        for k, (a, b) in enumerate(spans):
            # nothing of a cell may spill into the gap before the next column
            assert line[b:b + 2].strip() == "" or k == len(spans) - 1, line
            out[k] += line[a:b].split()
    return out


def expected_by_column(rows: list[list[str]]) -> list[list[str]]:
    return [[w for r in rows for w in r[k].split()] for k in range(len(rows[0]))]


LONG_NOTE = ("the transaction had failed: COMMIT rolled it back, and every statement it ran before "
             "the error is undone with it")


def two_sessions() -> Transcript:
    rows = [Row("1", "A", "BEGIN  → BEGIN", "", "", "ok"),
            Row("2", "A", "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at…  → id=1",
                "", "A:1", "ok"),
            Row("3", "B", "SELECT id FROM job WHERE status = 'PENDING' ORDER BY created_at…  <waiting ...>",
                "BLOCKS (waits for A; asked for RECORD X,GAP on job_pending ('PENDING', …, 2))",
                "A:1", "waiting"),
            Row("4", "A", "COMMIT  → COMMIT", LONG_NOTE + "; unblocks B", "B:2", "ok"),
            Row("3'", "B", "<... completed> → id=2", "", "B:2", "completed")]
    steps: list[Step] = []
    return Transcript(["A", "B"], rows, steps, show_locks=True)


def test_a_two_session_transcript_fits_and_keeps_every_word_in_its_column():
    t = two_sessions()
    text = t.to_text()
    lines = text.splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH
    rule = next(i for i, line in enumerate(lines) if set(line) <= set("- "))
    assert " ".join(lines[:rule]).split() == ["#", "A", "B", "note", "locked", "rows"]
    cells = [[r.n] + [r.text if r.session == s else "" for s in t.names] + [r.note, r.locks]
             for r in t.rows]
    assert words_by_column(text) == expected_by_column(cells)
    # every step starts a numbered line, in order; its continuation lines leave the number blank
    assert [line.split()[0] for line in lines[rule + 1:] if line[:1] != " "] == [r.n for r in t.rows]


def test_one_row_a_line_fits_too():
    t = two_sessions()
    lines = t.to_lines().splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH
    first = next(i for i, line in enumerate(lines) if line.startswith("1 "))
    assert " ".join(lines[:first]).split() == ["#", "session", "step", "→", "result", "note", "rows",
                                               "locked"]
    groups: list[list[str]] = []          # a row's lines: its numbered line and what follows it
    for line in lines[first:]:
        if line[:1] != " ":
            groups.append([])
        groups[-1].append(line)
    assert [g[0].split()[:2] for g in groups] == [[r.n, r.session] for r in t.rows]
    for r, g in zip(t.rows, groups):
        assert sorted(" ".join(g).split()) == sorted(" ".join([r.n, r.session, r.text, r.note, r.locks]).split())


def test_a_table_that_fits_is_left_as_it_is_and_one_that_does_not_wraps_between_words():
    short = table(["a", "bb"], [["1", "x"], ["22", "yy"]])
    assert short.splitlines() == ["a   bb", "--  --", "1   x", "22  yy"]
    long_cells = [["1", "word " * 40, "short"], ["2", "a" * 20 + " " + "b" * 30, "also short"]]
    text = table(["n", "text", "note"], long_cells, width=40)
    assert max(map(len, text.splitlines())) <= 40
    assert words_by_column(text) == expected_by_column(long_cells)
    # a word longer than its column stays whole: the line may run over rather than cut it
    assert "b" * 30 in text


def test_fill_wraps_prose_at_the_budget_with_its_indent():
    sentence = " ".join(f"word{i}" for i in range(60))
    out = fill(sentence, indent="    ", first="  ")
    lines = out.splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= TEXT_WIDTH
    assert lines[0].startswith("  word0") and all(line.startswith("    word") for line in lines[1:])
    assert out.split() == sentence.split()
