"""Tiny Hugging Face models and data made on the spot (nothing is downloaded).

`make_tiny_model(dir)` writes a random Qwen2 causal LM (2 layers, head_dim 64: vLLM's CPU backend
needs >= 64) with a byte-level BPE tokenizer trained here on a few strings, a Qwen-style chat template
and `<|im_end|>` as eos; `write_math_jsonl` writes a GSM8K/MATH-style prompt file.
"""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "What is 2 + 3? The answer is \\boxed{5}.",
    "Natalia sold 48 clips in April and half as many in May. How many clips did she sell? #### 72",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "system user assistant The final answer is 12. Let x = 7 so 3x = 21.",
    "0123456789 + - * / = ( ) { } \\frac{1}{2} \\sqrt{3}",
]


def make_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_model(out: Path, seed: int = 0, layers: int = 2, tie: bool = False) -> Path:
    """A random tiny Qwen2 + tokenizer saved as a Hugging Face model directory; returns `out`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = make_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,  # head_dim 64
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # a larger init than the default 0.02: responses vary with the prompt
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


MATH_ROWS = [
    {"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"},
    {"question": "Natalia sold 48 clips in April and half as many in May. How many?", "answer": "48 + 24\n#### 72"},
    {"problem": "What is half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
    {"prompt": "Let x = 7. What is 3x?", "answer": "3 * 7 = 21\n#### 21"},
]


def write_math_jsonl(path: Path, rows: list[dict] | None = None) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in (rows or MATH_ROWS)))
    return path


def warm_started_weights(model_dir: Path, data: Path, steps: int = 30, seed: int = 0) -> dict:
    """Weights after a short supervised warm start on `data` (the model learns to stop: eos shows up)."""
    from rlboost.contracts.spec import AlgorithmSpec, ModelSpec, TaskSpec
    from rlboost.trainer.learner import Learner

    learner = Learner(
        ModelSpec(kind="hf", path=str(model_dir), dtype="float32"),
        AlgorithmSpec(learning_rate=3e-3, seed=seed),
        TaskSpec(name="jsonl", path=data, reward="math_boxed"),
        device="cpu",
    )
    learner.warm_start(steps)
    return learner.state_dict()
