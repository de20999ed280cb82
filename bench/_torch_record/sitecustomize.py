"""Loaded by every Python process started with this directory on PYTHONPATH (bench/bench_torch.py puts
it there for one recording aclserver only): when FLEXNPU_BENCH_RECORD names a file, each call of the
operator library is appended to it (op, input copies, output shapes, attributes) for the in-process replay."""

import os

_PATH = os.environ.get("FLEXNPU_BENCH_RECORD")
if _PATH:
    import pickle

    import numpy as np

    from flexnpu_runtime.aclserver import operators

    _run = operators.run

    def _recording(op, inputs, outputs, attrs):  # type: ignore[no-untyped-def]
        record = (
            op,
            [None if x is None else np.array(x, copy=True) for x in inputs],
            [(o.shape, o.dtype.str) for o in outputs],
            dict(attrs),
        )
        with open(_PATH, "ab") as fh:
            pickle.dump(record, fh)
        return _run(op, inputs, outputs, attrs)

    operators.run = _recording
