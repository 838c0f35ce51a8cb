"""Pure data: frozen pydantic specs and the only loader of spec files."""

from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import list_hardware, list_models, load_hardware, load_model
from simulator.specs.model import DTYPE_BYTES, ModelSpec

__all__ = [
    "DTYPE_BYTES",
    "HardwareSpec",
    "ModelSpec",
    "list_hardware",
    "list_models",
    "load_hardware",
    "load_model",
]
