"""`python -m fleetwise`: the `fleetwise` command."""

import sys

from fleetwise.cli.main import main

sys.exit(main())
