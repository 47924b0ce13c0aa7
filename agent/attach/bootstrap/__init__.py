"""The folder ``zeroscope run`` puts first on the workers' ``PYTHONPATH``: it holds only the
``sitecustomize`` that loads the attach (see :mod:`zeroscope.agent.attach`)."""
