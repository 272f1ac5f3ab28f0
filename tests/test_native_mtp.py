"""Native MTP (specviz/drafters/published/native_mtp.py): tiny random targets saved with extra
MTP-layer tensors in the DeepSeek-V3 layout (a DeepseekV3ForCausalLM: MLA attention, MoE MLP)
and the MiMo layout (a Qwen2ForCausalLM with `model.mtp_layers.0.*`) load through Target.load,
the `mtp` strategy picks the checkpoint's own layer, its logits and drafts equal a reference
written below (transformers' decoder-layer class for the block, the MTP glue - position-0
embedding mask, norms, concat order, projection, head, chaining - in plain torch), and greedy
decoding equals `ar`. Bad checkpoints fail with one clear line."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specviz import runner, strategies
from specviz.drafters.base import DrafterUnavailable
from specviz.engine.decode import GenSettings
from specviz.engine.sampling import SamplingParams

D, VOCAB = 64, 49152
GREEDY = SamplingParams(temperature=0.0)
PROMPT = [1, 504, 2260, 314, 253, 1345, 28, 2683, 418, 9714, 30]


def _config(kind: str):
    from transformers import DeepseekV3Config, LlamaConfig, Qwen2Config
    common = dict(vocab_size=VOCAB, hidden_size=D, intermediate_size=128,
                  num_attention_heads=4, max_position_embeddings=512, rope_theta=10_000.0,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2, rms_norm_eps=1e-6)
    if kind == "deepseek":
        return DeepseekV3Config(**common, num_hidden_layers=3, num_key_value_heads=4,
                                moe_intermediate_size=32, n_shared_experts=1, n_routed_experts=8,
                                num_experts_per_tok=2, n_group=2, topk_group=1,
                                first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
                                qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                tie_word_embeddings=False, num_nextn_predict_layers=1)
    Config = Qwen2Config if kind == "mimo" else LlamaConfig
    return Config(**common, num_hidden_layers=4, num_key_value_heads=2, tie_word_embeddings=True)


def _rand_(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Random weights a test can tell apart: norms near 1, the rest small."""
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=gen)
                p.copy_(1 + 0.1 * noise if "norm" in name else 0.08 * noise)


def _per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused expert tensors -> a checkpoint's per-expert names."""
    out = {}
    for k, v in state.items():
        if k.endswith("experts.gate_up_proj"):
            gate, up = v.chunk(2, 1)
            for e in range(v.shape[0]):
                out[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = gate[e]
                out[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = up[e]
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                out[k.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
        else:
            out[k] = v
    return out


def _save_target(folder, kind: str) -> dict[str, torch.Tensor]:
    """A random target of `kind` saved (safetensors + the embedded tokenizer); its state."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.models.loading import embedded_folder
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(_config(kind)).eval()
    _rand_(model, torch.Generator().manual_seed(7))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(embedded_folder()).save_pretrained(folder)
    return model.state_dict()


def _mtp_tensors(kind: str, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.nn.Module]:
    """(the MTP layer's checkpoint tensors, without prefix; the block module they hold)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer
    cfg = _config(kind)
    block = (DeepseekV3DecoderLayer(cfg, layer_idx=3) if kind == "deepseek"
             else Qwen2DecoderLayer(cfg, layer_idx=3)).eval()
    _rand_(block, gen)
    t = _per_expert(block.state_dict())
    names = ({"enorm", "hnorm", "eh_proj", "shared_head.norm", "shared_head.head"}
             if kind == "deepseek" else
             {"token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm"})
    for n in names:
        shape = {"eh_proj": (D, 2 * D), "input_proj": (D, 2 * D), "shared_head.head": (VOCAB, D)}
        w = torch.randn(shape.get(n, (D,)), generator=gen)
        t[f"{n}.weight"] = 1 + 0.1 * w if len(shape.get(n, (D,))) == 1 else 0.1 * w
    if kind == "deepseek":
        t["shared_head.head.weight"] *= 5
    return t, block


def _write_mtp(folder, prefix: str, mtp: dict[str, torch.Tensor], split: bool) -> None:
    """Add the MTP tensors under `prefix`: in their own file named by an index (split), or in
    model.safetensors itself."""
    named = {prefix + k: v.contiguous() for k, v in mtp.items()}
    if split:
        save_file(named, str(folder / "mtp.safetensors"))
        keys = load_file(str(folder / "model.safetensors")).keys()
        index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in keys}
                 | {k: "mtp.safetensors" for k in named}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        state = load_file(str(folder / "model.safetensors"))
        save_file(state | named, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _load(folder):
    from specviz.models.target import Target
    return Target.load(str(folder), device="cpu")


@pytest.fixture(scope="module", params=["deepseek", "mimo"])
def native(request, tmp_path_factory):
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    _save_target(folder, kind)
    mtp, block = _mtp_tensors(kind, torch.Generator().manual_seed(11))
    prefix = "model.layers.3." if kind == "deepseek" else "model.mtp_layers.0."
    if kind == "deepseek":   # DeepSeek-V3 stores a copy of the shared embedding in the layer
        mtp["embed_tokens.weight"] = load_file(str(folder / "model.safetensors"))[
            "model.embed_tokens.weight"]
    _write_mtp(folder, prefix, mtp, split=kind == "deepseek")
    return kind, _load(folder), mtp, block


# --- the reference: the MTP glue of vLLM's deepseek_mtp.py / mimo_mtp.py, in plain torch ---------
def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def ref_chain(kind, target, t, block, ids, steps: int):
    """(each step's logits [V], greedy drafts) after `ids`: every step reruns the block over all
    entries from scratch (causal, no cache). Entry i pairs h_i with token i + 1 at position i;
    h_i = the target's final normed state on committed positions, then the fed-back state."""
    with torch.no_grad():
        h = target.model.model(input_ids=torch.tensor([ids[:-1]])).last_hidden_state[0].float()
        emb_w = target.embed.weight.float()
        head = t["shared_head.head.weight"] if kind == "deepseek" else target.lm_head.weight.float()
        toks, hs, logits_k, drafts = list(ids[1:]), list(h), [], []
        for _ in range(steps):
            n = len(toks)
            pos = torch.arange(n)
            e = emb_w[toks] * (pos != 0)[:, None]                      # zeroed at position 0
            hh = torch.stack(hs)
            if kind == "deepseek":
                x = torch.cat([rms(e, t["enorm.weight"]), rms(hh, t["hnorm.weight"])], -1)
                x = x @ t["eh_proj.weight"].T
            else:
                x = torch.cat([rms(hh, t["hidden_layernorm.weight"]),
                               rms(e, t["token_layernorm.weight"])], -1) @ t["input_proj.weight"].T
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out = block(x[None], attention_mask=mask, position_ids=pos[None],
                        position_embeddings=target.model.model.rotary_emb(x[None], pos[None]))
            out = (out[0] if isinstance(out, tuple) else out)[0]
            if kind == "deepseek":
                normed, fed = rms(out, t["shared_head.norm.weight"]), out
            else:
                normed = rms(out, t["final_layernorm.weight"])
                fed = normed
            logits_k.append(normed[-1] @ head.T)
            tok = int(logits_k[-1].argmax())
            drafts.append(tok)
            toks.append(tok)
            hs.append(fed[-1])
        return logits_k, drafts


def _drafter(target, **kw):
    """The mtp drafter in fp32: these tests compare with reference code (random tiny weights,
    whose near-tied logits a bf16 head can reorder)."""
    settings = {"precision": "fp32"} | kw
    return strategies.drafter_for(target, "mtp", strategies.parse_settings("mtp", settings))


def _state(target, drafter, ids):
    feats = {k: v[:-1] for k, v in
             target.forward(ids, target.new_cache(), taps=drafter.taps).taps.items()}
    return drafter.start(ids, feats)


def test_native_mtp(native):
    kind, target, t, block = native
    drafter = _drafter(target)                       # auto: the checkpoint ships MTP layers
    assert type(drafter.module).__name__ == "NativeMtp"
    assert type(_drafter(target, path="native").module).__name__ == "NativeMtp"
    ref_logits, ref_drafts = ref_chain(kind, target, t, block, PROMPT, 3)
    # the steps as MtpDrafter.draft runs them: committed entries, then the fed-back state
    state = _state(target, drafter, PROMPT)
    nxt = (state.tokens + [PROMPT[-1]])[1:len(state.tokens) + 1]
    h, normed = drafter._step(state, nxt, torch.cat(state.feats, 0))
    for k, ref in enumerate(ref_logits):
        torch.testing.assert_close(drafter.head.logits(normed), ref, atol=1e-4, rtol=1e-4)
        h, normed = drafter._step(state, [ref_drafts[k]], h[None])
    tree = drafter.draft(_state(target, drafter, PROMPT), PROMPT[-1], GREEDY, None)
    assert tree.tokens[1:] == ref_drafts
    assert "native MTP from the checkpoint" in tree.note
    layout = "DeepSeek-V3" if kind == "deepseek" else "MiMo"
    assert layout in tree.note
    gen = GenSettings(max_new_tokens=16)
    ar = runner.generate(target, strategy="ar", prompt_ids=PROMPT, gen=gen)
    for kw in ({}, {"path": "native", "gamma": "2"}):
        ours = runner.generate(target, strategy="mtp", prompt_ids=PROMPT, gen=gen, overrides=kw)
        assert ours.token_ids == ar.token_ids


# --- bad checkpoints: one clear line each --------------------------------------------------------
def _fails(target, *needles, **kw):
    with pytest.raises(DrafterUnavailable) as err:
        _drafter(target, **kw)
    msg = str(err.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg


def test_no_mtp_layers(tmp_path):
    _save_target(tmp_path, "llama")
    _fails(_load(tmp_path), "no MTP layers", path="native")
    with pytest.raises(ValueError, match="path=native"):
        strategies.parse_settings("mtp", {"path": str(tmp_path)})


def test_bad_mtp_tensors(tmp_path):
    mtp, _ = _mtp_tensors("deepseek", torch.Generator().manual_seed(11))
    for name, tensors, needles in [
        ("shape", mtp | {"eh_proj.weight": torch.zeros(D, D)},
         ("model.layers.3.eh_proj.weight", f"[{D}, {D}]", f"[{D}, {2 * D}]")),
        ("missing", {k: v for k, v in mtp.items() if k != "mlp.experts.5.up_proj.weight"},
         ("missing tensor model.layers.3.mlp.experts.5.up_proj.weight",)),
        ("fp8", mtp | {"eh_proj.weight_scale_inv": torch.ones(1)}, ("quantized",))]:
        folder = tmp_path / name
        _save_target(folder, "deepseek")
        _write_mtp(folder, "model.layers.3.", tensors, split=False)
        _fails(_load(folder), "native MTP (DeepSeek-V3 layout)", *needles)


def test_hybrid_target(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3NextConfig

    from specviz.models.loading import embedded_folder
    cfg = Qwen3NextConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=128,
                          moe_intermediate_size=32, shared_expert_intermediate_size=32,
                          num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                          layer_types=["linear_attention", "full_attention"],
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          linear_num_value_heads=4, linear_num_key_heads=2,
                          linear_key_head_dim=16, linear_value_head_dim=16,
                          max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(embedded_folder()).save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file(state | {"mtp.fc.weight": torch.zeros(D, 2 * D)}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})
    from specviz.models.loading import load_model
    from specviz.models.target import Target
    model, tok, name = load_model(str(tmp_path), device="cpu")
    target = Target(model, tok, name)
    _fails(target, "out of scope: rollback needs the recurrent state")          # auto
    _fails(target, "out of scope: rollback needs the recurrent state", path="native")
