"""The files shipped with beam-sft: the bundled tokenizer, samples, training and accelerate configs, tiny models.

In a checkout they are the repository's own `data/` and `configs/`; a built wheel carries copies under
`beam_sft/bundled/` (setup.py copies `BUNDLED` there at build time), so `beam-sft train --config quickstart`
runs from an install in any directory. `bundled("data/tokenizer")` is the one way to find them.
"""

from __future__ import annotations

import difflib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
INSTALLED_ROOT = PACKAGE_DIR / "bundled"
CHECKOUT_ROOT = PACKAGE_DIR.parent

# Repository paths a wheel carries, relative to the checkout (setup.py reads this list).
BUNDLED = (
    "data/tokenizer",
    "data/samples",
    "configs/quickstart.yaml",
    "configs/quickstart_gpt_oss.yaml",
    "configs/beam_full.yaml",
    "configs/beam_lora.yaml",
    "configs/beam_moe_lora.yaml",
    "configs/models/tiny",
    "configs/models/tiny_gpt_oss",
    "configs/accelerate",
)


def bundle_root() -> Path:
    """Where the bundled files are: the installed copy when there is one, else the checkout."""
    return INSTALLED_ROOT if INSTALLED_ROOT.is_dir() else CHECKOUT_ROOT


def bundled(relative: str) -> Path:
    """The bundled file or directory at `relative` (a path of `BUNDLED` or below it); it may not exist."""
    return bundle_root() / relative


def named_configs(kind: str = "training") -> list[str]:
    """The names `--config` (training) or `--config_file` (accelerate) accept: the shipped YAML files' stems."""
    folder = bundled("configs" if kind == "training" else "configs/accelerate")
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve_config(value: str, kind: str = "training") -> Path:
    """A config given as a path (used as is when it exists) or as a shipped config's name (`quickstart`).

    Raises ValueError naming the known configs, nearest first, when it is neither.
    """
    path = Path(value).expanduser()
    if path.is_file():
        return path
    names = named_configs(kind)
    stem = value.removesuffix(".yaml")
    if stem in names:
        return bundled(("configs/" if kind == "training" else "configs/accelerate/") + f"{stem}.yaml")
    near = difflib.get_close_matches(stem, names, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"{value!r} is neither a file nor a shipped config ({', '.join(names)}){hint}")
