"""``labkit hub``: one JupyterHub for a training room, and its load test.

The hub runs as root on one machine (JupyterHub's own LocalProcessSpawner): every trainee
gets a system user of their own, ``claimlab-trainee01`` ..., with a private home (0700)
holding a copy of the workbook.  Their Jupyter server, kernels and, in the default mode,
their embedded PostgreSQL all run as that user, so one trainee cannot open another's files,
socket or processes.  Where a trainee's PostgreSQL comes from is the room's *mode*:

``embedded``  each trainee's own embedded server, in their home (nothing shared);
``shared``    one server for the room: ``labkit classroom create`` makes one login role per
              trainee and the hub hands each trainee their own DSN (``LABKIT_DSN``).

Log-in: each trainee has a password of their own (``trainee01`` ... only), and the presenter
(``presenter``, the hub's admin) another; they are made for the room, kept in a file only
root may read, and printed on a handout.  A shared room password would let anyone who has
it log in as any trainee, and open that trainee's notebooks and PostgreSQL.

The room's state lives in one folder (``.hub/`` beside the workbook, or ``LABKIT_HUB_DIR``):
``room.json`` (mode, trainees, port), the passwords, the handout and the trainees' DSNs (0600),
JupyterHub's database and cookie secret, and the proxy (``configurable-http-proxy``, from
npm).  ``labkit hub clean`` stops the room's servers and removes the trainee users and
their homes, the passwords, and, in the shared mode, the classroom's roles.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from ..core.errors import LabkitError
from ..core.limits import number
from ..labs import puzzles
from . import classroom, oslimits

if sys.platform != "win32":  # Windows: no system users, no hub
    import pwd

ROOT = Path(__file__).resolve().parents[2]          # the workbook: notebooks/, student/, hub/
CONFIG = ROOT / "hub" / "jupyterhub_config.py"
SYSTEM_PREFIX = "claimlab-"
MARK = "labkit hub trainee"                          # the comment (GECOS) of the users we made
MODES = ("embedded", "shared")
MAX_TRAINEES = 60
PRESENTER = "presenter"
HOMES = Path("/home")
PROXY_PACKAGE = "configurable-http-proxy@5"
NODE_MAJOR = 20                                      # what configurable-http-proxy 5 asks for
PROFILE_MARK = "# labkit hub: labkit and jupyter in the terminal"
# Run as the trainee, in their home: $1 the workbook, $2 the hub's bin folder, $3 the mark.
SETUP_HOME = r"""
set -e
if [ ! -r "$1/notebooks/00_start_here.ipynb" ]; then
  echo "cannot read $1/notebooks: the workbook's folder is closed to this user" >&2; exit 1
fi
if [ ! -e claimlab ]; then
  mkdir claimlab
  for part in notebooks student; do
    if [ -d "$1/$part" ]; then cp -R "$1/$part" claimlab/; fi
  done
  find claimlab -name .ipynb_checkpoints -prune -exec rm -rf {} +
fi
if [ -n "$2" ] && ! grep -qsF "$3" .profile; then
  printf '\nexport PATH="%s:$PATH"   %s\n' "$2" "$3" >> .profile
fi
"""


def hub_dir() -> Path:
    return Path(os.environ.get("LABKIT_HUB_DIR") or ROOT / ".hub").resolve()


HUB_MARK = ".labkit-hub"          # in the room's folder: whether the hub made it, and its mode before
OURS = ("room.json", "node_modules", "package.json", "loadtest", HUB_MARK)


def room_folder(folder: Path) -> Path:
    """The room's folder, private (0700, root's): made here, or an empty folder given by
    LABKIT_HUB_DIR, whose mode ``clean`` gives back.  A folder that holds anything the hub
    did not put there is refused, never closed up."""
    try:
        folder.mkdir(mode=0o700)
        made = True
    except FileExistsError:
        made = False
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise LabkitError(f"{folder} is not a folder (a link or a file is in its place).",
                          "give LABKIT_HUB_DIR a new or empty folder, or remove what is there.")
    mark = folder / HUB_MARK
    if made:
        classroom.write_private(mark, json.dumps({"made": True}))
    elif not os.path.lexists(mark):
        names = {p.name for p in folder.iterdir()}
        if names and not names & set(OURS):
            raise LabkitError(f"{folder} already holds files the hub did not put there "
                              f"({', '.join(sorted(names)[:3])}{' ...' if len(names) > 3 else ''}).",
                              "give LABKIT_HUB_DIR a new or empty folder: the hub makes it private "
                              "(0700) and keeps the room's passwords there.")
        before = {"made": bool(names & set(OURS)), "mode": stat.S_IMODE(st.st_mode),
                  "uid": st.st_uid, "gid": st.st_gid}
        classroom.write_private(mark, json.dumps(before))
    os.chmod(folder, 0o700)
    return folder


def give_back(folder: Path) -> None:
    """An empty folder the presenter gave the hub gets its mode and owner back."""
    mark = folder / HUB_MARK
    try:
        before = json.loads(mark.read_text())
    except (OSError, ValueError):
        return
    if before.get("made", True):
        return
    mark.unlink()
    os.chown(folder, before["uid"], before["gid"])
    os.chmod(folder, before["mode"])


def trainee_names(n: int) -> list[str]:
    return [f"trainee{i:02d}" for i in range(1, n + 1)]


def system_user(trainee: str) -> str:
    if not re.fullmatch(r"trainee\d{2,3}", trainee):
        raise LabkitError(f"{trainee!r} is not a trainee of this room.", "log in as trainee01, trainee02, ...")
    return SYSTEM_PREFIX + trainee


@dataclass
class Room:
    mode: str
    trainees: int
    port: int
    bin: str                                  # the virtual environment's bin folder
    extra: dict = field(default_factory=dict)
    # the room's files, in its folder (all 0600)
    password_file: ClassVar[str] = "passwords.json"     # {"presenter": ..., "trainee01": ..., ...}
    handout_file: ClassVar[str] = "handout.txt"
    dsn_file: ClassVar[str] = "trainees.json"           # shared mode: the classroom's DSNs
    admin_dsn_file: ClassVar[str] = "admin-dsn"         # shared mode: the administrator's DSN

    @property
    def names(self) -> list[str]:
        return trainee_names(self.trainees)

    @staticmethod
    def load(folder: Path | None = None) -> Room:
        folder = folder or hub_dir()
        try:
            return Room(**json.loads((folder / "room.json").read_text()))
        except FileNotFoundError:
            raise LabkitError(f"No room is set up in {folder}.",
                              "run `sudo make hub` (or `labkit hub start --trainees N`) first.") from None

    def save(self, folder: Path) -> None:
        (folder / "room.json").write_text(json.dumps(asdict(self), indent=1) + "\n")

    def passwords(self, folder: Path) -> dict[str, str]:
        return json.loads((folder / self.password_file).read_text())

    def admin_dsn(self, folder: Path) -> str:
        return (folder / self.admin_dsn_file).read_text().strip()


# -- checks -------------------------------------------------------------------------------

def _reachable_by_others(path: Path, *, resolve: bool = True, read: bool = False) -> Path | None:
    """The first folder or file on the way to ``path`` that another user may not pass, or
    run (``read``: read) at the end (None: every user can)."""
    real = path.resolve() if resolve else path.absolute()
    for part in reversed(real.parents):
        if not part.stat().st_mode & 0o001:
            return part
    return None if real.stat().st_mode & (0o004 if read else 0o001) else real


def preflight() -> Path:
    """What the hub needs before anything is made; each missing piece names its fix."""
    if os.name != "posix" or os.geteuid() != 0:
        raise LabkitError("The training hub runs as root: it starts each trainee's server as that "
                          "trainee's own system user.",
                          "run it with sudo (sudo make hub), on the machine the room logs in to.")
    bin_dir = Path(sys.executable).parent
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        raise LabkitError("JupyterHub is not installed in this environment.",
                          "run `make hub`, which installs it (pip install -e '.[hub]').") from None
    blocked = _reachable_by_others(Path(sys.executable))
    if blocked is not None:
        raise LabkitError(f"The trainees' users cannot run this Python: {blocked} is closed to "
                          "other users.",
                          "build the hub's environment from a Python every user can run: "
                          "make hub HUB_PYTHON=/usr/bin/python3 (the default where it exists).")
    for needed, read in ((bin_dir / "jupyterhub-singleuser", False), (ROOT / "labkit" / "__init__.py", True)):
        blocked = _reachable_by_others(needed, resolve=False, read=read)
        if blocked is not None:
            raise LabkitError(f"The trainees' users cannot reach {needed}: "
                              f"{blocked} is closed to other users.",
                              "clone the workbook into a folder every user may enter and read, "
                              "such as /opt/claimlab (not under /root), and run make hub there.")
    if shutil.which("useradd") is None:
        raise LabkitError("useradd is not on this machine, so trainee users cannot be made.",
                          "run the hub on Linux (Debian or Ubuntu: apt-get install passwd).")
    return bin_dir


def proxy_command(folder: Path) -> list[str]:
    """configurable-http-proxy, installed from npm into the room's folder on first use."""
    local = folder / "node_modules" / ".bin" / "configurable-http-proxy"
    for near in (local, folder.parent / "node_modules" / ".bin" / "configurable-http-proxy"):
        if near.exists():                  # a load test's room sits inside the room's folder
            return [str(near)]
    found = shutil.which("configurable-http-proxy")
    if found:
        return [found]
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise LabkitError(f"JupyterHub's proxy (configurable-http-proxy) needs Node.js {NODE_MAJOR} or "
                          "newer and npm.",
                          f"install them (Node.js {NODE_MAJOR} or newer: nodejs.org or NodeSource; "
                          "Debian 12's own nodejs is 18), then run `make hub` again.")
    version = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    major = re.match(r"v?(\d+)", version)
    if major is None or int(major.group(1)) < NODE_MAJOR:
        raise LabkitError(f"JupyterHub's proxy needs Node.js {NODE_MAJOR} or newer; this machine has "
                          f"{version or 'an unknown version'}.",
                          f"install Node.js {NODE_MAJOR} or newer (nodejs.org or NodeSource), then run "
                          "`make hub` again.")
    print(f"installing {PROXY_PACKAGE} from npm into {folder} ...", flush=True)
    done = subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund",
                           "--loglevel", "error", PROXY_PACKAGE], capture_output=True, text=True)
    if done.returncode != 0 or not local.exists():
        raise LabkitError(f"npm could not install {PROXY_PACKAGE}: "
                          f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}",
                          "check that this machine reaches the npm registry, or install it yourself: "
                          f"npm install -g {PROXY_PACKAGE}.")
    return [str(local)]


def _typable(n: int) -> str:
    """A password a trainee types from a slip of paper: no 0/O, 1/l/I."""
    alphabet = "abcdefghjkmnpqrstuvwxyz23456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


def handout(room: Room, passwords: dict[str, str]) -> str:
    lines = [f"Claim Lab training room: http://{_address()}:{room.port}/", ""]
    lines += [f"{name}  password {passwords[name]}" for name in room.names]
    lines += ["", f"(presenter  password {passwords[PRESENTER]}  -- keep this line)"]
    return "\n".join(lines) + "\n"


def _address() -> str:
    """This machine's address as trainees on the network see it (the host name if unsure)."""
    import socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))          # a documentation address: nothing is sent
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


# -- the room's users ---------------------------------------------------------------------

def room_users() -> list[pwd.struct_passwd]:
    """The system users this hub made (name prefix *and* comment): nothing else is touched."""
    return [p for p in pwd.getpwall() if p.pw_name.startswith(SYSTEM_PREFIX) and p.pw_gecos == MARK]


def ensure_user(trainee: str, bin_dir: str | None = None) -> pwd.struct_passwd:
    """The trainee's system user, with a private home holding a copy of the workbook (and,
    given ``bin_dir``, the hub's environment on the PATH of their terminal's login shell,
    which /etc/profile would otherwise reset)."""
    name = system_user(trainee)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        done = subprocess.run(["useradd", "--create-home", "--home-dir", str(HOMES / name),
                               "--shell", "/bin/bash", "--comment", MARK, "--user-group", name],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise LabkitError(f"useradd could not make {name}: {done.stderr.strip()}",
                              "check that this machine lets root add users.") from None
        entry = pwd.getpwnam(name)
    if entry.pw_gecos != MARK:
        raise LabkitError(f"A system user {name} exists and this hub did not make it.",
                          "remove or rename that user, or run the room on another machine.")
    home = Path(entry.pw_dir)
    os.chmod(home, 0o700)         # /home is root's: the trainee cannot put a link in its place
    # Inside the home, everything is done as the trainee: root never writes, copies or
    # follows a link in a folder another user controls.
    done = subprocess.run(["/bin/sh", "-c", SETUP_HOME, "sh", str(ROOT), bin_dir or "", PROFILE_MARK],
                          env=user_env(entry, bin_dir or "/usr/bin"), preexec_fn=as_user(entry),
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise LabkitError(f"Could not set up {name}'s home: {done.stderr.strip()[:300]}",
                          f"check that every user may read {ROOT}.")
    return entry


def as_user(entry: pwd.struct_passwd):
    """A preexec function: become the trainee (groups, gid, uid), in their home."""
    def become():
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        os.chdir(entry.pw_dir)
    return become


def user_env(entry: pwd.struct_passwd, bin_dir: str) -> dict:
    return {"HOME": entry.pw_dir, "USER": entry.pw_name, "LOGNAME": entry.pw_name,
            "SHELL": entry.pw_shell or "/bin/sh", "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"}


def stop_trainee_server(entry: pwd.struct_passwd, bin_dir: str) -> None:
    """``labkit server stop`` as the trainee: their embedded PostgreSQL keeps running after
    their kernel ends (that is how it is shared by their kernels), until this."""
    try:
        subprocess.run([str(Path(bin_dir) / "labkit"), "server", "stop"], env=user_env(entry, bin_dir),
                       preexec_fn=as_user(entry), capture_output=True, timeout=90)
    except (OSError, subprocess.SubprocessError):
        pass        # labkit not runnable as the trainee: clean() ends their processes instead


SHARED_FOLDERS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


def remove_files_of(uid: int, folders=SHARED_FOLDERS) -> list[Path]:
    """Remove what a trainee's user left in the folders every user may write (their
    PgBouncer's folder, a kernel's temporary files): once the user is gone its uid is handed
    out again, and the next user of that uid would own them.  Links are removed, never
    followed; nothing of another user is touched."""
    removed: list[Path] = []
    for top in folders:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid != uid:
                continue
            path = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    path.unlink()
                except OSError:
                    continue
            removed.append(path)
    return removed


def _kill_user_processes(entry: pwd.struct_passwd) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids_of(entry.pw_uid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _pids_of(entry.pw_uid) and time.monotonic() < deadline:
            time.sleep(0.2)


def pids_by_uid(uids) -> dict[int, list[int]]:
    """The processes of each of ``uids``, from one pass over /proc."""
    found: dict[int, list[int]] = {uid: [] for uid in uids}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                uid = d.stat().st_uid
            except FileNotFoundError:      # it ended meanwhile
                continue
            if uid in found:
                found[uid].append(int(d.name))
    return found


def _pids_of(uid: int) -> list[int]:
    return pids_by_uid([uid])[uid]


# -- JupyterHub's spawner -----------------------------------------------------------------

def make_spawner_class(room: Room, folder: Path):
    """The room's spawner, made here so that importing labkit never imports JupyterHub."""
    from jupyterhub.spawner import LocalProcessSpawner

    class RoomSpawner(LocalProcessSpawner):
        """JupyterHub's LocalProcessSpawner, run as the trainee's own system user, with the
        room's mode: nothing more (embedded), or the trainee's own LABKIT_DSN (shared)."""

        def _entry(self) -> pwd.struct_passwd:
            return pwd.getpwnam(system_user(self.user.name))

        async def start(self):
            # once per start, off the hub's event loop: the user, their home and workbook
            # (copied again if the trainee removed it)
            import asyncio
            await asyncio.get_running_loop().run_in_executor(None, ensure_user, self.user.name, room.bin)
            return await super().start()

        def make_preexec_fn(self, name):
            become = super().make_preexec_fn(self._entry().pw_name)
            where = oslimits.prepare(self.user.name)

            def preexec():
                oslimits.join(where)       # as root: into the trainee's group, then become them
                become()
            return preexec

        def user_env(self, env):
            entry = self._entry()
            env.update(user_env(entry, room.bin))
            env["LABKIT_MYSQL_DSN"] = "off"       # the appendix's server is not the room's
            env["LABKIT_CLASSROOM"] = "1"         # a trainee's session: labkit refuses what is for trusted users
            if room.mode == "shared":
                dsns = {t["name"]: t["dsn"] for t in
                        json.loads((folder / room.dsn_file).read_text())["trainees"]}
                env["LABKIT_DSN"] = dsns[self.user.name]
            return env

        async def stop(self, now=False):
            await super().stop(now=now)
            if room.mode == "embedded":
                import asyncio
                await asyncio.get_running_loop().run_in_executor(
                    None, stop_trainee_server, self._entry(), room.bin)

    return RoomSpawner


def make_authenticator_class(room: Room, folder: Path):
    """Each name logs in with its own password only (made here so that importing labkit
    never imports JupyterHub)."""
    from jupyterhub.auth import Authenticator

    class RoomAuthenticator(Authenticator):
        async def authenticate(self, handler, data):
            name, given = data.get("username", ""), data.get("password", "")
            expected = room.passwords(folder).get(name)
            if expected and secrets.compare_digest(given.encode(), expected.encode()):
                return name
            return None

    return RoomAuthenticator


def _landing(handler):
    """The presenter lands on the admin page (they have no server); trainees on their own."""
    user = handler.current_user
    return "/hub/admin" if user is not None and user.admin else None


def configure(c, folder: Path | None = None) -> None:
    """Fill JupyterHub's config ``c`` for the room in ``folder`` (hub/jupyterhub_config.py)."""
    folder = folder or hub_dir()
    room = Room.load(folder)
    names = room.names
    c.JupyterHub.bind_url = f"http://:{room.port}"
    c.JupyterHub.hub_ip = "127.0.0.1"
    c.JupyterHub.db_url = f"sqlite:///{folder / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(folder / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(folder / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.command = proxy_command(folder)
    c.ConfigurableHTTPProxy.pid_file = str(folder / "proxy.pid")
    c.JupyterHub.authenticator_class = make_authenticator_class(room, folder)
    c.JupyterHub.default_url = _landing
    c.Authenticator.admin_users = {PRESENTER}
    c.Authenticator.allowed_users = set(names)
    c.JupyterHub.spawner_class = make_spawner_class(room, folder)
    c.Spawner.cmd = [str(Path(room.bin) / "jupyterhub-singleuser")]
    c.Spawner.notebook_dir = "~"
    c.Spawner.default_url = "/lab/tree/claimlab/notebooks/00_start_here.ipynb"
    c.Spawner.http_timeout = 120          # a loaded machine starts a server slowly
    c.Spawner.start_timeout = 180
    c.JupyterHub.concurrent_spawn_limit = 0
    token = os.environ.get("LABKIT_HUB_SERVICE_TOKEN")
    if token:                              # the load test's driver: it spawns and runs cells
        c.JupyterHub.services = [{"name": "claimlab-loadtest", "api_token": token}]
        c.JupyterHub.load_roles = [{"name": "claimlab-loadtest",
                                    "scopes": ["admin:users", "admin:servers", "access:servers"],
                                    "services": ["claimlab-loadtest"]}]


# -- setting up, starting and cleaning the room ---------------------------------------------

def prepare(*, trainees: int, mode: str, port: int = 8000, dsn: str | None = None,
            folder: Path | None = None, quiet: bool = False,
            trust_ok: bool = False) -> tuple[Room, Path]:
    number("trainees", trainees, low=1, high=MAX_TRAINEES, whole=True, example=12)
    number("port", port, low=1024, high=65535, whole=True, example=8000)
    if mode not in MODES:
        raise LabkitError(f"--mode {mode!r} is not a mode of the room.", "use --mode embedded or --mode shared.")
    bin_dir = preflight()
    folder = room_folder(folder or hub_dir())     # passwords and DSNs: root only
    proxy_command(folder)
    room = Room(mode=mode, trainees=trainees, port=port, bin=str(bin_dir))
    passwords = {PRESENTER: secrets.token_urlsafe(18)}
    passwords.update({name: _typable(10) for name in room.names})
    classroom.write_private(folder / room.password_file, json.dumps(passwords, indent=1) + "\n")
    classroom.write_private(folder / room.handout_file, handout(room, passwords))
    if mode == "shared":
        dsn = dsn or os.environ.get("LABKIT_DSN", "")
        dsn_file = folder / room.dsn_file
        if dsn_file.exists() or dsn_file.is_symlink():
            dsn_file.unlink()                  # a room made before and not cleaned: its roles are refused below
        made = classroom.create(dsn, trainees, out=dsn_file, trust_ok=trust_ok)
        classroom.write_private(folder / room.admin_dsn_file, dsn + "\n")
        room.extra["passwords_checked"] = classroom.asks_for_passwords(made[0])
        if not quiet:
            print(f"classroom: {len(made)} trainee roles on the shared server")
            if room.extra["passwords_checked"] is False:
                print(classroom.TRUST_WARNING)
    room.save(folder)
    for name in room.names:
        ensure_user(name, room.bin)
    return room, folder


def start(*, trainees: int, mode: str, port: int, dsn: str | None, trust_ok: bool = False) -> int:
    """``labkit hub start``: set the room up and run JupyterHub in the foreground."""
    folder = hub_dir()
    if (folder / "room.json").exists():
        old = Room.load(folder)
        if (old.mode, old.trainees) != (mode, trainees):
            raise LabkitError(f"A room is already set up here ({old.mode}, {old.trainees} trainees).",
                              "run `sudo make hub-clean` first, or start it with the same MODE and TRAINEES.")
        room = old
        if port != room.port:              # another port: the room keeps its people and passwords
            number("port", port, low=1024, high=65535, whole=True, example=8000)
            room.port = port
            room.save(folder)
            classroom.write_private(folder / room.handout_file, handout(room, room.passwords(folder)))
        for name in room.names:
            ensure_user(name, room.bin)
    else:
        room, folder = prepare(trainees=trainees, mode=mode, port=port, dsn=dsn, trust_ok=trust_ok)
    print(f"Claim Lab hub: http://{_address()}:{room.port}/  ({room.trainees} trainees, "
          f"{'each with an embedded PostgreSQL' if room.mode == 'embedded' else 'one shared PostgreSQL'})")
    print(f"  each trainee's name and password, and the presenter's, are on the handout: "
          f"{folder / room.handout_file} (root only; print it and cut it into slips)")
    places = [oslimits.prepare(name) for name in room.names]
    print(f"  {oslimits.describe(places[0])}")
    print("  Ctrl-C stops the hub and every trainee's server; `sudo make hub-clean` removes the room.",
          flush=True)
    # its own session: Ctrl-C reaches labkit only, which asks the hub once to stop
    proc = subprocess.Popen(hub_command(room), cwd=folder, start_new_session=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:       # Ctrl-C, SIGTERM or SIGHUP: the hub stops every server first
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise


# What a trainee's own embedded server says about their progress: a module run as the
# trainee, so only their own socket is opened.  It never starts a server that is not running.
PROGRESS = "labkit.tools._hub_progress"


def status(folder: Path | None = None) -> list[dict]:
    """One row per trainee: their Jupyter server, their PostgreSQL, lab schemas, the notebook
    run last, sessions open and idle in a transaction: who is where, and who is stuck."""
    folder = folder or hub_dir()
    room = Room.load(folder)
    shared = {}
    if room.mode == "shared":
        shared = {r["trainee"]: r for r in classroom.status(room.admin_dsn(folder))}
    rows = []
    for name in room.names:
        row = {"trainee": name, "server": "no user", "postgres": "-", "schemas": 0,
               "last_notebook": None, "sessions": 0, "idle_in_transaction": 0, "puzzles": {}}
        try:
            entry = pwd.getpwnam(system_user(name))
        except KeyError:
            rows.append(row)
            continue
        running = any("jupyterhub-singleuser" in _cmdline(pid) for pid in _pids_of(entry.pw_uid))
        row["server"] = "running" if running else "stopped"
        if room.mode == "shared":
            got = shared.get(name, {})
            row.update(postgres="shared", **{k: got.get(k, row[k]) for k in
                                             ("schemas", "last_notebook", "sessions", "idle_in_transaction",
                                              "puzzles")})
        else:
            row.update(_progress_of(entry, room.bin))
        rows.append(row)
    return rows


PROGRESS_BYTES = 64 * 1024      # a report is a few hundred bytes
PROGRESS_TIMEOUT_S = 60


def _progress_of(entry: pwd.struct_passwd, bin_dir: str) -> dict:
    """What a trainee's own embedded server says about their progress (the row's fields), read
    by running :data:`PROGRESS` as the trainee.  Everything it prints is the trainee's to
    choose (their server, their home), so it is taken as untrusted: Python in isolated mode
    (``-I``: neither the home folder nor the user's site-packages on its path), at most
    :data:`PROGRESS_BYTES` of output and :data:`PROGRESS_TIMEOUT_S` of time, and a report
    of the wrong shape is "unreadable" instead of a row that could break or forge the
    presenter's table."""
    out = _bounded_output([str(Path(bin_dir) / "python"), "-I", "-m", PROGRESS],
                          env=user_env(entry, bin_dir), preexec_fn=as_user(entry))
    try:
        got = json.loads(out.strip().splitlines()[-1]) if out else None
    except (ValueError, IndexError, RecursionError):
        got = None
    return checked_report(got)


def checked_report(got: object) -> dict:
    """A trainee's progress report (:mod:`labkit.tools._hub_progress`) as row fields, or
    ``{"postgres": "unreadable"}`` when it is not of that shape."""
    unreadable = {"postgres": "unreadable"}
    if not isinstance(got, dict) or got.get("postgres") not in ("running", "stopped"):
        return unreadable
    if got["postgres"] == "stopped" or "schemas" not in got:
        return {"postgres": got["postgres"]}

    def count(key: str) -> int | None:
        value = got.get(key)
        return value if type(value) is int and 0 <= value <= 10**6 else None

    def name_ok(key: str) -> bool:
        value = got.get(key)
        return value is None or (isinstance(value, str) and len(value) <= 100 and value.isprintable())

    counts = {k: count(k) for k in ("schemas", "sessions", "idle_in_transaction")}
    if None in counts.values() or not (name_ok("last_schema") and name_ok("mark")):
        return unreadable
    return {"postgres": "running", **counts, "puzzles": puzzles.checked_progress(got.get("puzzles")),
            "last_notebook": classroom.notebook_of(got.get("last_schema"), got.get("mark"))}


def _bounded_output(argv: list[str], *, env: dict, preexec_fn) -> str:
    """``argv``'s standard output, up to :data:`PROGRESS_BYTES`, within
    :data:`PROGRESS_TIMEOUT_S` seconds; "" when it printed more or took longer (it is ended)."""
    import selectors

    with subprocess.Popen(argv, env=env, preexec_fn=preexec_fn, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    proc.kill()
                    return ""
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > PROGRESS_BYTES:
                    proc.kill()
                    return ""
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            return ""
    return b"".join(chunks).decode(errors="replace")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def status_command(*, as_json: bool) -> int:
    rows = status()
    if as_json:
        print(json.dumps({"trainees": rows}, indent=1))
        return 0
    print(f"{'trainee':<10} {'server':<8} {'postgres':<9} {'schemas':>7}  {'last notebook':<30} "
          f"{'sessions':>8} {'idle in tx':>10}  puzzles")
    for r in rows:
        r = {k: classroom.printable(v) for k, v in r.items()}
        print(f"{r['trainee']:<10} {r['server']:<8} {r['postgres']:<9} {r['schemas']:>7}  "
              f"{r['last_notebook'] or '-':<30} {r['sessions']:>8} {r['idle_in_transaction']:>10}  "
              f"{puzzles.progress_line(r['puzzles'])}")
    return 0


def hub_command(room: Room) -> list[str]:
    return [str(Path(room.bin) / "jupyterhub"), "-f", str(CONFIG)]


def clean(folder: Path | None = None, *, out=print) -> int:
    """Stop every trainee server and process, remove the room's users and their homes, drop
    the classroom (shared mode), and remove the room's state."""
    folder = folder or hub_dir()
    room = None
    if (folder / "room.json").exists():
        room = Room.load(folder)
    bin_dir = room.bin if room else str((ROOT / ".hubenv" / "bin") if (ROOT / ".hubenv").is_dir()
                                        else Path(sys.executable).parent)
    for entry in room_users():
        stop_trainee_server(entry, bin_dir)
        _kill_user_processes(entry)
        oslimits.remove(entry.pw_name.removeprefix(SYSTEM_PREFIX))
        left = remove_files_of(entry.pw_uid)
        if left:
            out(f"removed {len(left)} file(s) and folder(s) of {entry.pw_name} outside its home "
                f"({', '.join(str(p) for p in left[:3])}{' ...' if len(left) > 3 else ''})")
        done = subprocess.run(["userdel", "--remove", entry.pw_name], capture_output=True, text=True)
        if done.returncode != 0 and "mail spool" not in done.stderr:
            raise LabkitError(f"userdel could not remove {entry.pw_name}: {done.stderr.strip()}",
                              "remove the user by hand (userdel --remove NAME).")
        out(f"removed {entry.pw_name} and its home")
    if room and room.mode == "shared" and (folder / room.admin_dsn_file).exists():
        dropped = classroom.drop(room.admin_dsn(folder))
        out(f"dropped {len(dropped)} classroom roles")
    if folder.exists() and (folder / "room.json").exists():
        for name in ("room.json", "jupyterhub.sqlite", "jupyterhub_cookie_secret", Room.admin_dsn_file,
                     Room.dsn_file, Room.password_file, Room.handout_file):
            (folder / name).unlink(missing_ok=True)
        out(f"removed the room's state and passwords in {folder} (the proxy is kept)")
    if folder.exists():
        give_back(folder)
    return 0
