"""Finds and loads liblunajit_torch.so (the TORCH_LIBRARY(lunajit) ops) into torch.

Searched, in order: next to this file (the staged package in a build tree, a pip
install of it), then <prefix>/lib for a package that `cmake --install` put in
<prefix>/lib/python3/dist-packages. No environment variable is needed.
"""
import json
import os
import re

import torch

LIBRARY_NAME = "liblunajit_torch.so"
_here = os.path.dirname(os.path.abspath(__file__))
CANDIDATES = (
    os.path.join(_here, LIBRARY_NAME),
    os.path.normpath(os.path.join(_here, os.pardir, os.pardir, os.pardir, LIBRARY_NAME)),
)


def _base_version(v):
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", v)
    return tuple(int(x) for x in m.groups()) if m else None


def load():
    """Loads the library once; returns its path and build info (a dict)."""
    path = next((p for p in CANDIDATES if os.path.isfile(p)), None)
    if path is None:
        raise ImportError(
            "lunajit: the op library %s was not found (looked in %s). Build lunajit with CMake and import "
            "the staged package (PYTHONPATH=<build>/python), pip install <build>/python, or cmake --install."
            % (LIBRARY_NAME, ", ".join(CANDIDATES)))
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError("lunajit: could not load %s into torch %s (was it built against another LibTorch?): %s"
                          % (path, torch.__version__, e)) from e
    info = json.loads(torch.ops.lunajit.build_info())
    built, running = _base_version(info["torch_version"]), _base_version(torch.__version__)
    if built is None or running is None or built[:2] != running[:2]:
        raise ImportError("lunajit: %s was built against LibTorch %s but this is torch %s; rebuild lunajit with "
                          "CMAKE_PREFIX_PATH=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
                          % (path, info["torch_version"], torch.__version__))
    info["library"] = path
    return path, info
