"""The model registry: the only way a config's ``model.name`` becomes a class.

A config is data: it names a model, it never imports code. The built-in models register
themselves (`autostrat.models`). A user's own Cell classes are registered from Python
(`register_model`) or, on the command line, by an explicit and printed opt-in:
``autostrat search my.yaml --import my_models`` imports that module (its code runs, because the
user asked for it on the command line) and registers every Cell subclass it defines.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from autostrat.errors import ConfigError
from autostrat.frontend.cell import Cell

BUILTIN_PACKAGE = "autostrat.models"  # registers the built-in models when imported
_REGISTRY: dict[str, type] = {}
_FILE_READERS: dict = {}  # a config's model key naming a file (hf_config) -> the builder models/ registers


def register_model(cls: type, name: str | None = None) -> type:
    """Make `cls` (a `Cell` subclass) what a config's ``model: {name: NAME}`` builds; `name`
    defaults to the class's own. Usable as a decorator. Registering another class under a
    taken name is an error; registering the same class again, or its module reloaded, is not.

    Example:
        >>> from autostrat import nn, ops
        >>> @register_model
        ... class TinyNet(nn.Cell):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.relu = ops.ReLU()
        ...     def construct(self, x):
        ...         return self.relu(x)
        >>> model_class("TinyNet", "model.name") is TinyNet
        True
    """
    name = cls.__name__ if name is None else name
    if not (inspect.isclass(cls) and issubclass(cls, Cell)):
        raise ConfigError(f"register_model: expected a Cell subclass, got {cls!r}")
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"register_model: expected a model name such as MyNet (a Python identifier), got {name!r}")
    taken = _REGISTRY.setdefault(name, cls)
    if taken is not cls and _qualified(taken) == _qualified(cls):  # its module imported again
        _REGISTRY[name] = taken = cls
    if taken is not cls:
        raise ConfigError(f"register_model: the name {name!r} is taken by {_qualified(taken)}; "
                          f"register {_qualified(cls)} under another name (register_model(cls, name=...))")
    return cls


def register_model_file(key: str, build) -> None:
    """Make a config's ``model: {KEY: FILE}`` build its model with ``build(path, **params)``
    (`models` registers ``hf_config``, HuggingFace's config.json). A key is registered once.

    Example:
        >>> register_model_file("doc_example_file", lambda path: path)
        >>> model_file_keys()[:1], model_file_builder("doc_example_file")("x.json")
        (('doc_example_file',), 'x.json')
        >>> unregister_model_file("doc_example_file")
    """
    if key in _FILE_READERS:
        raise ConfigError(f"register_model_file: the key {key!r} is already registered")
    _FILE_READERS[key] = build


def unregister_model_file(key: str) -> None:
    """Remove a registration (doc examples)."""
    _FILE_READERS.pop(key)


def model_file_keys() -> tuple[str, ...]:
    """The keys a config's model section may name a model file with, alphabetically."""
    _load_builtins()
    return tuple(sorted(_FILE_READERS))


def model_file_builder(key: str):
    """The builder registered for `key` (`model_file_keys` lists them)."""
    _load_builtins()
    return _FILE_READERS[key]


def model_names() -> tuple[str, ...]:
    """Every registered model name: the built-ins, then the others in the order registered.

    Example:
        >>> {"FFN", "GPT", "MLP"} <= set(model_names())
        True
    """
    _load_builtins()
    return tuple(_REGISTRY)


def model_class(name, where: str) -> type:
    """The class registered as `name`; a `ConfigError` at `where` for anything else (a name
    that looks like an import, ``package.module:Class``, says how to opt in).

    Example:
        >>> model_class("FFN", "model.name").__name__
        'FFN'
        >>> model_class("os:system", "model.name")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        autostrat.errors.ConfigError: model.name: 'os:system' is not a registered model; a config names ...
    """
    _load_builtins()
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    if not isinstance(name, str):
        raise ConfigError(f"{where}: expected a model name, got {name!r}")
    if ":" in name or "." in name:
        raise ConfigError(f"{where}: {name!r} is not a registered model; a config names a model, it never imports "
                          f"code: register your Cell with autostrat --import MODULE (command line) or "
                          f"register_model (Python); registered: {', '.join(_REGISTRY)}")
    raise ConfigError(f"{where}: unknown model {name!r}; registered models: {', '.join(_REGISTRY)} "
                      f"(your own Cell: --import MODULE on the command line)")


def import_models(spec: str) -> tuple[str, ...]:
    """Import the user's module `spec` (a module name, found in the current folder first, or a
    ``.py`` file) and register every Cell subclass defined in it; returns their names. This runs
    the module's code: only the command line's ``--import`` and Python callers use it, never a
    file autostrat reads.

    Example:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "my_cells.py").write_text(
        ...     "from autostrat import nn, ops\\n"
        ...     "class Doubler(nn.Cell):\\n"
        ...     "    def __init__(self):\\n"
        ...     "        super().__init__()\\n"
        ...     "        self.add = ops.Add()\\n"
        ...     "    def construct(self, x):\\n"
        ...     "        return self.add(x, x)\\n")
        >>> import_models(str(folder / "my_cells.py"))
        ('Doubler',)
    """
    module = _import(spec)
    defined = [cls for _, cls in inspect.getmembers(module, inspect.isclass)
               if issubclass(cls, Cell) and cls.__module__ == module.__name__]
    if not defined:
        raise ConfigError(f"--import {spec}: expected a module defining Cell subclasses to register as models, "
                          f"found none in {module.__file__}")
    for cls in defined:
        register_model(cls)
    return tuple(cls.__name__ for cls in defined)


def _import(spec: str):
    """The module `spec` names: a file path (``models/mine.py``) or a dotted module name."""
    try:
        if spec.endswith(".py") or "/" in spec:
            return _import_file(Path(spec))
        if not all(part.isidentifier() for part in spec.split(".")):
            raise ConfigError(f"--import: expected a module name such as my_models or a .py file, got {spec!r}")
        sys.path.insert(0, str(Path.cwd()))  # the user named it on the command line: look where they are first
        try:
            return importlib.import_module(spec)
        finally:
            sys.path.remove(str(Path.cwd()))
    except ConfigError:
        raise
    except ImportError as error:
        raise ConfigError(f"--import {spec}: cannot import it: {error}") from None
    except Exception as error:  # noqa: BLE001  (the user's module failed: say so in one line)
        raise ConfigError(f"--import {spec}: importing it raised {type(error).__name__}: {error}") from None


def _import_file(path: Path):
    if not path.is_file():
        raise ConfigError(f"--import: expected a Python file, {path} is not one")
    name = path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not name.isidentifier():
        raise ConfigError(f"--import: expected a Python file whose name is a module name, got {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_builtins() -> None:
    importlib.import_module(BUILTIN_PACKAGE)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
