"""Own traceable model code for the supported families, and loading from HF checkpoints."""

from graphspec.models.decoder import DecoderLM
from graphspec.models.loading import LoadedModel, load_model
from graphspec.models.spec import FAMILIES, ModelSpec

__all__ = ["FAMILIES", "DecoderLM", "LoadedModel", "ModelSpec", "load_model"]
