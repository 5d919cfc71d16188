"""The real pair (opt-in: ``just test-slow``): greedy text is sensible, the GGUF tokenizer and the draft's
logits match transformers' own GGUF loader."""

import pytest
import torch

import avkit.models
from avkit.config import DEFAULT_DRAFT, DEFAULT_TARGET
from avkit.models import Tokenizer
from avkit.models.gguf_file import GGUFFile
from avkit.models.registry import alias_path

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write a Python function is_even(n) that returns True when n is even."}]


def _greedy(loaded, ids: list[int], n: int) -> list[int]:
    model, out = loaded.model, []
    cache = model.new_cache(1, len(ids) + n + 1)
    logits = model.forward(torch.tensor([ids]), torch.tensor([len(ids)]), torch.tensor([0]), cache, logits="last")
    for _ in range(n):
        out.append(int(logits.argmax(-1)))
        if out[-1] in loaded.tokenizer.eos_token_ids:
            break
        logits = model.forward(torch.tensor([[out[-1]]]), torch.tensor([1]), torch.tensor([0]), cache,
                               logits="last")
    return out


@pytest.mark.parametrize("alias", [DEFAULT_DRAFT, DEFAULT_TARGET])
def test_greedy_code_is_sensible(alias):
    loaded = avkit.models.load(alias)
    tok = loaded.tokenizer
    text = tok.decode(_greedy(loaded, tok.apply_chat_template(PROMPT), 40))
    assert "def is_even(n)" in text, text
    assert loaded.model.config.vocab_size == 151936


def test_gguf_tokenizer_matches_transformers():
    import transformers

    path = alias_path(DEFAULT_DRAFT)
    ref = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours = Tokenizer.from_gguf(GGUFFile(path).metadata, str(path))
    text = "def f(x):\n\treturn x**2  # ünïcode 12345 <|im_end|>\n\n  spaces   ok"
    assert ours.encode(text) == ref.encode(text, add_special_tokens=False)
    assert ours.apply_chat_template(PROMPT) == ref.apply_chat_template(PROMPT, add_generation_prompt=True,
                                                                      tokenize=True, return_dict=False)


def test_draft_logits_match_transformers_gguf_loader():
    import transformers

    path = alias_path(DEFAULT_DRAFT)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    ours = avkit.models.load(path)
    ids = ours.tokenizer.apply_chat_template(PROMPT)
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].float()
    got = ours.model.forward(torch.tensor([ids]), torch.tensor([len(ids)]), torch.tensor([0]),
                             ours.model.new_cache(1, len(ids)))[0]
    torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3)
