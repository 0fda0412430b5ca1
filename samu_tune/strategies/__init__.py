"""Built-in strategies: importing a module registers it."""
from . import reference  # noqa: F401
from . import serial  # noqa: F401
from . import precomputed  # noqa: F401
from . import lookback  # noqa: F401
