"""Generation: the KV-cached decode equals re-running the full forward, top-k/top-p equal a direct reference, the
end-of-text token stops it, and ``tensorslim generate`` continues a prompt from a real (3-step) training run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tensorslim.cli.main import main
from tensorslim.generation import filter_logits, generate, generate_ids
from tensorslim.models.registry import build_model

VOCAB = 300


def _tiny(name: str = "tiny") -> nn.Module:
    torch.manual_seed(0)
    model = build_model(name, vocab_size=VOCAB, max_seq_len=32)
    with torch.no_grad():
        model.lm_head.weight.mul_(50)  # confident logits: no near-ties for rounding to flip
    return model


def _greedy_without_cache(model: nn.Module, prompt: list[int], steps: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps):
            token = model(ids)[:, -1].argmax(-1, keepdim=True)  # the full forward, every step
            ids = torch.cat([ids, token], dim=1)
    return ids[0, len(prompt) :].tolist()


def test_greedy_with_the_kv_cache_equals_the_full_forward_each_step() -> None:
    model = _tiny()
    prompt = [5, 17, 203, 9]
    assert hasattr(model, "new_cache")
    assert generate_ids(model, prompt, max_new_tokens=20, greedy=True) == _greedy_without_cache(model, prompt, 20)


def test_gpt2_generates_without_a_cache() -> None:
    from tensorslim.models.gpt2 import GPT2Config, GPT2ForCausalLM

    torch.manual_seed(0)
    gpt2 = GPT2ForCausalLM(GPT2Config(d_model=32, n_layers=2, n_heads=4, d_ff=64, vocab_size=VOCAB, max_seq_len=40))
    prompt = [1, 2, 3]
    assert generate_ids(gpt2, prompt, max_new_tokens=10, greedy=True) == _greedy_without_cache(gpt2.eval(), prompt, 10)


def test_generation_stops_at_the_context_length() -> None:
    model = _tiny()
    assert model.config.max_seq_len == 256  # the preset's context; build_model never shortens it
    assert len(generate_ids(model, list(range(250)), max_new_tokens=64, greedy=True)) == 6
    with pytest.raises(ValueError, match="fewer than the context 256"):
        generate_ids(model, list(range(256)), greedy=True)


def _reference_keep(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> set[int]:
    """The tokens top-k then top-p keep, by the definitions: sort by probability, cut at k, renormalize, and keep
    tokens until the cumulative probability first reaches p."""
    order = sorted(range(len(logits)), key=lambda i: -float(logits[i]))
    kept = order[:top_k] if top_k is not None else order
    probs = torch.softmax(logits[kept].double(), dim=0).tolist()
    if top_p is None:
        return set(kept)
    total, nucleus = 0.0, []
    for token, p in zip(kept, probs, strict=True):
        nucleus.append(token)
        total += p
        if total >= top_p:
            break
    return set(nucleus)


@pytest.mark.parametrize("top_k", [None, 1, 3, 20, 50])
@pytest.mark.parametrize("top_p", [None, 0.05, 0.3, 0.8, 0.99])
def test_top_k_and_top_p_keep_what_the_reference_keeps(top_k: int | None, top_p: float | None) -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    filtered = filter_logits(logits, top_k=top_k, top_p=top_p)
    for row, kept in zip(logits, filtered, strict=True):
        assert {int(i) for i in torch.nonzero(torch.isfinite(kept))} == _reference_keep(row, top_k, top_p)
        assert torch.equal(kept[torch.isfinite(kept)], row[torch.isfinite(kept)])


def test_sampling_is_seeded_and_top_k_one_is_greedy() -> None:
    model = _tiny()
    prompt = [5, 17, 203, 9]
    greedy = generate_ids(model, prompt, max_new_tokens=8, greedy=True)
    assert generate_ids(model, prompt, max_new_tokens=8, top_k=1, seed=3) == greedy
    hot = {"max_new_tokens": 8, "temperature": 50.0}
    assert generate_ids(model, prompt, seed=1, **hot) == generate_ids(model, prompt, seed=1, **hot)
    assert generate_ids(model, prompt, seed=1, **hot) != generate_ids(model, prompt, seed=2, **hot)


class _Scripted(nn.Module):
    """A causal LM whose next token after ``t`` tokens is ``script[t]`` (one-hot logits)."""

    def __init__(self, script: list[int]) -> None:
        super().__init__()
        self.script = script
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*ids.shape, 10)
        for t in range(ids.shape[1]):
            logits[:, t, self.script[t + 1]] = 10.0
        return logits + self.anchor


class _Tokenizer:
    """A Hugging Face-like tokenizer over the digits, eos = 0."""

    eos_token_id = 0

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return [int(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(str(i) for i in ids)


def test_generation_stops_at_the_end_of_text_token() -> None:
    model = _Scripted([7, 3, 4, 0, 5, 6, 8, 9, 1])
    assert generate_ids(model, [7], max_new_tokens=6, greedy=True, eos_id=0) == [3, 4, 0]
    assert generate(model, _Tokenizer(), "7", greedy=True) == "34"
    assert generate(model, _Tokenizer(), "7", greedy=True, stop_at_eos=False, max_new_tokens=6) == "340568"


def test_invalid_settings_are_one_line_errors() -> None:
    model = _Scripted([1, 2, 3])
    for bad in ({"temperature": 0}, {"top_k": 0}, {"top_p": 1.5}, {"max_new_tokens": -1}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}="):
            generate_ids(model, [1], **bad)


def test_cli_continues_a_prompt_from_a_training_run(
    small_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorslim.cli.generate import load_run
    from tensorslim.train.config import TrainConfig
    from tensorslim.train.trainer import Trainer

    config = TrainConfig(
        preset="tiny",
        method="cola",
        steps=3,
        batch_size=2,
        seq_len=32,
        vocab_size=300,
        data=str(small_corpus),
        eval_every=3,
        eval_blocks=2,
        checkpoint_every=3,
        out_dir=str(tmp_path / "run"),
        progress=False,
        tensorboard=False,
    )
    trainer = Trainer(config)
    trainer.run()
    model, tokenizer = load_run(tmp_path / "run")
    trained = trainer.model.state_dict()
    assert trained.keys() == model.state_dict().keys()
    assert all(torch.equal(trained[k], v) for k, v in model.state_dict().items())
    expected = "def " + generate(trainer.model, tokenizer, "def ", max_new_tokens=6, greedy=True)
    assert (
        main(["generate", "--run", str(tmp_path / "run"), "--prompt", "def ", "--max-new-tokens", "6", "--greedy"]) == 0
    )
    assert capsys.readouterr().out == expected + "\n"
    assert main(["generate", "--run", str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    capsys.readouterr()
    # Bad settings fail before the run is read; a corrupt checkpoint is one line, not a traceback.
    assert main(["generate", "--run", str(tmp_path / "run"), "--temperature", "0", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tensorslim generate: error: temperature=0.0 is invalid; allowed: a number > 0"
    checkpoint = tmp_path / "run" / "checkpoints" / "step_0000003"
    (checkpoint / "model.safetensors").write_bytes(b"not safetensors")
    assert main(["generate", "--run", str(tmp_path / "run")]) == 2
    assert f"{checkpoint / 'model.safetensors'} is missing or corrupt" in capsys.readouterr().err
    (checkpoint / "state.json").unlink()
    assert main(["generate", "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {checkpoint} is corrupt or incomplete" in err and len(err.splitlines()) == 1
