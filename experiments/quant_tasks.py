"""Labelled tasks before/after post-training quantization (RTN / GPTQ / COMQ at W4 and W3), through ``quantize_``.

Tasks:
    digits: a small CNN (2 Conv2d + 2 Linear) trained on scikit-learn's bundled ``load_digits`` (exercises Conv2d
        via unfold); test accuracy and agreement with the float model. The classifier head stays float (default).
    bbc: BBC News topic classification (``bbcnews_split`` fixed split) with the bundled MiniLM as a *frozen*
        encoder (mean-pooled) and a logistic-regression head trained on float features; the encoder's linear
        layers are quantized and the head is kept.
    bbc-finetune: the fine-tuning protocol: the whole MiniLM + a linear head on the mean-pooled output fine-tuned on the
        ``bbcnews_split`` train articles (seq 128, batch 16, AdamW, default 1 epoch), then the encoder's linear
        layers are quantized (calibration on train articles) and the float head is kept; test accuracy.
    llama: our tiny LLaMA from a ``tensorslim train`` checkpoint: validation perplexity (lm_head stays float).

Usage:
    .venv/bin/python experiments/quant_tasks.py --task digits --out /tmp/quant_digits.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import sys
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
from torch import nn

from tensorslim.quant import COMQConfig, GPTQConfig, RTNConfig, quantize_

CONFIGS = {
    "rtn": lambda b: RTNConfig(bits=b),
    "gptq": lambda b: GPTQConfig(bits=b),
    "comq-greedy1-release": lambda b: COMQConfig(init="float", order="greedy", bits=b, update_scale=False),
    "comq-greedy3": lambda b: COMQConfig(init="float", order="greedy", bits=b, sweeps=3),
}


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.fc = nn.Linear(32 * 4 * 4, 64)
        self.classifier = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 1, 8, 8) -> (B, 10)
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.classifier(F.relu(self.fc(x.flatten(1))))


def digits_task(bits_list: list[int], methods: list[str]) -> list[dict]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x / 16.0, y, test_size=0.25, random_state=0, stratify=y)
    x_tr, x_te = (torch.tensor(a, dtype=torch.float32).view(-1, 1, 8, 8) for a in (x_tr, x_te))
    y_tr, y_te = torch.tensor(y_tr), torch.tensor(y_te)
    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(40):
        for idx in torch.randperm(len(x_tr)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        float_pred = model(x_te).argmax(1)
    rows = [{"task": "digits", "method": "float", "bits": 32, "acc": float((float_pred == y_te).float().mean())}]
    calibration = list(x_tr[:512].split(64))
    for bits in bits_list:
        for method in methods:
            q = copy.deepcopy(model)
            report = quantize_(q, CONFIGS[method](bits), calibration)
            with torch.no_grad():
                pred = q(x_te).argmax(1)
            rows.append(
                {
                    "task": "digits",
                    "method": method,
                    "bits": bits,
                    "acc": float((pred == y_te).float().mean()),
                    "agree_float": float((pred == float_pred).float().mean()),
                    "layer_err": {r.name: r.rel_output_error for r in report.layers},
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _minilm_features(model: nn.Module, batches: list[dict]) -> torch.Tensor:
    outs = []
    with torch.no_grad():
        for batch in batches:
            hidden = model(**batch).last_hidden_state  # (B, T, 384)
            mask = batch["attention_mask"][..., None].to(hidden.dtype)
            outs.append((hidden * mask).sum(1) / mask.sum(1))
    return torch.cat(outs)


def bbc_task(bits_list: list[int], methods: list[str], *, seq_len: int, calib_docs: int) -> list[dict]:
    from sklearn.linear_model import LogisticRegression
    from transformers import AutoTokenizer, BertModel

    from tensorslim.data import bbcnews_labelled, bbcnews_split
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder

    texts, labels, _ = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    folder = model_folder("minilm")
    tok = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder).eval()
    train_b = calibration_batches(tok, [texts[i] for i in train_idx], seq_len=seq_len, batch_size=32)
    test_b = calibration_batches(tok, [texts[i] for i in test_idx], seq_len=seq_len, batch_size=32)
    y_tr, y_te = [labels[i] for i in train_idx], torch.tensor([labels[i] for i in test_idx])
    head = LogisticRegression(max_iter=2000, C=10.0).fit(_minilm_features(model, train_b).numpy(), y_tr)
    float_pred = torch.tensor(head.predict(_minilm_features(model, test_b).numpy()))
    rows = [{"task": "bbc", "method": "float", "bits": 32, "acc": float((float_pred == y_te).float().mean())}]
    print(json.dumps(rows[-1]), flush=True)
    calibration = calibration_batches(
        tok, [texts[i] for i in train_idx[:: max(1, len(train_idx) // calib_docs)]], seq_len=seq_len
    )
    no_pooler = lambda m, n: isinstance(m, nn.Linear) and "pooler" not in n  # noqa: E731 - pooler unused
    for bits in bits_list:
        for method in methods:
            q = copy.deepcopy(model)
            report = quantize_(q, CONFIGS[method](bits), calibration, filter_fn=no_pooler)
            pred = torch.tensor(head.predict(_minilm_features(q, test_b).numpy()))
            errs = [r.rel_output_error for r in report.layers]
            rows.append(
                {
                    "task": "bbc",
                    "method": method,
                    "bits": bits,
                    "acc": float((pred == y_te).float().mean()),
                    "agree_float": float((pred == float_pred).float().mean()),
                    "mean_layer_err_calib": sum(errs) / len(errs),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bbc_finetune_task(
    bits_list: list[int], methods: list[str], *, seq_len: int, calib_docs: int, steps: int | None, lr: float
) -> list[dict]:
    """Fine-tune the whole MiniLM + a linear head (mean-pooled) on the BBC train split, then quantize the encoder."""
    import time

    from transformers import AutoTokenizer, BertModel

    from tensorslim.data import bbcnews_labelled, bbcnews_split
    from tensorslim.quant.hf_inputs import calibration_batches, model_folder

    texts, labels, class_names = bbcnews_labelled()
    train_idx, test_idx = bbcnews_split()
    folder = model_folder("minilm")
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    model = BertModel.from_pretrained(folder)
    head = nn.Linear(model.config.hidden_size, len(class_names))
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=lr)
    order = [train_idx[i] for i in torch.randperm(len(train_idx)).tolist()]
    batches = [order[i : i + 16] for i in range(0, len(order), 16)]
    steps = len(batches) if steps is None else steps
    model.train()
    t0, losses = time.perf_counter(), []
    for step in range(steps):
        idx = batches[step % len(batches)]
        enc = dict(tok([texts[i] for i in idx], truncation=True, max_length=seq_len, padding=True, return_tensors="pt"))
        hidden = model(**enc).last_hidden_state
        mask = enc["attention_mask"][..., None].to(hidden.dtype)
        loss = F.cross_entropy(head((hidden * mask).sum(1) / mask.sum(1)), torch.tensor([labels[i] for i in idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step + 1}/{steps} loss {losses[-1]:.4f} {time.perf_counter() - t0:.0f}s", flush=True)
    train_seconds = time.perf_counter() - t0
    model.eval()
    head.eval()
    test_b = calibration_batches(tok, [texts[i] for i in test_idx], seq_len=seq_len, batch_size=32)
    y_te = torch.tensor([labels[i] for i in test_idx])

    def predict(encoder: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return head(_minilm_features(encoder, test_b)).argmax(1)

    float_pred = predict(model)
    rows = [
        {
            "task": "bbc-finetune",
            "method": "float",
            "bits": 32,
            "acc": float((float_pred == y_te).float().mean()),
            "train_steps": steps,
            "train_seconds": train_seconds,
            "train_loss_last10": sum(losses[-10:]) / len(losses[-10:]),
        }
    ]
    print(json.dumps(rows[-1]), flush=True)
    calibration = calibration_batches(
        tok, [texts[i] for i in train_idx[:: max(1, len(train_idx) // calib_docs)]], seq_len=seq_len
    )
    no_pooler = lambda m, n: isinstance(m, nn.Linear) and "pooler" not in n  # noqa: E731 - pooler unused
    for bits in bits_list:
        for method in methods:
            q = copy.deepcopy(model)
            report = quantize_(q, CONFIGS[method](bits), calibration, filter_fn=no_pooler)
            pred = predict(q)
            errs = [r.rel_output_error for r in report.layers]
            rows.append(
                {
                    "task": "bbc-finetune",
                    "method": method,
                    "bits": bits,
                    "acc": float((pred == y_te).float().mean()),
                    "agree_float": float((pred == float_pred).float().mean()),
                    "mean_layer_err_calib": sum(errs) / len(errs),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def llama_task(
    bits_list: list[int],
    methods: list[str],
    *,
    checkpoint: str,
    data: str,
    seq_len: int,
    calib_blocks: int,
    eval_blocks: int,
) -> list[dict]:
    from safetensors.torch import load_file

    from tensorslim.data import build_lm_data
    from tensorslim.models.registry import build_model, get_model
    from tensorslim.tasks.base import TaskData
    from tensorslim.tasks.lm import CausalLM

    def evaluate(model: torch.nn.Module, blocks: torch.Tensor, *, batch_size: int) -> float:
        data = TaskData(train=None, validation=blocks)
        return CausalLM().evaluate(model, data, batch_size=batch_size, autocast=contextlib.nullcontext)["val_loss"]

    vocab = get_model("tiny").config.vocab_size
    lm = build_lm_data(data, tokenizer=None, vocab_size=vocab, seq_len=seq_len, max_val_blocks=eval_blocks)
    model = build_model("tiny", vocab_size=lm.tokenizer.vocab_size, max_seq_len=seq_len)
    model.load_state_dict(load_file(checkpoint))
    model.eval()
    val = lm.validation[:eval_blocks]
    base = evaluate(model, val, batch_size=16)
    rows = [
        {"task": "llama", "method": "float", "bits": 32, "val_loss": base, "ppl": float(torch.exp(torch.tensor(base)))}
    ]
    print(json.dumps(rows[-1]), flush=True)
    calibration = list(lm.train[:calib_blocks].split(16))
    for bits in bits_list:
        for method in methods:
            q = copy.deepcopy(model)
            report = quantize_(q, CONFIGS[method](bits), calibration)
            loss = evaluate(q, val, batch_size=16)
            errs = [r.rel_output_error for r in report.layers]
            rows.append(
                {
                    "task": "llama",
                    "method": method,
                    "bits": bits,
                    "val_loss": loss,
                    "ppl": float(torch.exp(torch.tensor(loss))),
                    "layers": len(errs),
                    "mean_layer_err_calib": sum(errs) / len(errs),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=["digits", "bbc", "bbc-finetune", "llama"], required=True)
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 3])
    parser.add_argument("--methods", nargs="+", default=list(CONFIGS))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--calib-docs", type=int, default=128)
    parser.add_argument("--checkpoint", default=None, help="llama: model.safetensors of a tiny dense run")
    parser.add_argument("--data", default="stdlib")
    parser.add_argument("--eval-blocks", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ft-steps", type=int, default=None, help="bbc-finetune: optimizer steps (default 1 epoch)")
    parser.add_argument("--ft-lr", type=float, default=5e-5, help="bbc-finetune: AdamW learning rate")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.task == "digits":
        rows = digits_task(args.bits, args.methods)
    elif args.task == "bbc":
        rows = bbc_task(args.bits, args.methods, seq_len=args.seq_len, calib_docs=args.calib_docs)
    elif args.task == "bbc-finetune":
        rows = bbc_finetune_task(
            args.bits,
            args.methods,
            seq_len=args.seq_len,
            calib_docs=args.calib_docs,
            steps=args.ft_steps,
            lr=args.ft_lr,
        )
    else:
        rows = llama_task(
            args.bits,
            args.methods,
            checkpoint=args.checkpoint,
            data=args.data,
            seq_len=args.seq_len,
            calib_blocks=args.calib_docs,
            eval_blocks=args.eval_blocks,
        )
    meta = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}, torch {torch.__version__}, threads {args.threads}",
        "loadavg_at_end": list(os.getloadavg()),
    }
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
