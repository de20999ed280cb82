"""The one home of test doubles and harnesses: everything tests, benches and the demo share.

The rule: a stand-in for a real component (the fake Kubernetes API server, the kubelet and
scheduler simulators, the aclserver launch-contract double, in-memory fakes of the preparer's
collaborators), a harness that runs a real process for a test (the daemon, an aclserver,
podman), emulated hardware (inventories, device roots) and the demo that drives them live here.
``tests/`` holds only what pytest alone uses: tests, ``conftest.py`` fixtures and assertion
helpers.

This is a top-level package of the repository that no wheel and no image ships
(``pyproject.toml`` lists only the product's packages): pytest puts the repository's root on
``sys.path`` (``pythonpath`` in its config), ``scripts/demo.sh`` and the benches do the same, and a
subprocess that imports this package gets the root through :func:`pythonpath_env`. Production code
never imports it (``tests/unit/test_import_graph.py``).

Modules: ``fake_apiserver/`` (a package: store, patch, selectors, validation, HTTP, faults),
``kubelet.py``, ``scheduler.py``, ``extended_resources.py``, ``daemon.py`` (flexnpu-daemon
harness), ``fake_aclserver.py``, ``aclserver_harness.py`` (aclserver harness), ``fakes.py`` (in-memory
checkpoint store, daemon and status writer), ``clibrary.py`` (builds the C client and C test
programs), ``podman.py``, ``devroot.py`` (re-exports the production ``dra_driver/devroot.py``),
``fake_npu_smi.py``, ``toy_driver.py`` (a minimal DRA driver on the kubelet-plugin helper, as a
process), ``inventories/``, ``waiting.py`` (the one ``wait_for``: a condition polled
with a deadline), ``demo.py`` (``python -m flexnpu_testing.demo``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The repository's root: the directory that holds this package."""


def pythonpath_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the repository's root first on ``PYTHONPATH``."""
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = str(REPO) + (os.pathsep + rest if rest else "")
    return out
