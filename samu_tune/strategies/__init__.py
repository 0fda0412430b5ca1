"""Built-in strategies: importing a module registers it."""
from . import reference  # noqa: F401
