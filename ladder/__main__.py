import sys

from ladder.cli import main

sys.exit(main())
