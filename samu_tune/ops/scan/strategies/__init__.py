"""The scan's strategies: each module in this folder builds its :class:`~samu_tune.registry.Strategy`
and registers it on import.  The folder is read, not listed (:func:`load`), so a new strategy is
one new module here: the generated tests, the tuner, the CLI and ``explain`` find it in the
registry."""
import importlib
import pkgutil


def load() -> list[str]:
    """Import every module of this package (on every folder of its ``__path__``) not imported
    yet; returns the modules' names."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__))
    for name in names:
        importlib.import_module(f"{__name__}.{name}")
    return names


load()
