"""One job of a stage, as its entry (`run(job)`, latentstrat.stages) takes it: the files it reads
and writes by their rule names, the rule's params, the validated config it runs on and its
threads. Built once from the rule (`Job.from_rule(snakemake)`, in the one rule script), or by a
caller that runs a stage outside Snakemake."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from latentstrat.config import load_config
from latentstrat.paths import BaseFolders


@dataclass(frozen=True)
class Job:
    stage: str
    config: dict  # the validated collection config, the rule's params sections on top
    input: dict[str, str | list[str]] = field(default_factory=dict)  # rule name -> file(s)
    output: dict[str, str | list[str]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()  # every output file in the rule's order (unnamed ones too)
    params: dict = field(default_factory=dict)
    threads: int = 1

    @classmethod
    def from_rule(cls, smk) -> "Job":
        """From Snakemake's `snakemake` object: its input/output by name, its params, threads,
        and the config with the params `settings` (the sections the rule passes, what its
        `params` rerun trigger watches) on top."""
        params = dict(smk.params.items())
        cfg = load_config(cfg=dict(smk.config))
        cfg.update(params.get("settings", {}))
        return cls(
            stage=smk.rule,
            config=cfg,
            input={k: _plain(v) for k, v in smk.input.items()},
            output={k: _plain(v) for k, v in smk.output.items()},
            outputs=tuple(str(f) for f in smk.output),
            params=params,
            threads=int(smk.threads),
        )

    def file(self, name: str) -> Path:
        """One named input (or, failing that, output) file."""
        for files in (self.input, self.output):
            if name in files:
                return Path(files[name])
        raise KeyError(f"stage {self.stage}: the job has no input or output named {name!r}")

    def folder(self, name: str) -> Path:
        """The folder of a named input or output file: the stage folder it belongs to."""
        return self.file(name).parent

    def base(self) -> BaseFolders:
        """The base folders a model job reads: its data and reference inputs' folders (by the
        stages' file names), the entangle stage's folder from the `entangle_dir` param."""
        reference = self.folder("scales") if "scales" in self.input else None
        return BaseFolders(self.folder("tokenizer"), Path(self.params["entangle_dir"]), reference)

    def files(self, name: str) -> list[str]:
        """A named input that is a list of files (or one file)."""
        v = self.input[name]
        return [v] if isinstance(v, str) else list(v)


def _plain(v) -> str | list[str]:
    return str(v) if isinstance(v, (str, Path)) else [str(f) for f in v]
