"""``python -m zeroscope`` is the ``zeroscope`` command."""

import sys

from zeroscope.cli import main

sys.exit(main())
