"""``pip install .`` from a clone gives a working install: every file the packages read at run time
is in the wheel (a file git tracks under a package, not Python, missing from it is a broken install:
the CPU attention kernel's C source once was)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

from tests.sim_helpers import REPO

PACKAGES = ("runtime", "simulator", "traces", "analysis")


def _tracked(*paths: str) -> list[str]:
    return subprocess.run(["git", "ls-files", *paths], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.split()


def test_the_wheel_holds_every_file_of_the_packages(tmp_path):
    # built from the tracked files alone, as a fresh clone has them (a checkout's build/ and
    # *.egg-info would hand setuptools files its configuration does not name)
    src = tmp_path / "src"
    for name in _tracked():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("minivllm-*.whl"))
    inside = set(zipfile.ZipFile(wheel).namelist())
    tracked = _tracked(*PACKAGES)
    assert tracked, "not a git checkout"
    missing = [f for f in tracked if f not in inside]
    assert not missing, f"not in the wheel: {missing}"
