"""The local process fleet: engine replicas as processes behind the scale-target interface.

    from controlplane.fleet import LocalFleet, load_fleet_config
    cfg = load_fleet_config("examples/fleet_local.yaml")
    with LocalFleet(cfg, "runs/local") as fleet:
        fleet.scale(3, "manual")

See fleet.LocalFleet for the behaviour, config for the FLEET.yaml format.
"""

from controlplane.fleet.config import FleetConfig, load_fleet_config
from controlplane.fleet.fleet import LocalFleet

__all__ = ["FleetConfig", "LocalFleet", "load_fleet_config"]
