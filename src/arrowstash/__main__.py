import sys

from arrowstash.cli.main import main

sys.exit(main())
