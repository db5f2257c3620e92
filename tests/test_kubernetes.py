"""hub/kubernetes: the room's values for the Zero to JupyterHub chart, its image and start hook.

The values are checked as Helm checks them: the room's files merged (the shared mode's overlay
on top of values.yaml), then coalesced with the chart's defaults, then validated against the
chart's schema (JSON schema draft 7).  The chart's files are reference data outside the project, in
../shared/reference/z2jh/ beside the checkout; where they are absent those tests skip, saying
so.  No cluster, no Docker and no database server is needed: these run under -m "not server".
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from labkit.tools import capacity

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "hub" / "kubernetes"
VALUES = KUBE / "values.yaml"
SHARED = KUBE / "values-shared.yaml"
DOCKERFILE = KUBE / "Dockerfile"
HOOK = KUBE / "claimlab-home"
# The chart's files: LABKIT_Z2JH names their folder, or they are beside the checkout.  With
# LABKIT_REQUIRE_Z2JH=1 (CI, where it found them) their absence is a failure, not a skip.
Z2JH = Path(os.environ.get("LABKIT_Z2JH") or ROOT.parent / "shared" / "reference" / "z2jh")


def deep_merge(base, over):
    """Helm's merge of the values files given with -f, in order: mappings key by key, anything
    else (lists, and null too) replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    return copy.deepcopy(over)


def coalesce(values, defaults):
    """Helm's coalescing of the merged files with the chart's defaults (chartutil's
    coalesceValues): a key the chart has and the files set to null is removed; a mapping of
    the files is coalesced with the chart's key by key; a key the files lack is the chart's."""
    out = copy.deepcopy(values)
    for key, default in defaults.items():
        if key not in out:
            out[key] = copy.deepcopy(default)
        elif out[key] is None:
            del out[key]
        elif isinstance(out[key], dict) and isinstance(default, dict):
            out[key] = coalesce(out[key], default)
    return out


def helm_values(defaults, *layers):
    """What Helm validates and renders: the files merged in order, coalesced with the chart's."""
    merged = {}
    for layer in layers:
        merged = deep_merge(merged, layer)
    return coalesce(merged, defaults)


def load(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def chart():
    schema, defaults = Z2JH / "values.schema.yaml", Z2JH / "values.yaml"
    if not (schema.is_file() and defaults.is_file()):
        if os.environ.get("LABKIT_REQUIRE_Z2JH"):
            pytest.fail(f"LABKIT_REQUIRE_Z2JH is set, and the chart's schema and defaults are not in {Z2JH}")
        pytest.skip(f"the Zero to JupyterHub chart's schema and defaults are not here ({Z2JH}: "
                    "values.schema.yaml and values.yaml): the values are not checked against the chart")
    return load(schema), load(defaults)


def errors(chart, *layers) -> list[str]:
    import jsonschema
    schema, defaults = chart
    merged = helm_values(defaults, *layers)
    validator = jsonschema.Draft7Validator(schema)
    return sorted(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                  for e in validator.iter_errors(merged))


def test_the_merge_is_helms():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert deep_merge(base, {"a": {"c": [3]}, "e": 2}) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert deep_merge(base, {"a": None}) == {"a": None, "d": 1}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}          # not changed in place
    # null in a file removes the chart's key; a key the chart does not have stays null
    chart_defaults = {"a": {"b": 1, "h": {}}, "d": 1}
    assert helm_values(chart_defaults, {"a": {"h": {"x": 1}}}, {"a": {"h": None, "n": None}}) == \
        {"a": {"b": 1, "n": None}, "d": 1}
    assert helm_values(chart_defaults, {"a": {"h": {"x": 1}}}, {"a": {"h": {}}}) == \
        {"a": {"b": 1, "h": {"x": 1}}, "d": 1}                # {} keeps what the first file set


def test_the_embedded_values_pass_the_charts_schema(chart):
    assert errors(chart, load(VALUES)) == []


def test_the_shared_overlay_on_top_passes_the_charts_schema(chart):
    assert errors(chart, load(VALUES), load(SHARED)) == []


def test_the_shared_overlay_removes_the_embedded_servers_prestop_hook(chart):
    """values.yaml's preStop runs `labkit server stop`; the shared mode has no embedded server:
    the overlay's null removes the hook from what Helm renders, and the result is valid."""
    _, defaults = chart
    embedded = helm_values(defaults, load(VALUES))["singleuser"]
    assert embedded["lifecycleHooks"]["preStop"]["exec"]["command"] == ["labkit", "server", "stop"]
    shared = helm_values(defaults, load(VALUES), load(SHARED))["singleuser"]
    assert "preStop" not in (shared.get("lifecycleHooks") or {})
    assert load(SHARED)["singleuser"]["lifecycleHooks"] is None


def test_the_readmes_https_example_passes_the_charts_schema(chart):
    """The proxy's own HTTPS (Let's Encrypt, for a host name), as the README shows it."""
    text = (ROOT / "README.md").read_text()
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "https:" in b]
    assert len(blocks) == 1, "one example of proxy.https in the README"
    https = blocks[0]["proxy"]["https"]
    assert https["enabled"] is True and https["type"] == "letsencrypt"
    assert https["hosts"] and https["letsencrypt"]["contactEmail"]
    assert errors(chart, load(VALUES), blocks[0]) == []


def test_a_misspelt_key_is_reported(chart):
    values = load(VALUES)
    values["singleuser"]["memroy"] = values["singleuser"].pop("memory")
    found = errors(chart, values)
    assert any("singleuser" in e and "memroy" in e for e in found), found
    shared = load(SHARED)
    shared["hub"]["extraVolumeMount"] = shared["hub"].pop("extraVolumeMounts")
    found = errors(chart, load(VALUES), shared)
    assert any("extraVolumeMount" in e for e in found), found


def test_a_value_of_the_wrong_type_is_reported(chart):
    values = load(VALUES)
    values["cull"]["timeout"] = "an hour"
    assert any(e.startswith("cull.timeout") for e in errors(chart, values))


# -- what the room needs from the chart ------------------------------------------------------

def test_the_room_settings_are_there():
    v = load(VALUES)
    su = v["singleuser"]
    assert su["extraEnv"]["LABKIT_MYSQL_DSN"] == "off"
    assert su["extraEnv"]["LABKIT_CLASSROOM"] == "1"
    assert v["cull"]["enabled"] is True and v["cull"]["timeout"] > 0 and v["cull"]["every"] > 0
    assert su["storage"]["capacity"].endswith("Gi")
    # Docker Stacks' wrapper of jupyterhub-singleuser (the start hooks are run by the image's
    # entrypoint, start.sh, whatever the command)
    assert su["cmd"] == "start-singleuser.py"
    assert su["lifecycleHooks"]["preStop"]["exec"]["command"] == ["labkit", "server", "stop"]
    # the time the preStop hook needs (KubeSpawner's default is 1 s)
    spawner = v["hub"]["config"]["KubeSpawner"]
    assert spawner["delete_grace_period"] >= 30
    assert spawner["pod_security_context"] == {"fsGroupChangePolicy": "OnRootMismatch"}
    assert "LABKIT_DSN" not in su["extraEnv"]             # embedded: each pod's own server


def test_the_guarantees_are_what_the_plan_computes_from_the_measured_footprint():
    """values.yaml (embedded) and values-shared.yaml hold the guarantees `labkit hub plan`
    prints for data/room_footprint.yaml: a footprint measured again means new values."""
    merged = {"embedded": load(VALUES)["singleuser"],
              "shared": deep_merge(load(VALUES), load(SHARED))["singleuser"]}
    for mode, su in merged.items():
        fp = capacity.load_footprint(None, mode)
        assert su["cpu"]["guarantee"] == pytest.approx(capacity.cpu_per_trainee(fp)), mode
        assert su["memory"]["guarantee"] == f"{capacity.memory_mib_per_trainee(fp)}Mi", mode
        assert capacity.quantity_bytes(su["memory"]["limit"]) > capacity.quantity_bytes(su["memory"]["guarantee"])
        assert su["cpu"]["limit"] == capacity.CPU_LIMIT
        assert capacity.quantity_bytes(su["memory"]["limit"]) == capacity.MEMORY_LIMIT_MIB * capacity.MIB


def test_the_shared_hook_reads_the_json_labkit_classroom_writes(tmp_path):
    """The pre_spawn_hook of values-shared.yaml, run as the hub runs extraConfig, on a file
    of the shape `labkit classroom create --json` prints (classroom.as_json)."""
    from types import SimpleNamespace

    from labkit.tools import classroom

    made = [SimpleNamespace(name=f"trainee0{i}", dsn=f"postgresql://claimlab_trainee0{i}:pw{i}@db/room")
            for i in (1, 2)]
    secret = tmp_path / "trainees.json"
    secret.write_text(json.dumps(classroom.as_json(made)))
    code = load(SHARED)["hub"]["extraConfig"]["claimlab-dsn"]
    assert "/etc/claimlab/trainees.json" in code
    mount = load(SHARED)["hub"]["extraVolumeMounts"][0]["mountPath"]
    assert mount == "/etc/claimlab"
    c = SimpleNamespace(KubeSpawner=SimpleNamespace())
    exec(compile(code.replace("/etc/claimlab/trainees.json", str(secret)), "claimlab-dsn", "exec"), {"c": c})
    hook = c.KubeSpawner.pre_spawn_hook

    def spawn(name, admin=False):
        spawner = SimpleNamespace(user=SimpleNamespace(name=name, admin=admin), environment={})
        hook(spawner)
        return spawner.environment

    assert spawn("trainee02") == {"LABKIT_DSN": made[1].dsn}
    assert spawn("presenter", admin=True) == {}
    with pytest.raises(RuntimeError, match="trainee03 has no DSN"):
        spawn("trainee03")


# -- the image and its start hook agree with the values ------------------------------------

def test_the_default_url_names_a_notebook_of_the_workbook():
    url = load(VALUES)["singleuser"]["defaultUrl"]
    found = re.fullmatch(r"/lab/tree/claimlab/(notebooks/[\w]+\.ipynb)", url)
    assert found, url
    assert (ROOT / found.group(1)).is_file(), url


def test_the_dockerfile_installs_the_workbook_and_its_hook_where_docker_stacks_runs_it():
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"quay\.io/jupyter/minimal-notebook:\d{4}-\d{2}-\d{2}", base.group(1)), \
        "the base is minimal-notebook, pinned by a date tag"
    copied = re.findall(r"^COPY .*?(\S+) /opt/claimlab/?(\S*)$", text, re.M)
    into_opt = {src for src, _ in copied}
    for part in ("labkit", "data", "notebooks", "student"):
        assert part in into_opt and (ROOT / part).is_dir(), part
    assert "pip install --no-cache-dir /tmp/claimlab-build" in text and "-e " not in text
    hook = re.search(r"^COPY .*hub/kubernetes/claimlab-home (/usr/local/bin/before-notebook\.d/\S+)$", text, re.M)
    assert hook and not hook.group(1).endswith(".sh"), "an executable hook, run (a .sh would be sourced)"
    assert HOOK.is_file() and os.access(HOOK, os.X_OK)
    assert re.search(r"^USER \$\{NB_UID\}$", text, re.M), "labkit installed as jovyan, who owns the conda env"


def test_the_dockerignore_keeps_the_local_environments_out():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".hubenv", "work"} <= ignored
    assert not {"labkit", "data", "notebooks", "student", "hub"} & ignored


def test_the_hook_copies_the_workbook_where_the_default_url_points_and_keeps_a_trainees_copy(tmp_path):
    home = tmp_path / "jovyan"
    home.mkdir()
    env = {"PATH": os.defpath, "HOME": str(home), "CLAIMLAB_WORKBOOK": str(ROOT)}
    stale = home / ".cache" / "labkit" / "pg18" / "data" / "postmaster.pid"
    stale.parent.mkdir(parents=True)
    stale.write_text("12345\n")
    subprocess.run(["sh", str(HOOK)], env=env, check=True, timeout=60)
    url = load(VALUES)["singleuser"]["defaultUrl"]
    first = home / url.removeprefix("/lab/tree/")
    assert first.is_file()
    assert (home / "claimlab" / "student").is_dir()
    assert not stale.exists(), "a stale postmaster.pid is removed before the server can start"
    first.write_text("the trainee's own work")
    subprocess.run(["sh", str(HOOK)], env=env, check=True, timeout=60)
    assert first.read_text() == "the trainee's own work"
    # the kubelet's fsGroup widened the cluster folder's mode at the mount: set back to 0700
    data = stale.parent
    data.chmod(0o2770)
    subprocess.run(["sh", str(HOOK)], env=env, check=True, timeout=60)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    # shared mode: the embedded server's files are not touched
    stale.write_text("12345\n")
    data.chmod(0o2770)
    subprocess.run(["sh", str(HOOK)], env={**env, "LABKIT_DSN": "postgresql://x@db/room"}, check=True, timeout=60)
    assert stale.exists() and stat.S_IMODE(data.stat().st_mode) == 0o2770
    assert not list(home.glob(".claimlab-copy.*")), "no copy left beside the workbook"


def test_a_copy_a_killed_pod_left_half_made_is_not_taken_for_the_workbook(tmp_path):
    """The workbook is copied into a folder of its own and renamed into place when whole: a
    pod killed mid-copy leaves that folder, not ~/claimlab, and the next start copies again."""
    home = tmp_path / "jovyan"
    half = home / ".claimlab-copy.Ab12Cd" / "notebooks"
    half.mkdir(parents=True)
    (half / "00_start_here.ipynb").write_text("{")              # cut short
    env = {"PATH": os.defpath, "HOME": str(home), "CLAIMLAB_WORKBOOK": str(ROOT)}
    subprocess.run(["sh", str(HOOK)], env=env, check=True, timeout=60)
    copied = home / "claimlab" / "notebooks" / "00_start_here.ipynb"
    assert copied.read_text() == (ROOT / "notebooks" / "00_start_here.ipynb").read_text()
    assert {p.name for p in (home / "claimlab").iterdir()} == {"notebooks", "student"}
    assert not list(home.glob(".claimlab-copy.*"))
    text = HOOK.read_text()
    assert re.search(r'^\s*mv "\$part_copy" claimlab$', text, re.M), "renamed into place when whole"
    assert "cp -R \"$WORKBOOK/$part\" claimlab" not in text
