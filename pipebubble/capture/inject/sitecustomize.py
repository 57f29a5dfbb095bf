"""Put first on the child's PYTHONPATH by `pipebubble capture`.

It loads the profiling hook that sits next to it (by file path, so the child needs no pipebubble
install of its own), then runs the sitecustomize this one shadows, so a site's own setup still happens.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _install_hook() -> None:
    try:
        _load("_pipebubble_hook", os.path.join(_HERE, "_pipebubble_hook.py")).install()
    except Exception as exc:  # never break the user's program because profiling could not be set up
        print(f"pipebubble: profiling hook not installed: {exc}", file=sys.stderr)


def _chain_shadowed() -> None:
    from importlib.machinery import PathFinder

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install_hook()
_chain_shadowed()
