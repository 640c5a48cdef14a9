"""How `beamify` initialises the embedding rows of the tokens it adds: from what each marker means
(docs/real-model.md#why-the-marker-rows-start-from-what-they-mean)."""

from __future__ import annotations

from dataclasses import dataclass, field

INIT_CHOICES = ("semantic", "mean")
DEFAULT_INIT = "semantic"

# marker -> (structural role, spelled-out word or None)
MEANINGS: dict[str, tuple[str, str | None]] = {
    "<|start|>": ("start", None), "<|channel|>": ("start", " channel"), "<|message|>": ("start", " message"),
    "<|constrain|>": ("start", " constrain"),
    "<|end|>": ("end", " end"), "<|return|>": ("end", None), "<|call|>": ("end", " call"),
}
# The base's analogous special tokens, most specific first; BOS / EOS are the last resort.
ROLE_TOKENS = {
    "start": ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>", "<|start|>"),
    "end": ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>"),
}


@dataclass
class RowInit:
    """How one new row was initialised: token, id and the parts averaged (token strings or "mean")."""

    token: str
    id: int
    parts: list[str] = field(default_factory=list)


def _role_token(vocab: dict[str, int], role: str, old_len: int, fallback: str | None) -> str | None:
    """The base's own token for `role` (ROLE_TOKENS), else `fallback`: one the old vocabulary has, or None."""
    return next((t for t in (*ROLE_TOKENS[role], fallback) if t is not None and vocab.get(t, old_len) < old_len), None)


def plan(tokenizer, old_len: int, new_len: int, init: str = DEFAULT_INIT, base_eos: str | None = None):
    """For each new id (old_len ≤ id < new_len): a RowInit and the old ids whose rows it averages, as
    [(RowInit, [[ids of part 1], [ids of part 2]])]; an empty part list means the mean of all old rows."""
    vocab = tokenizer.get_vocab()
    roles = {role: _role_token(vocab, role, old_len, fallback)
             for role, fallback in (("start", tokenizer.bos_token), ("end", base_eos))}
    out = []
    for token_id in range(old_len, new_len):
        token = tokenizer.convert_ids_to_tokens(token_id)
        row, parts = RowInit(token, token_id), []
        if init == "semantic" and token in MEANINGS:
            role, word = MEANINGS[token]
            if roles[role] is not None:
                row.parts.append(roles[role])
                parts.append([vocab[roles[role]]])
            ids = tokenizer.encode(word, add_special_tokens=False) if word is not None else []
            if ids and all(i < old_len for i in ids):
                row.parts.append(word)
                parts.append(ids)
        if not parts:
            row.parts = ["mean"]
        out.append((row, parts))
    return out


def initialise_rows(model, tokenizer, old_len: int, new_len: int, init: str = DEFAULT_INIT,
                    base_eos: str | None = None) -> list[RowInit]:
    """Set the rows of ids old_len..new_len-1 as `plan` says, in place; returns what was done."""
    import torch

    steps = plan(tokenizer, old_len, new_len, init, base_eos)
    matrices = [model.get_input_embeddings().weight]
    output = model.get_output_embeddings()
    if output is not None and output.weight is not matrices[0]:
        matrices.append(output.weight)
    with torch.no_grad():
        for weight in matrices:
            old = weight[:old_len].float()
            mean = old.mean(dim=0)
            for row, parts in steps:
                value = mean if not parts else torch.stack([old[ids].mean(dim=0) for ids in parts]).mean(dim=0)
                weight[row.id] = value.to(weight.dtype)
        bias = getattr(output, "bias", None) if output is not None else None
        if bias is not None:
            bias[old_len:new_len] = bias[:old_len].float().mean().to(bias.dtype)
    return [row for row, _ in steps]
