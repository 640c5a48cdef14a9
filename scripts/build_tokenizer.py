"""Build the bundled Beam tokenizer in `data/tokenizer/` from the text in `data/tokenizer_corpus/`.

A small byte-level BPE (about 6k tokens, so tiny test models stay fast) with the seven Beam Harmony markers
as single tokens (only `<|return|>` special: it is EOS), a special `<|pad|>`, and the chat and response
templates from `beam_sft/template/`. Byte-level with no normalizer and no prefix space, so
`decode(encode(text)) == text` for any text. The build is deterministic: the same corpus and templates
give byte-identical files.

# Rebuild (after changing the corpus or the templates)
```bash
python scripts/build_tokenizer.py
```

# Check that data/tokenizer is up to date (exit status 1 if not), e.g. in CI
```bash
python scripts/build_tokenizer.py --check
```

# Build elsewhere, with other templates or another vocabulary size
```bash
python scripts/build_tokenizer.py --output_dir /tmp/tok --template_dir /tmp/templates --vocab_size 8000
```
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Files in the corpus directory that are not corpus text.
NOT_CORPUS = {"README.md"}


@dataclass
class BuildTokenizerArguments:
    corpus_dir: str = field(
        default=str(REPO / "data" / "tokenizer_corpus"),
        metadata={
            "help": "Directory of UTF-8 text files to train on (all files, sorted by name; README.md skipped)."
        },
    )
    output_dir: str = field(
        default=str(REPO / "data" / "tokenizer"), metadata={"help": "Where to write the tokenizer."}
    )
    template_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory with chat_template.jinja and response_template.json (default: the package's)."
        },
    )
    vocab_size: int = field(
        default=6000, metadata={"help": "Target vocabulary size, markers and pad included."}
    )
    min_frequency: int = field(default=2, metadata={"help": "Minimum pair count for a BPE merge."})
    model_max_length: int = field(default=8192, metadata={"help": "Saved as tokenizer.model_max_length."})
    check: bool = field(
        default=False,
        metadata={
            "help": "Build into a temporary directory and compare with output_dir; exit 1 on any difference."
        },
    )


def corpus_files(corpus_dir: Path) -> list[Path]:
    files = sorted(p for p in corpus_dir.iterdir() if p.is_file() and p.name not in NOT_CORPUS)
    assert files, f"no corpus files in {corpus_dir}"
    return files


def build(
    corpus_dir: str | Path,
    output_dir: str | Path,
    *,
    template_dir: str | Path | None = None,
    vocab_size: int = 6000,
    min_frequency: int = 2,
    model_max_length: int = 8192,
) -> list[Path]:
    """Train and save the tokenizer; returns the saved files, sorted."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from beam_sft.template.tokenizer import (
        EOS_TOKEN,
        PAD_TOKEN,
        PLAIN_MARKERS,
        install_templates,
        save_tokenizer,
    )

    texts = [p.read_text(encoding="utf-8") for p in corpus_files(Path(corpus_dir))]
    reserved = len(PLAIN_MARKERS) + 2  # + EOS + pad, appended after training
    backend = Tokenizer(models.BPE())
    # No normalizer and no prefix space: text goes in byte for byte, so decoding gives it back exactly.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - reserved,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    # Markers after the learned vocabulary: they are not in the corpus' merges, and fixed ids at the end
    # keep them apart from byte tokens. normalized=False as there is no normalizer to bypass anyway.
    backend.add_tokens([AddedToken(m, special=False, normalized=False) for m in PLAIN_MARKERS])
    backend.add_special_tokens(
        [
            AddedToken(EOS_TOKEN, special=True, normalized=False),
            AddedToken(PAD_TOKEN, special=True, normalized=False),
        ]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    install_templates(tokenizer, template_dir)
    # Write next to the target and swap directories, so a failed build never leaves a half-written tokenizer.
    output_dir = Path(output_dir)
    staging = staging_dir(output_dir)
    try:
        save_tokenizer(tokenizer, staging)
        swap_in(staging, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(p for p in output_dir.iterdir() if p.is_file())


def staging_dir(output_dir: Path) -> Path:
    """An empty directory beside `output_dir` to build into, with the usual permissions."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the tokenizer dir is an ordinary one
    return staging


def swap_in(staging: Path, output_dir: Path) -> None:
    """Put the finished `staging` directory in place of `output_dir` (replacing it whole, if it exists)."""
    if output_dir.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.old.", dir=output_dir.parent))
        output_dir.rename(retired / output_dir.name)
        staging.rename(output_dir)
        shutil.rmtree(retired)
    else:
        staging.rename(output_dir)


def compare_dirs(expected: Path, actual: Path) -> list[str]:
    """Names of files that differ (or exist on one side only)."""
    names = {p.name for p in expected.iterdir() if p.is_file()} | {
        p.name for p in actual.iterdir() if p.is_file()
    }
    return sorted(
        n
        for n in names
        if not ((expected / n).is_file() and (actual / n).is_file())
        or (expected / n).read_bytes() != (actual / n).read_bytes()
    )


def main(args: BuildTokenizerArguments) -> int:
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            build(
                args.corpus_dir,
                Path(tmp) / "tokenizer",
                template_dir=args.template_dir,
                vocab_size=args.vocab_size,
                min_frequency=args.min_frequency,
                model_max_length=args.model_max_length,
            )
            target = Path(args.output_dir)
            if not target.is_dir():
                print(f"{target} does not exist; run python scripts/build_tokenizer.py", file=sys.stderr)
                return 1
            differ = compare_dirs(target, Path(tmp) / "tokenizer")
        if differ:
            print(
                f"{target} is out of date ({', '.join(differ)}); run python scripts/build_tokenizer.py",
                file=sys.stderr,
            )
            return 1
        print(f"{target} is up to date")
        return 0
    files = build(
        args.corpus_dir,
        args.output_dir,
        template_dir=args.template_dir,
        vocab_size=args.vocab_size,
        min_frequency=args.min_frequency,
        model_max_length=args.model_max_length,
    )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)
    print(
        f"wrote {', '.join(p.name for p in files)} to {args.output_dir} (len(tokenizer) = {len(tokenizer)})"
    )
    return 0


def make_parser():
    from trl import TrlParser

    return TrlParser((BuildTokenizerArguments,))


if __name__ == "__main__":
    # The trainer's parallel word counting is deterministic, but one thread keeps the build cheap on
    # shared machines and rules out any ordering effect.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    sys.path.insert(0, str(REPO))
    (script_args,) = make_parser().parse_args_and_config()
    sys.exit(main(script_args))
