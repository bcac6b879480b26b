"""``labkit course hub``: a class on one server -- users, exchange, hub, nbgrader, sandbox.

One command, run as root on a fresh server, sets up what ``docs/instructors.md`` describes
(JupyterHub's "zero to JupyterHub with LocalProcessSpawner" setup, nbgrader's "managing
assignment files" exchange, labkit's grading box):

1. **users**: the instructor and every student as local Linux users (``useradd``), each
   home private (mode 700: a student cannot read another's notebooks or feedback);
2. **the course**: ``nbgrader_config.py``, ``solutions/`` (with the instructor-only
   ``_grading/`` and a fresh course secret) and ``exercises/`` copied into the instructor's
   course folder, mode 700; the checkout labkit runs from has its ``solutions/`` closed, and
   what a student can still read is checked as that student (:mod:`labkit.grading.keys`);
3. **the exchange**: nbgrader's ``Exchange.root``, world-writable with the sticky bit, and
   ``<root>/labkit`` made and owned by the instructor; collect is labkit's
   (:mod:`labkit.grading.exchange`: identity from the owner, never a symlink followed);
4. **nbgrader's system-wide config** (``course_id``, ``Exchange.root``, the grading cgroup);
5. **the sandbox**: a cgroup folder per controller delegated to the instructor, so each
   grading box gets its own process, memory and CPU limits without root; then a probe box,
   run as the instructor, says which protections hold on this machine;
6. **the hub's config** (``jupyterhub_config.py``: PAM login, one local single-user server
   per user on loopback by default, each in a cgroup of its own with memory and process
   limits (:mod:`labkit.grading.spawner`), the proxy's API on loopback).

``--serve`` then starts JupyterHub with that config. What is and is not protected is
printed at the end (and written in ``docs/instructors.md``).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.base.errors import ConfigError, LabError
from labkit.base.validate import check_fields, integer, option
from labkit.grading import keys, spawner
from labkit.grading.spawner import ServerLimits

NAME = re.compile(r"[a-z_][a-z0-9_-]{0,30}")
COURSE_ID = "labkit"


@dataclass(kw_only=True, frozen=True)
class HubPlan:
    """Where everything of one class goes; every path absolute."""

    instructor: str = "instructor"
    students: tuple[str, ...] = ()
    course_dir: Path | None = None
    """The instructor's course folder (default ``~INSTRUCTOR/labkit-course``)."""
    exchange: Path = Path("/srv/nbgrader/exchange")
    hub_dir: Path = Path("/srv/labkit-hub")
    config_dir: Path = Path("/etc/jupyter")
    ip: str = "127.0.0.1"
    port: int = option(8000, integer(1, 65535, example=8000))
    hub_port: int = option(8081, integer(1, 65535, example=8081))
    api_port: int = option(8001, integer(1, 65535, example=8001))
    python: str = sys.executable
    """The interpreter of every single-user server and of grading (labkit installed in it)."""
    pythonpath: str = ""
    """Put on PYTHONPATH of every server (a labkit checkout that is not installed)."""
    cgroup: str = "/labkit-grading"
    server_memory_mb: int = option(4096, integer(128, 1 << 24, example=4096))
    """MiB one student's server may use with all its kernels and ranks (its own cgroup)."""
    server_processes: int = option(512, integer(16, 1 << 20, example=512))
    """Processes and threads one student's server may hold at once."""
    passwords: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        problems = check_fields(self)
        for name in (self.instructor, *self.students):
            if not NAME.fullmatch(name):
                problems.append(f"user name ({name!r}) must be lower-case letters, digits, "
                                "'_' or '-', starting with a letter; e.g. alice")
        if self.instructor in self.students:
            problems.append(f"the instructor ({self.instructor!r}) cannot also be a student")
        if not self.students:
            problems.append("students (none) must name at least one user; e.g. "
                            "--students alice,bob")
        if problems:
            raise ConfigError(problems)

    @property
    def course(self) -> Path:
        return self.course_dir or Path(_home(self.instructor)) / "labkit-course"

    @property
    def users(self) -> tuple[str, ...]:
        return (self.instructor, *self.students)


def _home(user: str) -> str:
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return f"/home/{user}"


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    tool = shutil.which(cmd[0], path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") or cmd[0]
    proc = subprocess.run([tool, *cmd[1:]], capture_output=True, text=True, timeout=120,
                          check=False, **kw)
    if proc.returncode != 0:
        raise LabError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}): "
                       f"{proc.stderr.strip()[-500:]}")
    return proc


# ---- 1. users ---------------------------------------------------------------------------------
def ensure_users(plan: HubPlan) -> list[str]:
    made = []
    for user in plan.users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            _run(["useradd", "--create-home", "--shell", "/bin/bash", user])
            made.append(user)
        os.chmod(_home(user), 0o700)  # Debian's default 755 lets students read each other
    if plan.passwords:
        lines = "".join(f"{u}:{p}\n" for u, p in plan.passwords.items() if u in plan.users)
        _run(["chpasswd"], input=lines)
    return [f"users: {len(plan.users)} ({len(made)} new), homes private (mode 700)"]


# ---- 2. the course, 3. the exchange, 4. nbgrader's config -------------------------------------
def install_course(plan: HubPlan, source: Path) -> list[str]:
    course = plan.course
    if not (course / "nbgrader_config.py").exists():
        course.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / "nbgrader_config.py", course / "nbgrader_config.py")
        for folder in ("solutions", "exercises"):
            shutil.copytree(source / folder, course / folder, dirs_exist_ok=True)
    (course / "course").mkdir(exist_ok=True)  # nbgrader's gradebook and work folders
    user = pwd.getpwnam(plan.instructor)
    for path in [course, *course.rglob("*")]:
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    os.chmod(course, 0o700)
    keys.write_course_secret(course / "solutions" / "_grading", user.pw_uid, user.pw_gid)
    return [f"course: {course} (the instructor's only: solutions, keys and a fresh course "
            "secret stay there)"]


def make_exchange(plan: HubPlan) -> list[str]:
    from labkit.grading.exchange import own_course_folder

    plan.exchange.mkdir(parents=True, exist_ok=True)
    os.chmod(plan.exchange, 0o1777)  # nbgrader's requirement: writable by all, sticky
    return [f"exchange: {plan.exchange} (mode 1777, nbgrader keeps submissions unlistable)",
            *own_course_folder(plan.exchange, COURSE_ID, plan.instructor)]


def nbgrader_config(plan: HubPlan) -> str:
    return "\n".join([
        "# Written by `labkit course hub`: every user's nbgrader reads it (students fetch and",
        "# submit through this exchange; the instructor's course config adds the rest).",
        "c = get_config()  # noqa: F821",
        f"c.CourseDirectory.course_id = {COURSE_ID!r}",
        f"c.Exchange.root = {str(plan.exchange)!r}",
        "# collect: the student is the folder's owner, the time the disk's, no symlink followed",
        "c.ExchangeFactory.collect = 'labkit.grading.exchange.SafeCollect'",
        f"c.SandboxedExecute.cgroup = {plan.cgroup!r}", ""])


def write_configs(plan: HubPlan) -> list[str]:
    plan.config_dir.mkdir(parents=True, exist_ok=True)
    (plan.config_dir / "nbgrader_config.py").write_text(nbgrader_config(plan))
    os.chmod(plan.config_dir / "nbgrader_config.py", 0o644)
    plan.hub_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(plan.hub_dir, 0o700)
    (plan.hub_dir / "jupyterhub_config.py").write_text(hub_config(plan))
    return [f"nbgrader config: {plan.config_dir / 'nbgrader_config.py'}",
            f"hub config: {plan.hub_dir / 'jupyterhub_config.py'} (start: labkit course hub "
            "... --serve, or jupyterhub -f that file)"]


def hub_config(plan: HubPlan) -> str:
    """jupyterhub_config.py for this class (PAM login, local processes, loopback proxy API)."""
    env = {"JUPYTER_CONFIG_PATH": str(plan.config_dir)}
    if plan.pythonpath:
        env["PYTHONPATH"] = plan.pythonpath
    for key in ("JUPYTER_PATH", "LABKIT_SANDBOX", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH"):
        if key in os.environ:
            env[key] = os.environ[key]
    hub = plan.hub_dir
    return "\n".join([
        "# Written by `labkit course hub` (labkit.grading.hub). Start: jupyterhub -f THIS_FILE",
        "c = get_config()  # noqa: F821",
        f"c.JupyterHub.bind_url = 'http://{plan.ip}:{plan.port}'",
        f"c.JupyterHub.hub_bind_url = 'http://127.0.0.1:{plan.hub_port}'",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{plan.api_port}'",
        f"c.ConfigurableHTTPProxy.pid_file = {str(hub / 'proxy.pid')!r}",
        f"c.JupyterHub.db_url = {'sqlite:///' + str(hub / 'jupyterhub.sqlite')!r}",
        f"c.JupyterHub.cookie_secret_file = {str(hub / 'jupyterhub_cookie_secret')!r}",
        "c.JupyterHub.authenticator_class = 'pam'",
        "c.Authenticator.allowed_users = {" + ", ".join(map(repr, sorted(plan.users))) + "}",
        f"c.Authenticator.admin_users = {{{plan.instructor!r}}}",
        "# each server in a cgroup of its own: one student's runaway notebook stays hers",
        "c.JupyterHub.spawner_class = 'labkit.grading.spawner.LimitedSpawner'",
        f"c.Spawner.mem_limit = {plan.server_memory_mb * 2**20}",
        f"c.LimitedSpawner.pids_limit = {plan.server_processes}",
        f"c.Spawner.cmd = [{plan.python!r}, '-m', 'jupyterhub.singleuser']",
        "c.Spawner.default_url = '/lab'",
        "c.Spawner.notebook_dir = '~'",
        f"c.Spawner.environment = {env!r}",
        "c.Spawner.http_timeout = 120",
        "c.Spawner.start_timeout = 120",
        "c.JupyterHub.cleanup_servers = True  # stopping the hub stops every server", ""])


# ---- 5. the sandbox ---------------------------------------------------------------------------
def delegate_cgroup(plan: HubPlan) -> list[str]:
    """A cgroup folder per v1 controller owned by the instructor (boxes go inside it)."""
    from labkit.grading.sandbox.limits import _mounts

    user = pwd.getpwnam(plan.instructor)
    done = []
    for mount, kind, opts in _mounts():
        controller = next((c for c in ("pids", "memory", "cpu") if c in opts), None)
        if kind != "cgroup" or controller is None:
            continue
        folder = Path(mount) / plan.cgroup.strip("/")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for path in (folder, folder / "cgroup.procs", folder / "tasks"):
                os.chown(path, user.pw_uid, user.pw_gid)
        except OSError:
            continue
        done.append(controller)
    if {"pids", "memory"} <= set(done):
        return [f"cgroups: {plan.cgroup} delegated to {plan.instructor} ({', '.join(done)})"]
    return ["cgroups: not delegated (cgroup v2 here: grade as root, or inside "
            "`systemd-run --scope -p Delegate=yes`); boxes use rlimits only"]


PROBE = r"""
import json, sys
from labkit.grading.sandbox.box import Box
INSIDE = ("import json, os\n"
          "try:\n    open('/proc/1/environ', 'rb').read()\n    pid1 = 'readable'\n"
          "except OSError:\n    pid1 = 'hidden'\n"
          "print(json.dumps({'env': sorted(os.environ), 'pid1': pid1}))\n")
box = Box(cgroup_parent=sys.argv[1]).start()
try:
    reply = box.request("run", 60, source=INSIDE)
    inside = json.loads(reply["stdout"].strip().splitlines()[-1])
    print(json.dumps({"mode": box.mode, "cgroup": box.cgroup is not None, **inside}))
finally:
    box.stop()
"""


def _user_env(plan: HubPlan, user: str) -> dict[str, str]:
    """The environment a command of ``user`` gets here: their servers' (see ``hub_config``)."""
    env = {"PATH": f"{Path(plan.python).parent}:/usr/local/bin:/usr/bin:/bin",
           "HOME": _home(user), "JUPYTER_CONFIG_PATH": str(plan.config_dir)}
    if plan.pythonpath:
        env["PYTHONPATH"] = plan.pythonpath
    if "LD_LIBRARY_PATH" in os.environ:
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def probe(plan: HubPlan) -> dict[str, Any]:
    """Start a grading box as the instructor and report what it protects."""
    env = _user_env(plan, plan.instructor)
    proc = _run(["runuser", "-u", plan.instructor, "--", plan.python, "-c", PROBE,
                 plan.cgroup], env=env, cwd="/")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def check_students_can_run(plan: HubPlan) -> list[str]:
    """Every single-user server imports labkit and jupyterhub as its student (a Python that
    lives in /root, say, cannot be run by anyone else)."""
    env = _user_env(plan, plan.students[0])
    try:
        _run(["runuser", "-u", plan.students[0], "--", plan.python, "-c",
              "import labkit.grading, jupyterhub, nbgrader"], env=env, cwd="/")
    except LabError as exc:
        raise LabError(f"student {plan.students[0]} cannot run {plan.python} with labkit, "
                       f"jupyterhub and nbgrader ({exc}); install them in an environment "
                       "every user can read, e.g. /opt/labkit/venv") from None
    return [f"python: {plan.python} runs labkit, jupyterhub and nbgrader for every user"]


def setup(plan: HubPlan, source: Path) -> list[str]:
    """Everything above, in order; the report lines (raises LabError on the first failure)."""
    if os.geteuid() != 0:
        raise ConfigError("labkit course hub creates users and system folders: run it as root "
                          "(e.g. sudo labkit course hub ...)")
    lines = ensure_users(plan) + install_course(plan, source) + make_exchange(plan)
    lines += write_configs(plan) + delegate_cgroup(plan) + check_students_can_run(plan)
    box = probe(plan)
    lines.append(f"grading box: {box['mode']}, cgroup limits {'on' if box['cgroup'] else 'off'}"
                 f", box's pid 1 {box['pid1']}, environment {len(box['env'])} variables "
                 "(the grader's never)")
    lines += keys.audit(plan.students[0], plan.course, keys.checkouts(plan.pythonpath))
    return lines + protections(box) + spawner.check(ServerLimits(
        memory_mb=plan.server_memory_mb, processes=plan.server_processes))


def protections(box: dict[str, Any]) -> list[str]:
    """What the class set-up protects, and what it does not (docs/instructors.md)."""
    held = ["protected: one student's notebooks and feedback from another (private homes; "
            "nbgrader's exchange lists nothing)"]
    if box["mode"] == "bwrap" and box["cgroup"]:
        held.append("protected: the server from a submission (processes, memory, /tmp, CPU "
                    "per box)")
    else:
        held.append("NOT protected: limits are per process only (no cgroup or no bwrap)")
    return held
