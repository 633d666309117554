"""controlplane package."""
