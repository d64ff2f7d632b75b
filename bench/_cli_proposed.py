"""`levers9 ...` with levers9.runtime.reader.read swapped for the prototype in _proposed.read_push;
everything else is the real CLI. Used only by `bench_replay.py --variant proposed`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import levers9.runtime.reader  # noqa: E402
from _proposed import read_push  # noqa: E402

levers9.runtime.reader.read = read_push  # cli._replay imports it from the module at call time

from levers9.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
