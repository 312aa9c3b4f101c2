"""The lessons ship inside the package: lessons/ is allreduce_edu.lessons (examples/ likewise).

Everything else about the project is in pyproject.toml; setup.py only maps those folders, which
pyproject.toml's package discovery cannot express, and puts a copy of protos/'s rank.proto beside
the stubs generated from it, so lessons 01 and 09 work from an installed wheel too.
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
    packages=find_packages(include=["allreduce_edu*"])
    + ["allreduce_edu.lessons", "allreduce_edu.examples"],
    package_dir={"allreduce_edu.lessons": "lessons", "allreduce_edu.examples": "examples"},
    package_data={"allreduce_edu.lessons": ["[0-9][0-9]_*.ipynb", "nbval_sanitize.cfg"],
                  "allreduce_edu.viz": ["*.js", "*.css"],  # the widgets' browser code
                  "allreduce_edu.exercises": ["*.toml"]},  # the exercises' texts
    cmdclass={"build_py": BuildWithProto},
)
