"""The lessons ship inside the package: the repository's lessons/ folder is allreduce_edu.lessons.

Everything else about the project is in pyproject.toml; setup.py only maps that one folder, which
pyproject.toml's package discovery cannot express, and puts a copy of protos/'s rank.proto beside
the stubs generated from it, so lesson 01 can show the contract from an installed wheel too.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PROTO = Path("protos/allreduce_edu/_proto/rank.proto")


class BuildWithProto(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib, "allreduce_edu", "_proto", "rank.proto")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROTO, target)


setup(
    packages=find_packages(include=["allreduce_edu*"]) + ["allreduce_edu.lessons"],
    package_dir={"allreduce_edu.lessons": "lessons"},
    package_data={"allreduce_edu.lessons": ["[0-9][0-9]_*.ipynb", "nbval_sanitize.cfg"]},
    cmdclass={"build_py": BuildWithProto},
)
