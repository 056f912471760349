"""python -m latentstrat.bench train|decode|entangle|curve|seedscale|calibrate [options]"""

import importlib
import sys

COMMANDS = {
    "train": "latentstrat.bench.train",
    "decode": "latentstrat.bench.decode",
    "entangle": "latentstrat.bench.entangle",
    "curve": "latentstrat.bench.curve",
    "seedscale": "latentstrat.bench.seedscale",
    "calibrate": "latentstrat.bench.calibrate",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m latentstrat.bench {{{'|'.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    mod = importlib.import_module(COMMANDS[argv[0]])  # lazy: each benchmark imports its own deps
    return mod.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
