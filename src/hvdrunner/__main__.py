import sys

from hvdrunner.cli import main

sys.exit(main())
