"""Build hook only (the metadata is pyproject.toml): a wheel carries the bundled data and configs.

`beam_sft/template/bundled.py` names them (`BUNDLED`, repository-relative); they are copied to
`beam_sft/bundled/` in the build, where the installed package looks first.
"""

import ast
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def bundled_paths() -> tuple[str, ...]:
    # Read, not imported: the build environment need not have beam-sft's dependencies.
    tree = ast.parse((ROOT / "beam_sft" / "template" / "bundled.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "BUNDLED":
            return ast.literal_eval(node.value)
    raise RuntimeError("BUNDLED not found in beam_sft/template/bundled.py")


class BuildWithBundle(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "beam_sft" / "bundled"
        for relative in bundled_paths():
            source, dest = ROOT / relative, target / relative
            if source.is_dir():
                shutil.copytree(source, dest, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)


setup(cmdclass={"build_py": BuildWithBundle})
