"""OMRU: plan and run many DNN training jobs on one shared GPU cluster."""

#: The version when the package is not installed (importlib.metadata is asked first).
__version__ = "0.1.0"
