"""The files shipped with beam-sft (`BUNDLED`): the repository's `data/` and `configs/` in a checkout, the
copies setup.py puts under `beam_sft/bundled/` in a wheel, so `bundled("data/tokenizer")` works anywhere."""

from __future__ import annotations

import difflib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
INSTALLED_ROOT = PACKAGE_DIR / "bundled"
CHECKOUT_ROOT = PACKAGE_DIR.parent

# Repository paths a wheel carries, relative to the checkout (setup.py reads this list).
BUNDLED = ("data/tokenizer", "data/samples", "configs/quickstart.yaml", "configs/quickstart_gpt_oss.yaml",
           "configs/beam_full.yaml", "configs/beam_lora.yaml", "configs/beam_moe_lora.yaml", "configs/models/tiny",
           "configs/models/tiny_gpt_oss", "configs/accelerate")


def bundled(relative: str) -> Path:
    """Bundled `relative` (of `BUNDLED`, may not exist): from the installed copy if any, else the checkout."""
    return (INSTALLED_ROOT if INSTALLED_ROOT.is_dir() else CHECKOUT_ROOT) / relative


def resolve_config(value: str, kind: str = "training") -> Path:
    """A config given as a path (used as is when it exists) or as a shipped config's name (`quickstart`);
    neither: ValueError naming the known configs, nearest first."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    folder = bundled("configs" if kind == "training" else "configs/accelerate")
    names = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    stem = value.removesuffix(".yaml")
    if stem in names:
        return folder / f"{stem}.yaml"
    near = difflib.get_close_matches(stem, names, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    raise ValueError(f"{value!r} is neither a file nor a shipped config ({', '.join(names)}){hint}")
