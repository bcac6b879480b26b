"""`labkit course hub`'s plan and the configs it writes, without users or a hub (no root).

Bad names are refused before anything is created, with the rule and an example; the hub's
config listens where it was told, keeps the proxy's API and the hub itself on loopback,
logs in with PAM and admits exactly the class; nbgrader's system-wide config names the
exchange and the grading cgroup. The whole class, for real, is tests/classroom.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from labkit.base.errors import ConfigError
from labkit.grading import cli as grading_cli
from labkit.grading.hub import HubPlan, hub_config, nbgrader_config

pytestmark = pytest.mark.lesson08


def plan(**kw: object) -> HubPlan:
    base = {"instructor": "prof", "students": ("ann", "bob"), "port": 18000,
            "python": "/opt/labkit/venv/bin/python", "exchange": Path("/srv/x/exchange"),
            "config_dir": Path("/srv/x/etc"), "hub_dir": Path("/srv/x/hub")}
    return HubPlan(**{**base, **kw})  # type: ignore[arg-type]


def test_bad_names_and_ports_are_refused_with_the_rule_and_an_example() -> None:
    with pytest.raises(ConfigError, match=r"user name \('Ann!'\) must be lower-case.*e\.g\. alice"):
        plan(students=("Ann!",))
    with pytest.raises(ConfigError, match=r"students \(none\) must name at least one user"):
        plan(students=())
    with pytest.raises(ConfigError, match=r"instructor \('ann'\) cannot also be a student"):
        plan(instructor="ann")
    with pytest.raises(ConfigError, match=r"port \(70000\)"):
        plan(port=70000)


def test_the_hub_config_admits_the_class_on_loopback_with_pam() -> None:
    text = hub_config(plan())
    assert "c.JupyterHub.bind_url = 'http://127.0.0.1:18000'" in text
    assert "hub_bind_url = 'http://127.0.0.1:8081'" in text
    assert "api_url = 'http://127.0.0.1:8001'" in text
    assert "authenticator_class = 'pam'" in text
    assert "allowed_users = {'ann', 'bob', 'prof'}" in text
    assert "admin_users = {'prof'}" in text
    assert "c.Spawner.cmd = ['/opt/labkit/venv/bin/python', '-m', 'jupyterhub.singleuser']" in text
    assert "'JUPYTER_CONFIG_PATH': '/srv/x/etc'" in text
    assert "spawner_class = 'labkit.grading.spawner.LimitedSpawner'" in text
    assert "c.Spawner.mem_limit = 4294967296" in text and "pids_limit = 512" in text
    compile(text, "jupyterhub_config.py", "exec")  # it is Python


def test_nbgrader_config_names_the_exchange_and_the_grading_cgroup() -> None:
    text = nbgrader_config(plan(cgroup="/labkit-grading"))
    assert "c.CourseDirectory.course_id = 'labkit'" in text
    assert "c.Exchange.root = '/srv/x/exchange'" in text
    assert "c.SandboxedExecute.cgroup = '/labkit-grading'" in text


def test_the_cli_has_course_hub_with_its_options() -> None:
    parser = argparse.ArgumentParser()
    grading_cli.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["course", "hub", "--students", "ann,bob", "--port", "9000",
                              "--serve"])
    assert args.func is grading_cli._hub and args.students == "ann,bob"
    assert args.port == 9000 and args.serve and args.instructor == "instructor"
