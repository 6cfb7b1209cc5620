import sys

from specdecode.cli import main

sys.exit(main())
