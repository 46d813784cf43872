"""`python -m services.executor.worker`: one rank of a training job (see train.py).

The worker dies with the executor that started it (Linux: SIGKILL when the
parent exits), so an executor killed alone leaves no rank training on."""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the node lease file still stops the worker
        return
    if os.getppid() == 1:  # the parent died before the signal was set
        os._exit(1)


die_with_parent()

from services.executor.worker.train import main  # noqa: E402

sys.exit(main())
