"""The labkit command line: its one argparse tree, the README's list of it, and labkit
doctor and labkit clean run as a user would run them."""

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import cli

README = Path(__file__).resolve().parent.parent / "README.md"


def labkit_cmd(*args):
    return subprocess.run([sys.executable, "-m", "labkit", *args], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=120)


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, help text, parser, has subcommands) of every command and subcommand in the tree."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                yield (*path, name), helps.get(name), sub, nested
                yield from commands(sub, (*path, name))


def test_every_command_and_subcommand_has_help_and_its_help_exits_0(capsys):
    tree = list(commands(cli.build_parser()))
    assert {" ".join(path) for path, *_ in tree} >= {"server status", "trace drain", "drill check",
                                                     "grade claim", "spec run", "bench-history"}
    for path, text, _, _ in tree:
        assert text and text.strip(), f"`labkit {' '.join(path)}` has no help text"
        with pytest.raises(SystemExit) as done:
            cli.main([*path, "--help"])
        assert done.value.code == 0, path
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: labkit {' '.join(path)} "), shown


def test_no_arguments_print_the_usage_and_exit_2_and_help_exits_0():
    bare = labkit_cmd()
    assert bare.returncode == 2 and bare.stdout.startswith("usage: labkit"), bare.stdout + bare.stderr
    helped = labkit_cmd("--help")
    assert helped.returncode == 0 and "trace" in helped.stdout and "bench-history" in helped.stdout
    unknown = labkit_cmd("trace", "nothing")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def readme_commands(tree: dict[tuple[str, ...], bool]) -> set[tuple[str, ...]]:
    """The commands the README's command list shows (``labkit trace relay|dual-write ...``
    stands for each of them); each must be one of ``tree`` (path -> has subcommands)."""
    section = README.read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    found = set()
    for line in block.splitlines():
        words = line.split("#", 1)[0].split()
        assert words[:1] == ["labkit"] and len(words) > 1, line
        paths = [()]
        for word in words[1:]:
            paths = [(*p, w) for p in paths for w in word.split("|")]
            unknown = [" ".join(p) for p in paths if p not in tree]
            assert not unknown, f"the README lists what labkit does not have: {unknown}"
            found.update(paths)
            if not any(tree[p] for p in paths):       # commands that run: the rest is options
                break
    return found


def test_the_readme_lists_every_command_of_the_tree():
    tree = {path: nested for path, _, _, nested in commands(cli.build_parser())}
    missing = sorted(" ".join(p) for p in set(tree) - readme_commands(tree))
    assert not missing, f"the README's command list lacks: {missing}"


def test_doctor_reports_a_session_left_in_a_transaction_and_clean_ends_it(lab):
    lab.create_jobs(1)
    stray = lab.connect(role="forgotten")
    stray.execute("BEGIN")
    stray.execute("SELECT id FROM job FOR UPDATE")
    pid = stray.info.backend_pid
    # a moment ago is not a leftover by default (it could be a running notebook) ...
    assert f"pid {pid}" not in labkit_cmd("doctor").stdout
    # ... but it is once it has been idle longer than the threshold
    out = labkit_cmd("doctor", "--idle-seconds", "0")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"pid {pid}" in out.stdout and "labkit clean" in out.stdout
    assert "PostgreSQL" in out.stdout and "psycopg" in out.stdout
    cleaned = labkit_cmd("clean", "--idle-seconds", "0")
    assert cleaned.returncode == 0 and "ended" in cleaned.stdout
    # the lock is gone with the session
    assert lab.execute("SELECT id FROM job FOR UPDATE NOWAIT") == [(1,)]
    stray.close()


def _slot_names(lab) -> set[str]:
    return {r[0] for r in lab.execute("SELECT slot_name FROM pg_replication_slots")}


def test_a_killed_cdc_runs_slot_is_reported_and_dropped_by_clean_and_others_kept(lab):
    """A slot named like the change-data-capture lab's (a physical one here, so that a server
    at wal_level replica can hold it too: clean goes by the name) keeps WAL until dropped."""
    from labkit.core.db import current_user_tag
    from labkit.core.lab import schema_name
    gone = f"{schema_name(f'cdc_gone_{os.getpid()}', current_user_tag())}_cdc"
    mine = f"{lab.schema}_cdc"                              # its schema still exists
    other = f"lab_cdc_gone_{os.getpid()}_someone_else_cdc"    # another user's, schema gone
    for slot in (gone, mine, other):
        lab.execute("SELECT pg_create_physical_replication_slot(%s, true)", (slot,))
    try:
        out = labkit_cmd("doctor").stdout
        assert f"replication slot {gone} (inactive) keeps" in out and "labkit clean" in out
        cleaned = labkit_cmd("clean")
        assert cleaned.returncode == 0, cleaned.stderr
        assert "dropped 1 replication slot(s)" in cleaned.stdout
        assert _slot_names(lab) & {gone, mine, other} == {mine, other}
    finally:
        for slot in _slot_names(lab) & {gone, mine, other}:
            lab.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_doctor_exits_1_when_the_server_cannot_be_reached(tmp_path):
    env = os.environ.copy()
    env["LABKIT_DSN"] = "postgresql://nobody@127.0.0.1:1/none"
    out = subprocess.run([sys.executable, "-m", "labkit", "doctor"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 1 and "PROBLEM" in out.stdout


def test_bad_usage_is_reported_by_argparse():
    out = labkit_cmd("server", "explode")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_build_parser_is_a_short_list_of_one_builder_per_command_group():
    import inspect

    source = inspect.getsource(cli.build_parser)
    assert len(source.splitlines()) < 60, "build_parser should only call the configure_*_parser builders"
    builders = re.findall(r"^\s+(configure_\w+_parser)\(commands\)$", source, re.M)
    assert len(builders) >= 10 and all(callable(getattr(cli, name)) for name in builders)
    assert "lambda" not in source and "add_argument" not in source


def _convoy_json(*spelling: str) -> list[dict]:
    out = labkit_cmd("convoy", "--workers", "1,2", "--policies", "nowait,skip", "--seconds", "0.2",
                     "--job-ms", "10", "--no-progress", *spelling)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def test_convoy_json_prints_what_format_json_prints(db):
    """``labkit convoy --json`` is ``--format json``: the same points, the same fields (the
    measured figures differ from run to run; the model's do not)."""
    spelt_short, spelt_long = _convoy_json("--json"), _convoy_json("--format", "json")
    assert [list(row) for row in spelt_short] == [list(row) for row in spelt_long]
    same = ("policy", "workers", "model_jobs_per_s")
    assert [[row[k] for k in same] for row in spelt_short] == [[row[k] for k in same] for row in spelt_long]
    assert [(row["policy"], row["workers"]) for row in spelt_short] == [("nowait", 1), ("nowait", 2),
                                                                       ("skip", 1), ("skip", 2)]


def test_convoy_json_is_documented_and_refused_beside_another_format(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["convoy", "--help"])
    assert done.value.code == 0
    assert "the same as --format json" in " ".join(capsys.readouterr().out.split())
    both = labkit_cmd("convoy", "--format", "csv", "--json")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr, both.stderr
