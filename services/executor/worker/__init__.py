"""The training worker: spec, model zoo, data, linear scaling rule, checkpoints,
the DDP worker process (`train`) and the local launcher (`launch`)."""
