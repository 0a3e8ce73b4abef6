"""`python -m rankops` is the `rankops` command (for subprocesses that must use this interpreter)."""
import sys

from rankops.cli import main

sys.exit(main())
