"""`python -m climb.cli ...`: the same as the `climb` command."""
import sys

from climb.cli import main

sys.exit(main())
