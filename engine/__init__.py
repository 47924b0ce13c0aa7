"""The bundled ZeRO 0/1/2/3 training engine, configured by DeepSpeed's ds_config.json."""
