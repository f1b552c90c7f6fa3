"""`python -m builder`: the nodeforge command line."""

import sys

from .cli import main

sys.exit(main())
