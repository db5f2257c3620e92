"""The benchmark: every figure is produced, each from real runs on the real server.

Only the *presence* and sanity of the figures is asserted here (positive numbers, ratios that
are the quotient of the two measured figures); whether the goals are met is the benchmark's
own output (`labkit bench --check`), not a unit test.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import backends_gone

from labkit.core.errors import LabkitError
from labkit.core.queries import strip_comments
from labkit.tools import bench

ROOT = Path(__file__).resolve().parent.parent


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.fixture(scope="module")
def quick():
    """One `labkit bench --quick --json` run as a subprocess (the command a reader types)."""
    before = _digest(bench.NOTEBOOKS)
    proc = subprocess.run([sys.executable, "-m", "labkit", "bench", "--quick", "--seconds", "0.3",
                           "--json", "--notebooks", "00_start_here"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr, before


def test_quick_run_produces_every_key(quick):
    result, _, _ = quick
    for key in ("claim_jobs_per_s", "pgbench_jobs_per_s", "ratio_vs_pgbench", "ratio_vs_peer",
                "convoy_efficiency_16", "notebook_seconds", "workbook_seconds", "history",
                "server_start", "amqp", "peer", "goals"):
        assert key in result, key
    assert set(result["claim_jobs_per_s"]) == set(result["pgbench_jobs_per_s"]) == {"1", "10", "100"}


def test_every_run_says_how_durable_its_commits_were(quick, db):
    result, stderr, _ = quick
    d = result["durability"]
    with db.connect() as conn:
        for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"):
            assert d[name] == conn.execute(f"SHOW {name}").fetchone()[0], name
    assert d["commits_durable"] == (d["fsync"] == "on" and d["synchronous_commit"] != "off")
    assert set(d["claim_jobs_per_s_synchronous_commit_off"]) == {"1", "10"}
    assert all(v > 0 for v in d["claim_jobs_per_s_synchronous_commit_off"].values())
    if d["fsync"] == "on":
        assert set(d["claim_jobs_per_s_durable"]) == {"1", "10"}
        assert all(v > 0 for v in d["claim_jobs_per_s_durable"].values())
    else:  # nothing durable can be measured on such a server, and the result says so
        assert d["claim_jobs_per_s_durable"] is None and "fsync = off" in d["note"]
    assert "durability, batch" in stderr


def test_the_durable_ceiling_really_ran_with_durable_commits(lab):
    """Each order's synchronous_commit reaches every claimer connection: the claimers read it
    back from the server while they run."""
    bench.ensure_job_table(lab)
    with bench.ClaimerPool(lab, 2) as pool:
        for sc in ("off", "on", "off"):
            bench.fill(lab, 2_000, history=0)
            res = pool.order(mode="ceiling", batch=10, seconds=0.2, style="pq", synchronous_commit=sc)
            assert res["synchronous_commit"] == [sc, sc]


def test_claim_figures_are_measured_and_ratios_are_their_quotients(quick):
    result, _, _ = quick
    for b in ("1", "10", "100"):
        mine, theirs = result["claim_jobs_per_s"][b], result["pgbench_jobs_per_s"][b]
        assert mine > 0 and theirs > 0
        assert result["ratio_vs_pgbench"][b] == pytest.approx(mine / theirs)
    # each median comes from runs whose claimed rows were counted in the table
    runs = result["ceiling_runs"]
    assert {r["who"] for r in runs} >= {"labkit", "pgbench", "labkit (cursor API)"}
    assert all(r["jobs"] > 0 and r["seconds"] > 0 for r in runs)
    # a batch of 10 moves more jobs per second than single-job claims, on any machine
    assert result["claim_jobs_per_s"]["10"] > result["claim_jobs_per_s"]["1"]


def test_peer_and_convoy_and_history_figures(quick):
    result, _, _ = quick
    peer = result["peer"]
    assert peer["labkit"]["jobs_per_s"] > 0
    # the test extra installs PgQueuer, so the peer figure is always measured in the suite
    assert bench.peer_available()[0], "pip install -e '.[test]' installs pgqueuer[asyncpg]"
    assert result["ratio_vs_peer"] == pytest.approx(peer["labkit"]["jobs_per_s"] / peer["pgqueuer"]["jobs_per_s"])
    assert "PgQueuer" in peer["what"] and "labkit" in peer["what"]
    assert 0 < result["convoy_efficiency_16"] < 1.5
    points = result["history"]["points"]
    assert {(p["done_rows"], p["partial_index"]) for p in points} == {
        (0, True), (0, False), (result["history"]["done_rows"], True), (result["history"]["done_rows"], False)}
    assert all(p["jobs_per_s"] > 0 for p in points)


def test_the_broker_is_measured_in_the_same_run_as_the_durable_claim(quick):
    """With RabbitMQ at LABKIT_AMQP_URL (CI's second leg), the JSON carries the broker's durable
    figure per batch beside the table's durable claim from the same run, and what each side
    was measured under; without one it says the broker was not measured."""
    result, stderr, _ = quick
    a, d = result["amqp"], result["durability"]
    if os.environ.get("LABKIT_AMQP_URL", "").strip():
        assert a["measured"] is True and "skipped" not in a
        m = a["durable"]
        assert set(m["messages_per_s"]) == set(d["claim_jobs_per_s_durable"]) == {"1", "10"}
        assert all(v > 0 for v in m["messages_per_s"].values()) and m["publish_msgs_per_s"] > 0
        assert m["table_claim_jobs_per_s_durable"] == d["claim_jobs_per_s_durable"]   # this run's
        assert m["consumers"] == result["settings"]["clients"] and m["messages"] % 10 == 0
        for b, v in m["messages_per_s"].items():
            assert m["ratio_to_table"][b] == pytest.approx(v / d["claim_jobs_per_s_durable"][b])
        assert m["under"]["fsync"] == d["fsync"] and m["under"]["synchronous_commit"] == d["synchronous_commit"]
        assert "persistent" in m["under"]["broker"] and "confirm" in m["under"]["broker"]
        assert a["transient"]["publish_msgs_per_s"] > 0 and a["transient"]["consume_msgs_per_s"] > 0
        assert "broker, durable, batch 10" in stderr
        assert "durable claim vs durable consume+ack, batch 1" in bench.table(result)
    else:
        assert a["measured"] is False and "durable" not in a
        assert "not measured" in a["skipped"] and "LABKIT_AMQP_URL" in a["skipped"]
        assert "not measured here" in bench.table(result)


def test_a_broker_that_does_not_answer_is_said_not_measured(monkeypatch):
    monkeypatch.setenv("LABKIT_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
    said: list[str] = []
    out = bench.amqp(bench.Settings.quick_settings(), said.append)["amqp"]
    assert out["measured"] is False and "durable" not in out
    assert "not measured here" in out["skipped"] and "did not answer" in out["skipped"]
    assert any("not measured here" in line for line in said)
    assert "RabbitMQ durable publish msgs/s" not in bench.headline({"amqp": out})


def test_durable_cost_measures_both_commit_modes_again():
    got = bench.durable_cost(1, bench.Settings.quick_settings(seconds=0.3))
    assert got["on"] > 0 and got["off"] > 0 and got["fsync"] in ("on", "off")


def test_broker_server_and_notebook_figures(quick):
    result, _, before = quick
    st = result["server_start"]
    assert st["first_start_s"] > 0 and st["cold_start_s"] > 0 and st["warm_connect_ms"] > 0
    assert set(result["notebook_seconds"]) == {"00_start_here"}
    assert result["notebook_errors"] == {}
    assert result["workbook_seconds"] >= result["notebook_seconds"]["00_start_here"] > 0
    # timing ran copies: nothing in notebooks/ was rewritten
    assert _digest(bench.NOTEBOOKS) == before


def test_goals_are_judged_from_the_measured_figures(quick):
    result, stderr, _ = quick
    by = {g["key"]: g for g in result["goals"]}
    assert by["convoy_efficiency_16"]["measured"] == result["convoy_efficiency_16"]
    assert by["ratio_vs_pgbench_10"]["measured"] == result["ratio_vs_pgbench"]["10"]
    assert by["workbook_seconds"]["status"] == "not measured"     # one notebook is not the workbook
    for g in result["goals"]:
        assert g["status"] in ("met", "missed", "not measured")
    # a progress line per figure went to stderr
    for word in ("claim ceiling", "peer drain", "convoy", "history", "server", "notebook"):
        assert word in stderr
    # and the table renders from the same dict
    text = bench.table(result)
    assert "claim ceiling, batch 10" in text and "goals:" in text and "synchronous_commit" in text


def test_claimer_claims_each_job_once_and_marks_it(lab):
    bench.ensure_job_table(lab)
    bench.fill(lab, 25, history=0)
    a = bench.Claimer(lab.connect(role="bench-a"), "a", batch=10)
    b = bench.Claimer(lab.connect(role="bench-b"), "b", batch=10)
    got_a, got_b = a.claim(), b.claim()
    assert got_a == list(range(1, 11)) and got_b == list(range(11, 21))
    assert a.claim() == [21, 22, 23, 24, 25] and b.claim() == []
    rows = dict(lab.execute("SELECT worker_id, count(*) FROM job WHERE status = 'IN_PROGRESS' GROUP BY 1"))
    assert rows == {"a": 15, "b": 10}
    assert a.finish(got_a) == 10 and b.finish(got_a) == 0        # only the owner finishes its jobs
    assert bench.count_status(lab, "DONE") == 10
    a.close()
    b.close()


def test_pgbench_script_is_the_claim_file_with_pgbench_variables():
    script = bench.pgbench_script()
    plain = strip_comments(bench.claim_statement())
    assert script.strip() == plain.replace("%(batch)s", ":batch").replace("%(worker_id)s", ":client_id")
    assert "FOR UPDATE SKIP LOCKED" in script and "RETURNING job.id" in script


def test_numbered_placeholders():
    text, names = bench.numbered("-- c %(x)s\nSELECT %(a)s, %(b)s, %(a)s")
    assert text == "SELECT $1, $2, $1" and names == ["a", "b"]


def test_claimer_pool_leaves_no_process_or_session(lab, db):
    bench.ensure_job_table(lab)
    bench.fill(lab, 500, history=0)
    with bench.ClaimerPool(lab, 3) as pool:
        res = pool.order(mode="drain", batch=7)
        proc = pool.worker
    assert sum(c["finished"] for c in res["clients"]) == 500 == bench.count_status(lab, "DONE")
    assert not proc.alive
    assert backends_gone(db, f"labkit:{lab.schema}:bench-%") == []


@pytest.mark.parametrize("kw, word", [
    ({"clients": 0}, "clients"),
    ({"seconds": -1}, "seconds"),
    ({"peer_jobs": 0}, "peer_jobs"),
    ({"batches": (0, 10)}, "Batch sizes"),
    ({"clients": 500}, "clients"),
    ({"seconds": float("inf")}, "seconds"),
    ({"seconds": float("nan")}, "seconds"),
    ({"history_rows": 10**12}, "history_rows"),
    ({"convoy_seconds": float("inf")}, "convoy_seconds"),
])
def test_bad_settings_name_the_fix(kw, word):
    with pytest.raises(LabkitError, match=word) as info:
        bench.Settings.quick_settings(**kw).check()
    assert "Fix:" in str(info.value)


def test_unknown_notebook_or_figure_names_the_fix():
    with pytest.raises(LabkitError, match="No notebook") as info:
        bench.notebook_names(["99_nope"])
    assert "00_start_here" in str(info.value)
    with pytest.raises(LabkitError, match="figure"):
        bench.run(figures=("ceiling", "speed"))


def test_reference_file_has_every_key():
    ref = bench.load_reference()
    for key in ("claim_jobs_per_s", "pgbench_jobs_per_s", "ratio_vs_pgbench", "ratio_vs_peer",
                "convoy_efficiency_16", "notebook_seconds", "workbook_seconds"):
        assert ref.get(key) is not None, key
    assert ref["quick"] is False and ref["workbook_complete"]
    assert ref["history"]["done_rows"] == 1_000_000


def test_reference_run_is_durable_and_labelled_as_its_settings_say():
    """The reference's durability label follows from its settings, and its commits were durable,
    as a learner's embedded server's are: notebook 16 sets the two runs side by side."""
    d = bench.load_reference()["durability"]
    assert d["commits_durable"] == (d["fsync"] == "on" and d["synchronous_commit"] != "off")
    assert d["commits_durable"] is True, "record the reference on a server with fsync = on"
    assert set(d["claim_jobs_per_s_durable"]) == {"1", "10"}
    assert all(v > 0 for v in d["claim_jobs_per_s_durable"].values())


def _figure(v: float) -> str:
    """A figure as bench_reference.md writes it: two decimals below 10, else a whole number."""
    return f"{v:.2f}" if abs(v) < 10 else f"{v:,.0f}"


def _reference_md_figures(ref: dict) -> dict[str, list[str]]:
    """Every number of each "What it says" line of bench_reference.md, in the order written,
    as the JSON gives it (the line's first words name it)."""
    c, p, r = ref["claim_jobs_per_s"], ref["pgbench_jobs_per_s"], ref["ratio_vs_pgbench"]
    batches = list(c)
    d, peer, h = ref["durability"], ref["peer"], ref["history"]
    by = {(pt["done_rows"], pt["partial_index"]): pt["jobs_per_s"] for pt in h["points"]}
    a, st, nb = ref["amqp"], ref["server_start"], ref["notebook_seconds"]
    durable, off = d["claim_jobs_per_s_durable"], d["claim_jobs_per_s_synchronous_commit_off"]
    return {
        "Claim ceiling": [*map(_figure, c.values()), *batches, *map(_figure, p.values()),
                          *(f"{v:.2f}" for v in r.values())],
        "Durable commits": [x for b in durable for x in (_figure(durable[b]), _figure(off[b]), b)],
        "Draining": [f"{peer['labkit']['jobs']:,}", _figure(peer["labkit"]["jobs_per_s"]),
                     _figure(peer["pgqueuer"]["jobs_per_s"]), f"{ref['ratio_vs_peer']:.2f}"],
        "Convoy": [str(ref["convoy"]["workers"]), str(ref["convoy"]["job_ms"]),
                   f"{ref['convoy_efficiency_16']:.2f}"],
        "History": [_figure(by[(0, True)]), _figure(by[(h["done_rows"], True)]), "0",
                    f"{h['done_rows']:,}", _figure(by[(0, False)]), _figure(by[(h["done_rows"], False)])],
        "RabbitMQ": [_figure(a["transient"]["publish_msgs_per_s"]), _figure(a["transient"]["consume_msgs_per_s"]),
                     _figure(a["durable"]["publish_msgs_per_s"]),
                     *map(_figure, a["durable"]["messages_per_s"].values()), *a["durable"]["messages_per_s"],
                     *map(_figure, a["durable"]["table_claim_jobs_per_s_durable"].values())],
        "Embedded server": [f"{st['first_start_s']:.2f}", f"{st['cold_start_s']:.2f}",
                            f"{st['warm_connect_ms']:.1f}"],
        "Notebooks": [f"{max(nb.values()):.1f}", str(len(nb)), f"{ref['workbook_seconds']:.0f}"],
    }


def test_reference_md_says_what_the_reference_json_holds():
    """bench_reference.md describes the recorded run: its server settings, its length, its load
    and every number of every "What it says" line and goal are the JSON's, rounded as written."""
    ref = bench.load_reference()
    text = (ROOT / "data" / "bench_reference.md").read_text(encoding="utf-8")
    settings = next(line for line in text.splitlines() if line.startswith("| server settings |"))
    said = dict(re.findall(r"`(\w+) = (\w+)`", settings))
    for name in ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"):
        assert said.get(name) == ref["durability"][name], name
    assert f"run took {ref['bench_seconds']:.0f} s." in " ".join(text.split())
    assert f"{ref['machine']['cpus']} vCPUs" in text
    assert f"load average {ref['machine']['load_average_1m']:.1f} " in text
    says = text.split("## What it says", 1)[1].split("\n## ", 1)[0]
    # each bullet, its wrapped lines joined, up to the blank line that may follow it
    bullets = [" ".join(b.split("\n\n", 1)[0].split()) for b in re.split(r"\n- ", "\n" + says)[1:]]
    figures = {b.split(":", 1)[0].split(" (", 1)[0]: b for b in bullets if not b.startswith("**")}
    expected = _reference_md_figures(ref)
    for name, line in figures.items():
        matched = [k for k in expected if name.startswith(k)]
        assert matched, f"a 'What it says' line the test does not know: {line!r}"
        numbers = re.findall(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?", line)
        assert numbers == expected[matched[0]], line
    assert len(figures) == len(expected)
    for g in ref["goals"]:
        assert f"**{g['status']}**: {g['goal']} (measured {_figure(g['measured'])})" in says, g["goal"]


def test_pgbench_never_gets_the_password_on_its_command_line(lab, tmp_path):
    """Anyone on the machine can read a command line (ps): pgbench is given the connection
    without the password, which waits in a file only we can read, removed after the run."""
    import dataclasses
    import threading
    import time

    import psutil
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(lab.db.dsn)
    info.setdefault("password", "s3cret-Pw")          # a trust server takes any password
    secret = info["password"]
    lab.db = dataclasses.replace(lab.db, dsn=make_conninfo(**info))
    bench.ensure_job_table(lab, index=True)
    bench.fill(lab, 20_000, history=0)
    script = tmp_path / "claim.sql"
    script.write_text(bench.pgbench_script())
    seen: list = []

    def watch():
        me = psutil.Process()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not seen:
            for p in me.children(recursive=True):
                try:
                    if "pgbench" in p.name():
                        seen.append((p.cmdline(), p.environ().get("PGPASSFILE")))
                except psutil.Error:
                    pass
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = bench.run_pgbench(lab, 1, 2, 1.0, script, bench.pgbench_path(lab.db))
    watcher.join(5)
    assert run.jobs > 0                                  # it connected and claimed
    assert seen, "pgbench was never seen running"
    argv, passfile = seen[0]
    assert argv and not any(secret in arg for arg in argv), argv
    assert not any("password" in arg for arg in argv), argv
    assert passfile and not os.path.exists(passfile) and not os.path.exists(os.path.dirname(passfile))


def test_without_nbclient_the_notebook_figure_is_skipped_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nbclient", None)          # `import nbclient` now fails
    said: list[str] = []
    out = bench.time_notebooks(["00_start_here"], said.append)
    assert out["notebook_seconds"] == {} and out["workbook_seconds"] is None
    assert "pip install 'labkit[slides]'" in out["notebooks_skipped"]
    assert any("pip install 'labkit[slides]'" in line for line in said)
    assert {g["key"]: g["status"] for g in bench.goals(out)}["notebook_max_seconds"] == "not measured"


def test_without_pika_the_broker_figure_is_skipped_naming_the_extra(monkeypatch):
    monkeypatch.setenv("LABKIT_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
    monkeypatch.setitem(sys.modules, "pika", None)
    said: list[str] = []
    out = bench.amqp(bench.Settings.quick_settings(), said.append)
    assert "pip install 'labkit[rabbitmq]'" in out["amqp"]["skipped"]
    assert any("labkit[rabbitmq]" in line for line in said)


def test_pgbench_sessions_carry_the_claimers_guards(lab, monkeypatch):
    """pgbench gets the lab's search_path, a labkit session name and the workers' guards."""
    seen: dict = {}

    def fake_run(args, env, **kw):
        seen.update(env)
        raise subprocess.TimeoutExpired(args, 0)

    bench.ensure_job_table(lab)
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    with pytest.raises(LabkitError, match="pgbench did not finish"):
        bench.run_pgbench(lab, 1, 1, 1.0, Path("claim.sql"), Path("pgbench"))
    assert seen["PGAPPNAME"] == f"labkit:{lab.schema}:bench-pgbench"[:63]
    assert seen["PGOPTIONS"].split(" -c ") == [
        f"-c search_path={lab.schema},public", "lock_timeout=10s", "statement_timeout=60s",
        "idle_in_transaction_session_timeout=60s"]


def test_figures_measures_only_the_figures_named(db):
    proc = subprocess.run([sys.executable, "-m", "labkit", "bench", "--quick", "--json",
                           "--figures", "server"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["server_start"]["warm_connect_ms"] > 0
    assert not result.get("claim_jobs_per_s") and not result.get("history")
    bad = subprocess.run([sys.executable, "-m", "labkit", "bench", "--figures", "speed"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "invalid choice: 'speed'" in bad.stderr
