"""ZeRO stages: partition math, the per-stage strategies and the strategy protocol."""
