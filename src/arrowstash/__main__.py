import sys

from arrowstash.cli import main

sys.exit(main())
