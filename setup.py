"""The lessons ship inside the package: the repository's lessons/ folder is allreduce_edu.lessons.

Everything else about the project is in pyproject.toml; setup.py only maps that one folder, which
pyproject.toml's package discovery cannot express.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["allreduce_edu*"]) + ["allreduce_edu.lessons"],
    package_dir={"allreduce_edu.lessons": "lessons"},
    package_data={"allreduce_edu.lessons": ["[0-9][0-9]_*.ipynb", "nbval_sanitize.cfg"]},
)
