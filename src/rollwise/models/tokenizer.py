"""A character-level tokenizer saved in Hugging Face format, for the tiny models rollwise builds itself.

Why: nothing can be downloaded here, and a tiny model learns arithmetic far faster over characters than
over a BPE vocabulary. It is a real `PreTrainedTokenizerFast` (tokenizer.json), so checkpoints that carry
it load anywhere with `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0, 1, 2, 3


def build_char_tokenizer(chars: str):
    """Tokenizer with ids 0..3 for the special tokens and one id per distinct character of `chars`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    uniq = list(dict.fromkeys(chars))
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for c in uniq:
        if c in vocab:
            continue
        vocab[c] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
