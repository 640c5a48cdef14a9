"""One set of data options (beam_sft.dataset.arguments): `beam-sft prepare` and training parse the same names the
same way, one YAML file serves both and gives the same `DataSettings`, and a renamed option fails in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
OPENAI = str(REPO / "data" / "samples" / "openai.jsonl")


def _yaml(tmp_path: Path, **config) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.mark.parametrize("old,new", [
    (["--limit", "5"], "--limit was renamed: use --max_records N"),
    (["--format", "openai"], "--format was renamed: use --dataset_format FORMAT"),
    (["--keep-duplicates"], "--keep-duplicates was renamed: use --dedup false"),
    (["--full-sequence-loss"], "--full-sequence-loss was renamed: use --assistant_only_loss false"),
    (["--num-proc=2"], "--num-proc was renamed: use --dataset_num_proc N"),
    (["--eval-split", "validation"], "--eval-split was renamed: use --dataset_test_split NAME"),
    (["--tokenizer", "data/tokenizer"], "--tokenizer was renamed: use --tokenizer_name_or_path PATH_OR_ID"),
    (["--columns", "messages=dialog"], "--columns was renamed: use --dataset_columns KEY=COLUMN[,...]"),
])
def test_a_renamed_prepare_option_is_one_line_naming_the_new_one(tmp_path, capsys, old, new):
    from beam_sft.cli import main

    out = tmp_path / "out"
    assert main(["prepare", OPENAI, "-o", str(out), *old]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {new}\n", err
    assert not out.exists()


def test_test_split_size_is_refused_by_both_commands_naming_eval_split_size(tmp_path):
    from beam_sft.cli.prepare import parse
    from beam_sft.errors import UsageError
    from beam_sft.train.options import make_parser

    config = _yaml(tmp_path, dataset_name=OPENAI, test_split_size=0.1)
    with pytest.raises(UsageError, match="test_split_size was renamed: use eval_split_size$"):
        parse(["--config", config, "-o", str(tmp_path / "out")])
    with pytest.raises(UsageError, match="test_split_size was renamed: use eval_split_size$"):
        make_parser().parse_args_and_config(["--config", config])


def test_one_yaml_gives_both_commands_the_same_data_settings(tmp_path):
    """Each command passes over the other's keys (learning_rate, output) and builds the same DataSettings."""
    from beam_sft.cli.prepare import parse
    from beam_sft.dataset.arguments import data_settings
    from beam_sft.train.options import make_parser

    config = _yaml(tmp_path, dataset_name=OPENAI, dataset_format="openai", max_length=300, max_records=40,
                   truncation_policy="drop", eval_split_size=0.25, seed=7, missing_reasoning="keep", dedup=False,
                   assistant_only_loss=False, learning_rate=1e-4, num_train_epochs=2, output=str(tmp_path / "p"),
                   dataset_num_proc=1)
    data, options, inputs, _ = parse(["--config", config])
    assert inputs == [] and options.output == str(tmp_path / "p") and options.dataset_num_proc == 1
    script_args, training_args, _ = make_parser().parse_args_and_config(["--config", config])
    prepared, trained = data_settings(data, options), data_settings(script_args, training_args)
    assert prepared == trained
    assert (prepared.max_length, prepared.max_records, prepared.seed, prepared.dedup) == (300, 40, 7, False)
    assert (prepared.format, prepared.missing_reasoning, prepared.assistant_only_loss) == ("openai", "keep", False)


def test_a_key_neither_command_takes_is_refused_with_the_nearest(tmp_path):
    from beam_sft.cli.prepare import parse
    from beam_sft.errors import UsageError

    with pytest.raises(UsageError, match="unknown key 'max_record' \\(did you mean 'max_records'\\?\\)"):
        parse(["--config", _yaml(tmp_path, max_record=3), "-o", str(tmp_path / "out")])


def test_prepare_takes_trainings_defaults_for_the_sftconfig_fields():
    """max_length, assistant_only_loss, seed and dataset_num_proc: prepare declares them with training's names
    and defaults, so an option left out means the same data in both commands."""
    from beam_sft.dataset.arguments import RUN_FIELDS, PrepareArguments
    from beam_sft.train.config import BeamSFTConfig

    prepare = {f.name: f.default for f in dataclasses.fields(PrepareArguments)}
    training = {f.name: f.default for f in dataclasses.fields(BeamSFTConfig)}
    assert {name: prepare[name] for name in RUN_FIELDS} == {name: training[name] for name in RUN_FIELDS}


def test_data_given_twice_or_not_at_all_is_refused(tmp_path, capsys):
    from beam_sft.cli import main

    assert main(["prepare", OPENAI, "--dataset_name", OPENAI, "-o", str(tmp_path / "a")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["prepare", "-o", str(tmp_path / "b")]) == 2
    assert "no data" in capsys.readouterr().err


# Every other command that reads data: its removed spellings (with a value where they took one), and what it
# needs besides (an output where it writes one).
OLD_SPELLINGS = {
    "convert": ["--format openai", "--limit 5", "--num-proc 2", "--split train", "--revision main",
                "--data-dir d", "--data-files x.jsonl", "--columns messages=dialog", "--keep-duplicates"],
    "inspect": ["--format openai", "--split train", "--tokenizer data/tokenizer"],
    "eval": ["--format beam", "--tokenizer data/tokenizer"],
    "contamination": ["--format openai", "--split train"],
    "backfill": ["--format openai", "--limit 5", "--split train", "--tokenizer data/tokenizer"],
    "augment": ["--format openai", "--limit 5", "--split train"],
}
WRITES = {"convert", "backfill", "augment"}


def _command_line(command: str, tmp_path: Path, *options: str) -> list[str]:
    inputs = [] if command in ("eval", "contamination") else [OPENAI]
    output = ["-o", str(tmp_path / "out.jsonl")] if command in WRITES else []
    teacher = ["--model", "teacher"] if command == "backfill" else []
    return [command, *inputs, *output, *teacher, *options]


@pytest.mark.parametrize("command,old", [(c, o) for c, olds in OLD_SPELLINGS.items() for o in olds])
def test_every_command_refuses_a_removed_spelling_in_one_line(tmp_path, capsys, command, old):
    """The same one line as prepare's (`RENAMED`), exit status 2, before anything is read or written."""
    from beam_sft.cli import main
    from beam_sft.dataset.arguments import renamed

    name = old.split()[0]
    assert main(_command_line(command, tmp_path, *old.split())) == 2
    assert capsys.readouterr().err == f"error: {renamed(name)}\n"
    assert list(tmp_path.iterdir()) == []


def test_eval_names_its_own_split_and_convert_dataset_refuses_too(tmp_path, capsys):
    from beam_sft.cli import main
    from beam_sft.cli.convert import main as convert_dataset

    assert main(["eval", "--data", OPENAI, "--split", "test"]) == 2
    assert capsys.readouterr().err == "error: --split was renamed: use --dataset_test_split NAME\n"
    assert convert_dataset([OPENAI, "-o", str(tmp_path / "o.jsonl"), "--limit=3"]) == 2
    assert capsys.readouterr().err == "error: --limit was renamed: use --max_records N\n"


# The new spellings, each command's: (option, value, the parsed value).
NEW_SPELLINGS = {
    "convert": [("dataset_format", "openai", "openai"), ("max_records", "5", 5), ("dataset_num_proc", "2", 2),
                ("dataset_train_split", "dev", "dev"), ("dataset_config", "c", "c"), ("dataset_revision", "r", "r"),
                ("dataset_data_dir", "d", "d"), ("dataset_data_files", "x.jsonl", ["x.jsonl"]),
                ("dataset_columns", "messages=dialog", "messages=dialog"), ("dedup", "false", False),
                ("missing_reasoning", "keep", "keep")],
    "inspect": [("dataset_format", "openai", "openai"), ("dataset_train_split", "dev", "dev"),
                ("tokenizer_name_or_path", "t", "t"), ("max_length", "64", 64), ("truncation_policy", "drop", "drop"),
                ("missing_reasoning", "keep", "keep")],
    "eval": [("dataset_format", "beam", "beam"), ("dataset_test_split", "dev", "dev"),
             ("tokenizer_name_or_path", "t", "t"), ("max_records", "5", 5)],
    "contamination": [("dataset_format", "openai", "openai"), ("dataset_train_split", "dev", "dev")],
    "backfill": [("dataset_format", "openai", "openai"), ("max_records", "5", 5), ("dataset_train_split", "dev", "dev"),
                 ("tokenizer_name_or_path", "t", "t")],
    "augment": [("dataset_format", "openai", "openai"), ("max_records", "5", 5),
                ("dataset_train_split", "dev", "dev")],
}


@pytest.mark.parametrize("command", NEW_SPELLINGS)
def test_every_command_takes_the_one_spelling_and_its_dash_form(tmp_path, command):
    from beam_sft.cli import make_parser

    parser = make_parser()
    for name, value, parsed in NEW_SPELLINGS[command]:
        for spelling in (name, name.replace("_", "-")):
            args = parser.parse_args(_command_line(command, tmp_path, f"--{spelling}", value))
            assert getattr(args, name) == parsed, (command, spelling)
