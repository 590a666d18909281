import sys

from optimus_egg.cli import main

sys.exit(main())
