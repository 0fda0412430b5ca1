"""Built-in strategies: importing a module registers it."""
from . import reference  # noqa: F401
from . import serial  # noqa: F401
from . import precomputed  # noqa: F401
from . import chunk  # noqa: F401
from . import hierarchical  # noqa: F401
from . import grouped  # noqa: F401
from . import lookback  # noqa: F401
