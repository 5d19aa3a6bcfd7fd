"""``tensorslim predict``: the predictions of a trained run for raw inputs (see :mod:`tensorslim.predict`).

classify, lookahead: texts (arguments, ``--file`` lines, or stdin lines) → one JSON line each with the label and every
label's probability; mlm: texts holding ``[MASK]`` → one JSON line each with the filled text; lm, longctx, readlm: a
prompt → its continuation (as ``tensorslim generate``); longqa: documents (one per line) and ``--question`` → one JSON
line each with the answer; distill: texts → one JSON line each with the student's sentence embedding; segment: image
files → ``<name>_mask.png`` and ``<name>_overlay.png`` in ``--out`` (a new or empty folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

HELP = (
    "predict with a trained run: labels (classify, lookahead), filled masks (mlm), continuations (lm), answers "
    "(longqa), embeddings (distill), masks (segment)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", dest="run_dir", required=True, metavar="DIR", help="run folder, model/ or checkpoint")
    parser.add_argument("inputs", nargs="*", help="texts, a prompt (lm), documents (longqa) or image files (segment)")
    parser.add_argument("--file", help="read the texts from this file, one per line ('-': stdin)")
    parser.add_argument("--question", help="longqa: the question asked about each document")
    parser.add_argument(
        "--out", help="segment: a new or empty folder for the mask and overlay PNGs (default: predictions)"
    )
    parser.add_argument("--overwrite", action="store_true", help="segment: write into an --out folder that holds files")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="lm: tokens to generate at most (default: 64)")
    parser.add_argument("--greedy", action="store_true", help="lm: take the most likely token at each step")
    parser.add_argument("--temperature", type=float, default=1.0, help="lm: divides the logits (default: 1.0)")
    parser.add_argument("--seed", type=int, default=0, help="lm: sampling seed (default: 0)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")


def _texts(args: argparse.Namespace) -> list[str]:
    if args.file == "-" or (args.file is None and not args.inputs):
        lines = sys.stdin.read().splitlines()
    elif args.file is not None:
        lines = Path(args.file).read_text().splitlines()
    else:
        lines = list(args.inputs)
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise ValueError("no input text; allowed: texts as arguments, --file FILE, or lines on stdin")
    return texts


def _read_image(path: str) -> object:
    """A grey image in [0, 1] (an RGB file's channels averaged)."""
    import matplotlib.image
    import numpy as np

    image = np.asarray(matplotlib.image.imread(path), dtype=np.float32)
    if image.ndim == 3:
        image = image[..., :3].mean(axis=-1)
    return image / 255.0 if image.max() > 1.0 else image


def _segment(predictor: object, args: argparse.Namespace) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    from tensorslim._checks import require_output

    if not args.inputs:
        raise ValueError("no image files; allowed: one or more image files as arguments")
    out = Path(args.out or "predictions")
    require_output("out", out, folder=True, overwrite=args.overwrite)
    images = [_read_image(path) for path in args.inputs]
    masks = predictor.segment(images).numpy()
    out.mkdir(parents=True, exist_ok=True)
    for path, image, mask in zip(args.inputs, images, masks, strict=True):
        stem = Path(path).stem
        plt.imsave(out / f"{stem}_mask.png", mask.astype(np.uint8) * 255, cmap="gray", vmin=0, vmax=255)
        overlay = np.repeat(image[..., None], 3, axis=-1)
        overlay[mask] = 0.5 * overlay[mask] + 0.5 * np.array([1.0, 0.0, 0.0])
        plt.imsave(out / f"{stem}_overlay.png", np.clip(overlay, 0, 1))
        print(json.dumps({"image": path, "foreground_pixels": int(mask.sum()), "mask": str(out / f"{stem}_mask.png")}))


def run(args: argparse.Namespace) -> int:
    from tensorslim.generation import check_sampling
    from tensorslim.predict import CLASSIFY_TASKS, LM_TASKS, predictor

    check_sampling(args.max_new_tokens, args.temperature, None, None)
    model = predictor(args.run_dir, device=args.device)
    if model.task == "segment":
        _segment(model, args)
    elif model.task in CLASSIFY_TASKS:
        _print_rows(model.classify(_texts(args)))
    elif model.task == "mlm":
        _print_rows(model.fill_mask(_texts(args)))
    elif model.task in LM_TASKS:
        prompt = " ".join(_texts(args))
        sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed}
        print(prompt + model.generate(prompt, greedy=args.greedy, **sampling))
    elif model.task == "longqa":
        if not args.question:
            raise ValueError("a longqa run answers a question; allowed: --question 'what is the code word of John?'")
        _print_rows(model.answer(_texts(args), args.question))
    elif model.task == "distill":
        texts = _texts(args)
        rows = zip(texts, model.embed(texts).tolist(), strict=True)
        _print_rows({"text": text, "embedding": [round(x, 6) for x in row]} for text, row in rows)
    else:
        allowed = [*CLASSIFY_TASKS, "mlm", *LM_TASKS, "longqa", "distill", "segment"]
        raise ValueError(f"run {args.run_dir!r} trained task={model.task!r}; allowed: {allowed}")
    return 0


def _print_rows(rows: Iterable[dict]) -> None:
    for row in rows:
        print(json.dumps(row))
