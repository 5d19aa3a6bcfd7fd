"""Bounded attention memory: eviction order, exactness against full attention, RoPE positions after eviction,
decoding with eviction, wait-to-attend, bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers
from torch import nn

from tensorslim.layers.memory import MemoryConfig, equip_memory_, memory_stores
from tensorslim.layers.memory.equip import LlamaMemoryAttention
from tensorslim.layers.memory.policies import initial_stat, keep_indices, observe
from tensorslim.models.llama import Attention, LlamaConfig, LlamaForCausalLM, apply_rotary, rotary_cos_sin
from tensorslim.tasks.longctx.streaming import generate, stream_logits, stream_nll

# --- eviction order on hand-made attention maps -------------------------------------------------------------------


def reference_keep(score: list[float], positions: list[int], *, capacity: int, protected: set[int]) -> list[int]:
    """Plain-Python ranking: protected first, then score, then the newest position."""
    order = sorted(range(len(score)), key=lambda j: (j in protected, score[j], positions[j]), reverse=True)
    return sorted(order[:capacity])


def run_policy(policy: str, maps: list[torch.Tensor], *, tau: float = 0.1) -> torch.Tensor:
    """Entry statistic after the given attention maps ``(Q, N)``, one per step, over N entries inserted at step 0."""
    n = maps[0].shape[-1]
    stat = initial_stat(policy, (1, 1, n), step=0, device=torch.device("cpu"))
    for step, probs in enumerate(maps, start=1):
        stat = observe(policy, stat, probs[None, None], step=step, tau=tau)
    return stat


# Six entries; step 1 attends entries 1 and 4, step 2 attends 4 (twice) and 2, step 3 attends 0 weakly and 2.
MAPS = [
    torch.tensor([[0.0, 0.6, 0.0, 0.0, 0.4, 0.0], [0.0, 0.5, 0.0, 0.0, 0.5, 0.0]]),
    torch.tensor([[0.0, 0.0, 0.3, 0.0, 0.7, 0.0], [0.0, 0.0, 0.0, 0.05, 0.95, 0.0]]),
    torch.tensor([[0.05, 0.0, 0.95, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]),
]


@pytest.mark.parametrize(
    ("policy", "sinks", "recent", "expected"),
    [
        ("fifo", 0, 0, [3, 4, 5]),  # the newest
        ("fifo", 1, 0, [0, 4, 5]),  # StreamingLLM: sink + newest
        ("lra", 0, 0, [1, 2, 4]),  # last attended at steps 1 (entry 1), 3 (2), 2 (4); entry 0's 0.05 < tau
        ("lfa", 0, 0, [1, 2, 4]),  # hit counts 0, 2, 3, 0, 4, 0
        ("lfa", 0, 1, [2, 4, 5]),  # the newest is protected: entry 1 (2 hits) goes before 2 (3 hits)
        ("h2o", 0, 1, [2, 4, 5]),  # masses 0.05, 1.1, 2.25, 0.05, 2.55, 0 with the newest protected
    ],
)
def test_eviction_order_on_hand_made_maps(policy: str, sinks: int, recent: int, expected: list[int]) -> None:
    stat = run_policy(policy, MAPS)
    positions = torch.arange(6)[None, None]
    kept = keep_indices(policy, stat, positions, capacity=3, sinks=sinks, recent=recent)[0, 0].tolist()
    assert kept == expected
    score = positions[0, 0].float().tolist() if policy == "fifo" else stat[0, 0].tolist()
    protected = {j for j in range(6) if j < sinks or j > 5 - recent}
    assert kept == reference_keep(score, list(range(6)), capacity=3, protected=protected)


def test_lra_without_insert_keeps_an_entry_attended_once_over_newer_unattended_ones() -> None:
    """Entries 0-1 inserted at step 0, entry 1 attended (0.9) at step 1, entries 2-5 inserted at steps 2-3 and never
    attended. Counting insertion as attention keeps the newest (FIFO); counting attention only keeps entry 1."""
    probs = torch.tensor([[0.05, 0.9]])[None, None]  # (1, 1, Q=1, N=2)
    kept = {}
    for lra_insert in (True, False):
        stat = initial_stat("lra", (1, 1, 2), step=0, device=torch.device("cpu"), lra_insert=lra_insert)
        stat = observe("lra", stat, probs, step=1, tau=0.1)
        for step in (2, 3):
            new = initial_stat("lra", (1, 1, 2), step=step, device=torch.device("cpu"), lra_insert=lra_insert)
            stat = torch.cat([stat, new], dim=-1)
        positions = torch.arange(6)[None, None]
        kept[lra_insert] = keep_indices("lra", stat, positions, capacity=3, sinks=0, recent=0)[0, 0].tolist()
        assert kept[lra_insert] == reference_keep(stat[0, 0].tolist(), list(range(6)), capacity=3, protected=set())
    assert kept[True] == [3, 4, 5]
    assert kept[False] == [1, 4, 5]  # the attended entry, then the newest of the never-attended


def test_lra_without_insert_in_the_store_counts_the_inserting_chunks_attention() -> None:
    """Through :class:`KVStore`: a chunk's own queries attend its entries before eviction, so an entry they attend
    is stamped with that step, and ``recent`` protects the newest entries nobody has attended yet."""
    from tensorslim.layers.memory.store import KVStore

    store = KVStore(MemoryConfig(capacity=4, chunk=4, policy="lra", tau=0.5, lra_insert=False, recent=1))
    keys = torch.zeros(1, 1, 8, 2)
    keys[0, 0, 1] = torch.tensor([20.0, 0.0])  # the first chunk's query attends entry 1 only (probability ~1)
    values = torch.randn(1, 1, 8, 2)
    for start in (0, 4):
        store.insert(keys[:, :, start : start + 4], values[:, :, start : start + 4])
        query = torch.tensor([1.0, 0.0]) if start == 0 else torch.tensor([0.0, 0.0])  # the second attends evenly
        store.attend(query.view(1, 1, 1, 2), torch.tensor([start + 3]), scale=1.0)
        store.evict()
    # Step 0: entry 1 stamped 0; step 1: 8 entries, the second query's 1/8 < tau, so all others stay at -1: keep
    # entry 1, the protected newest (7), then the newest of the never-attended (5, 6).
    assert store.positions[0, 0].tolist() == [1, 5, 6, 7]


def test_ties_evict_the_oldest_and_random_scores_match_the_reference() -> None:
    torch.manual_seed(0)
    stat = torch.randint(0, 3, (2, 3, 20)).float()  # many ties
    positions = torch.arange(100, 120).expand(2, 3, 20)
    kept = keep_indices("lfa", stat, positions, capacity=7, sinks=0, recent=0)
    for b in range(2):
        for h in range(3):
            want = reference_keep(stat[b, h].tolist(), positions[b, h].tolist(), capacity=7, protected=set())
            assert kept[b, h].tolist() == want


# --- exactness at full capacity -------------------------------------------------------------------------------------


def tiny_llama(max_seq_len: int = 256) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(d_model=64, n_layers=2, n_heads=4, d_ff=128, vocab_size=97, max_seq_len=max_seq_len)
    return LlamaForCausalLM(config).eval()


def tiny_hf_llama() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=512,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(("chunk", "lra_insert"), [(1, True), (17, True), (64, True), (17, False)])
def test_full_capacity_equals_full_attention_ours(chunk: int, lra_insert: bool) -> None:
    model = tiny_llama()
    ids = torch.randint(0, 97, (2, 150))
    with torch.no_grad():
        reference = model(ids)
    equip_memory_(model, MemoryConfig(capacity=150, chunk=chunk, policy="lra", lra_insert=lra_insert))
    assert torch.allclose(stream_logits(model, ids), reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("policy", ["fifo", "lfa"])
def test_full_capacity_equals_full_attention_hf_llama(policy: str) -> None:
    model = tiny_hf_llama()
    ids = torch.randint(0, 97, (1, 130))
    with torch.no_grad():
        reference = model(ids).logits
    report = equip_memory_(model, MemoryConfig(capacity=192, chunk=32, policy=policy))
    assert report.layers == ("model.layers.0.self_attn", "model.layers.1.self_attn")
    assert torch.allclose(stream_logits(model, ids), reference, atol=1e-5, rtol=0)
    assert model.state_dict().keys() == tiny_hf_llama().state_dict().keys()  # same parameter names


@pytest.mark.parametrize("policy", ["fifo", "lra", "lfa", "h2o", "lra-unattended"])
def test_peak_entries_stay_within_capacity_plus_chunk(policy: str) -> None:
    model = tiny_llama()
    config = MemoryConfig(capacity=40, chunk=16, policy=policy[:4].rstrip("-"), sinks=4, lra_insert="-" not in policy)
    equip_memory_(model, config)
    result = stream_nll(model, torch.randint(0, 97, (1, 300)))
    stores = memory_stores(model)
    assert all(s.peak == 40 + 16 for s in stores) and all(s.size == 40 for s in stores)
    assert result.nll.shape == (1, 299) and math.isfinite(result.perplexity)


# --- RoPE from stored positions -------------------------------------------------------------------------------------


def test_rope_uses_stored_positions_after_eviction() -> None:
    """After FIFO eviction with sinks, a chunk's attention equals dense attention at the tokens' absolute positions
    restricted to the kept keys (a slot-index RoPE would rotate the kept keys by their new slots and differ)."""
    torch.manual_seed(1)
    attention = Attention(LlamaConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=10)).eval()
    config = MemoryConfig(capacity=12, chunk=8, policy="fifo", sinks=3)
    layer = LlamaMemoryAttention(copy.deepcopy(attention), rope_theta=1e4, config=config)
    x = torch.randn(1, 48, 32)
    with torch.no_grad():
        for start in range(0, 40, 8):
            layer(x[:, start : start + 8], None, None)
        kept = layer.store.positions[0, 0].tolist()
        assert kept == [0, 1, 2, 31, 32, 33, 34, 35, 36, 37, 38, 39]
        last = layer(x[:, 40:48], None, None)  # (1, 8, 32)
        # Dense reference over all 48 tokens, rotated at their absolute positions, masking the evicted keys.
        cos, sin = rotary_cos_sin(48, 16, theta=1e4, device=x.device)
        heads = lambda t: t.view(1, 48, 2, 16).transpose(1, 2)  # noqa: E731
        q = apply_rotary(heads(attention.q_proj(x)), cos, sin)
        k = apply_rotary(heads(attention.k_proj(x)), cos, sin)
        v = heads(attention.v_proj(x))
        allowed = torch.zeros(8, 48, dtype=torch.bool)
        allowed[:, kept] = True
        allowed[:, 40:] = torch.ones(8, 8).tril().bool()
        y = torch.nn.functional.scaled_dot_product_attention(q[:, :, 40:], k, v, attn_mask=allowed)
        reference = attention.o_proj(y.transpose(1, 2).reshape(1, 8, 32))
    assert torch.allclose(last, reference, atol=1e-5, rtol=0)


# --- decoding keeps evicting ----------------------------------------------------------------------------------------


def test_generate_with_full_memory_matches_kv_cache_decoding() -> None:
    model = tiny_llama()
    prompt = torch.randint(0, 97, (2, 20))
    with torch.no_grad():  # reference: greedy decoding with the model's own growing KV cache
        cache, expected = model.new_cache(), []
        logits = model(prompt, cache=cache)
        for _ in range(12):
            token = logits[:, -1].argmax(-1, keepdim=True)
            expected.append(token)
            logits = model(token, cache=cache)
    equip_memory_(model, MemoryConfig(capacity=64, chunk=8, policy="lra"))
    assert torch.equal(generate(model, prompt, max_new_tokens=12), torch.cat(expected, dim=1))


def test_decoding_past_the_training_length_stays_bounded() -> None:
    model = tiny_llama(max_seq_len=32)
    equip_memory_(model, MemoryConfig(capacity=16, chunk=8, policy="lfa", sinks=2))
    out = generate(model, torch.randint(0, 97, (1, 24)), max_new_tokens=100)  # 124 tokens > max_seq_len 32
    assert out.shape == (1, 100)
    stores = memory_stores(model)
    assert all(s.seen == 124 and s.size == 16 and s.peak == 16 + 8 for s in stores)
    assert all(set(range(2)) <= set(s.positions[0, 0].tolist()) for s in stores)  # the sinks survived


def test_same_seed_same_stream() -> None:
    def run() -> torch.Tensor:
        model = tiny_llama()
        equip_memory_(model, MemoryConfig(capacity=32, chunk=8, policy="h2o"))
        torch.manual_seed(5)
        return stream_nll(model, torch.randint(0, 97, (1, 100))).nll

    assert torch.equal(run(), run())


# --- wait-to-attend (bidirectional) ---------------------------------------------------------------------------------


def tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertModel(config).eval()


def test_wait_and_capacity_covering_the_input_equal_full_bidirectional_attention() -> None:
    model = tiny_bert()
    ids = torch.randint(0, 97, (2, 90))
    with torch.no_grad():
        reference = model(ids).last_hidden_state
    equip_memory_(model, MemoryConfig(capacity=96, chunk=16, wait=90))
    with torch.no_grad():
        assert torch.allclose(model(ids).last_hidden_state, reference, atol=1e-5, rtol=0)


def test_each_encoder_call_reads_one_document_from_an_empty_memory() -> None:
    """A second document (another batch size) must not see the first one's entries, and its gradients flow."""
    fresh = tiny_bert()
    equip_memory_(fresh, MemoryConfig(capacity=32, chunk=8, wait=8, policy="lra"))
    used = tiny_bert()
    equip_memory_(used, MemoryConfig(capacity=32, chunk=8, wait=8, policy="lra"))
    first, second = torch.randint(0, 97, (3, 40)), torch.randint(0, 97, (2, 56))
    used(first).last_hidden_state.sum().backward()
    reference = fresh(second).last_hidden_state
    assert torch.allclose(used(second).last_hidden_state, reference, atol=1e-6, rtol=0)


@pytest.mark.parametrize("wait", [0, 5, 23])
def test_each_query_sees_exactly_wait_later_tokens(wait: int) -> None:
    """One BERT self-attention layer with an unbounded memory: query i attends keys j <= i + wait."""
    inner = tiny_bert().encoder.layer[0].attention.self
    x = torch.randn(1, 50, 32)
    with torch.no_grad():
        heads = lambda t: t.view(1, 50, 2, 16).transpose(1, 2)  # noqa: E731
        q, k, v = heads(inner.query(x)), heads(inner.key(x)), heads(inner.value(x))
        band = torch.arange(50)[None, :] <= torch.arange(50)[:, None] + wait
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=band)
        reference = y.transpose(1, 2).reshape(1, 50, 32)
        holder = nn.Sequential(inner)
        equip_memory_(holder, MemoryConfig(capacity=64, chunk=8, wait=wait))
        out, _ = holder[0](x)
    assert torch.allclose(out, reference, atol=1e-5, rtol=0)


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": 8, "chunk": 16}, "capacity=8 is smaller than chunk=16"),
        ({"policy": "lru"}, "policy='lru' is unknown; allowed: ['fifo', 'lra', 'lfa', 'h2o']"),
        ({"wait": -1}, "wait=-1 is invalid; allowed: an integer >= 0"),
        ({"capacity": 64, "sinks": 64}, "leave no evictable entry"),
        ({"tau": 0.0}, "tau=0.0 is invalid"),
        ({"lra_insert": "no"}, "lra_insert='no' is invalid"),
        ({"capacity": 0}, "capacity=0 is invalid"),
    ],
)
def test_bad_config_is_one_line_naming_the_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as error:
        MemoryConfig(**kwargs)
    assert "\n" not in str(error.value) and "allowed" in str(error.value)


def test_models_that_cannot_be_equipped() -> None:
    with pytest.raises(ValueError, match="has no attention layer we can equip; allowed: tensorslim LLaMA"):
        equip_memory_(nn.Sequential(nn.Linear(4, 4)), MemoryConfig())
    with pytest.raises(ValueError, match="wait=4 needs a bidirectional model"):
        equip_memory_(tiny_llama(), MemoryConfig(wait=4))
    model = tiny_llama()
    equip_memory_(model, MemoryConfig())
    with pytest.raises(ValueError, match="already has a memory"):
        equip_memory_(model, MemoryConfig())


# --- long documents -------------------------------------------------------------------------------------------------


def test_needle_documents_are_deterministic_by_seed_and_hold_their_facts() -> None:
    from tensorslim.data.longctx.documents import NEEDLE_KEYS, NEEDLE_VALUES, long_tokenizer, needle_documents

    tokenizer = long_tokenizer()
    first, again, other = (needle_documents(tokenizer, length=200, count=3, seed=s) for s in (7, 7, 8))
    assert torch.equal(first.ids, again.ids) and torch.equal(first.answers, again.answers)
    assert not torch.equal(first.ids, other.ids)
    key_ids = {tokenizer.encode_batch([k])[0][0] for k in NEEDLE_KEYS}
    for n in range(3):
        ids = first.ids[n].tolist()
        for depth in (0.1, 0.3, 0.5, 0.7):  # each recalled value follows its key twice: the fact, its restatement
            (at,) = (first.query_depth[n] == depth).nonzero()[:, 0].tolist()
            key, value = ids[at - 1], ids[at]
            assert key in key_ids and tokenizer.decode([value]) in NEEDLE_VALUES
            pairs = [i for i in range(len(ids) - 1) if ids[i] == key]
            assert len(pairs) == 2 and all(ids[i + 1] == value for i in pairs)
            assert pairs[0] < 0.75 * len(ids) < pairs[1]  # planted in the body, asked at the end
    recalled = needle_documents(tokenizer, length=200, count=2, depths=(0.1, 0.2), recalls=(0.6, 0.4), seed=7)
    for n in range(2):
        ids = recalled.ids[n].tolist()
        for depth, recall in ((0.1, 0.6), (0.2, 0.4)):
            (at,) = (recalled.query_depth[n] == depth).nonzero()[:, 0].tolist()
            places = [i for i in range(len(ids) - 1) if ids[i] == ids[at - 1]]
            assert len(places) == 3 and all(ids[i + 1] == ids[at] for i in places)  # planted, recalled, asked
            assert abs(places[1] / 200 - recall) < 0.12  # the recall sits near its depth (facts shift it a little)
    with pytest.raises(ValueError, match=r"depths=\(1.5,\) is invalid"):
        needle_documents(tokenizer, length=200, count=1, depths=(1.5,))
    with pytest.raises(ValueError, match=r"recalls=\(0.5,\) is invalid"):
        needle_documents(tokenizer, length=200, count=1, depths=(0.1, 0.2), recalls=(0.5,))


def test_needle_training_documents_state_each_fact_several_times() -> None:
    from tensorslim.data.longctx.documents import NEEDLE_KEYS, long_tokenizer, needle_training_documents

    tokenizer = long_tokenizer()
    docs = needle_training_documents(tokenizer, length=256, count=2, keys=5, mentions=3, seed=1)
    assert docs.shape == (2, 256)
    assert torch.equal(docs, needle_training_documents(tokenizer, length=256, count=2, keys=5, mentions=3, seed=1))
    key_ids = {tokenizer.encode_batch([k])[0][0] for k in NEEDLE_KEYS}
    for doc in docs.tolist():
        keys = [token for token in doc[:-1] if token in key_ids]
        assert len(set(keys)) == 5 and all(keys.count(k) == 3 for k in set(keys))
        for key in set(keys):  # every mention carries the same value
            assert len({doc[i + 1] for i in range(len(doc) - 1) if doc[i] == key}) == 1
    with pytest.raises(ValueError, match="mentions=1 are invalid"):
        needle_training_documents(tokenizer, length=256, count=1, keys=5, mentions=1)


def test_fact_share_sets_how_many_facts_a_training_block_holds() -> None:
    from tensorslim.data.longctx.documents import NEEDLE_KEYS, long_tokenizer, needle_training_documents
    from tensorslim.tasks.longctx.lm import LongContextLM, LongContextOptions

    # Each statement is 3 tokens (key, value, period): the default 3/8 of a block keeps the old cap seq_len // (8 m).
    assert LongContextLM({"mentions": 2})._fact_room(256) == 256 // 16
    dense = LongContextLM({"mentions": 2, "fact_share": 0.75})
    assert dense._fact_room(128) == 16  # 16 facts x 2 statements x 3 tokens = 96 = 0.75 x 128
    tokenizer = long_tokenizer()
    docs = needle_training_documents(tokenizer, length=128, count=2, keys=16, mentions=2, seed=3)
    key_ids = {tokenizer.encode_batch([k])[0][0] for k in NEEDLE_KEYS}
    for doc in docs.tolist():
        keys = [token for token in doc if token in key_ids]
        assert len(keys) == 32 and len(set(keys)) == 16  # dense: a quarter of the block is filler
    with pytest.raises(ValueError, match=r"fact_share=1 is invalid; allowed: a share in \(0, 1\)"):
        LongContextOptions(fact_share=1)


def test_key_weight_weights_the_prediction_after_a_key() -> None:
    import torch.nn.functional as F

    from tensorslim.tasks.longctx.lm import LongContextOptions, weighted_lm_loss

    torch.manual_seed(0)
    logits, ids = torch.randn(2, 6, 11), torch.randint(0, 7, (2, 6))  # no 7 but the keys set below
    ids[0, 2], ids[1, 4], ids[1, 5] = 7, 7, 7  # key 7; the last position predicts nothing
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1), reduction="none").view(2, 5)
    weights = torch.ones(2, 5)
    weights[0, 2] = weights[1, 4] = 3.0
    expected = (per_token * weights).sum() / weights.sum()  # a dense reference on the sliced logits
    assert torch.allclose(weighted_lm_loss(logits, ids, torch.tensor([7]), 3.0), expected)
    assert torch.allclose(weighted_lm_loss(logits, ids, torch.tensor([7]), 1.0), per_token.mean())
    # the range check names the bound; a value that is no finite float at all is refused by its type first
    for bad, allowed in ((0.5, "a finite number >= 1"), (math.inf, "a finite number"), (True, "a finite number")):
        with pytest.raises(ValueError, match=rf"^key_weight={bad!r} is invalid; allowed: {allowed}$"):
            LongContextOptions(key_weight=bad)


def test_repeated_documents_read_one_passage_twice() -> None:
    from tensorslim.data.longctx.documents import long_tokenizer, repeated_documents
    from tensorslim.tasks.longctx.lm import LongContextOptions

    docs = repeated_documents(long_tokenizer(), length=101, count=3, seed=2)
    assert docs.shape == (3, 101) and torch.equal(docs[:, :50], docs[:, 51:101])
    assert not torch.equal(docs[0], docs[1])
    with pytest.raises(ValueError, match=r"repeats=1 is invalid; allowed: a share in \[0, 1\)"):
        LongContextOptions(repeats=1)


def test_lookahead_rows_put_the_labelled_cue_within_reach_of_cls_only() -> None:
    from tensorslim.data.longctx.documents import long_tokenizer
    from tensorslim.tasks.longctx.lookahead import CUES, lookahead_rows

    tokenizer = long_tokenizer()
    rows, vocab = lookahead_rows(tokenizer, count=50, seq_len=40, max_distance=12, split="test", seed=3)
    assert rows.shape == (50, 41) and vocab > tokenizer.vocab_size  # [CLS] is a new id after the BPE's
    cues = torch.tensor([tokenizer.encode_batch([c])[0][0] for c in CUES])
    ids, labels = rows[:, 1:], rows[:, 0]
    assert (ids[:, 0] == tokenizer.vocab_size).all()  # [CLS] first
    found = torch.isin(ids, cues)
    assert (found.sum(dim=1) == 1).all()  # exactly one cue word per document
    where = found.nonzero()[:, 1]
    assert where.min() >= 1 and where.max() <= 12 and len(set(where.tolist())) > 6
    assert torch.equal(ids[found], cues[labels])  # the cue is the label's word
    assert torch.equal(rows, lookahead_rows(tokenizer, count=50, seq_len=40, max_distance=12, split="test", seed=3)[0])
    with pytest.raises(ValueError, match="max_distance=40 does not fit seq_len=40"):
        lookahead_rows(tokenizer, count=1, seq_len=40, max_distance=40, split="test", seed=0)
