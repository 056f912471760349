"""One job of a stage, as its entry (`run(job)`, latentstrat.stages) takes it: the files it reads
and writes by their rule names, the rule's params, the config sections its stage reads and its
threads. Built once from the rule (`Job.from_rule(snakemake)`, in the one rule script), or by a
caller that runs a stage outside Snakemake.

A job's config holds the sections its stage's declaration names (`Stage.sections`), exactly as
its rule passed them (validated once, when the workflow loaded), and `resources`: what the job
was given (`given_resources`). Reading another section is an error naming the stage and its
sections, so what a stage reads is what reruns it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from latentstrat.config import load_config
from latentstrat.paths import BaseFolders
from latentstrat.stages import BY_NAME, EVERY_SECTION


class Sections(Mapping):
    """The config sections a stage reads; another section is a KeyError naming the stage."""

    def __init__(self, sections: dict, stage: str, every: bool = False):
        # every: the stage reads the whole config (its optional keys may be absent)
        self._sections, self.stage, self.every = dict(sections), stage, every

    def __getitem__(self, key):
        if key not in self._sections and not self.every:
            raise KeyError(
                f"stage {self.stage} reads config section {key!r}, which its declaration does not pass "
                f"(latentstrat.stages: sections {', '.join(self._sections) or 'none'})"
            )
        return self._sections[key]

    def get(self, key, default=None):  # a section not passed is an error here too
        return self._sections.get(key, default) if self.every else self[key]

    def __iter__(self):
        return iter(self._sections)

    def __len__(self):
        return len(self._sections)


@dataclass(frozen=True)
class Job:
    stage: str
    config: Mapping  # the config sections the stage reads (Sections), as its rule passed them
    input: dict[str, str | list[str]] = field(default_factory=dict)  # rule name -> file(s)
    output: dict[str, str | list[str]] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()  # every output file in the rule's order (unnamed ones too)
    params: dict = field(default_factory=dict)
    threads: int = 1

    @classmethod
    def from_rule(cls, smk) -> "Job":
        """From Snakemake's `snakemake` object: its input/output by name, its params, threads,
        and the config sections the rule passes (params `settings`, what its `params` rerun
        trigger watches)."""
        params = dict(smk.params.items())
        sections = {"resources": given_resources(smk), **params.get("settings", {})}
        stage = BY_NAME.get(smk.rule)
        also = stage.also_reads if stage else ()
        if also:  # sections the stage reads beyond its params: from the workflow's config
            cfg = load_config(cfg=dict(smk.config))
            sections.update({k: v for k, v in cfg.items() if (k in also or also == EVERY_SECTION) and k != "resources"})
        return cls(
            stage=smk.rule,
            config=Sections(sections, smk.rule, every=stage is not None and EVERY_SECTION in (stage.sections, also)),
            input={k: _plain(v) for k, v in smk.input.items()},
            output={k: _plain(v) for k, v in smk.output.items()},
            outputs=tuple(str(f) for f in smk.output),
            params=params,
            threads=int(smk.threads),
        )

    @property
    def cell(self):
        """The job's cell, its settings parsed and typed (cells.Cell, from the `cell` param)."""
        from latentstrat.cells import Cell

        return Cell.from_json(self.params["cell"])

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


def given_resources(smk) -> dict:
    """The `resources` section a job reads: what Snakemake gave this job (its threads, and a GPU
    when it was given one, whole or a shard), not the config's; changing those never reruns it."""
    res = smk.resources
    gres = str(getattr(res, "gres", "") or "")
    gpu = int(getattr(res, "gpu", 0) or 0) or int(any(k in gres for k in ("gpu", "shard")))
    return {"gpu": gpu, "threads": int(smk.threads)}


def _plain(v) -> str | list[str]:
    return str(v) if isinstance(v, (str, Path)) else [str(f) for f in v]
