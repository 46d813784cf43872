"""OMRU: plan and run many DNN training jobs on one shared GPU cluster.

The SDK: `omru.client` (Client, SyncClient, job), its errors `omru.errors`, and
``from omru import TlsConfig`` (the TLS files a client presents and trusts);
docs/sdk.md.
"""

#: The version when the package is not installed (importlib.metadata is asked first).
__version__ = "0.1.0"


def __getattr__(name: str):
    # TlsConfig is imported on first use only: `import omru` stays free of the services' modules
    if name == "TlsConfig":
        from services.common.config import TlsConfig

        return TlsConfig
    raise AttributeError(f"module 'omru' has no attribute {name!r}")


__all__ = ["TlsConfig", "__version__"]
