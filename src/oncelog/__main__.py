import sys

from oncelog.cli import main

sys.exit(main())
