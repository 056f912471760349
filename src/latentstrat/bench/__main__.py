"""python -m latentstrat.bench COMMAND [options]: the project's benchmarks and its calibration.

`python -m latentstrat.bench --help` lists the commands; `python -m latentstrat.bench COMMAND
--help` gives one command's options.
"""

import importlib
import sys

# command -> (module, one line: what it measures); each module is imported only when run
COMMANDS = {
    "train": ("latentstrat.bench.train", "the trainer's step against a naive step, in one process (speed ratio)"),
    "decode": ("latentstrat.bench.decode", "the batched KV-cache decoder against a naive loop, on one batch"),
    "entangle": (
        "latentstrat.bench.entangle",
        "the entangle step as this host resolves `auto` against plain float32, with the CPU model",
    ),
    "curve": ("latentstrat.bench.curve", "one cell's learning curves: what a training budget buys"),
    "seedscale": ("latentstrat.bench.seedscale", "one cell of the cluster config on Qwen2.5-0.5B's architecture"),
    "calibrate": (
        "latentstrat.bench.calibration",
        "the verdict's false-sign rate, coverage and power, by simulation through the aggregate's code",
    ),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        "usage: python -m latentstrat.bench COMMAND [options]",
        "",
        "Benchmarks compare against a baseline in the same run and print the ratio, with the CPU model.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {what}" for name, (_, what) in COMMANDS.items()),
        "",
        "python -m latentstrat.bench COMMAND --help: that command's options.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in COMMANDS:
        got = f"unknown command {argv[0]!r}\n\n" if argv else ""
        print(got + usage(), file=sys.stderr)
        return 2
    mod = importlib.import_module(COMMANDS[argv[0]][0])
    return mod.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
