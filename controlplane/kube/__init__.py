"""The controller on Kubernetes: InferenceAutoscaler (and opted-in ScaledObject) resources watched
from the API server, targets scaled through their scale subresource, state and conditions in the
resource's status, Events, and leader election on a Lease (see manager.KubeController)."""
