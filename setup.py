"""Build hook: the demo (routes.yaml and the qualification records of its lanes) ships inside the wheel
as gateway/demo/, so `gateway demo` runs from any folder after `pip install`. The checkout's files stay
where admins edit them (the repository root); every build copies them."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithDemo(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "gateway" / "demo"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / "routes.yaml", target / "routes.yaml")
        shutil.copytree(ROOT / "qualifications", target / "qualifications", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithDemo})
