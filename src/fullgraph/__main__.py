import sys

from fullgraph.cli.main import main

sys.exit(main())
