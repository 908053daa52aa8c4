"""The install is locked: constraints.txt pins every dependency the project declares (torch is pinned in
pyproject.toml itself), and the environment the tests run in is exactly that set, so a green CI run
on a fresh clone tests the versions a user of the README's commands gets."""
from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip()).group(0)).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, ver = line.partition("==")
            assert ver, f"constraints.txt: '{line}' is not an exact pin"
            pins[_name(name)] = ver.strip()
    return pins


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {_name(r) for r in reqs}


def test_constraints_pin_every_declared_dependency_but_torch():
    pins = _pins()
    missing = sorted(_declared() - set(pins) - {"torch"})
    assert not missing, f"constraints.txt lacks {missing}: run scripts/lock.sh"
    assert "torch" not in pins, "torch is pinned in pyproject.toml (CPU wheel; a CUDA build replaces it on GPU machines)"


def test_the_environment_is_the_locked_set():
    drift = {}
    for name, want in _pins().items():
        try:
            got = version(name)
        except PackageNotFoundError:
            continue  # a platform-specific package this machine does not need
        if got != want:
            drift[name] = (want, got)
    assert not drift, f"installed versions differ from constraints.txt (pinned, installed): {drift}; after testing an upgrade run scripts/lock.sh"
