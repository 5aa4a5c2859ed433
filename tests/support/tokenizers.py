"""Real tokenizers for tiny models: a fixed character vocabulary (the decoding tests' ids), the characters of
the reasoning tasks, and a word-level Hugging Face tokenizer without a MASK token."""

from __future__ import annotations

from setdlm.data.tasks import reasoning_split
from setdlm.data.tokenizers import char_tokenizer

V = 48
MASK = V - 1
PAD, BOS, EOS = 0, 1, 2
PROMPTS = [[BOS, 5, 7], [BOS, 9, 4, 11, 3, 6, 20], [BOS, 30, 8, 12, 40]]  # ragged on purpose


class CharTokenizer:
    """A character tokenizer: 0 PAD, 1 BOS, 2 EOS, 3 unused, letters and punctuation, MASK last."""

    chars = "abcdefghijklmnopqrstuvwxyz .,;:!?'-0123456789"[: V - 5]
    vocab_size, pad_token_id, bos_token_id, eos_token_id, mask_token_id = V, PAD, BOS, EOS, MASK

    def encode(self, text: str) -> list[int]:
        return [4 + self.chars.index(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i - 4] for i in ids if 4 <= i < 4 + len(self.chars))


def task_tokenizer():
    """Characters of the reasoning problems plus plain English text."""
    texts = [e.prompt + e.completion for e in reasoning_split("train", 300, level="easy")]
    return char_tokenizer(texts + ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:'!?-"])


def tiny_tokenizer(n_words: int = 60):
    """A word-level fast tokenizer without a MASK token: <unk>, <s>, </s>, w0..w{n-1}."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(n_words)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
