"""The wheel's package data: `gate/_data/oracle_pins` and `gate/_data/goldens` are symbolic
links to the checkout's top-level `oracle_pins/` and `goldens/` (their one home); the build
follows them, so the wheel holds the folders' files under `gate/_data/`, where
`gate.core.storage.files.own_data_dir` finds them with importlib.resources, as it finds the
links in a checkout. Everything else about the build is in pyproject.toml.

Python can import any folder whose name is an identifier (a namespace package), so
setuptools treats `gate/_data/oracle_pins/HuggingFaceTB/` as the package
`gate._data.oracle_pins.HuggingFaceTB` and warns when it is shipped as data of its parent
instead. Each such folder is declared here as the package it is, with its own data; a
folder whose name is not an identifier (`SmolLM2-135M-Instruct`) is data of the package
above it. No warning is silenced: there is none left to silence.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup

# The data folders, each a link to a top-level folder of the checkout.
DATA = ("gate/_data/oracle_pins", "gate/_data/goldens")
PATTERNS = ("*.json", "*.jsonl")


def data_packages(package: str, folder: Path) -> dict[str, list[str]]:
    """`package` (at `folder`) and every importable folder under it, each with the glob
    patterns of its own data files: those in it and in the non-importable folders below."""
    found: dict[str, list[str]] = {package: list(PATTERNS)}
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if child.name.isidentifier():
            found.update(data_packages(f"{package}.{child.name}", child))
        else:
            found[package] += [f"{child.name}/**/{pattern}" for pattern in PATTERNS]
    return found


HERE = Path(__file__).resolve().parent
# The Qwen3.6 test checkpoint (gate/models/qwen_tiny.py) lives in the package itself.
PACKAGE_DATA: dict[str, list[str]] = {"gate": ["py.typed"], "gate._data.models": ["*/*"]}
for folder in DATA:
    if (HERE / folder).is_dir():
        PACKAGE_DATA.update(data_packages(folder.replace("/", "."), HERE / folder))

setup(
    packages=[*find_packages(include=["gate", "gate.*"]), "gate._data", *sorted(set(PACKAGE_DATA) - {"gate"})],
    package_data=PACKAGE_DATA,
)
