"""The driver distribution's dependencies, which pyproject.toml cannot state alone.

The driver needs the container client (``flexnpu-client``, in ``client/``), which is not on a
package index. In a checkout the requirement is a direct reference to ``client/`` beside this
file, so ``pip install -e .`` and ``pip install .`` in a clone install both distributions; a build
without ``client/`` (an sdist) asks for the same version by name. Everything else is read from
``[tool.flexnpu].dependencies`` in pyproject.toml.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "client"
CLIENT_VERSION = "0.1.0"


def _client_requirement() -> str:
    if (CLIENT / "pyproject.toml").is_file():
        return f"flexnpu-client @ {CLIENT.as_uri()}"
    return f"flexnpu-client=={CLIENT_VERSION}"


def _dependencies() -> list[str]:
    pyproject = tomllib.loads((HERE / "pyproject.toml").read_text())
    return [_client_requirement(), *pyproject["tool"]["flexnpu"]["dependencies"]]


setup(install_requires=_dependencies())
