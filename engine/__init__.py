"""The bundled ZeRO 0/1/2/3 training engine, configured by DeepSpeed's ds_config.json.

Import-free on purpose (the TUI must start fast); the entry point is
``from zeroscope.engine.api import initialize`` (see docs/engine.md)."""
