"""``python -m labkit ARGS`` is ``labkit ARGS``."""

import sys

from .cli import main

sys.exit(main())
