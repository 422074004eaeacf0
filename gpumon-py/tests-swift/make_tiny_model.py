"""Writes a tiny Qwen2 (built from a config, random weights, ~30k parameters), its tokenizer
(a byte-level BPE trained here on the dataset's own text) and a chat dataset file:

    make_tiny_model.py OUT_DIR      -> OUT_DIR/model/, OUT_DIR/train.jsonl

Nothing is downloaded: ms-swift then trains it offline (HF_HUB_OFFLINE=1, --check_model false).
"""

import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's ChatML template, as its tokenizer_config.json ships it (system prompt optional).
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def rows(n: int = 64):
    for i in range(n):
        a, b = i % 9 + 1, (i * 7) % 11 + 1
        yield {
            "messages": [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
            ]
        }


def main() -> None:
    out = sys.argv[1]
    model_dir = os.path.join(out, "model")
    os.makedirs(model_dir, exist_ok=True)
    data = list(rows())
    with open(os.path.join(out, "train.jsonl"), "w") as f:
        for r in data:
            f.write(json.dumps(r) + "\n")

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [m["content"] for r in data for m in r["messages"]] + ["user", "assistant", "system"]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=512
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    print(f"make_tiny_model.py: Qwen2 with {params} parameters, vocabulary {len(tokenizer)}, {len(data)} rows -> {out}")


if __name__ == "__main__":
    main()
