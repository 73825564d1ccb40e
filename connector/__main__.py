"""`python -m connector` runs the CLI."""

import sys

from connector.cli.main import main

sys.exit(main())
