"""What this machine can do: CPU model, native bf16 support, a C++ compiler for torch.compile.

The CPU's features come from `torch.cpu.get_capabilities()` (x86 and ARM). The training step's
`auto` settings start from these facts and are then checked by a short timed trial
(entangle_step.choose_step_settings): on a CPU without native bf16 (no AVX512_BF16, AMX or ARM
BF16), bf16 autocast emulates bf16 and runs slower than float32, so it is never a candidate
there.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# native bf16 matmuls: x86 AVX512_BF16 or AMX-BF16; ARM BF16 (NEON or SVE)
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")


@functools.cache
def capabilities() -> dict:
    """What torch found this CPU can do (`torch.cpu.get_capabilities()`: x86 and ARM alike)."""
    import torch

    try:
        return dict(torch.cpu.get_capabilities())
    except (AttributeError, RuntimeError):
        return {}


def cpu_flags() -> frozenset[str]:
    """The CPU features torch reports as present."""
    return frozenset(k for k, v in capabilities().items() if v is True)


@functools.cache
def cpu_model() -> str:
    return str(capabilities().get("cpu_name") or platform.processor() or platform.machine())


def vector_isa() -> str:
    """The widest SIMD the CPU offers for float32 matmuls: AVX-512, AVX2, NEON/SVE, or the
    kernel level ATen picked (`torch.backends.cpu.get_cpu_capability()`) when the flags say nothing."""
    flags = cpu_flags()
    if "avx512_f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    if "sve" in flags:
        return "SVE"
    if "asimd" in flags or "neon" in flags:
        return "NEON"
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def cpu_capability() -> str:
    """The CPU's capability in words, named next to every speed number: machines that share a
    model name differ by 2.4x on the same cell (`AVX-512 + native bf16`, `AVX2, no native bf16`)."""
    return f"{vector_isa()} + native bf16" if native_bf16() else f"{vector_isa()}, no native bf16"


def cpu_label() -> str:
    """`AMD EPYC (AVX-512 + native bf16)`: the model name with its capability."""
    return f"{cpu_model()} ({cpu_capability()})"


def native_bf16() -> bool:
    """bf16 matmuls in hardware (AVX512_BF16, AMX-BF16, or ARM's BF16)."""
    return any(f in cpu_flags() for f in BF16_FLAGS)


def cxx_compiler_error() -> str | None:
    """Why torch.compile's CPU backend (inductor) finds no C++ compiler, or None when it does."""
    try:
        from torch._inductor import cpp_builder

        cpp_builder.get_cpp_compiler()
        return None
    except Exception as e:  # noqa: BLE001 - any failure to find one means the same thing
        return str(e) or type(e).__name__


def has_cxx_compiler() -> bool:
    return cxx_compiler_error() is None


def describe() -> dict:
    """The host facts recorded next to every step-speed choice and benchmark number."""
    return {
        "cpu": cpu_model(),
        "cpu_capability": cpu_capability(),
        "native_bf16": native_bf16(),
        "bf16_flags": sorted(f for f in BF16_FLAGS if f in cpu_flags()),
    }


@functools.cache
def code_version() -> dict:
    """The code a job ran: the git commit of the package's checkout and whether it had
    uncommitted changes, or the installed package version outside git."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return {
            "code_commit": commit,
            "code_dirty": bool(status.strip()),
            "code_version": commit[:12] + ("+dirty" if status.strip() else ""),
        }
    except (OSError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("latentstrat")
        except PackageNotFoundError:
            v = "unknown"
        return {"code_commit": None, "code_dirty": None, "code_version": f"latentstrat {v}"}


# what a job's code is: the package and the workflow that runs it (rules, scripts, Snakefile)
CODE_SUFFIXES = (".py", ".smk", ".yaml", ".json")


def code_files(root: Path) -> list[Path]:
    """The files whose content is the code a job ran: the package's sources and data files, and
    the workflow's rules and scripts beside it (a checkout) when they are there."""
    package = Path(__file__).resolve().parents[1]
    files = [f for f in package.rglob("*") if f.suffix in CODE_SUFFIXES and "__pycache__" not in f.parts]
    for extra in (root / "workflow", root / "Snakefile"):
        if extra.is_dir():
            files += [f for f in extra.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
        elif extra.is_file():
            files.append(extra)
    return sorted(f for f in files if f.is_file())


@functools.cache
def code_hash() -> str:
    """The sha256 (16 hex digits) of the code's content as it is on disk, uncommitted edits
    included: two jobs share it only when they ran the same code (a commit with `+dirty` does not
    say which edits)."""
    import hashlib

    root = Path(__file__).resolve().parents[2]
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in code_files(root):
        rel = f.relative_to(package.parent if f.is_relative_to(package) else root)
        h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def torch_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def provenance(device: str | None = None) -> dict:
    """Who ran a job where: code version, torch version, host, CPU and its capability, device
    (recorded in a cell's summary)."""
    return {
        **code_version(),
        "code_hash": code_hash(),
        "torch_version": torch_version(),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_capability": cpu_capability(),
        "device": device,
    }
