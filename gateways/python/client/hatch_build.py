"""hatchling's build hook for capgate-client: the generated modules are made by the build itself.

* A wheel (`pip install gateways/python/client`, `uv build`) gets `capgate_client/_gen` compiled
  into a temporary folder and added to the archive, so installing needs nothing generated
  beforehand and leaves the source tree as it was.
* An editable install (the uv workspace's `uv sync`) points at `src/`, so there the modules are
  written into `src/capgate_client/_gen` (ignored by git).
* An sdist carries the protos themselves, as `proto/capgate/v1/`, so a wheel can be built from it
  away from the repository.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _protogen(root: Path) -> ModuleType:
    # protogen.py sits beside this file; the build backend does not put the project on sys.path.
    spec = importlib.util.spec_from_file_location("capgate_client_protogen", root / "protogen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GeneratedModulesHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        protogen = _protogen(root)
        protos = protogen.find_protos(root)
        if self.target_name == "sdist":
            build_data["force_include"][str(protos / "capgate" / "v1")] = "proto/capgate/v1"
            return
        if version == "editable":
            protogen.generate(protos, root / "src" / "capgate_client" / "_gen")
            return
        self._scratch = Path(tempfile.mkdtemp(prefix="capgate-client-gen-"))
        protogen.generate(protos, self._scratch / "_gen")
        build_data["force_include"][str(self._scratch / "_gen")] = "capgate_client/_gen"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
