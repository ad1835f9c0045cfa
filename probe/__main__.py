"""``python -m probe``: the same as the ``probe`` command."""

import sys

from probe.entry import main

sys.exit(main())
