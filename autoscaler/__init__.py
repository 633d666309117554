"""autoscaler package."""
