import sys

from omru.cli.main import main

sys.exit(main())
