"""`python -m orchestrator.cli`: the same as the `warren` command."""

import sys

from orchestrator.cli.main import main

sys.exit(main())
