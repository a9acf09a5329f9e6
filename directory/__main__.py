"""``python -m directory``: the same as the ``flowdir`` command."""

import sys

from .cli import main

sys.exit(main())
