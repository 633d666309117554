"""The tag a latency-model JSON file carries, so that a model and a profile's metadata (both JSON,
often side by side) are never taken for one another."""

FORMAT = "slopilot-latency-model/1"
