"""`python -m rollwise.cli ...`: the same as the `rollwise` command."""

import sys

from rollwise.cli.main import main

sys.exit(main())
