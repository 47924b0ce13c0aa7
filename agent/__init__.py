"""In-process telemetry for training ranks: wire schema, probes, publisher."""
