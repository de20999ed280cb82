"""The one home of test doubles and harnesses: everything tests, benches and the demo share.

The rule: a stand-in for a real component (the fake Kubernetes API server, the kubelet and
scheduler simulators, the aclserver launch-contract double), a harness that runs a real process
for a test (the daemon, an aclserver, podman), emulated hardware (inventories, device roots) and
the demo that drives them live here. ``tests/`` holds only what pytest alone uses: tests,
``conftest.py`` fixtures and assertion helpers. Production code never imports this package: the
console-script entry points are checked by ``tests/unit/test_production_imports.py``, and
``kubeletplugin/cli.py`` imports :mod:`dra_driver.testing.demo` only for ``flexnpu-dra demo``.

Modules: ``fake_apiserver/`` (a package: store, patch, selectors, validation, HTTP, faults),
``kubelet.py``, ``scheduler.py``, ``extended_resources.py``, ``daemon.py`` (flexnpu-daemon
harness), ``fake_aclserver.py``, ``aclservers.py`` (aclserver harness), ``clibrary.py`` (builds
the C client and C test programs), ``podman.py``, ``devroot.py`` (re-exports the production
``dra_driver/devroot.py``), ``inventories/``, ``waiting.py`` (wait on a condition with a deadline),
``demo.py``.
"""
