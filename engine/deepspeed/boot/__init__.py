"""The folder ``zeroscope run --as-deepspeed`` puts first on the workers' PYTHONPATH: its
``sitecustomize.py`` installs the ``deepspeed`` alias at interpreter start-up (this file only
makes the folder ship as package data)."""
