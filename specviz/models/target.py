"""The target wrapper: one small interface over a Hugging Face causal LM.

Boundary: prefill / forward on new tokens with explicit position ids and an optional tree mask,
feature taps, and KV crop (rollback) and keep (tree compaction); a slot for the drafters built
for it. It hides transformers' cache-API differences (the `past_key_values` -> `cache` rename,
`crop` semantics) and the chat template. The engine talks to models only through this class.
"""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from specviz.models.masks import additive_mask, depths
from specviz.models.kernels import pack_linears, use_grouped_sdpa
from specviz.models.kvcache import new_cache
from specviz.models.loading import EMBEDDED, load_model


@dataclass
class Output:
    logits: torch.Tensor                 # [k, V] float32, rows for the requested positions
    taps: dict[int, torch.Tensor]        # hidden_states index -> [k, d] (all k input positions)


class Target:
    """A frozen causal LM. Positions and masks are explicit; caches are owned by the caller."""

    def __init__(self, model, tokenizer, model_id: str):
        self.model = model
        self.tokenizer = tokenizer
        self.model_id = model_id
        cfg = model.config
        self.n_layers = cfg.num_hidden_layers
        self.hidden = cfg.hidden_size
        self.vocab = cfg.vocab_size
        self.max_len = getattr(cfg, "max_position_embeddings", 2048)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        params = inspect.signature(model.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._pieces: dict[int, str] = {}
        # drafters built for this target (strategies.drafter_for): they hold the target, so they
        # live here, and go with it, rather than in a registry that would keep it alive
        self.drafters: dict = {}
        eos = tokenizer.eos_token_id
        self.eos_ids = {eos} if isinstance(eos, int) else set(eos or [])
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_ids |= {gen_eos} if isinstance(gen_eos, int) else set(gen_eos or [])

    @classmethod
    def load(cls, name: str = EMBEDDED, device: str = "auto", threads: int | None = None,
             dtype: torch.dtype | None = None) -> "Target":
        """The model with its linear layers prepacked for oneDNN and grouped-query attention
        kept grouped, on CPU (kernels.py); dtype None = the device's default (bf16 on CUDA)."""
        if threads:
            torch.set_num_threads(threads)
        model, tok, model_id = load_model(name, device, dtype)
        target = cls(use_grouped_sdpa(pack_linears(model)), tok, model_id)
        target.warm_up()
        return target

    # --- identity --------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """A short hash of the config and the embedding row sums: drafters check it on load. The
        sums are taken in float64 on the CPU, so that no device or kernel's summation order can
        move one across a rounding boundary (one of SmolLM2's sits 2e-7 from it)."""
        cfg = self.model.config
        emb = self.model.get_input_embeddings().weight.detach()
        sig = f"{cfg.model_type}:{self.n_layers}:{self.hidden}:{self.vocab}:" + \
              ",".join(f"{v:.3f}" for v in emb[:64].cpu().double().sum(-1).tolist())
        return hashlib.sha256(sig.encode()).hexdigest()[:16]

    @property
    def embed(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.model.get_output_embeddings()

    @property
    def final_norm(self) -> torch.nn.Module:
        return self.model.model.norm

    # --- text ------------------------------------------------------------------------------
    def encode(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        if isinstance(prompt, list) or (chat and self.tokenizer.chat_template):
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)
            return list(ids["input_ids"] if isinstance(ids, dict) else ids)
        return self.tokenizer.encode(prompt)

    def piece(self, token: int) -> str:
        # events name every token they carry: decode each id once per process
        if token not in self._pieces:
            self._pieces[token] = self.tokenizer.decode([token])
        return self._pieces[token]

    def pieces(self, tokens: list[int]) -> list[str]:
        return [self.piece(t) for t in tokens]

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    # --- caches ----------------------------------------------------------------------------
    def new_cache(self) -> DynamicCache:
        return new_cache(self.model.config)

    @staticmethod
    def cache_len(cache: DynamicCache) -> int:
        return cache.get_seq_length()

    @staticmethod
    def crop(cache: DynamicCache, length: int) -> None:
        """Roll back to `length` positions (crop(-n) removes n in every transformers version)."""
        n = cache.get_seq_length() - length
        if n > 0:
            cache.crop(-n)

    @staticmethod
    def keep(cache: DynamicCache, start: int, rel: list[int]) -> None:
        """Tree compaction: keep positions start+rel (in order) at start.., drop the rest."""
        if rel != list(range(len(rel))):
            idx = torch.tensor(rel, dtype=torch.long) + start
            with torch.inference_mode():   # the cache's tensors are inference tensors
                for layer in cache.layers:
                    for t in (layer.keys, layer.values):
                        t[..., start:start + len(rel), :] = t.index_select(-2, idx.to(t.device))
        Target.crop(cache, start + len(rel))

    # --- forward ---------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: list[int], cache: DynamicCache, parents: list[int] | None = None,
                taps: tuple[int, ...] = (), logits_for: str | int = "all") -> Output:
        """Run k new tokens after the cached prefix; the cache grows by k.

        parents: tree parents (node 0's parent -1) for a draft tree; None means a causal chain.
        Positions are past_len + depth. taps: hidden_states indices to return (0 = embeddings,
        i = output of decoder layer i-1, n_layers = final normed state before the LM head).
        logits_for: "all" rows, the "last" row only (prefill), or the last n rows (a verify
        whose input starts with prompt tokens that need no logits).
        """
        past = cache.get_seq_length()
        k = len(tokens)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        if parents is None:
            pos = torch.arange(past, past + k, device=self.device)
            mask = None
        else:
            pos = torch.tensor(depths(parents), device=self.device) + past
            mask = additive_mask(parents, past, self.dtype, self.device)
        out = self.model.model(input_ids=ids, position_ids=pos[None], attention_mask=mask,
                               use_cache=True, output_hidden_states=bool(taps),
                               **{self._cache_kw: cache})
        h = out.last_hidden_state[0]
        n = k if logits_for == "all" else 1 if logits_for == "last" else logits_for
        rows = h[k - n:]
        logits = self.lm_head(rows).float()
        tapped = {}
        if taps:
            hs = out.hidden_states
            tapped = {i: (h if i == self.n_layers else hs[i][0]) for i in taps}
        return Output(logits, tapped)

    @torch.inference_mode()
    def forward_packed(self, tokens: list[int], positions: list[int], allowed: torch.Tensor,
                       cache: DynamicCache, taps: tuple[int, ...] = ()) -> Output:
        """Several requests' new tokens packed in one row after a shared cache row whose slots
        belong to different requests (engine/batch.py); the cache grows by k = len(tokens).

        positions: each token's own logical position in its request. allowed: [k, past + k]
        bool, True where query i may attend to cache slot or new token j; every query must see
        at least itself. It becomes a float additive mask (DESIGN.md §3.4: never a boolean one).
        Logits for all k rows; taps as in `forward`."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        pos = torch.tensor([positions], dtype=torch.long, device=self.device)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed.to(self.device), torch.finfo(self.dtype).min)
        out = self.model.model(input_ids=ids, position_ids=pos, attention_mask=mask[None, None],
                               use_cache=True, output_hidden_states=bool(taps),
                               **{self._cache_kw: cache})
        h = out.last_hidden_state[0]
        tapped = {}
        if taps:
            tapped = {i: (h if i == self.n_layers else out.hidden_states[i][0]) for i in taps}
        return Output(self.lm_head(h).float(), tapped)

    def warm_up(self) -> None:
        cache = self.new_cache()
        self.forward([1, 2, 3], cache)
        self.forward([4, 5], cache, parents=[-1, 0])
