"""The training run, as plain data. ``tensorslim train`` maps one flag onto each field (and onto each field of the
chosen method's options)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from tensorslim._checks import check_fields, require_int
from tensorslim.distributed.layout import ParallelSetup
from tensorslim.distributed.parallelize import OVERLAPS, STYLES
from tensorslim.methods import get_method, method_options
from tensorslim.methods.recipes import recipe_for
from tensorslim.methods.vocab import check_vocabulary_choice
from tensorslim.models.registry import MODELS, get_model, resolve_task
from tensorslim.options import option, resolve_options
from tensorslim.tasks import get_task
from tensorslim.train.execution import DTYPES
from tensorslim.train.optim import STATE_DTYPES, galore_projection_rank
from tensorslim.train.schedule import LRSchedule

# Seeds go to torch generators (64-bit) as ``seed + epoch`` and ``seed + 1``: below 2**63 they never overflow.
MAX_SEED = 2**63 - 1

# Fields that may differ between an interrupted run and its resumption without changing the math. ``out_dir`` is
# where the checkpoint was found, so naming it (or leaving the default that names the same folder) changes nothing.
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "overwrite",
        "progress",
        "eval_every",
        "checkpoint_every",
        "tensorboard",
        "tp",
        "tp_style",
        "dp_shard",
        "tp_overlap",
        "out_dir",
        "cuda_graphs",
        "compile",
        "keep_freed_memory",
    }
)


def check_preset(name: str) -> None:
    """A one-line error naming ``--preset`` for a model that is not registered."""
    if name not in MODELS:
        raise ValueError(f"preset={name!r} is unknown; allowed: {list(MODELS)}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that defines a training run (defaults: tiny CoLA on the built-in stdlib corpus).

    ``options`` holds the method's own settings (e.g. :class:`tensorslim.methods.comera.CoMERAOptions`) and
    ``task_options`` the task's; None takes their defaults.
    """

    preset: str = option("tiny", "registered model (listed above)")
    task: str | None = option(None, "a task listed above (default: the model's first task)")
    method: str = option("cola", "training method (listed above)")
    options: Any = option(None, "the method's options")
    factor_vocab: int = option(0, "rank of a factored LM head (LLaMA; beyond the papers), 0 keeps it dense")
    factor_embedding: bool = option(
        False, "also factor the token embedding at --factor-vocab's rank (fewer parameters, no faster step)"
    )
    task_options: Any = option(None, "the task's options")
    steps: int = option(300, "optimizer steps")
    batch_size: int = option(16, "sequences per micro-batch")
    seq_len: int = option(128, "tokens per sequence")
    grad_accum: int = option(1, "micro-batches per optimizer step")
    lr: float | None = option(None, "peak learning rate (default: the method's recipe)")
    weight_decay: float = option(0.01, "AdamW weight decay")
    optimizer_state: str = option(
        "fp32", "dtype of AdamW's moments: fp32, or bf16 (half the optimizer memory, slower on CPU; beyond the papers)"
    )
    grad_clip: float = option(0.5, "max gradient norm, 0 disables clipping")
    warmup_fraction: float | None = option(None, "warm-up share of steps (default: recipe)")
    min_lr_ratio: float = option(0.1, "cosine floor as a fraction of the peak lr")
    dtype: str = option(
        "fp32", "fp32, bf16 autocast (slow on CPUs without AVX-512 BF16), or auto: bf16 where the hardware has it"
    )
    compile: bool = option(False, "torch.compile the model (compile time reported apart)")
    keep_freed_memory: bool = option(
        True, "CPU: keep freed memory in the process (no page faults each step; holds the peak until exit)"
    )
    seed: int = option(0, "seed of model init and data order")
    data: str = option(
        "stdlib", "stdlib, bbcnews, a .txt/.jsonl file or folder, a datasets save_to_disk folder, or parquet"
    )
    text_field: str = option("text", "text column of a datasets/parquet table, or field of a .jsonl")
    tokenizer: str | None = option(None, "local Hugging Face tokenizer path (default: BPE)")
    vocab_size: int | None = option(None, "BPE vocabulary size (default: the model's)")
    eval_every: int = option(100, "steps between validation passes")
    eval_blocks: int = option(64, "size of the fixed held-out set, in sequences")
    checkpoint_every: int = option(100, "steps between checkpoints")
    init: str | None = option(
        None,
        "start from a folder of the same model written by save_pretrained / `tensorslim convert --save` "
        "(default: none)",
    )
    init_base: str | None = option(
        None,
        "start the model from another run of the same preset before the method converts it (e.g. an MLM run's "
        "encoder under adapters): its run folder or checkpoint; every weight it has under the same name is loaded, "
        "a new head keeps its init (default: none)",
    )
    out_dir: str | None = option(None, "run folder (default: runs/<preset>-<method>)")
    resume: bool = option(False, "continue from the run folder's latest checkpoint")
    overwrite: bool = option(
        False, "replace the run in a non-empty out_dir (its checkpoints, metrics, summary and model)"
    )
    device: str = option("cpu", "cpu or cuda")
    cuda_graphs: bool = option(
        False, "capture each step in a CUDA graph (device cuda, one process, grad_accum 1, no method hook)"
    )
    progress: bool = option(True, "show a progress bar")
    tensorboard: bool = option(True, "also log to TensorBoard when it is installed")
    # Tensor parallelism (tensorslim.distributed; launch with torchrun, one process per rank).
    tp: int = option(1, "tensor-parallel size; the rest of the world is data parallel")
    tp_style: str = option("btp", "btp (BOOST), vanilla (low-rank TP) or megatron (dense)")
    dp_shard: int = option(1, "FSDP2 over the data-parallel axis: its size (world / tp); 1 keeps DDP")
    tp_overlap: str = option(
        "none", "btp: overlap latent all-reduces with computation: none, backward or full (docs/scale_out.md)"
    )

    def __post_init__(self) -> None:
        check_fields(self)  # types first: a bool, a text or a non-finite number is named before any range check
        check_preset(self.preset)
        # The preset's recipe, looked up once: the learning rate, warm-up and GaLore rank defaults below read it.
        object.__setattr__(self, "_recipe", recipe_for(self.preset))
        get_method(self.method)
        if self.init and self.init_base:
            raise ValueError(
                f"init={self.init!r} and init_base={self.init_base!r} are both set; allowed: one start (init: the "
                "same model, init_base: its weights before the method converts it)"
            )
        object.__setattr__(self, "options", method_options(self.method, self.options))
        if self.task is None:
            object.__setattr__(self, "task", resolve_task(self.preset))
        resolve_task(self.preset, self.model_task)
        task_kind = get_task(self.task).options
        object.__setattr__(
            self, "task_options", resolve_options(task_kind, self.task_options, owner=f"task {self.task!r}")
        )
        for name in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every", "eval_blocks", "checkpoint_every"):
            require_int(name, getattr(self, name))
        if self.vocab_size is not None:
            require_int("vocab_size", self.vocab_size)
        require_int("factor_vocab", self.factor_vocab, minimum=0)
        check_vocabulary_choice(self.factor_vocab, self.factor_embedding)
        require_int("tp", self.tp)
        require_int("seed", self.seed, minimum=0)  # numpy's generators (segment, reading tasks) take no negatives
        if self.seed > MAX_SEED:
            raise ValueError(f"seed={self.seed} is invalid; allowed: an integer in [0, {MAX_SEED}]")
        require_int("dp_shard", self.dp_shard)
        if self.tp_style not in STYLES:
            raise ValueError(f"tp_style={self.tp_style!r} is unknown; allowed: {list(STYLES)}")
        if self.tp_overlap not in OVERLAPS:
            raise ValueError(f"tp_overlap={self.tp_overlap!r} is unknown; allowed: {list(OVERLAPS)}")
        if self.lr is not None and not 0 < self.lr < math.inf:
            raise ValueError(f"lr={self.lr} is invalid; allowed: a finite number > 0")
        # One process's tokens per update; a data-parallel run updates on more, so its recipe rate errs low.
        tokens_per_step = self.batch_size * self.seq_len * self.grad_accum
        object.__setattr__(self, "_recipe_lr", self._recipe.lr_at(tokens_per_step))
        for name in ("weight_decay", "grad_clip"):  # ``not >=`` also rejects nan
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)} is invalid; allowed: a number >= 0")
        if self.warmup_fraction is not None and not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction={self.warmup_fraction} is invalid; allowed: [0, 1)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} is invalid; allowed: [0, 1]")
        if self.optimizer_state not in STATE_DTYPES:
            raise ValueError(f"optimizer_state={self.optimizer_state!r} is invalid; allowed: {list(STATE_DTYPES)}")
        method = get_method(self.method)
        if self.optimizer_state != "fp32" and (self.cuda_graphs or method.optimizer != "adamw" or method.hook):
            raise ValueError(
                f"optimizer_state={self.optimizer_state!r} needs the training loop's own AdamW; allowed: 'fp32' with "
                "GaLore, a method that builds its own optimizer (CoMERA) or --cuda-graphs"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid; allowed: {list(DTYPES)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r} is invalid; allowed: 'cpu' or 'cuda'")

    @property
    def model_task(self) -> str:
        """The head the model is built with: the task's own, or the one it names (``distill`` builds ``embed``)."""
        return get_task(self.task).model_task or self.task

    @property
    def model_family(self) -> str:
        """The family of the preset's model (``llama``, ``bert``, ``gpt2`` ...)."""
        return get_model(self.preset).family.name

    def model_spec(self) -> dict[str, Any]:
        """The run's model as :func:`tensorslim.methods.build_for_method` builds it (preset, method, head, the
        method's options, a factored vocabulary), for every place that builds or counts it."""
        return {
            "model_name": self.preset,
            "method": self.method,
            "task": self.model_task,
            "options": self.options,
            "factor_vocab": self.factor_vocab,
            "factor_embedding": self.factor_embedding,
        }

    def parallel_setup(self) -> ParallelSetup:
        """What the run's parallel layout needs of it (:func:`tensorslim.distributed.layout.parallel_layout`)."""
        return ParallelSetup(
            tp=self.tp,
            tp_style=self.tp_style,
            tp_overlap=self.tp_overlap,
            dp_shard=self.dp_shard,
            batch_size=self.batch_size,
            method=self.method,
            task=self.task,
            preset=self.preset,
            family=self.model_family,
            device=self.device,
            dtype=self.dtype,
        )

    def optimizer_settings(self) -> dict[str, Any]:
        """The run's own optimizer as :func:`tensorslim.train.optim.build_optimizer` builds it: AdamW, or GaLore-AdamW
        with the method's projection settings (rank by default the model's CoLA rank, else 128)."""
        settings = {"lr": self.peak_lr(), "weight_decay": self.weight_decay, "state_dtype": self.optimizer_state}
        if get_method(self.method).optimizer == "galore":
            settings.update(
                galore_rank=galore_projection_rank(self._recipe.cola_rank, rank=self.options.rank),
                galore_update_proj_gap=self.options.update_proj_gap,
                galore_scale=self.options.scale,
            )
        return settings

    @property
    def run_dir(self) -> str:
        if self.out_dir:
            return self.out_dir
        default_task = get_model(self.preset).tasks[0]
        middle = "" if self.task == default_task else f"-{self.task}"
        return f"runs/{self.preset}{middle}-{self.method}"

    def peak_lr(self) -> float:
        """The given lr, else the method's own (GaLore: 0.01), else the model's recipe (CoLA's lr per size) at this
        run's tokens per update (:meth:`Recipe.lr_at`)."""
        return self.lr or get_method(self.method).lr or self._recipe_lr

    def warmup(self) -> float:
        return self.warmup_fraction if self.warmup_fraction is not None else self._recipe.warmup_fraction

    def lr_schedule(self) -> LRSchedule:
        """The run's learning rate: warm-up over :meth:`warmup` of the steps to :meth:`peak_lr`, then cosine down to
        ``min_lr_ratio`` of it."""
        return LRSchedule(
            peak_lr=self.peak_lr(),
            total_steps=self.steps,
            warmup_steps=round(self.steps * self.warmup()),
            min_ratio=self.min_lr_ratio,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the options as a nested dict)."""
        return dataclasses.asdict(self)

    def differences(self, other: dict) -> list[str]:
        """Names of the fields that differ from a stored config, ignoring those that may change on resume."""
        mine = self.to_dict()
        return [name for name, value in mine.items() if name not in RESUMABLE_CHANGES and other.get(name) != value]
