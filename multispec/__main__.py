"""`python -m multispec ...` (and `accelerate launch -m multispec bench ...`): the command line."""

import sys

from .entrypoints.cli import main

sys.exit(main())
