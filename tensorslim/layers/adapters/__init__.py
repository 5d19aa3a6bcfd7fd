"""Parameter-efficient fine-tuning on a frozen model: gated LoRA, gated prefix tuning, gated bottleneck adapters,
prompt tuning, and their combinations UniPELT (arXiv 2110.07577) and UniPELT + prompt (arXiv 2405.05493)."""

from tensorslim.layers.adapters.config import (
    BottleneckConfig,
    GatedLoRAConfig,
    PELTConfig,
    PrefixConfig,
    PromptConfig,
    unipelt,
)
from tensorslim.layers.adapters.equip import (
    adapter_state_dict,
    equip_,
    gate_values,
    load_adapters,
    merge_lora_,
    save_adapters,
    trainable_parameters,
)

__all__ = [
    "BottleneckConfig",
    "GatedLoRAConfig",
    "PELTConfig",
    "PrefixConfig",
    "PromptConfig",
    "adapter_state_dict",
    "equip_",
    "gate_values",
    "load_adapters",
    "merge_lora_",
    "save_adapters",
    "trainable_parameters",
    "unipelt",
]
