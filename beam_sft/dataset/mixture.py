"""Dataset mixtures: TRL's `datasets:` YAML list and fraction rule (`trl.scripts.utils.get_dataset`), plus
beam-sft's per-source keys (docs/training.md#dataset-mixtures)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from itertools import chain, compress, islice
from pathlib import Path
from typing import Any

from beam_sft.errors import UsageError
from beam_sft.records.files import Source, check_columns, data_sources, is_hub_layout, iter_items

# `datasets` packaged builders whose rows come from `data_files`, and beam-sft's reader for each.
BUILDERS = ("json", "parquet", "text", "csv", "arrow")


@dataclass
class MixtureSource:
    """One entry of `datasets:` (TRL's `DatasetConfig` keys, then beam-sft's)."""

    path: str
    name: str | None = None
    data_dir: str | None = None
    data_files: str | list[str] | dict[str, Any] | None = None
    split: str = "train"
    columns: list[str] | dict[str, str] | None = None
    fraction: float | None = None
    revision: str | None = None
    format: str | None = None
    max_records: int | None = None
    missing_reasoning: str | None = None
    shuffle: bool | int = False
    label: str | None = None

    @classmethod
    def from_dict(cls, entry: dict[str, Any], where: str) -> MixtureSource:
        if not isinstance(entry, dict) or "path" not in entry:
            raise UsageError(f"{where}: a dataset entry needs a `path` (got {entry!r})")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(entry) - known):
            raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)} in dataset {entry['path']!r}; known: "
                             f"{', '.join(sorted(known))}")
        source = cls(**entry)
        source.check(where)
        return source

    def check(self, where: str) -> None:
        self.columns = check_columns(self.columns, f"{where}: dataset {self.path!r}")
        if self.path in BUILDERS and (self.name is not None or self.revision is not None):
            raise UsageError(f"{where}: `path: {self.path}` reads data_files: `name` and `revision` apply to a hub "
                             f"dataset or a dataset directory")
        for key in ("fraction", "max_records"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise UsageError(f"{where}: {key} must be >= 0 (dataset {self.path!r})")
        if self.path in BUILDERS and not self.data_files:
            raise UsageError(f"{where}: `path: {self.path}` needs `data_files`")
        if self.label is not None and (not isinstance(self.label, str) or _slug(self.label) != self.label):
            raise UsageError(f"{where}: label {self.label!r} of dataset {self.path!r} must be lowercase letters, "
                             f"digits and _ (it names metrics: eval_<label>_loss), e.g. {_slug(str(self.label))!r}")

    def sources(self, base: Path) -> list[Source]:
        """The files (or saved / hub dataset) this entry reads, relative paths taken from `base`."""
        if self.path in BUILDERS:
            files = self.data_files
            if isinstance(files, dict):
                if self.split not in files:
                    raise UsageError(f"dataset {self.path!r}: data_files has no split {self.split!r}")
                files = files[self.split]
            files = [files] if isinstance(files, str) else list(files)
            if self.data_dir:
                files = [os.path.join(self.data_dir, f) for f in files]
            return data_sources([_under(base, f) for f in files], self.split, {"columns": self.columns})
        local = _under(base, self.path)
        target = local if os.path.exists(local) else self.path
        options = {"config": self.name, "revision": self.revision, "data_dir": self.data_dir,
                   "data_files": self.data_files, "columns": self.columns}
        if (self.data_dir and self.name is None and self.revision is None and self.data_files is None
                and os.path.isdir(target) and not is_hub_layout(Path(target))):
            # a plain directory of files: its data_dir's files (what load_dataset(DIR, data_dir=...) reads)
            target, options["data_dir"] = os.path.join(target, self.data_dir), None
        return data_sources([target], self.split, options)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def source_slug(entry: MixtureSource) -> str:
    """A short name of a mixture entry when it has no `label`: `data/glaive.jsonl` -> glaive, `path: json` with
    `data_files: [chat-*.jsonl]` -> chat, `org/agent-traces` with `name: tools` -> agent_traces_tools."""
    first = entry.path.rstrip("/")
    if entry.path in BUILDERS:
        files = entry.data_files
        if isinstance(files, dict):
            files = files.get(entry.split) or next(iter(files.values()), "")
        first = files if isinstance(files, str) else (list(files) or [""])[0]
    base = Path(str(first)).name.split(".")[0]
    return "_".join(part for part in (_slug(base), _slug(entry.name or "")) if part) or "source"


def _under(base: Path, path: str) -> str:
    """A relative path from the working directory where it exists there (as TRL reads it), else from `base`."""
    if os.path.isabs(path) or os.path.exists(path) or not (base / path).exists():
        return path
    return str(base / path)


@dataclass
class SourcePlan:
    """What the mixture takes of one entry: its files, rows read (after max_records) and rows taken."""

    entry: MixtureSource
    files: list[Source]
    rows: int | None  # None: not counted (a streamed mixture)
    taken: int | None = 0


@dataclass
class Mixture:
    """A `datasets:` list, resolved: every entry's files and row counts, and what TRL's rule takes of each."""

    plans: list[SourcePlan]
    seed: int = 0
    settings: dict[str, Any] = field(default_factory=dict)  # other keys of the YAML (test_split_size, ...)

    @property
    def sources(self) -> list[Source]:
        return [src for plan in self.plans for src in plan.files]

    def items(self) -> Iterator[Any]:
        """The taken rows (`beam_sft.records.files.Item`), source after source, each in file order."""
        import numpy as np

        if any(plan.rows is None for plan in self.plans):
            raise UsageError("a streamed mixture (not counted) is read with streamed_items()")
        for plan in self.plans:
            shuffle = plan.entry.shuffle
            chosen = None
            if shuffle is not False and shuffle is not None and plan.taken < plan.rows:
                seed = self.seed if shuffle is True else int(shuffle)
                # one byte per row, not a set of Python ints: 10 MB at 10^7 rows instead of ~500 MB
                chosen = np.zeros(plan.rows, dtype=bool)
                chosen[np.random.default_rng(seed).choice(plan.rows, size=plan.taken, replace=False)] = True
            items = iter_items(plan.files, limit=plan.rows)
            yield from islice(items, plan.taken) if chosen is None else compress(items, chosen)

    def streamed_items(self) -> Iterator[Any]:
        """The rows of a mixture that is not counted first (`resolve(count=False)`, for streaming): without
        fractions every row, source after source; with fractions a seeded draw of the next source by its share,
        until a source runs out. The same seed gives the same sequence on every rank."""
        import numpy as np

        streams = [iter_items(plan.files, limit=plan.entry.max_records) for plan in self.plans]
        fractions = [plan.entry.fraction for plan in self.plans]
        if all(f is None for f in fractions):
            yield from chain.from_iterable(streams)
            return
        weights = np.asarray(shares(fractions))
        rng = np.random.default_rng(self.seed)
        while True:
            for k in rng.choice(len(streams), size=1024, p=weights).tolist():
                item = next(streams[k], None)
                if item is None:
                    return
                yield item

    def formats(self, default: str) -> list[str]:
        """The converter of every file of `sources`, in order."""
        return [plan.entry.format or default for plan in self.plans for _ in plan.files]

    def policies(self, default: str) -> list[str]:
        return [plan.entry.missing_reasoning or default for plan in self.plans for _ in plan.files]

    def labels(self) -> list[str]:
        """Each entry's name in per-source eval metrics: its `label`, else `source_slug`, unique (`_2`, `_3`)."""
        given = [plan.entry.label for plan in self.plans if plan.entry.label]
        if len(given) != len(set(given)):
            raise UsageError(f"datasets: two sources have the same label ({', '.join(sorted(given))})")
        out: list[str] = []
        for plan in self.plans:
            name = plan.entry.label or source_slug(plan.entry)
            if not plan.entry.label:
                stem, n = name, 2
                while name in out or name in given:
                    name, n = f"{stem}_{n}", n + 1
            out.append(name)
        return out

    def groups(self) -> list[int]:
        """The entry (index into `labels`) of every file of `sources`, in order."""
        return [i for i, plan in enumerate(self.plans) for _ in plan.files]

    def identity(self) -> list[dict[str, Any]]:
        """The entries as given and what was taken of each: part of the cache fingerprint and the manifest."""
        return [{**asdict(plan.entry), "rows": plan.rows, "taken": plan.taken} for plan in self.plans]


def shares(fractions: list[float | None]) -> list[float]:
    """The fractions normalised to sum to one (every one set: mixed is an error, as in TRL)."""
    if any(f is None for f in fractions):
        raise UsageError("`fraction` must be set for either all datasets in the mixture or none of them")
    total_share = sum(fractions)
    if total_share <= 0:
        raise UsageError("the fractions of the mixture sum to 0")
    return [f / total_share for f in fractions]


def taken_counts(rows: list[int], fractions: list[float | None]) -> list[int]:
    """TRL's rule: with every fraction set, shares normalised, N the largest mixture that oversamples no source,
    round(share * N) rows of each; with none set, every row. Mixed: an error, as in TRL."""
    if all(f is None for f in fractions):
        return list(rows)
    weights = shares(fractions)
    total = min(n / w for n, w in zip(rows, weights, strict=True) if w > 0)
    return [round(w * total) for w in weights]


def resolve(entries: list[dict[str, Any]], *, base: str | os.PathLike = ".", seed: int = 0,
            where: str = "datasets", settings: dict[str, Any] | None = None, count: bool = True) -> Mixture:
    """`datasets:` entries (dicts, as YAML gives them) -> a Mixture: files found, rows counted (one read of
    each source), TRL's fraction rule applied. `count=False` (streaming): nothing is read; rows and taken
    stay None and the shares are drawn while streaming (`Mixture.streamed_items`)."""
    if not entries:
        raise UsageError(f"{where}: the `datasets` list is empty")
    plans = []
    for entry in entries:
        spec = MixtureSource.from_dict(entry, where)
        files = spec.sources(Path(base))
        if not count:
            if spec.shuffle not in (False, None):
                raise UsageError(f"{where}: `shuffle` of dataset {spec.path!r} samples counted rows; a streamed "
                                 "mixture is not counted: drop it and use --shuffle_buffer")
            for src in files:  # a hub split arrives as it downloads, not after a full download
                src.streaming = src.kind == "hub"
        rows = sum(1 for _ in iter_items(files, limit=spec.max_records)) if count else None
        plans.append(SourcePlan(spec, files, rows))
    fractions = [p.entry.fraction for p in plans]
    if count:
        for plan, taken in zip(plans, taken_counts([p.rows for p in plans], fractions), strict=True):
            plan.taken = taken
    elif not all(f is None for f in fractions):
        shares(fractions)  # refused now if mixed or all zero
    return Mixture(plans, seed, dict(settings or {}))


def read_mixture(path: str | os.PathLike, *, seed: int = 0) -> Mixture:
    """A YAML config's `datasets:` list (a TRL config, or one written for `beam-sft prepare --config`); relative
    paths are taken from the working directory, else from the file's directory."""
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise UsageError(f"{path}: cannot read the config: {err}") from err
    if not isinstance(config, dict) or not isinstance(config.get("datasets"), list):
        raise UsageError(f"{path}: no `datasets:` list")
    rest = {k: v for k, v in config.items() if k != "datasets"}
    return resolve(config["datasets"], base=Path(path).parent, seed=seed, where=str(path), settings=rest)
