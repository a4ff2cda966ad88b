"""Model, data, trainer and checkpoints on CPU: loss goes down, batches are deterministic,
and resuming from a checkpoint reproduces the uninterrupted loss trajectory bit for bit."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.checkpoint import CheckpointStore
from agent.config import TrainConfig, tiny_cpu
from agent.data import CharCorpus, CharTokenizer, Dataset
from agent.model import GPT, GPTConfig
from agent.trainer import Trainer

TINY = tiny_cpu().train


@pytest.fixture(scope="module")
def corpus():
    return CharCorpus.shakespeare(seed=TINY.seed)


def test_default_model_is_about_four_hundred_thousand_parameters(corpus):
    model = GPT(GPTConfig(vocab_size=corpus.vocab_size))
    assert 300_000 < model.num_params() < 500_000


def test_corpus_ships_with_attribution(corpus):
    from agent.data import DATA_DIR
    notice = (DATA_DIR / "NOTICE.md").read_text()
    assert "Open Knowledge Foundation" in notice and "CC-BY 2.5" in notice
    assert corpus.vocab_size == 76 and isinstance(corpus, Dataset)
    assert (DATA_DIR / "shakespeare.txt").stat().st_size < 1_000_001


def test_batches_are_a_pure_function_of_sample_indices(corpus):
    x1, y1 = corpus.batch("train", 100, 8, 32)
    x2, y2 = corpus.batch("train", 100, 4, 32)
    x3, _ = corpus.batch("train", 104, 4, 32)
    assert torch.equal(x1, torch.cat([x2, x3])) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(corpus.batch("val", 100, 4, 32)[0], x2)


def test_bad_batch_requests_are_refused(corpus):
    with pytest.raises(ValueError, match="split"):
        corpus.batch("test", 0, 1, 8)
    with pytest.raises(ValueError, match="size"):
        corpus.batch("train", 0, 0, 8)
    with pytest.raises(ValueError, match="shorter"):
        CharCorpus("abcdefghij" * 3, val_fraction=0.1).batch("val", 0, 1, 8)
    with pytest.raises(ValueError, match="vocabulary"):
        CharTokenizer.from_text("abc").encode("abz")


@given(st.text(alphabet="abcdef \n", min_size=1, max_size=50))
@settings(max_examples=50, deadline=None)
def test_tokenizer_round_trips(text):
    tok = CharTokenizer.from_text("abcdef \n")
    assert tok.decode(tok.encode(text)) == text


def test_invalid_configs_name_the_field():
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(n_embd=130, n_head=4)
    with pytest.raises(ValueError, match="step_samples"):
        TrainConfig(step_samples=0)


def test_training_loss_decreases(corpus):
    torch.set_num_threads(1)
    t = Trainer(TINY, corpus)
    before = t.evaluate()
    losses = [r.loss for r in t.train_steps(40, 16)]
    after = t.evaluate()
    assert before > math.log(corpus.vocab_size) - 0.3   # starts near a uniform guess
    assert sum(losses[-5:]) / 5 < losses[0] - 0.8
    assert after < before - 0.8


def test_a_cut_micro_batch_trains_the_samples_prefixes_token_weighted(corpus):
    """The enforcer fills a window's tail with samples cut to a fraction of the sequence: that is the
    same model on each sample's first tokens, and the step's loss weighs every token the same."""
    torch.set_num_threads(1)
    t, block = Trainer(TINY, corpus), TINY.model.block_size
    full = t.micro_batch(4)
    x, y = corpus.batch("train", 4, 4, block)
    with torch.no_grad():
        _, want = t.model(x[:, :block // 2], y[:, :block // 2])
    cut = t.micro_batch(4, 0.5)
    assert cut.tokens == 4 * (block // 2) and cut.loss == pytest.approx(want.item(), rel=1e-5)
    assert t.tokens_seen == 4 * block + 4 * (block // 2) and t.samples_seen == t.pending_samples == 8
    assert t.state_dict()["train_state"]["tokens_seen"] == 0      # rewound past both pending batches
    step = t.optimizer_step()
    assert step.loss == pytest.approx((full.loss * 4 * block + cut.loss * 4 * (block // 2)) / (6 * block), rel=1e-6)
    for bad in (0.0, -0.5, 1.5, math.nan):
        with pytest.raises(ValueError, match="fraction"):
            t.micro_batch(2, bad)
    assert t.samples_seen == 8                                     # refused input consumed no data


def test_accumulated_micro_batches_equal_one_big_batch(corpus):
    torch.set_num_threads(1)
    a, b = Trainer(TINY, corpus), Trainer(TINY, corpus)
    a.micro_batch(5)
    a.micro_batch(11)
    b.micro_batch(16)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.allclose(pa.grad, pb.grad, rtol=1e-4, atol=1e-6)   # sums of per-sample gradients
    sa, sb = a.optimizer_step(), b.optimizer_step()
    assert sa.samples == sb.samples == 16 and sa.applied and sb.applied
    assert sa.loss == pytest.approx(sb.loss, rel=1e-5)
    assert sa.grad_norm == pytest.approx(sb.grad_norm, rel=1e-4)


def test_resume_continues_the_same_loss_trajectory_bit_identically(corpus, tmp_path):
    torch.set_num_threads(1)
    straight = Trainer(TINY, corpus)
    full = [r.loss for r in straight.train_steps(12, 8)]

    first = Trainer(TINY, corpus)
    head = [r.loss for r in first.train_steps(6, 8)]
    store = CheckpointStore(tmp_path, keep_last=2)
    store.save(first.state_dict(), first.step)

    resumed = Trainer(TINY, corpus)
    resumed.load_state_dict(store.load())
    assert resumed.step == 6 and resumed.samples_seen == 48
    tail = [r.loss for r in resumed.train_steps(6, 8)]
    assert head + tail == full                      # exact float equality, not approx
    assert resumed.step == straight.step == 12


def test_checkpoints_are_atomic_and_only_the_last_k_are_kept(corpus, tmp_path):
    t = Trainer(TINY, corpus)
    store = CheckpointStore(tmp_path, keep_last=2)
    for _ in range(4):
        t.train_steps(1, 2)
        store.save(t.state_dict(), t.step)
    assert [c.step for c in store.list()] == [3, 4]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp files left
    state = store.load()
    assert state["config"]["model"]["vocab_size"] == 76 and state["config"]["seed"] == TINY.seed
    (tmp_path / "ckpt-000000009.pt.tmp").write_bytes(b"partial")            # a crashed writer's leftover
    assert store.latest().step == 4


def test_checkpoint_mid_accumulation_rewinds_to_the_last_step(corpus):
    torch.set_num_threads(1)
    straight = Trainer(TINY, corpus)
    full = [r.loss for r in straight.train_steps(4, 8)]
    t = Trainer(TINY, corpus)
    t.train_steps(2, 8)
    t.micro_batch(5)                                   # pending, not in the checkpoint
    state = t.state_dict()
    assert state["train_state"]["samples_seen"] == 16
    resumed = Trainer(TINY, corpus)
    resumed.load_state_dict(state)
    assert [r.loss for r in resumed.train_steps(2, 8)] == full[2:]


def test_checkpoint_refuses_foreign_models(corpus):
    t = Trainer(TINY, corpus)
    t.train_steps(1, 2)
    other = Trainer(TrainConfig(model=GPTConfig(n_embd=32, n_head=2, n_layer=1, block_size=16)), corpus)
    with pytest.raises(ValueError, match="does not match"):
        other.load_state_dict(t.state_dict())


def test_tiny_preset_matches_the_golden_loss_curve(corpus):
    """Numeric drift (init, data order, optimizer) fails loudly, as torchtitan's loss assets do. The
    tolerance absorbs float differences between CPU instruction sets, not behaviour changes."""
    from pathlib import Path
    golden = [float(line.split()[1]) for line in
              (Path(__file__).parent / "assets" / "losses_tiny_cpu.txt").read_text().splitlines()
              if line and not line.startswith("#")]
    torch.set_num_threads(1)
    got = [r.loss for r in Trainer(TINY, corpus).train_steps(len(golden), 16)]
    assert got == pytest.approx(golden, rel=2e-3)


def test_example_config_file_loads_and_round_trips():
    from pathlib import Path

    from agent.config import AgentConfig, load_config
    cfg = load_config(Path(__file__).resolve().parents[2] / "agent" / "agent.example.json")
    assert cfg.lease.site_id == "site-0" and cfg.train.model.n_embd == 64
    assert AgentConfig.from_dict(cfg.to_dict()) == cfg


class CountingTask:
    """A user's own Dataset (the seam): sequences counting up mod 10 from a start set by the index."""

    vocab_size = 10

    def batch(self, split, start, size, block_size):
        base = torch.arange(start, start + size)[:, None] * (7 if split == "train" else 3)
        seq = (base + torch.arange(block_size + 1)[None, :]) % 10
        return seq[:, :-1], seq[:, 1:]


def test_a_user_dataset_plugs_into_the_trainer():
    torch.set_num_threads(1)
    task = CountingTask()
    assert isinstance(task, Dataset)
    t = Trainer(TrainConfig(model=GPTConfig(n_embd=32, n_head=2, n_layer=1, block_size=16), lr=1e-2,
                            eval_samples=32), task)
    assert t.config.model.vocab_size == 10
    before = t.evaluate()
    t.train_steps(40, 16)
    assert t.evaluate() < before / 4          # next token is fully determined: the loss collapses
