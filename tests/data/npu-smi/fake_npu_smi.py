"""A stand-in for ``npu-smi`` that prints recorded outputs: ``fake_npu_smi.py SAMPLE_DIR ARGS...``.

``info`` -> info.txt, ``info -m`` -> info-m.txt, ``info -t board -i N -c C`` -> board-N-C.txt.
Anything else, or a missing file, exits 1 with a message on stderr, like npu-smi does.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    root, args = Path(argv[0]), argv[1:]
    names = {("info",): "info.txt", ("info", "-m"): "info-m.txt"}
    name = names.get(tuple(args))
    if name is None and len(args) == 7 and args[0:4] == ["info", "-t", "board", "-i"] and args[5] == "-c":
        name = f"board-{args[4]}-{args[6]}.txt"
    path = root / name if name else None
    if path is None or not path.is_file():
        sys.stderr.write(f"Error: unsupported command or no such device: {' '.join(args)}\n")
        return 1
    sys.stdout.write(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
