"""The training run, as plain data. ``tensorslim train`` maps one flag onto each field."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tensorslim._checks import require_int
from tensorslim.methods import check_method
from tensorslim.models.llama import get_preset

_DTYPES = ("fp32", "bf16")
# Fields that may differ between an interrupted run and its resumption without changing the math.
RESUMABLE_CHANGES = frozenset({"resume", "progress", "eval_every", "checkpoint_every", "tensorboard", "tp", "tp_style"})


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that defines a training run (defaults: tiny CoLA on the built-in stdlib corpus)."""

    preset: str = field(default="tiny", metadata=_help("model size: tiny, 60m, 130m, 350m, 1b, 7b"))
    method: str = field(default="cola", metadata=_help("dense, cola, svd or galore"))
    steps: int = field(default=300, metadata=_help("optimizer steps"))
    batch_size: int = field(default=16, metadata=_help("sequences per micro-batch"))
    seq_len: int = field(default=128, metadata=_help("tokens per sequence"))
    grad_accum: int = field(default=1, metadata=_help("micro-batches per optimizer step"))
    lr: float | None = field(default=None, metadata=_help("peak learning rate (default: the preset's CoLA lr)"))
    weight_decay: float = field(default=0.01, metadata=_help("AdamW weight decay"))
    grad_clip: float = field(default=0.5, metadata=_help("max gradient norm, 0 disables clipping"))
    warmup_fraction: float | None = field(default=None, metadata=_help("warm-up share of steps (default: preset)"))
    min_lr_ratio: float = field(default=0.1, metadata=_help("cosine floor as a fraction of the peak lr"))
    dtype: str = field(default="fp32", metadata=_help("fp32, or bf16 autocast (slow on CPUs without AMX)"))
    seed: int = field(default=0, metadata=_help("seed of model init and data order"))
    data: str = field(default="stdlib", metadata=_help("stdlib, bbcnews, or a .txt/.jsonl file or folder"))
    tokenizer: str | None = field(default=None, metadata=_help("local Hugging Face tokenizer path (default: BPE)"))
    vocab_size: int | None = field(default=None, metadata=_help("BPE vocabulary size (default: the preset's)"))
    rank: int | None = field(default=None, metadata=_help("low-rank / GaLore rank (default: the preset's)"))
    galore_update_proj_gap: int = field(default=200, metadata=_help("GaLore: steps between SVDs"))
    galore_scale: float = field(default=0.25, metadata=_help("GaLore: update scale alpha"))
    eval_every: int = field(default=100, metadata=_help("steps between validation passes"))
    eval_blocks: int = field(default=64, metadata=_help("size of the fixed held-out set, in sequences"))
    checkpoint_every: int = field(default=100, metadata=_help("steps between checkpoints"))
    out_dir: str | None = field(default=None, metadata=_help("run folder (default: runs/<preset>-<method>)"))
    resume: bool = field(default=False, metadata=_help("continue from the run folder's latest checkpoint"))
    device: str = field(default="cpu", metadata=_help("cpu or cuda"))
    progress: bool = field(default=True, metadata=_help("show a progress bar"))
    tensorboard: bool = field(default=True, metadata=_help("also log to TensorBoard when it is installed"))
    # Tensor parallelism (tensorslim.distributed; launch with torchrun, one process per rank).
    tp: int = field(default=1, metadata=_help("tensor-parallel size; the rest of the world is data parallel"))
    tp_style: str = field(default="btp", metadata=_help("btp (BOOST), vanilla (low-rank TP) or megatron (dense)"))
    # CoMERA (arXiv 2405.14377): rank-adaptive stages of method "comera" (tensorslim.comera.train_hook).
    comera_target_ratio: float = field(default=0.5, metadata=_help("CoMERA: late-stage target size S*/S, in (0, 1]"))
    comera_late_fraction: float = field(default=0.5, metadata=_help("CoMERA: share of steps in the late stage"))
    comera_gamma: float = field(default=0.01, metadata=_help("CoMERA: weight of the rank penalty (early stage)"))
    comera_target_loss: float | None = field(
        default=None, metadata=_help("CoMERA: late-stage loss target L* (default: end-of-early-stage loss)")
    )

    def __post_init__(self) -> None:
        get_preset(self.preset)
        check_method(self.method)
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every", "eval_blocks", "checkpoint_every"):
            require_int(name, getattr(self, name))
        for name in ("vocab_size", "rank", "galore_update_proj_gap"):
            if getattr(self, name) is not None:
                require_int(name, getattr(self, name))
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr={self.lr} is invalid; allowed: a number > 0")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"weight_decay={self.weight_decay}, grad_clip={self.grad_clip}: allowed values are >= 0")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction={self.warmup_fraction} is invalid; allowed: [0, 1)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} is invalid; allowed: [0, 1]")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid; allowed: {list(_DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} is invalid; allowed: 'cpu' or 'cuda'")
        _check_comera(self)

    @property
    def run_dir(self) -> str:
        return self.out_dir or f"runs/{self.preset}-{self.method}"

    def peak_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        # GaLore's scripts use lr 0.01 (0.005 at 7B); every other method uses the preset's CoLA lr (§1.3).
        return 0.01 if self.method == "galore" else get_preset(self.preset).lr

    def differences(self, other: dict) -> list[str]:
        """Names of the fields that differ from a stored config, ignoring those that may change on resume."""
        return [
            f.name
            for f in fields(self)
            if f.name not in RESUMABLE_CHANGES and other.get(f.name) != getattr(self, f.name)
        ]


def _check_comera(config: TrainConfig) -> None:
    if not 0 < config.comera_target_ratio <= 1:
        raise ValueError(f"comera_target_ratio={config.comera_target_ratio} is invalid; allowed: (0, 1]")
    if not 0 <= config.comera_late_fraction < 1:
        raise ValueError(f"comera_late_fraction={config.comera_late_fraction} is invalid; allowed: [0, 1)")
    if not config.comera_gamma >= 0:
        raise ValueError(f"comera_gamma={config.comera_gamma} is invalid; allowed: a number >= 0")
    if config.comera_target_loss is not None and not config.comera_target_loss > 0:
        raise ValueError(f"comera_target_loss={config.comera_target_loss} is invalid; allowed: a number > 0")
