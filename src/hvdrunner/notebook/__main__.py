"""``python -m hvdrunner.notebook run ...``"""

import sys

from hvdrunner.notebook.run import main

sys.exit(main())
