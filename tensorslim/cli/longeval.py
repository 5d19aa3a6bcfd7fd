"""``tensorslim longeval``: read long documents through a model with a bounded attention memory.

Streaming perplexity (``--data stdlib`` or ``bbc-<topic>``) or multi-key needle recall (``--data needles``) of a
``tensorslim train --task longctx`` run (``--run DIR``), or of a freshly initialised model (``--preset``, for a smoke
test), with one memory (the flags below, from :class:`tensorslim.layers.memory.MemoryConfig`) or, with
``--compare``, with the baselines side by side at the same capacity: full attention, FIFO, StreamingLLM (FIFO +
sinks), H2O, LRA, LFA.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

NAME = "longeval"
HELP = "perplexity / needle recall on long documents with a bounded attention memory (--memory lra --capacity N)"
BASELINE_SINKS = 4  # StreamingLLM's 4 attention sinks (arXiv 2309.17453 §3.2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tensorslim.cli.flags import add_dataclass_arguments
    from tensorslim.layers.memory import MemoryConfig
    from tensorslim.tasks.longctx.evaluate import DATA

    source = parser.add_mutually_exclusive_group()
    source.add_argument("--run", dest="run_dir", metavar="DIR", help="a tensorslim train --task longctx run folder")
    source.add_argument("--preset", help="a freshly initialised LLaMA preset instead of a run (smoke test)")
    parser.add_argument("--data", default="stdlib", help=f"documents, one of {list(DATA)} (default: stdlib)")
    parser.add_argument("--length", type=int, default=512, help="tokens per document (default: 512)")
    parser.add_argument("--docs", type=int, default=8, help="documents read (default: 8)")
    parser.add_argument("--compare", action="store_true", help="also run every baseline at the same capacity")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace the --json file when it exists")
    memory = parser.add_argument_group("memory (tensorslim.layers.memory.MemoryConfig)")
    add_dataclass_arguments(memory, MemoryConfig)
    # --memory POLICY is an alias of --policy POLICY.
    memory.add_argument("--memory", dest="policy", default=argparse.SUPPRESS, help="same as --policy")


def _configs(config: object, *, length: int, compare: bool) -> list[object]:
    from tensorslim.tasks.longctx.evaluate import full_attention

    if not compare:
        return [config]
    sinks = min(BASELINE_SINKS, config.capacity // 4)
    replace = dataclasses.replace
    return [
        full_attention(length, chunk=config.chunk),
        replace(config, policy="fifo", sinks=0, recent=0),
        replace(config, policy="fifo", sinks=sinks, recent=0),
        replace(config, policy="h2o", sinks=sinks, recent=0),
        replace(config, policy="lra", sinks=sinks, recent=0),
        replace(config, policy="lfa", sinks=sinks, recent=0),
    ]


def run(args: argparse.Namespace) -> int:
    from tensorslim._checks import require_output
    from tensorslim.cli.flags import config_from_args
    from tensorslim.layers.memory import MemoryConfig, equip_memory_
    from tensorslim.models.registry import get_model
    from tensorslim.tasks.longctx.evaluate import DATA, documents, evaluate

    config = config_from_args(MemoryConfig, args)  # bad flags fail before anything is loaded
    for name in ("length", "docs"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}={getattr(args, name)} is invalid; allowed: an integer >= 1")
    if args.data not in DATA:
        raise ValueError(f"data={args.data!r} is unknown; allowed: {list(DATA)}")
    if args.json:
        require_output("json", args.json, folder=False, overwrite=args.overwrite)
    if args.preset and not hasattr(get_model(args.preset).config, "vocab_size"):  # e.g. a U-Net
        raise ValueError(f"preset={args.preset!r} reads no tokens; allowed: a language model preset such as 'tiny'")
    model, tokenizer = _load(args)
    equip_memory_(copy.deepcopy(model), config)  # a model we cannot equip fails before the documents are read
    docs = documents(args.data, tokenizer(), length=args.length, count=args.docs)
    rows = [evaluate(model, docs, c).row() for c in _configs(config, length=args.length, compare=args.compare)]
    _print(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _load(args: argparse.Namespace) -> tuple[object, Callable[[], object]]:
    """The model, and how to get its tokenizer: the run's, or for a fresh ``--preset`` (seed 0, vocabulary 4096)
    the 4096-token BPE of the documents, loaded only once the model is known to fit."""
    if args.run_dir:
        from tensorslim.cli.generate import load_run

        model, tokenizer = load_run(args.run_dir)
        return model, lambda: tokenizer
    import torch

    from tensorslim.data.longctx.documents import long_tokenizer
    from tensorslim.models.registry import build_model

    torch.manual_seed(0)
    return build_model(args.preset or "tiny", vocab_size=4096).eval(), long_tokenizer


def _print(rows: list[dict[str, object]]) -> None:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    print(" | ".join(keys))
    for row in rows:
        print(
            " | ".join(f"{row.get(k, ''):.4g}" if isinstance(row.get(k), float) else str(row.get(k, "")) for k in keys)
        )
