"""Scale targets behind one interface (see base.Target): the local process fleet lives in
controlplane.fleet; MemoryTarget holds a number (dry runs, tests)."""

from controlplane.targets.base import Replicas, ScaleError, Target
from controlplane.targets.memory import MemoryTarget

__all__ = ["MemoryTarget", "Replicas", "ScaleError", "Target"]
