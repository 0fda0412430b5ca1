import sys

from samu_tune.cli import main

sys.exit(main())
