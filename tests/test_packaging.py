"""environment.yml and pyproject.toml list the same packages, so conda and pip users get the same thing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.split(r"[\s<>=!~\[;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _spec(spec: str) -> str:
    return spec.split("#")[0].replace(" ", "").lower()


def test_environment_yml_lists_the_pyproject_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_specs = project["dependencies"] + project["optional-dependencies"]["test"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_specs = [d for d in env["dependencies"] if isinstance(d, str)]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_specs += [d for d in pip_section if not d.startswith("-e")]  # wheels conda-forge lacks
    conda = {_name(s): _spec(s) for s in conda_specs if _name(s) not in ("python", "pip")}
    pip = {_name(s): _spec(s) for s in pip_specs}
    assert conda == pip, f"only in environment.yml: {set(conda) - set(pip)}; only in pyproject: {set(pip) - set(conda)}"
    python = next(s for s in conda_specs if _name(s) == "python")
    assert python.replace(" ", "") == "python" + project["requires-python"]


def test_stubs_and_runtime_pins_agree():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stub = (ROOT / "allreduce_edu/_proto/rank_pb2_grpc.py").read_text()
    generated = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", stub)[1]
    assert f"grpcio-tools=={generated}" in [_spec(s) for s in project["optional-dependencies"]["test"]]
    assert f"grpcio>={generated}" in _spec(next(s for s in project["dependencies"] if _name(s) == "grpcio"))
    pb2 = (ROOT / "allreduce_edu/_proto/rank_pb2.py").read_text()
    protobuf = re.search(r"# Protobuf Python Version: ([\d.]+)", pb2)[1]
    assert f"protobuf>={protobuf}" in _spec(next(s for s in project["dependencies"] if _name(s) == "protobuf"))


def test_the_exercises_texts_ship_in_the_wheel():
    """Every lesson's exercise texts (exercises/lessonNN.toml) are package data, and Python 3.10 gets
    the TOML reader that 3.11 has built in."""
    setup = (ROOT / "setup.py").read_text()
    assert '"allreduce_edu.exercises": ["*.toml"]' in setup
    texts = sorted((ROOT / "allreduce_edu/exercises").glob("lesson*.toml"))
    assert len(texts) == len(sorted((ROOT / "allreduce_edu/exercises").glob("lesson[0-9][0-9].py")))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(_name(d) == "tomli" and "python_version<'3.11'" in _spec(d) for d in project["dependencies"])
