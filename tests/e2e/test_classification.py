"""model.task: classification through the same engine: a tiny BERT checkpoint on a labelled jsonl set."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.helpers import train_with_output

WORDS_POS = ["good", "great", "fine", "lovely", "superb"]
WORDS_NEG = ["bad", "awful", "poor", "dull", "boring"]
FILLER = ["the", "movie", "was", "a", "plot", "actor", "scene", "and", "very", "it"]


@pytest.fixture(scope="module")
def reviews(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    rows = []
    for i in range(240):
        label = i % 2
        words = rng.choices(FILLER, k=6) + [rng.choice(WORDS_POS if label else WORDS_NEG)]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": ["negative", "positive"][label]})
    f = tmp_path_factory.mktemp("reviews") / "reviews.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    return f


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT checkpoint and its WordPiece tokenizer, saved into one folder."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    d = tmp_path_factory.mktemp("bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(WORDS_POS + WORDS_NEG + FILLER))]
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})  # transformers 5: a dict, not a file
    assert tok("the movie was good").input_ids.count(tok.unk_token_id) == 0
    cfg = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
    )
    torch.manual_seed(0)  # the head's init decides how hard the task starts; keep it fixed
    BertForSequenceClassification(cfg).save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    return d / "model"


def test_bert_classification_end_to_end(tmp_path: Path, reviews: Path, bert: Path) -> None:
    out = tmp_path / "runs"
    sets = {
        "model.name": str(bert),
        "model.task": "classification",
        "data.tokenizer": str(bert),
        "data.source": str(reviews),
        "data.seq_len": "16",
        "data.val_fraction": "0.25",
        "algorithm.rounds": "4",
        "algorithm.inner_steps": "40",
        "algorithm.trainers": "1",  # the run reports trainer 0: one model, four workers
        "batch.initial": "4",
        "switch.b_max": "8",
        # lr 3e-3 collapsed to one class for 1 head init in 6; 1e-3 over 40 steps learned all 8 tried
        "inner.lr": "1e-3",
        "eval.max_examples": "null",
        "logging.progress": "plain",
    }
    run, printed = train_with_output(out, sets)
    assert "val acc" in printed and "validation accuracy" in printed
    s = json.loads((run / "summary.json").read_text())
    assert s["final_val_ppl"] is None and s["final_val_accuracy"] > 0.9 > s["initial_val_accuracy"]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("val_accuracy" in e for e in events if e["event"] == "eval")
    assert (run / "plots" / "val_accuracy_vs_round.png").is_file()
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(run / "model")
    assert model.config.id2label == {0: "negative", 1: "positive"}
    tok = AutoTokenizer.from_pretrained(run / "model")
    logits = model(
        **tok(["the movie was great", "the movie was awful"], return_tensors="pt", padding=True)
    ).logits
    assert logits.argmax(-1).tolist() == [1, 0]
