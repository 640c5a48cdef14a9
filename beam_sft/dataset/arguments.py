"""The data options of `beam-sft prepare` and of training, one name each, parsed by TRL's parser from a YAML
file and the command line alike (docs/cli.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from trl.scripts.utils import DatasetConfig

from beam_sft.dataset.examples import TRUNCATION_POLICIES
from beam_sft.dataset.settings import DataSettings
from beam_sft.validate import reasoning
from beam_sft.validate.calls import TOOL_CALL_CHECKS_CHOICES
from beam_sft.validate.convert import INPUT_FORMATS
from beam_sft.validate.rules import MISSING_REASONING_CHOICES

# SFTConfig's fields that decide the prepared data (their defaults: TRL's, assistant_only_loss Beam's).
RUN_FIELDS = ("max_length", "assistant_only_loss", "seed", "dataset_num_proc")

# A removed option or YAML key (either spelling) -> what replaced it: the old `beam-sft prepare` flags, and TRL's
# mixture key test_split_size (eval_split_size is its one name here).
RENAMED = {"format": "--dataset_format FORMAT", "limit": "--max_records N", "keep_duplicates": "--dedup false",
           "full_sequence_loss": "--assistant_only_loss false", "split": "--dataset_train_split NAME",
           "eval_split": "--dataset_test_split NAME", "num_proc": "--dataset_num_proc N",
           "tokenizer": "--tokenizer_name_or_path PATH_OR_ID", "revision": "--dataset_revision REV",
           "data_dir": "--dataset_data_dir DIR", "data_files": "--dataset_data_files PATTERN",
           "columns": "--dataset_columns KEY=COLUMN[,...]", "test_split_size": "--eval_split_size X"}


def renamed(option: str, table: dict[str, str] = RENAMED) -> str | None:
    """The one-line refusal of a removed option (`--limit`, `--limit=5`) or YAML key (`test_split_size`), else
    None; `table` maps the removed names to their successors (a command's own: `beam_sft.cli.RENAMED_IN`)."""
    name = option.split("=", 1)[0]
    new = table.get(name.lstrip("-").replace("-", "_"))
    if new is None:
        return None
    return f"{name} was renamed: use {new if name.startswith('-') else new.split()[0].lstrip('-')}"


@dataclass
class DataArguments:
    """The data options both commands take (docs/cli.md#beam-sft-prepare)."""

    dataset_name: str | None = field(default=None, metadata={"help": (
        "The data: a .jsonl/.json/.parquet file, a glob, a directory of them, a save_to_disk "
        "dataset, a hub dataset id, or (training) a directory written by `beam-sft prepare`, trained "
        "as is after its manifest is checked against the run's tokenizer and settings. `beam-sft "
        "prepare` also takes the data as INPUT arguments.")})
    # The annotation is TRL's (`DatasetMixtureConfig.datasets`), so a TRL YAML parses the same; the entries stay
    # dicts: beam_sft.dataset.mixture reads them, beam-sft's own keys included.
    datasets: list[DatasetConfig] = field(default_factory=list, metadata={"help": (
        "A dataset mixture, in a --config YAML only: TRL's `datasets:` list (path, data_files, "
        "data_dir, split, fraction) plus beam-sft's per-source format, max_records, missing_reasoning, "
        "shuffle and label; replaces dataset_name (docs/training.md#dataset-mixtures).")})
    dataset_format: str = field(default="auto", metadata={"help": (
        "Format of the rows: 'beam' (convert-dataset output), a converter's name, or 'auto' "
        "(detect per row)."), "choices": list(INPUT_FORMATS)})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to read from a hub/disk dataset."})
    dataset_test_split: str | None = field(default=None, metadata={"help": (
        "TRL's name: the eval split. With eval_dataset_name, the split read from it (default "
        "test); without, the eval data is this split of dataset_name (a hub dataset or dataset "
        "directory), read with the same dataset_config/revision/data_dir, deduplicated against the "
        "training split.")})
    eval_dataset_name: str | None = field(default=None, metadata={"help": (
        "Separate evaluation data (same forms as dataset_name).")})
    dataset_config: str | None = field(default=None, metadata={"help": (
        "TRL's name: the subset (load_dataset's `name`) of a hub dataset or of a local directory "
        "laid out like one (a README.md with `configs:`).")})
    dataset_revision: str | None = field(default=None, metadata={"help": (
        "The hub dataset's revision (branch, tag or commit sha); part of the cache fingerprint "
        "as the commit it resolves to.")})
    dataset_data_dir: str | None = field(default=None, metadata={"help": (
        "load_dataset's data_dir for a hub dataset (or a dataset directory).")})
    dataset_data_files: str | None = field(default=None, metadata={"help": (
        "load_dataset's data_files for a hub dataset (or a dataset directory): a path or glob "
        "inside it (a YAML config may give a list or a split mapping).")})
    dataset_columns: str | None = field(default=None, metadata={"help": (
        "Rename columns to the record keys the converters read before the format is detected: "
        "KEY=COLUMN[,KEY=COLUMN...], e.g. messages=conversations,tools=functions. Applies to "
        "eval_dataset_name too.")})
    eval_split_size: float = field(default=0.0, metadata={"help": (
        "Hold out this share (0-1) or number (>=1) of the training records for evaluation "
        "(`beam-sft prepare`: as DIR/eval) when no eval_dataset_name or dataset_test_split is given. "
        "The split is seeded by --seed; a `datasets:` mixture draws it among all its sources.")})
    max_records: int | None = field(default=None, metadata={"help": "Use only the first N training records."})
    missing_reasoning: str = field(default=reasoning.DEFAULT, metadata={"help": (
        "An assistant turn without reasoning: 'mask' (weight 0: context, not trained), 'keep' "
        "(trained with an empty analysis: teaches Beam to skip reasoning, docs/reasoning.md) or "
        "'reject' the record. Same option as `beam-sft convert --missing_reasoning`."),
        "choices": list(MISSING_REASONING_CHOICES)})
    tool_call_checks: str = field(default="reject", metadata={"help": (
        "A record that breaks a rule eval scores by (a call to a tool it does not declare, or with no "
        "tools declared; arguments against the tool's schema; a turn without text; a conversation the "
        "assistant opens): 'reject' it (default, with its own reason) or 'keep' it "
        "(docs/data.md#calls-checked-against-their-tools). Same option as `beam-sft convert`."),
        "choices": list(TOOL_CALL_CHECKS_CHOICES)})
    dedup: bool = field(default=True, metadata={"help": (
        "Reject exact duplicates (validated Beam records equal to an earlier one, whatever format "
        "each came in; an eval record equal to a training one), counted as `duplicate`, the first "
        "kept. `--dedup false` keeps them. Not applied with --streaming.")})
    max_reject_share: float = field(default=0.5, metadata={"help": (
        "The share (0-1) of the input records a run may drop (rejected, or too long for max_length) and "
        "still succeed: more, or nothing written, exits non-zero after writing its outputs and rejects "
        "(docs/prepare.md#what-was-dropped); 1.0 accepts any share.")})
    truncation_policy: str = field(default="turn", metadata={"help": (
        "Records longer than max_length: 'turn' cuts back to the last whole assistant turn "
        "(drops the record if none fits), 'drop' drops them, 'keep_start' cuts at max_length."),
        "choices": list(TRUNCATION_POLICIES)})
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": (
        "Tokenizer with the Beam templates. Training: default the model's own (data/tokenizer "
        "for the embedded model); `beam-sft prepare`: the one training will use (default: the bundled "
        "data/tokenizer).")})


def data_settings(data_args: DataArguments, run_args) -> DataSettings:
    """What decides the prepared data, from the data options and `RUN_FIELDS` of `run_args` (training's
    SFTConfig, or `beam-sft prepare`'s options); checked. A `max_length` of 0 means no limit."""
    settings = DataSettings(
        format=data_args.dataset_format, split=data_args.dataset_train_split, seed=run_args.seed,
        max_length=run_args.max_length or None, assistant_only_loss=run_args.assistant_only_loss,
        **{name: getattr(data_args, name) for name in ("truncation_policy", "max_records", "eval_split_size",
                                                       "missing_reasoning", "dedup", "tool_call_checks",
                                                       "max_reject_share")},
    )
    settings.check()
    return settings


@dataclass
class PrepareArguments:
    """`beam-sft prepare`'s own options, and `RUN_FIELDS` with training's names and defaults (so one YAML file
    prepares the data that training would)."""

    output: str = field(
        metadata={"aliases": ["-o"], "help": "DIR: the prepared dataset directory (replaced if it already holds one)."}
    )
    max_length: int | None = field(default=1024, metadata={"help": (
        "Tokens per record (training's max_length); 0 for no limit.")})
    assistant_only_loss: bool = field(default=True, metadata={"help": (
        "Label the assistant turns only (training's assistant_only_loss); false labels every "
        "token.")})
    seed: int = field(default=42, metadata={"help": "Seed of the eval split (training's seed)."})
    dataset_num_proc: int | None = field(default=None, metadata={"help": (
        "Worker processes, each converting and tokenizing whole chunks of 5,000 records; the "
        "output is the same for any N (default: the cores this process may use, at most 32).")})
    rejects: str | None = field(default=None, metadata={"help": (
        "Also copy the rejects here (they are always in DIR/rejects.jsonl).")})
    stats: str | None = field(default=None, metadata={"help": "Write the manifest (counts included) here as JSON."})
    force: bool = field(default=False, metadata={"help": (
        "Rebuild DIR even when it was prepared from the same files, tokenizer and settings.")})
    shard: str | None = field(default=None, metadata={"help": (
        "I/N: prepare only shard I of N (chunks I, I+N, ...; 0 <= I < N) into DIR, a shard "
        "directory; run all N (on as many machines), then --merge them.")})
    merge: list[str] = field(default_factory=list, metadata={"help": (
        "SHARD...: write DIR from the N shard directories of --shard runs with these same "
        "inputs and options: the same bytes a single run writes.")})
    quiet: bool = field(default=False, metadata={"aliases": ["-q"], "help": "No progress bars."})


# The YAML keys only `beam-sft prepare` takes: training passes over them.
PREPARE_ONLY = frozenset(f.name for f in fields(PrepareArguments)) - set(RUN_FIELDS)
