"""The piece encoder (render/pieces.py) gives the tokenizer's own ids, token for token: on the agent
corpus, on generated text (ASCII with every character class the pre-tokenizer tells apart, added tokens
and their fragments, non-ASCII mixed in), one text at a time and in batches; and a tokenizer of another
configuration is never shortcut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, pre_tokenizers

from gateway.render import pieces
from gateway.render.pieces import PieceEncoder
from gateway.render.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GATEWAY_SHARED", REPO.parent / "shared"))
TOOL = SHARED / "tools" / "make_agent_corpus.py"


def _hf() -> Tokenizer:
    return load_tokenizer()._tok


def _reference(texts: list[str]) -> list[list[int]]:
    tok = _hf()
    return [list(tok.encode(t, add_special_tokens=False).ids) for t in texts]


@pytest.fixture(scope="module")
def encoder() -> PieceEncoder:
    enc = PieceEncoder.for_tokenizer(_hf())
    assert enc is not None, "the packaged tokenizer's configuration takes the piece path"
    return enc


def test_the_packaged_tokenizer_encodes_through_pieces() -> None:
    assert load_tokenizer()._pieces is not None


ADDED = sorted(_hf().get_added_tokens_decoder().items())
ADDED_TEXTS = [t.content for _, t in ADDED]
FRAGMENTS = [
    # every class the word pattern tells apart, on ASCII
    "a", "Z", "abc", "Hello", "x_y", "0", "12", "123", "1234567", "3.14", " ", "  ", "   ", "\t", "\n", "\r\n",
    "\n\n", " \n", "\t\n ", "\x0b", "\x0c", "\r", ".", "!", "?!", "...", "'s", " 's", "'", "\"", "(", ")", "{}",
    "[]", "<", ">", "</", "/>", "=", "==", "->", "#", "$", "%", "&", "*", "+", "-", "--", "/", "\\", ":", ";",
    "@", "^", "_", "`", "|", "~", ",", " .", " (", "(\n", ".\n\n", "\x00", "\x01", "\x1c", "\x1f", "\x7f",
    "\x01a", " \x01", "def f(x):\n    return x + 1\n", "  439  ", "if __name__ == \"__main__\":",
    # added tokens, their parts and near misses
    "<think>", "</think>", "<think", "think>", "<dsml:", "</dsml:", "<dsml", "<|EOT|>", "<|EOT", "｜DSML｜",
    "<｜User｜>", "<｜Assistant｜>", "<｜", "｜>", "｜", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
    "<｜System｜>", "<｜tool▁calls▁begin｜>", "<|place_holder_mm_span_0021|>", "<|place_holder", "<｜/table>｜",
    "<｜tr｜>", "<｜DSML｜ calls>",
    # not ASCII
    "é", "naïve café", "日本語", "中文", "ひらがな", "カタカナ", "Ω", "١٢٣", "😀", "\u00a0", "\u2028", "\u0301",
]


@st.composite
def texts(draw) -> str:
    parts = draw(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.sampled_from(ADDED_TEXTS),
                                    st.text(alphabet=st.characters(max_codepoint=127), max_size=12),
                                    st.text(max_size=6)), max_size=24))
    return "".join(parts)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts())
def test_generated_text_encodes_as_the_tokenizer_does(encoder: PieceEncoder, text: str) -> None:
    assert list(encoder.encode(text)) == _reference([text])[0]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts(), min_size=0, max_size=6))
def test_batches_encode_as_the_tokenizer_does(encoder: PieceEncoder, batch: list[str]) -> None:
    assert [list(a) for a in encoder.encode_batch(batch)] == _reference(batch)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=64))
def test_any_ascii_text_encodes_as_the_tokenizer_does(encoder: PieceEncoder, text: str) -> None:
    assert list(encoder.encode(text)) == _reference([text])[0]


def test_the_text_tokenizer_gives_the_same_ids_either_way(monkeypatch) -> None:
    """TextTokenizer with and without the piece path (GATEWAY_TOKENIZER_PIECES=0), single and batched."""
    from gateway.render import tokenizer
    from gateway.render.tokenizer import TextTokenizer, default_tokenizer_path

    monkeypatch.setattr(tokenizer, "PIECES", False)  # GATEWAY_TOKENIZER_PIECES=0 (process_switches.py)
    plain = TextTokenizer(default_tokenizer_path())
    assert plain._pieces is None
    fast = load_tokenizer()
    batch = ["<｜begin▁of▁sentence｜><｜System｜>You are agent 3.", "<｜User｜>Step 4 of task 3.0: continue."
             "<｜Assistant｜><think>", "Done.</think>ok<｜end▁of▁sentence｜>"]
    assert [list(a) for a in fast.encode_batch(batch)] == [list(a) for a in plain.encode_batch(batch)]
    assert list(fast.encode(batch[1])) == list(plain.encode(batch[1]))


def test_the_piece_table_is_bounded(encoder: PieceEncoder, monkeypatch) -> None:
    monkeypatch.setattr(pieces, "MAX_PIECES", 50)
    text = " ".join(f"w{k}x" for k in range(40)) + " " + " ".join(f"v{k}y" for k in range(40))
    assert list(encoder.encode(text)) == _reference([text])[0]
    assert len(encoder._pieces) <= 200  # replaced when full, then filled with this text's pieces
    assert list(encoder.encode(text)) == _reference([text])[0]


def test_threads_encoding_while_the_table_is_replaced_get_the_same_ids(monkeypatch) -> None:
    """GATEWAY_ANALYSIS=thread and the limits' exact count encode from threads: a table replaced when
    full never leaves another thread without its pieces."""
    import threading

    enc = PieceEncoder.for_tokenizer(_hf())
    assert enc is not None
    monkeypatch.setattr(pieces, "MAX_PIECES", 64)
    texts = [" ".join(f"t{k}w{j}" for j in range(30)) for k in range(8)]
    want = _reference(texts)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(30):
                assert list(enc.encode(texts[k])) == want[k]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_tokenizer_of_another_configuration_is_not_shortcut() -> None:
    other = Tokenizer.from_str(_hf().to_str())
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert PieceEncoder.for_tokenizer(other) is None
    stripped = Tokenizer.from_str(_hf().to_str())
    from tokenizers import AddedToken

    stripped.add_special_tokens([AddedToken("<｜extra｜>", special=True, lstrip=True)])
    assert PieceEncoder.for_tokenizer(stripped) is None


def test_the_agent_corpus_encodes_as_the_tokenizer_does(encoder: PieceEncoder, tmp_path) -> None:
    if not TOOL.exists():
        pytest.skip(f"{TOOL} not found")
    out = tmp_path / "agent.json"
    subprocess.run([sys.executable, str(TOOL), "--messages", "300", "--approx-tokens", "60000", "-o", str(out)],
                   check=True, capture_output=True)
    body = json.loads(out.read_text())
    texts = [m["content"] for m in body["messages"] if isinstance(m.get("content"), str) and m["content"]]
    texts += [json.dumps(body["tools"])]
    assert [list(a) for a in encoder.encode_batch(texts)] == _reference(texts)


def test_a_large_text_in_the_gateways_own_process_goes_to_the_tokenizer(monkeypatch) -> None:
    # The piece path holds the GIL: in the gateway's process (the limits' exact count runs in a thread
    # beside the event loop) a text above PIECES_MAX_CHARS goes to the tokenizer, which releases it.
    from gateway.render import tokenizer as tokenizer_mod

    tok = load_tokenizer()
    used: list[int] = []

    class Spy:
        def __init__(self, inner) -> None:
            self.inner = inner

        def encode(self, text):
            used.append(len(text))
            return self.inner.encode(text)

        def encode_batch(self, texts):
            used.append(sum(map(len, texts)))
            return self.inner.encode_batch(texts)

    monkeypatch.setattr(tok, "_pieces", Spy(tok._pieces))
    small, big = "a few words", "many words here. " * 2000
    assert tok.encode(small).tolist() == tok._tok.encode(small, add_special_tokens=False).ids
    assert tok.encode(big).tolist() == tok._tok.encode(big, add_special_tokens=False).ids
    assert tok.encode_batch([big, small])[0].tolist() == tok._tok.encode(big, add_special_tokens=False).ids
    assert used == [len(small)]
    monkeypatch.setattr(tokenizer_mod, "PIECES_MAX_CHARS", None)  # as the analysis worker sets it
    tok.encode(big)
    assert used == [len(small), len(big)]
