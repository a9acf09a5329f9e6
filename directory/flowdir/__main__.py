"""``python -m flowdir``: the same as the ``flowdir`` command."""

import sys

from .cli import main

sys.exit(main())
