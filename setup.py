"""The wheel's package data: the checkout's top-level `oracle_pins/` and `goldens/` are
mapped into the package as `gate/_data/oracle_pins/` and `gate/_data/goldens/`, where
`gate.core.storage.files.own_data_dir` finds them with importlib.resources from any folder.
Everything else about the build is in pyproject.toml.
"""

from setuptools import find_packages, setup

# Top-level folder -> the data package it becomes inside `gate`.
DATA = {"gate._data.oracle_pins": "oracle_pins", "gate._data.goldens": "goldens"}

setup(
    packages=[*find_packages(include=["gate", "gate.*"]), "gate._data", *DATA],
    package_dir={"gate._data": "gate/_data", **DATA},
    package_data={"gate": ["py.typed"], **{name: ["**/*.json", "**/*.jsonl"] for name in DATA}},
)
