"""The screen registry: names the keys, the command palette and the help refer to."""

from __future__ import annotations

from .base import StateScreen

SCREENS: dict[str, tuple[str, str]] = {
    "cluster": ("Cluster view", "every rank: memory bar, step time, slowness, exposed comm"),
    "memory": ("Memory: predicted vs measured", "ZeRO formulas vs the engine's bytes, per rank"),
    "comm": ("Communication", "bytes per step vs 2Ψ/3Ψ, bus bandwidth per op, exposed share"),
    "loss_scale": ("Loss scale", "fp16 loss scale on a log2 axis, overflow and skip events"),
    "log": ("Log", "the job's own output (runs/<job>.log), followed live"),
}


def screen_for(name: str) -> StateScreen:
    if name == "memory":
        from .memory_screen import MemoryScreen

        return MemoryScreen()
    if name == "comm":
        from .comm_screen import CommScreen

        return CommScreen()
    if name == "loss_scale":
        from .loss_scale_screen import LossScaleScreen

        return LossScaleScreen()
    if name == "log":
        from .log_screen import LogScreen

        return LogScreen()
    raise ValueError(f"no screen named {name!r}")
