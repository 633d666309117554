"""The built-in policy types, one module each; importing this package registers them, in the order
below, which is the order of the schema's type enum (and so of the CRD and the reference)."""
# isort: skip_file

from autoscaler.policies import keda  # noqa: F401
from autoscaler.policies import ratio  # noqa: F401
from autoscaler.policies import slo_model  # noqa: F401
from autoscaler.policies import kpa  # noqa: F401
from autoscaler.policies import pd_model  # noqa: F401
