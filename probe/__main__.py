"""``python -m probe``: the same as the ``probe`` command."""

import sys

from probe.cli.entry import main

sys.exit(main())
