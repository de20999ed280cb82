"""Loaded by every Python process started with this directory on PYTHONPATH (bench/bench_torch.py puts
it there for one recording aclserver only): when FLEXNPU_BENCH_RECORD names a file, each call of the
operator library is appended to it (op, input copies, output layouts, attributes; strides kept) for the in-process replay."""

import os

_PATH = os.environ.get("FLEXNPU_BENCH_RECORD")
if _PATH:
    import ctypes
    import pickle

    from flexnpu_runtime.aclserver import operators

    _run = operators.run

    def _layout(x):  # type: ignore[no-untyped-def]
        """The bytes an array spans, and its view of them: (first byte, byte count, shape, dtype, strides)."""
        lo = hi = 0
        for d, st in zip(x.shape, x.strides, strict=True):
            if st >= 0:
                hi += (d - 1) * st
            else:
                lo += (d - 1) * st
        count = 0 if x.size == 0 else hi - lo + x.itemsize
        return lo, count, x.shape, x.dtype, x.strides

    def _copy(x):  # type: ignore[no-untyped-def]
        """An input as the aclserver saw it: the bytes its view spans (copied) and the view's layout."""
        lo, count, shape, dtype, strides = _layout(x)
        raw = ctypes.string_at(x.__array_interface__["data"][0] + lo, count) if count else b""
        return raw, -lo, shape, dtype, strides

    def _recording(op, inputs, outputs, attrs):  # type: ignore[no-untyped-def]
        record = (
            op,
            [None if x is None else _copy(x) for x in inputs],
            [
                None if o is None else (_layout(o)[1], -_layout(o)[0], o.shape, o.dtype, o.strides)
                for o in outputs
            ],
            dict(attrs),
        )
        with open(_PATH, "ab") as fh:
            pickle.dump(record, fh)
        return _run(op, inputs, outputs, attrs)

    operators.run = _recording
