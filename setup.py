"""Build hook: copy the package data that lives at the repo root into `connector/_data/` of the wheel."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# (source glob under the repo root, destination folder under connector/_data)
DATA = (
    ("schemas/*.json", "schemas"),
    ("catalog/actions.json", "catalog"),
    ("catalog/actions.json.sig", "catalog"),
    ("catalog/trust/*.pub", "catalog/trust"),
)


class BuildWithData(build_py):
    """`build_py` plus the schemas and the example catalog (public keys only) as package data."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "connector" / "_data"
        for pattern, folder in DATA:
            for source in sorted(ROOT.glob(pattern)):
                (target / folder).mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / folder / source.name)


setup(cmdclass={"build_py": BuildWithData})
