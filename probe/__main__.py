"""``python -m probe``: the same as the ``probe`` command."""

import sys

from probe.cli import main

sys.exit(main())
