"""The package's public names resolve, and importing it loads nothing heavy."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import tensorslim


def test_every_public_name_resolves() -> None:
    # Importing a submodule sets an attribute of the package: no submodule may be named like a public function.
    for module in pkgutil.walk_packages(tensorslim.__path__, "tensorslim."):
        if module.name != "tensorslim.__main__":  # that one runs the command line
            importlib.import_module(module.name)
    for name in tensorslim.__all__:
        value = getattr(tensorslim, name)
        assert isinstance(value, dict) if name in ("METHODS", "TRANSFORMS") else value.__name__ == name


def test_import_has_no_heavy_side_effects() -> None:
    code = "import sys, tensorslim; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
