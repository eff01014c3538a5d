"""oxccl from Python.

- ``torch.distributed.init_process_group("oxccl")`` (or ``"cpu:oxccl"``,
  ``"cpu:oxccl,cuda:nccl"``) uses oxccl for CPU tensors; the package's
  ``torch.distributed.backends`` entry point registers it, so no import is needed (torch
  2.11, which reads no such entry point, gets it registered by ``_autoload`` below).
- ``oxccl.version()`` is the C library's version (``major * 10000 + minor * 100 + patch``).

The C library is loaded on first use of ``LIBRARY``, ``OxcclError`` or ``version`` (or of the
backend), not by ``import oxccl``: torch imports this package on every ``import torch``.
"""

__all__ = ["LIBRARY", "OxcclError", "version", "register"]
__version__ = "0.1.0"


def __getattr__(name):
    if name in ("LIBRARY", "OxcclError", "version"):
        from . import _lib

        return getattr(_lib, name)
    raise AttributeError(f"module 'oxccl' has no attribute {name!r}")


def register():
    """Registers the torch.distributed backend "oxccl" (imports torch)."""
    from .torch_backend import register as _register

    _register()


def _autoload():
    """torch's ``torch.backends`` entry point, which ``import torch`` calls (torch 2.11 and
    2.15 alike). torch 2.15 finds the distributed backend by its own entry point when a group
    asks for it, so this does nothing there; torch 2.11 has no such lookup, so this registers
    the backend. It never raises: an error here would fail ``import torch`` itself."""
    import sys

    if "oxccl.torch_backend" in sys.modules:
        return  # being imported (it imported torch): it registers itself on torch 2.11
    try:
        import torch.distributed as dist

        if not dist.is_available() or hasattr(dist.Backend, "_ensure_backend_registered"):
            return
        from . import torch_backend  # noqa: F401 - registers the backend (torch 2.11)
    except Exception as e:  # noqa: BLE001 - see the docstring
        try:
            import logging

            logging.getLogger("oxccl").warning(
                "oxccl: not registered as a torch.distributed backend: %s", e
            )
        except Exception:  # noqa: BLE001, S110 - see the docstring
            pass
