"""A post-import hook: call back once a module has finished executing (loaded by the hook).

Standard library only, and no pipebubble import: this runs in the profiled program's interpreter.
"""

import importlib.abc
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls callbacks[name](module) once that module has finished executing (a post-import hook).

    A callback that raises is passed to on_error(exc), never to the program that imported the module."""

    def __init__(self, callbacks, on_error):
        self.callbacks = dict(callbacks)
        self.on_error = on_error

    def find_spec(self, name, path=None, target=None):
        # Only wrap here: importlib.util.find_spec("torch") (a probe, no import) comes through too.
        if name not in self.callbacks:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find else None
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenCall(spec.loader, lambda module: self._fire(name, module), self.on_error)
                return spec
        return None

    def _fire(self, name, module):
        callback = self.callbacks.pop(name, None)
        if callback is not None:
            callback(module)


class _ThenCall:
    def __init__(self, loader, callback, on_error):
        self._loader, self._callback, self._on_error = loader, callback, on_error

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self._loader
        try:
            self._callback(module)
        except Exception as exc:  # profiling must never break the user's program
            self._on_error(exc)
