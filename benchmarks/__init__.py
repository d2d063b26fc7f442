"""The benchmark scripts; each runs as `python benchmarks/NAME.py` (see benchmarks/common.py)."""
from . import common  # noqa: F401  (also registers it as `common`, which the scripts import)
