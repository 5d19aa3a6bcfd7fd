"""Model families and named models; importing this package registers them all (see :mod:`.registry`)."""

from tensorslim.models import bert, gpt2, hf_bert, llama, unet
from tensorslim.models.registry import (
    MODELS,
    TASKS,
    ModelFamily,
    ModelPreset,
    build_model,
    get_model,
    model_config,
    model_names,
    register_model,
    register_presets,
    resolve_task,
)

__all__ = [
    "MODELS",
    "TASKS",
    "ModelFamily",
    "ModelPreset",
    "bert",
    "build_model",
    "get_model",
    "gpt2",
    "hf_bert",
    "llama",
    "model_config",
    "model_names",
    "register_model",
    "register_presets",
    "resolve_task",
    "unet",
]
