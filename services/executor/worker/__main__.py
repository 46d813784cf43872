"""`python -m services.executor.worker`: one rank of a training job (see train.py)."""

import sys

from services.executor.worker.train import main

sys.exit(main())
