"""oxccl from Python.

- ``torch.distributed.init_process_group("oxccl")`` (or ``"cpu:oxccl"``,
  ``"cpu:oxccl,cuda:nccl"``) uses oxccl for CPU tensors; the package's
  ``torch.distributed.backends`` entry point registers it, so no import is needed.
- ``oxccl.version()`` is the C library's version (``major * 10000 + minor * 100 + patch``).
"""

from ._lib import LIBRARY, OxcclError, version

__all__ = ["LIBRARY", "OxcclError", "version", "register"]
__version__ = "0.1.0"


def register():
    """Registers the torch.distributed backend "oxccl" (imports torch)."""
    from .torch_backend import register as _register

    _register()
